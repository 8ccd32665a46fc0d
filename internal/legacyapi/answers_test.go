package legacyapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAnswers(t *testing.T) {
	t.Parallel()
	users := func(api *API) string { return mustJSON(api.Items("/api/users")) }
	seedUsers := mustJSON(New(fixture()...).Items("/api/users"))

	tests := []struct {
		name, method, path, body string
		status                   int
		ct                       string
		wantBody                 string // exact, if set
		contains                 string // substring, if set
		allow                    string
		check                    func(t *testing.T, api *API, a answer)
	}{
		{name: "list ordered numerically", method: "GET", path: "/api/users", status: 200, ct: ctJSON,
			wantBody: `[{"id":1,"name":"Ada"},{"id":2,"name":"Bob"},{"id":10,"name":"Cy","role":"admin"}]`},
		{name: "list trailing slash", method: "GET", path: "/api/users/", status: 200, ct: ctJSON, contains: `"Ada"`},
		{name: "list nested", method: "GET", path: "/api/users/1/posts", status: 200, ct: ctJSON, wantBody: `[{"id":1,"title":"hello"}]`},
		{name: "page", method: "GET", path: "/api/users?offset=1&limit=1", status: 200, ct: ctJSON, wantBody: `[{"id":2,"name":"Bob"}]`},
		{name: "page past end", method: "GET", path: "/api/users?offset=9", status: 200, ct: ctJSON, wantBody: `[]`},
		{name: "page bad limit", method: "GET", path: "/api/users?limit=x", status: 400, ct: ctPlain},
		{name: "page negative offset", method: "GET", path: "/api/users?offset=-1", status: 400, ct: ctPlain},
		{name: "head list", method: "HEAD", path: "/api/users", status: 200, ct: ctJSON, wantBody: "",
			check: func(t *testing.T, _ *API, a answer) {
				if a.header.Get("Content-Length") == "0" || a.header.Get("Content-Length") == "" {
					t.Errorf("HEAD Content-Length = %q, want the GET length", a.header.Get("Content-Length"))
				}
			}},
		{name: "get item", method: "GET", path: "/api/users/1", status: 200, ct: ctJSON, wantBody: `{"id":1,"name":"Ada"}`},
		{name: "get escaped string id", method: "GET", path: "/gadgets/a%20b", status: 200, ct: ctJSON, wantBody: `{"id":"a b","name":"Spanner"}`},
		{name: "get missing item", method: "GET", path: "/api/users/7", status: 404, ct: ctHTML, contains: "<title>404 Not Found</title>"},
		{name: "head missing item", method: "HEAD", path: "/api/users/7", status: 404, ct: ctHTML, wantBody: ""},
		{name: "unknown path", method: "GET", path: "/nope", status: 404, ct: ctHTML, contains: "<h1>Not Found</h1>"},
		{name: "two segments deep", method: "GET", path: "/api/users/1/2", status: 404, ct: ctHTML},
		{name: "item trailing slash", method: "GET", path: "/api/users/1/", status: 404, ct: ctHTML},

		{name: "post assigns numeric id", method: "POST", path: "/api/users", body: `{"name":"Dee","age":42}`, status: 201, ct: ctJSON,
			wantBody: `{"age":42,"id":1000,"name":"Dee"}`,
			check: func(t *testing.T, api *API, a answer) {
				if rec, ok := api.Item("/api/users", "1000"); !ok || rec["id"] != json.Number("1000") {
					t.Errorf("stored %v, %v; want id json.Number 1000", rec, ok)
				}
			}},
		{name: "post with string id", method: "POST", path: "/gadgets", body: `{"id":"x/y","name":"Bolt"}`, status: 201, ct: ctJSON, wantBody: `{"id":"x/y","name":"Bolt"}`},
		{name: "post not object", method: "POST", path: "/api/users", body: `[1]`, status: 400, ct: ctPlain, wantBody: "body must be a JSON object"},
		{name: "post bad json", method: "POST", path: "/api/users", body: `{"name":`, status: 400, ct: ctPlain},
		{name: "post empty name", method: "POST", path: "/api/users", body: `{"name":""}`, status: 422, ct: ctHTML, contains: "<!DOCTYPE html>",
			check: func(t *testing.T, api *API, _ answer) {
				if got := users(api); got != seedUsers {
					t.Errorf("state changed: %s", got)
				}
			}},
		{name: "post name not string", method: "POST", path: "/api/users", body: `{"name":5}`, status: 422, ct: ctHTML},
		{name: "post duplicate id", method: "POST", path: "/api/users", body: `{"id":1,"name":"Eve"}`, status: 409, ct: ctPlain, wantBody: "duplicate id"},
		{name: "delete collection", method: "DELETE", path: "/api/users", status: 405, ct: ctHTML, allow: "GET, HEAD, POST"},

		{name: "put replaces keeping id", method: "PUT", path: "/api/users/2", body: `{"id":"2","name":"Bobby"}`, status: 200, ct: ctJSON,
			wantBody: `{"id":2,"name":"Bobby"}`},
		{name: "put cannot create", method: "PUT", path: "/api/users/7", body: `{"name":"Gus"}`, status: 404, ct: ctHTML,
			check: func(t *testing.T, api *API, _ answer) {
				if _, ok := api.Item("/api/users", "7"); ok {
					t.Error("PUT created a record on a collection without PutCreates")
				}
			}},
		{name: "put creates numeric", method: "PUT", path: "/gadgets/42", body: `{"name":"Gear"}`, status: 201, ct: ctJSON, wantBody: `{"id":42,"name":"Gear"}`},
		{name: "put creates string", method: "PUT", path: "/gadgets/c%20d", body: `{"name":"Cog"}`, status: 201, ct: ctJSON, wantBody: `{"id":"c d","name":"Cog"}`},
		{name: "put creates with body id type", method: "PUT", path: "/gadgets/7", body: `{"id":"7"}`, status: 201, ct: ctJSON, wantBody: `{"id":"7"}`},
		{name: "put not object", method: "PUT", path: "/api/users/1", body: `"x"`, status: 400, ct: ctPlain},
		{name: "put null name", method: "PUT", path: "/api/users/1", body: `{"name":null}`, status: 422, ct: ctHTML,
			check: func(t *testing.T, api *API, _ answer) {
				if got := users(api); got != seedUsers {
					t.Errorf("state changed: %s", got)
				}
			}},

		{name: "patch merges and removes null", method: "PATCH", path: "/api/users/10", body: `{"id":99,"role":null,"age":30}`, status: 200, ct: ctJSON,
			wantBody: `{"age":30,"id":10,"name":"Cy"}`,
			check: func(t *testing.T, api *API, _ answer) {
				if rec, _ := api.Item("/api/users", "10"); mustJSON(rec) != `{"age":30,"id":10,"name":"Cy"}` {
					t.Errorf("stored %v", rec)
				}
			}},
		{name: "patch missing", method: "PATCH", path: "/api/users/7", body: `{}`, status: 404, ct: ctHTML},
		{name: "patch not object", method: "PATCH", path: "/api/users/1", body: `null`, status: 400, ct: ctPlain},
		{name: "patch empty name", method: "PATCH", path: "/api/users/10", body: `{"name":"","age":1}`, status: 422, ct: ctHTML,
			check: func(t *testing.T, api *API, _ answer) {
				if got := users(api); got != seedUsers {
					t.Errorf("state changed: %s", got)
				}
			}},

		{name: "delete answers 200 {}", method: "DELETE", path: "/api/users/1", status: 200, ct: ctJSON, wantBody: `{}`,
			check: func(t *testing.T, api *API, _ answer) {
				if _, ok := api.Item("/api/users", "1"); ok {
					t.Error("record still there")
				}
			}},
		{name: "delete missing", method: "DELETE", path: "/api/users/7", status: 404, ct: ctHTML},
		{name: "post on item", method: "POST", path: "/api/users/1", body: `{}`, status: 405, ct: ctHTML, allow: "GET, HEAD, PUT, PATCH, DELETE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := start(t)
			a := do(t, tc.method, srv.URL+tc.path, tc.body)
			if a.status != tc.status {
				t.Errorf("status = %d, want %d (body %q)", a.status, tc.status, a.body)
			}
			if ct := a.header.Get("Content-Type"); ct != tc.ct {
				t.Errorf("Content-Type = %q, want %q", ct, tc.ct)
			}
			if tc.method != "HEAD" && a.header.Get("Content-Length") != fmt.Sprint(len(a.body)) {
				t.Errorf("Content-Length = %q, body has %d bytes", a.header.Get("Content-Length"), len(a.body))
			}
			if (tc.wantBody != "" || tc.method == "HEAD") && a.body != tc.wantBody {
				t.Errorf("body = %q, want %q", a.body, tc.wantBody)
			}
			if !strings.Contains(a.body, tc.contains) {
				t.Errorf("body = %q, want it to contain %q", a.body, tc.contains)
			}
			if got := a.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
			if tc.check != nil {
				tc.check(t, api, a)
			}
		})
	}
}

