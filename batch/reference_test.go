package batch

// References: an operation's url and body filled from what the
// operations it names did (docs/envelope.md).

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

func TestEnvelopeCreatesWithReferences(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/100/posts")
	w := runEnvelope(t, shop(t, func(s *policy.Settings) { s.Concurrency = 1 }), userWithPosts, api)
	equal(t, "status", w.Code, 200)
	equal(t, "outcome", w.Outcome, "succeeded")
	want := map[string]string{
		"/users/100":           `{"id":100,"name":"ada"}`,
		"/users/100/posts/101": `{"author":"100","author_id":100,"id":101,"title":"hello"}`,
		"/users/100/posts/102": `{"id":102,"tags":["100","$5"],"title":"again"}`,
	}
	if got := api.state(); !maps.Equal(got, want) {
		t.Errorf("store %v\nwant %v", got, want)
	}
	for i, want := range []string{"u POST /users 100", "p1 POST /users/100/posts 101", "p2 POST /users/100/posts 102"} {
		it := w.Items[i]
		equal(t, fmt.Sprintf("item %d", i), strings.Join([]string{it.Op, it.Method, it.URL, it.ID}, " "), want)
	}
}

func TestEnvelopeReferencesFilled(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		answer  string // the user's create answer
		second  string // the second operation
		status  int
		outcome string
		detail  string
		sent    string // the second operation's request, when sent
	}{
		{"number member keeps its type", `{"id": 100, "n": 5}`, `{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"n": "$u#/n", "all": "$u#"}}`,
			200, "succeeded", "", `POST /users/100/posts {"all":{"id":100,"n":5},"n":5}`},
		{"member into a url", `{"id": 100, "slug": "ada"}`, `{"id": "g", "method": "GET", "url": "/users/$u%23%2Fslug"}`,
			404, "rolled_back", "", "GET /users/ada"},
		{"hostile id from a member", `{"id": 100, "x": "a/b"}`, `{"id": "g", "method": "GET", "url": "/users/$u%23%2Fx"}`,
			400, "rolled_back", "contains '/'", ""},
		{"dot segment from a member", `{"id": 100, "x": ".."}`, `{"id": "g", "method": "GET", "url": "/users/$u%23%2Fx"}`,
			400, "rolled_back", "dot segment", ""},
		{"missing member", `{"id": 100}`, `{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"n": "$u#/nope"}}`,
			400, "rolled_back", `no member "nope"`, ""},
		{"object into a url", `{"id": 100, "o": {}}`, `{"id": "g", "method": "GET", "url": "/users/$u%23%2Fo"}`,
			400, "rolled_back", "cannot stand in a url", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			f.on("POST", "/users", reply(201, tt.answer))
			f.on("DELETE", "/users/100", reply(200, `{}`))
			f.on("DELETE", "/users/a%2Fb", reply(200, `{}`))
			f.on("GET", "/users/100", reply(200, tt.answer))
			f.on("GET", "/users/a%2Fb", reply(200, tt.answer))
			f.on("GET", "/users/ada", reply(404, `{}`))
			f.on("POST", "/users/100/posts", reply(201, `{"id": 1}`))
			body := `{"operations": [{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}}, ` + tt.second + `]}`
			w := runEnvelope(t, shop(t), body, f)
			equal(t, "status", w.Code, tt.status)
			equal(t, "outcome", w.Outcome, tt.outcome)
			if tt.detail != "" && !strings.Contains(w.Items[1].Error, tt.detail) {
				t.Errorf("error %q, want it to say %q", w.Items[1].Error, tt.detail)
			}
			var second []string
			for _, c := range f.log()[1:] {
				if !strings.HasPrefix(c.Path, "/users/100") || c.Method != "GET" && c.Method != "DELETE" {
					second = append(second, strings.TrimSpace(c.String()+" "+c.Body))
				}
			}
			if tt.sent == "" {
				for _, s := range second {
					if !strings.HasPrefix(s, "DELETE ") && !strings.HasPrefix(s, "GET /users/a%2Fb") {
						t.Errorf("sent %s; the operation must not be sent", s)
					}
				}
				return
			}
			if len(second) == 0 || second[0] != tt.sent {
				t.Errorf("sent %v, want first %s", second, tt.sent)
			}
		})
	}
}
