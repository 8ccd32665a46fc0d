package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-batch/caddy-batch/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// apiStore is a small legacy API over several collections, for envelopes:
// any path whose last segment is not a collection's is an item of the
// collection before it. A create gets the next number as its id (or the
// id its body names), and answers 201 with an absolute Location; PATCH
// merges, PUT replaces (and cannot create), DELETE answers 200 {}. Every
// write it carries out is logged, in order; fail scripts one answer.
type apiStore struct {
	mu          sync.Mutex
	collections map[string]bool
	records     map[string]map[string]any // by item path
	next        int
	writes      []string // "METHOD path", in the order carried out
	calls       []string
	fail        map[string]answer // "METHOD path" → a scripted answer, once
	locationOff bool
}

func newAPIStore(collections ...string) *apiStore {
	s := &apiStore{collections: map[string]bool{}, records: map[string]map[string]any{}, next: 100, fail: map[string]answer{}}
	for _, c := range collections {
		s.collections[c] = true
	}
	return s
}

func (s *apiStore) put(path string, rec map[string]any) *apiStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records[path] = rec
	return s
}

func (s *apiStore) failOnce(method, path string, a answer) *apiStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[method+" "+path] = a
	return s
}

func (s *apiStore) state() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return asJSON(s.records)
}

func (s *apiStore) log() (writes, calls []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes), slices.Clone(s.calls)
}

func (s *apiStore) Send(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := req.Method + " " + req.Path
	s.calls = append(s.calls, key)
	if a, ok := s.fail[key]; ok {
		delete(s.fail, key)
		if a.err != nil {
			return nil, a.err
		}
		return &SubResponse{Status: a.status, Header: a.header, Body: []byte(a.body)}, nil
	}
	js := func(status int, v any) *SubResponse {
		b, _ := json.Marshal(v)
		return &SubResponse{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: b}
	}
	var body map[string]any
	if req.Body != nil {
		if err := json.Unmarshal(req.Body, &body); err != nil {
			return js(400, map[string]string{"error": err.Error()}), nil
		}
	}
	if s.collections[req.Path] {
		if req.Method != http.MethodPost {
			return js(405, nil), nil
		}
		id := fmt.Sprint(body["id"])
		if body["id"] == nil {
			id = strconv.Itoa(s.next)
			s.next++
			body["id"] = s.next - 1
		}
		path := req.Path + "/" + url.PathEscape(id)
		if s.records[path] != nil {
			return js(409, map[string]string{"error": "exists"}), nil
		}
		s.records[path] = body
		s.writes = append(s.writes, "POST "+path)
		resp := js(201, body)
		if !s.locationOff {
			resp.Header.Set("Location", "http://legacy.test"+path)
		}
		return resp, nil
	}
	rec := s.records[req.Path]
	if rec == nil {
		return js(404, map[string]string{"error": "not found"}), nil
	}
	switch req.Method {
	case http.MethodGet:
		return js(200, rec), nil
	case http.MethodPatch:
		maps.Copy(rec, body)
		for k, v := range body {
			if v == nil {
				delete(rec, k)
			}
		}
	case http.MethodPut:
		body["id"] = rec["id"]
		s.records[req.Path] = body
		rec = body
	case http.MethodDelete:
		delete(s.records, req.Path)
		s.writes = append(s.writes, key)
		return js(200, map[string]any{}), nil
	}
	s.writes = append(s.writes, key)
	return js(200, rec), nil
}