func TestNumericIDsAndLocation(t *testing.T) {
	t.Parallel()
	api, srv := start(t)
	a := do(t, "POST", srv.URL+"/api/users", `{"name":"Dee"}`)
	if a.status != 201 || a.header.Get("Location") != srv.URL+"/api/users/1000" {
		t.Fatalf("POST: %d, Location %q", a.status, a.header.Get("Location"))
	}
	if id := decode(t, a.body).(map[string]any)["id"]; id != json.Number("1000") {
		t.Errorf("id = %#v, want a JSON number", id)
	}
	if a := do(t, "POST", srv.URL+"/api/users", `{"name":"Eve"}`); !strings.Contains(a.body, `"id":1001`) {
		t.Errorf("second POST = %s, want id 1001", a.body)
	}
	// An absolute Location escapes the id and leads back to the record.
	a = do(t, "POST", srv.URL+"/gadgets", `{"id":"x y/z","name":"Nut"}`)
	loc := a.header.Get("Location")
	if loc != srv.URL+"/gadgets/x%20y%2Fz" {
		t.Fatalf("Location = %q", loc)
	}
	if a := do(t, "GET", loc, ""); a.status != 200 || a.body != `{"id":"x y/z","name":"Nut"}` {
		t.Errorf("GET Location: %d %s", a.status, a.body)
	}
	for _, id := range []string{"1", "2", "10"} {
		if rec, _ := api.Item("/api/users", id); rec["id"] != json.Number(id) {
			t.Errorf("seed %s id = %#v, want json.Number", id, rec["id"])
		}
	}
	// Mixed ids: numbers numerically among themselves, otherwise lexically.
	mixed := New(Collection{Path: "/m", Seed: []map[string]any{{"id": "b"}, {"id": 10}, {"id": 9}, {"id": "a"}}})
	s := httptest.NewServer(mixed)
	defer s.Close()
	if a := do(t, "GET", s.URL+"/m", ""); a.body != `[{"id":9},{"id":10},{"id":"a"},{"id":"b"}]` {
		t.Errorf("order = %s", a.body)
	}
}

func TestNewPanicsOnMalformedDeclaration(t *testing.T) {
	t.Parallel()
	for _, c := range []Collection{
		{Path: "api"}, {Path: "/api/"}, {Path: "/a//b"},
		{Path: "/a", Seed: []map[string]any{{"name": "no id"}}},
		{Path: "/a", Seed: []map[string]any{{"id": 1}, {"id": 1}}},
		{Path: "/a", Seed: []map[string]any{{"id": true}}},
		{Path: "/a", ETags: true, ContentETags: true},
		{Path: "/a/*/b", Seed: []map[string]any{{"id": 1}}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", c)
				}
			}()
			New(c)
		}()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("New did not panic on a pattern declared twice")
			}
		}()
		New(Collection{Path: "/a/*/b"}, Collection{Path: "/a/*/b"})
	}()
}

func TestCreateAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		answer    CreateAnswer
		status    int
		locations []string // of the two POSTs, after the server's URL
		bodies    []string
		ct        string
	}{
		{AnswerCreated, 201, []string{"/api/users/1000", "/api/users/5"}, []string{`{"id":1000,"name":"A"}`, `{"id":5,"name":"B"}`}, ctJSON},
		{AnswerAccepted, 202, []string{"/jobs/1", "/jobs/2"}, []string{`{"id":1,"status":"queued"}`, `{"id":2,"status":"queued"}`}, ctJSON},
		{AnswerSeeOther, 303, []string{"/api/users/1000", "/api/users/5"}, []string{"", ""}, ""},
		{AnswerBare, 201, []string{"", ""}, []string{"", ""}, ""},
	}
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.status, tc.bodies[0]), func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) { c.CreateAnswer, c.ETags = tc.answer, true })...)
			for i, body := range []string{`{"name":"A"}`, `{"id":5,"name":"B"}`} {
				a, err := send(noRedirects, "POST", srv.URL+"/api/users", body, nil)
				if err != nil {
					t.Fatal(err)
				}
				loc := tc.locations[i]
				if loc != "" {
					loc = srv.URL + loc
				}
				if a.status != tc.status || a.header.Get("Location") != loc || a.body != tc.bodies[i] || a.header.Get("Content-Type") != tc.ct {
					t.Errorf("POST %d: %d Location %q %q %q, want %d %q %q %q", i, a.status, a.header.Get("Location"), a.header.Get("Content-Type"), a.body,
						tc.status, loc, tc.ct, tc.bodies[i])
				}
				if hasTag := a.header.Get("ETag") != ""; hasTag != (tc.answer == AnswerCreated) {
					t.Errorf("POST %d: ETag %q", i, a.header.Get("ETag"))
				}
			}
			for _, id := range []string{"1000", "5"} {
				if _, ok := api.Item("/api/users", id); !ok {
					t.Errorf("record %s not created", id)
				}
			}
		})
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("New accepted an unknown CreateAnswer")
			}
		}()
		New(Collection{Path: "/x", CreateAnswer: AnswerBare + 1})
	}()
}

func TestAssignIDs(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, with(func(c *Collection) { c.AssignIDs, c.ETags = true, true })...)
	run(t, srv, []step{
		{"POST", "/api/users", `{"id":5,"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"POST", "/api/users", `{"id":1,"name":"B"}`, 201, `{"id":1001,"name":"B"}`}, // not a duplicate
		{"POST", "/api/users", `{"id":true,"name":"C"}`, 201, `{"id":1002,"name":"C"}`},
		{"POST", "/gadgets", `{"id":"x","name":"D"}`, 201, `{"id":1000,"name":"D"}`},
	})
	if a := doH(t, "POST", srv.URL+"/api/users", `{"id":2,"name":"E"}`, http.Header{"If-None-Match": {"*"}}); a.status != 201 ||
		a.header.Get("Location") != srv.URL+"/api/users/1003" {
		t.Errorf("POST naming an existing id with If-None-Match: *: %d %q", a.status, a.header.Get("Location"))
	}
	if rec, _ := api.Item("/api/users", "1"); rec["name"] != "Ada" {
		t.Errorf("user 1 = %v", rec)
	}
	if _, ok := api.Item("/api/users", "5"); ok {
		t.Error("the client's id was used")
	}
}