// shop is the policy of the envelope tests: users, and each user's posts.
func shop(t testing.TB, mods ...func(*policy.Settings)) *Envelope {
	t.Helper()
	s := policy.Defaults()
	for _, m := range mods {
		m(&s)
	}
	g := policy.GatewayDefaults()
	pol, err := policy.New([]policy.ResourceSpec{
		{Path: "/users", CollectionMethods: []string{"GET", "POST"}, ItemMethods: []string{"GET", "PUT", "PATCH", "DELETE"}, Settings: s, Gateway: g},
		{Path: "/users/{user}/posts", CollectionMethods: []string{"GET", "POST"}, ItemMethods: []string{"GET", "PUT", "PATCH", "DELETE"}, Settings: s, Gateway: g},
		{Path: "/users/{user}/tags", CollectionMethods: []string{"GET", "POST"}, ItemMethods: []string{"GET", "DELETE"}, Settings: s, Gateway: g},
		{Path: "/reports", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: s, Gateway: g},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Envelope{Path: "/batch", Settings: s, Atomicity: s.Atomicity[policy.OpCreate], Lookup: pol.Lookup}
}

func admitEnvelope(t testing.TB, e *Envelope, body string, header ...string) (*Plan, *problemView) {
	t.Helper()
	p, prob := AdmitEnvelope(newRequest("POST", "/batch", body, header...), e)
	if prob != nil {
		rec := httptest.NewRecorder()
		if err := prob.Write(rec); err != nil {
			t.Fatal(err)
		}
		return nil, decodeProblem(t, rec)
	}
	return p, nil
}

func runEnvelope(t testing.TB, e *Envelope, body string, s Sender, header ...string) *wire {
	t.Helper()
	p, prob := admitEnvelope(t, e, body, header...)
	if prob != nil {
		t.Fatalf("refused: %d %s", prob.Status, prob.Detail)
	}
	return write(t, Run(context.Background(), p, Runtime{Send: s, Locks: &itemlock.Local{}}))
}

const userWithPosts = `{"operations": [
	{"id": "u",  "method": "POST", "url": "/users", "body": {"name": "ada"}},
	{"id": "p1", "method": "POST", "url": "/users/$u/posts", "body": {"title": "hello", "author": "$u", "author_id": "$u#/id"}},
	{"id": "p2", "method": "POST", "url": "/users/$u/posts", "body": {"title": "again", "tags": ["$u", "$$5"]}}
]}`

func TestEnvelopeCreatesWithReferences(t *testing.T) {
	api := newAPIStore("/users", "/users/100/posts")
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

func TestEnvelopeRollsBackDependentsFirst(t *testing.T) {
	api := newAPIStore("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7, "name": "grace", "email": "g@old"})
	api.failOnce("POST", "/users/100/posts", answer{status: 422, body: `{"error":"title too short"}`})
	before := api.state()
	body := `{"operations": [
		{"id": "m", "method": "PATCH", "url": "/users/7", "body": {"email": "g@new"}},
		{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
		{"id": "p1", "method": "POST", "url": "/users/$u/posts", "body": {"title": "x"}}
	]}`
	e := shop(t, func(s *policy.Settings) { s.Concurrency = 1 })
	w := runEnvelope(t, e, body, api)
	equal(t, "status", w.Code, 422)
	equal(t, "outcome", w.Outcome, "rolled_back")
	checkSameRecords(t, api.state(), before)
	writes, _ := api.log()
	equalSlices(t, "writes in the order carried out", writes, []string{"PATCH /users/7", "POST /users/100", "DELETE /users/100", "PUT /users/7"})
}

func TestEnvelopeUndoesDependentsBeforeWhatTheyDependOn(t *testing.T) {
	// Two posts of a new user, then a failure: whatever the concurrency,
	// both posts go before their user.
	for range 20 {
		api := newAPIStore("/users", "/users/100/posts")
		api.failOnce("GET", "/reports/1", answer{status: 503, body: "down"})
		api.put("/reports/1", map[string]any{"id": 1})
		body := `{"operations": [
			{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
			{"id": "p1", "method": "POST", "url": "/users/$u/posts", "body": {"title": "a"}},
			{"id": "p2", "method": "POST", "url": "/users/$u/posts", "body": {"title": "b"}},
			{"id": "r", "method": "GET", "url": "/reports/1", "depends_on": ["p1", "p2"]}
		]}`
		w := runEnvelope(t, shop(t), body, api)
		equal(t, "outcome", w.Outcome, "rolled_back")
		writes, _ := api.log()
		user := slices.Index(writes, "DELETE /users/100")
		for _, post := range []string{"DELETE /users/100/posts/101", "DELETE /users/100/posts/102"} {
			if k := slices.Index(writes, post); k < 0 || k > user {
				t.Fatalf("writes %v: %s must come before the user's delete", writes, post)
			}
		}
	}
}

func TestEnvelopeAcrossResourcesRolledBack(t *testing.T) {
	api := newAPIStore("/users", "/users/9/posts").
		put("/users/7", map[string]any{"id": 7, "name": "grace"}).
		put("/users/9", map[string]any{"id": 9, "name": "linus"}).
		put("/users/9/posts/3", map[string]any{"id": 3, "title": "old"})
	api.failOnce("POST", "/users/9/posts", answer{status: 500, body: "<h1>boom</h1>", header: http.Header{"Content-Type": {"text/html"}}})
	before := api.state()
	body := `{"operations": [
		{"id": "m", "method": "PATCH", "url": "/users/7", "body": {"name": "Grace"}},
		{"id": "d", "method": "DELETE", "url": "/users/9/posts/3", "depends_on": ["m"]},
		{"id": "c", "method": "POST", "url": "/users/9/posts", "body": {"title": "new"}, "depends_on": ["d"]}
	]}`
	// The API's PUT cannot create: a deleted post is re-created by POST.
	w := runEnvelope(t, shop(t, func(s *policy.Settings) { s.RestoreDeleted = policy.RestorePost }), body, api)
	equal(t, "status", w.Code, 502)
	equal(t, "outcome", w.Outcome, "rolled_back")
	checkSameRecords(t, api.state(), before)
	writes, _ := api.log()
	equalSlices(t, "writes", writes, []string{"PATCH /users/7", "DELETE /users/9/posts/3", "POST /users/9/posts/3", "PUT /users/7"})
}

func TestEnvelopePartialFailedDependency(t *testing.T) {
	api := newAPIStore("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"})
	api.failOnce("POST", "/users", answer{status: 422, body: `{"error":"name taken"}`})
	body := `{"atomicity": "partial", "operations": [
		{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
		{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"title": "x"}},
		{"id": "q", "method": "PATCH", "url": "/users/7", "body": {"name": "G"}, "depends_on": ["p"]},
		{"id": "g", "method": "GET", "url": "/users/7"}
	]}`
	w := runEnvelope(t, shop(t, func(s *policy.Settings) { s.AllowOverride = true }), body, api)
	equal(t, "status", w.Code, 207)
	outcomes := []string{}
	for _, it := range w.Items {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", it.Outcome, it.Status))
	}
	equalSlices(t, "outcomes", outcomes, []string{"failed 422", "not_attempted 424", "not_attempted 424", "succeeded 200"})
	equal(t, "user 7 untouched", api.state()["/users/7"], `{"id":7,"name":"grace"}`)
}

func TestEnvelopeInputRules(t *testing.T) {
	ops := func(list ...string) string { return `{"operations": [` + strings.Join(list, ",") + `]}` }
	create := `{"id": "u", "method": "POST", "url": "/users", "body": {"name": "a"}}`
	for _, tt := range []struct {
		name, body string
		status     int
		detail     string
	}{
		{"not JSON", `{`, 400, "not valid"},
		{"no operations", `{"operations": []}`, 400, "no operations"},
		{"unknown member", `{"operations": [], "atomic": true}`, 400, `unknown field "atomic"`},
		{"operation's unknown member", ops(`{"id": "a", "method": "GET", "url": "/users/1", "dependson": ["x"]}`), 400, `unknown field "dependson"`},
		{"bad op id", ops(`{"id": "a b", "method": "GET", "url": "/users/1"}`), 400, "must be one or more of"},
		{"duplicate op id", ops(create, create), 400, `both have id "u"`},
		{"unknown method", ops(`{"id": "a", "method": "HEAD", "url": "/users/1"}`), 400, "not an operation's"},
		{"url matching no resource", ops(`{"id": "a", "method": "GET", "url": "/nothing/1"}`), 400, "matches no resource"},
		{"absolute url", ops(`{"id": "a", "method": "GET", "url": "http://evil.test/users/1"}`), 400, "must be a path"},
		{"POST on an item", ops(`{"id": "a", "method": "POST", "url": "/users/1", "body": {}}`), 400, "goes to a collection"},
		{"PATCH on a collection", ops(`{"id": "a", "method": "PATCH", "url": "/users", "body": {}}`), 400, "goes to an item"},
		{"method the map refuses", ops(`{"id": "a", "method": "PUT", "url": "/users/1/tags/2", "body": {}}`), 405, "PUT is not allowed on /users/1/tags/2"},
		{"a write that could not be undone", ops(`{"id": "a", "method": "DELETE", "url": "/users/1/tags/2"}`), 400, "does not allow PUT on the item"},
		{"a # in a url", ops(create, `{"id": "b", "method": "GET", "url": "/users/$u#/id"}`), 400, "percent-encoded"},
		{"forward reference", ops(`{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {}}`, create), 400, `"u", which is no earlier operation`},
		{"self reference", ops(`{"id": "u", "method": "POST", "url": "/users", "body": {"boss": "$u"}}`), 400, "no earlier operation"},
		{"forward depends_on", ops(`{"id": "a", "method": "GET", "url": "/users/1", "depends_on": ["u"]}`, create), 400, "depends_on names"},
		{"hostile id", ops(`{"id": "a", "method": "GET", "url": "/users/%2e%2e"}`), 400, "dot segment"},
		{"body on a DELETE", ops(`{"id": "a", "method": "DELETE", "url": "/users/1", "body": {"x": 1}}`), 400, "has no body"},
		{"no body on a PATCH", ops(`{"id": "a", "method": "PATCH", "url": "/users/1"}`), 400, "needs a body"},
		{"array body", ops(`{"id": "a", "method": "POST", "url": "/users", "body": [1]}`), 400, "must be a JSON object"},
		{"bad pointer", ops(create, `{"id": "b", "method": "GET", "url": "/users/$u%23id"}`), 400, "not a JSON pointer"},
		{"atomicity without allow_override", `{"atomicity": "partial", "operations": [` + create + `]}`, 400, "allow_override is off"},
		{"unscoped query on a write", ops(`{"id": "a", "method": "PATCH", "url": "/users/1?$select=name", "body": {}}`), 400, "scope_query"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, prob := admitEnvelope(t, shop(t), tt.body)
			if prob == nil {
				t.Fatalf("admitted; want %d", tt.status)
			}
			equal(t, "status", prob.Status, tt.status)
			if !strings.Contains(prob.Detail, tt.detail) {
				t.Errorf("detail %q, want it to say %q", prob.Detail, tt.detail)
			}
		})
	}
	t.Run("more operations than max_items", func(t *testing.T) {
		_, prob := admitEnvelope(t, shop(t, func(s *policy.Settings) { s.MaxItems = 1 }), ops(create, `{"id": "b", "method": "GET", "url": "/users/1"}`))
		if prob == nil || prob.Status != 413 {
			t.Fatalf("got %+v, want 413", prob)
		}
	})
	t.Run("body over max_body_size", func(t *testing.T) {
		_, prob := admitEnvelope(t, shop(t, func(s *policy.Settings) { s.MaxBodySize = 20 }), ops(create))
		if prob == nil || prob.Status != 413 {
			t.Fatalf("got %+v, want 413", prob)
		}
	})
}

func TestEnvelopeReferencesFilled(t *testing.T) {
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

func TestEnvelopeLocksEveryItemItWrites(t *testing.T) {
	// A known item is locked before anything is sent; a created one as
	// soon as it is known, and the item a reference names before it is
	// written.
	api := newAPIStore("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7})
	locks := &recordingLocks{}
	body := `{"operations": [
		{"id": "m", "method": "PATCH", "url": "/users/7", "body": {"a": 1}},
		{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
		{"id": "e", "method": "PATCH", "url": "/users/$u", "body": {"b": 2}},
		{"id": "g", "method": "GET", "url": "/users/7"}
	]}`
	p, prob := admitEnvelope(t, shop(t), body)
	if prob != nil {
		t.Fatal(prob.Detail)
	}
	res := Run(context.Background(), p, Runtime{Send: api, Locks: locks})
	equal(t, "outcome", res.Outcome, Succeeded)
	equalSlices(t, "locked", locks.taken(), []string{"/users/7", "/users/100"})
}

// recordingLocks are local locks that remember what was locked, in order.
type recordingLocks struct {
	itemlock.Local
	mu   sync.Mutex
	keys []string
}

func (l *recordingLocks) Lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	l.keys = append(l.keys, key)
	l.mu.Unlock()
	return l.Local.Lock(ctx, key)
}

func (l *recordingLocks) taken() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.keys)
}

func TestEnvelopeLateItemIsPreflighted(t *testing.T) {
	// The item a PATCH names through a reference is read before it is
	// written, so that its undo puts back what was there.
	api := newAPIStore("/users").put("/users/5", map[string]any{"id": 5, "name": "old", "boss": 7}).put("/users/7", map[string]any{"id": 7, "name": "b"})
	api.failOnce("DELETE", "/users/7", answer{status: 409, body: `{"error":"has reports"}`})
	before := api.state()
	body := `{"operations": [
		{"id": "g", "method": "GET", "url": "/users/7"},
		{"id": "e", "method": "PATCH", "url": "/users/5", "body": {"name": "new"}},
		{"id": "b", "method": "PATCH", "url": "/users/$g", "body": {"name": "boss"}, "depends_on": ["e"]},
		{"id": "d", "method": "DELETE", "url": "/users/$g", "depends_on": ["b"]}
	]}`
	w := runEnvelope(t, shop(t), body, api)
	equal(t, "outcome", w.Outcome, "rolled_back")
	checkSameRecords(t, api.state(), before)
}

func TestEnvelopeWritesOneItemInOrder(t *testing.T) {
	t.Run("two writes of one item must be ordered", func(t *testing.T) {
		_, prob := admitEnvelope(t, shop(t), `{"operations": [
			{"id": "a", "method": "PATCH", "url": "/users/7", "body": {"a": 1}},
			{"id": "b", "method": "PATCH", "url": "/users/7/", "body": {"b": 2}}
		]}`)
		if prob == nil || prob.Status != 400 || !strings.Contains(prob.Detail, `operations "b" and "a" both write /users/7`) {
			t.Fatalf("got %+v", prob)
		}
	})
	t.Run("ordered, and undone in turn", func(t *testing.T) {
		api := newAPIStore("/users").put("/users/7", map[string]any{"id": 7, "name": "grace"})
		api.failOnce("GET", "/reports/1", answer{status: 503, body: "down"})
		before := api.state()
		w := runEnvelope(t, shop(t), `{"operations": [
			{"id": "a", "method": "PATCH", "url": "/users/7", "body": {"name": "G"}},
			{"id": "b", "method": "PATCH", "url": "/users/7", "body": {"name": "GG"}, "depends_on": ["a"]},
			{"id": "r", "method": "GET", "url": "/reports/1", "depends_on": ["b"]}
		]}`, api)
		equal(t, "outcome", w.Outcome, "rolled_back")
		checkSameRecords(t, api.state(), before)
		writes, _ := api.log()
		equalSlices(t, "writes", writes, []string{"PATCH /users/7", "PATCH /users/7", "PUT /users/7", "PUT /users/7"})
	})
	t.Run("a delete, then a create of the same id", func(t *testing.T) {
		api := newAPIStore("/users").put("/users/9", map[string]any{"id": 9, "name": "old"})
		w := runEnvelope(t, shop(t), `{"operations": [
			{"id": "d", "method": "DELETE", "url": "/users/9"},
			{"id": "c", "method": "POST", "url": "/users", "body": {"id": 9, "name": "new"}, "depends_on": ["d"]}
		]}`, api)
		equal(t, "outcome", w.Outcome, "succeeded")
		equal(t, "user 9", api.state()["/users/9"], `{"id":9,"name":"new"}`)
	})
	t.Run("two writes named by references must be ordered", func(t *testing.T) {
		api := newAPIStore("/users")
		w := runEnvelope(t, shop(t, func(s *policy.Settings) { s.Concurrency = 1 }), `{"operations": [
			{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
			{"id": "a", "method": "PATCH", "url": "/users/$u", "body": {"x": 1}},
			{"id": "b", "method": "PATCH", "url": "/users/$u", "body": {"y": 2}}
		]}`, api)
		equal(t, "outcome", w.Outcome, "rolled_back")
		if !strings.Contains(w.Items[2].Error, `operations "b" and "a" both write /users/100`) {
			t.Errorf("error %q", w.Items[2].Error)
		}
		equal(t, "store", len(api.state()), 0)
	})
}

func TestEnvelopeResume(t *testing.T) {
	// A saga killed after the user and one post were created is finished
	// from its journal: the post is deleted before the user.
	api := newAPIStore("/users", "/users/100/posts")
	e := shop(t, func(s *policy.Settings) { s.Concurrency = 1 })
	p, prob := admitEnvelope(t, e, userWithPosts)
	if prob != nil {
		t.Fatal(prob.Detail)
	}
	j := &killingJournal{killAt: 3} // the third write's record never comes back
	res := Run(context.Background(), p, Runtime{Send: api, Journal: j})
	equal(t, "outcome of the killed run", res.Outcome, RolledBack)
	snap := j.snapshot()
	api2 := api // the same legacy API, as the dead gateway left it
	api2.mu.Lock()
	api2.writes = nil
	api2.mu.Unlock()
	// Put back what the dead run's own compensation did, as if it had
	// never run: the API as it was when the gateway died.
	api2.put("/users/100", map[string]any{"id": 100, "name": "ada"})
	api2.put("/users/100/posts/101", map[string]any{"id": 101, "title": "hello", "author": "100", "author_id": 100})
	res2, err := Resume(context.Background(), snap, nil, e, Runtime{Send: api2})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "outcome", res2.Outcome, RolledBack)
	equal(t, "store", len(api2.state()), 0)
	writes, _ := api2.log()
	equalSlices(t, "undos", writes, []string{"DELETE /users/100/posts/101", "DELETE /users/100"})
	equal(t, "described", res2.Items[1].describe(), `operation "p1" (POST /users/100/posts)`)
}

// killingJournal keeps the snapshot as a journal would, and stops
// recording at the killAt'th write about to be sent, as if the gateway
// died there: that write is refused, so it is never sent.
type killingJournal struct {
	mu     sync.Mutex
	killAt int
	sends  int
	dead   bool
	snap   *Snapshot
}

func (j *killingJournal) Begin(_ context.Context, p *Plan) error {
	j.snap = p.Snapshot()
	return nil
}

func (j *killingJournal) Record(_ context.Context, t Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.dead {
		return nil
	}
	if t.Phase == PhaseSending {
		if j.sends++; j.sends == j.killAt {
			j.dead = true
			return fmt.Errorf("killed")
		}
	}
	j.snap.Items[t.Index] = t.Item
	return nil
}

func (j *killingJournal) End(context.Context, *Result) {}

func (j *killingJournal) snapshot() *Snapshot {
	j.mu.Lock()
	defer j.mu.Unlock()
	b, _ := json.Marshal(j.snap)
	var s Snapshot
	_ = json.Unmarshal(b, &s)
	return &s
}

// FuzzAdmitEnvelope holds what every envelope AdmitEnvelope accepts must
// hold, whatever the client sent: every operation whose item is known goes
// to an item (or a collection) of the resource its url matched, under one
// escaped segment; references and depends_on name only earlier
// operations; the limits hold.
func FuzzAdmitEnvelope(f *testing.F) {
	for _, b := range []string{
		userWithPosts,
		`{"operations": [{"id": "a", "method": "GET", "url": "/users/1"}]}`,
		`{"operations": [{"id": "a", "method": "DELETE", "url": "/users/%2e%2e"}]}`,
		`{"operations": [{"id": "a", "method": "GET", "url": "/users/1/../../admin"}]}`,
		`{"operations": [{"id": "a", "method": "GET", "url": "/users/$a"}]}`,
		`{"operations": [{"id": "a", "method": "POST", "url": "/users", "body": {"id": "1/2"}}]}`,
		`{"operations": [{"id": "a", "method": "POST", "url": "/users", "body": {"x": "$$a"}}, {"id": "b", "method": "PATCH", "url": "/users/$a%23%2Fx", "body": {"y": ["$a#/z"]}}]}`,
		`{"atomicity": "partial", "operations": [{"id": "a", "method": "PUT", "url": "/users/7?tenant=x", "body": {}}]}`,
		`{"operations": [{"id": "a", "method": "GET", "url": "//evil/users/1"}]}`, `{}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(b))
	}
	e := shop(f, func(s *policy.Settings) { s.MaxItems, s.MaxBodySize = fuzzMaxItems, 4096 })
	f.Fuzz(func(t *testing.T, body []byte) {
		r := &http.Request{
			Method: http.MethodPost, URL: &url.URL{Path: "/batch"}, Header: http.Header{},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		}
		p, prob := AdmitEnvelope(r, e)
		if prob != nil {
			if prob.Status != http.StatusMethodNotAllowed { // a method the map refuses
				checkProblem(t, prob.Status)
			}
			return
		}
		if len(p.Items) == 0 || len(p.Items) > fuzzMaxItems {
			t.Fatalf("%d operations (max_items %d)", len(p.Items), fuzzMaxItems)
		}
		for i, it := range p.Items {
			for _, j := range it.operation.deps {
				if j >= i {
					t.Fatalf("operation %d depends on %d, which is not earlier", i, j)
				}
			}
			if it.tgt == nil {
				continue
			}
			path := it.tgt.collectionPath
			if it.tgt.kind != policy.OpCreate {
				if reason := badID(it.ID); reason != "" {
					t.Fatalf("operation %d: id %q was accepted, but %s", i, it.ID, reason)
				}
				path = it.tgt.paths.Path(it.ID)
			}
			m, ok := e.Lookup(path)
			if !ok || m.Resource != it.operation.resource || m.Item != (it.tgt.kind != policy.OpCreate) {
				t.Fatalf("operation %d goes to %s, which is not the %s it was admitted for", i, path, it.operation.resource.Collection)
			}
		}
	})
}

// TestEnvelopeDependsOnIsLinear: whether a write waits for an earlier
// write of the same item is decided by looking at each operation once.
// Here every read waits for every read before it, and the last write for
// the last read alone: the paths back to the first write are 2^96, which
// a walk of every path would never finish.
func TestEnvelopeDependsOnIsLinear(t *testing.T) {
	ops := []string{`{"id": "w0", "method": "PATCH", "url": "/users/7", "body": {"a": 1}}`}
	for k := 1; k < 99; k++ {
		var deps []string
		for d := 1; d < k; d++ {
			deps = append(deps, fmt.Sprintf(`"r%d"`, d))
		}
		ops = append(ops, fmt.Sprintf(`{"id": "r%d", "method": "GET", "url": "/users/1", "depends_on": [%s]}`, k, strings.Join(deps, ",")))
	}
	ops = append(ops, `{"id": "w1", "method": "PATCH", "url": "/users/7", "body": {"b": 2}, "depends_on": ["r98"]}`)
	_, prob := admitEnvelope(t, shop(t), `{"operations": [`+strings.Join(ops, ",")+`]}`)
	if prob == nil || prob.Status != 400 || !strings.Contains(prob.Detail, `operations "w1" and "w0" both write /users/7`) {
		t.Fatalf("got %+v", prob)
	}
}

// An operation's url in the answer is the request that reached the
// legacy API: the id canonical under id_format, references filled, and
// the query it carried, the envelope's included.
func TestEnvelopeAnswersTheURLAsSent(t *testing.T) {
	api := newAPIStore("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"})
	e := shop(t, func(s *policy.Settings) {
		s.IDFormat, s.Concurrency, s.ScopeQuery = policy.IDInteger, 1, []string{"by", "tenant"}
	})
	w := runEnvelope(t, e, `{"operations": [
		{"id": "m", "method": "PATCH", "url": "/users/007?by=ada", "body": {"name": "Grace"}},
		{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
		{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"title": "x"}},
		{"id": "g", "method": "GET", "url": "/users/+7"}
	]}`, api)
	equal(t, "outcome", w.Outcome, "succeeded")
	for i, want := range []string{"/users/7?by=ada", "/users", "/users/100/posts", "/users/7"} {
		equal(t, fmt.Sprintf("item %d's url", i), w.Items[i].URL, want)
	}
	_, calls := api.log()
	if !slices.Contains(calls, "PATCH /users/7") {
		t.Errorf("calls %v: the PATCH did not go to /users/7", calls)
	}
}
