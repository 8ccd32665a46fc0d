package e2e

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The gateway in front of what real frameworks do (docs/legacy-apis.md):
// Django REST framework and FeathersJS normalise what they
// store, ignore ids and unknown members, shape answers by query, send
// ETags they do not enforce and redirect to a trailing slash. Each test
// plays one habit through Caddy and reads the legacy API's final state.

// withoutStamp is a record without the updated_at a normalising API
// stamps on every save: a rollback puts the data back, not the clock.
func withoutStamp(rec map[string]any) map[string]any {
	out := maps.Clone(rec)
	delete(out, "updated_at")
	return out
}

// A write the API normalised (trimmed, lower-cased, stamped, unknown
// members ignored) is answered with the item as stored: that answer is
// what the undo's proof expects, and the batch rolls back.
func TestNormalisedWritesAreUndone(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{
		Path: "/api/authors", Normalize: true, Fields: []string{"name", "email"}, ReadOnly: []string{"created_at"},
		Seed: []map[string]any{
			{"id": 26, "name": "ada", "email": "ada@example.com"},
			{"id": 27, "name": "bob", "email": "bob@example.com"},
		},
	})
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/authors {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	before := api.Items("/api/authors")

	r := g.do(t, "PATCH", "/api/authors", `[{"id": 26, "name": "  padded  ", "email": "ADA@EXAMPLE.COM", "nickname": "x", "created_at": "then"}, {"id": 27, "name": "   "}]`)
	b := checkProblem(t, r, 422)
	if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" {
		t.Fatalf("outcome %q, item 0 %q: want the normalised update rolled back: %s", b.Outcome, b.Items[0].Outcome, r.Body)
	}
	if body := string(b.Items[0].Body); !strings.Contains(body, `"name":"padded"`) {
		t.Errorf("item 0's answer %s is not the normalised record", body)
	}
	for id, rec := range before {
		after, _ := api.Item("/api/authors", id)
		if !sameJSON(t, withoutStamp(after), rec) {
			t.Errorf("author %s is %v, want its pre-image %v", id, after, rec)
		}
	}

	r = g.do(t, "POST", "/api/authors", `[{"name": " cy ", "email": "CY@example.com", "nickname": "x"}, {"name": ""}]`)
	b = checkProblem(t, r, 422)
	if b.Outcome != "rolled_back" {
		t.Fatalf("create: outcome %q: %s", b.Outcome, r.Body)
	}
	if n := len(api.Items("/api/authors")); n != 2 {
		t.Errorf("%d authors after the rolled back create, want 2: %v", n, api.Items("/api/authors"))
	}
}

// An all-or-nothing create whose element names an id, in front of an API
// that ignores client ids, answered too late: nothing is at the element's
// id, but the API created the item under its own. The gateway cannot know
// where: rollback_failed and an ERROR line, never "nothing was changed".
func TestUnknownCreateUnderAnIgnoredID(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/authors", AssignIDs: true, WriteDelay: 400 * time.Millisecond})
	g := startGateway(t, api, `
	batch {
		item_timeout 100ms
		compensation_retries 0
		resource /api/authors {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	r := g.do(t, "POST", "/api/authors", `[{"id": 9990, "name": "x"}]`)
	b := checkLeftBehind(t, r, 0, "an id of its own")
	if strings.Contains(b.Detail, "nothing was changed") {
		t.Errorf("detail %q says nothing was changed", b.Detail)
	}
	eventually(t, 5*time.Second, "the late create to land", func() bool { return len(api.Items("/api/authors")) == 1 })
	if _, ok := api.Item("/api/authors", "1000"); !ok {
		t.Errorf("the API holds %v, want the create under its own id 1000", api.Items("/api/authors"))
	}
	entries := testLogs.entries("http.handlers.batch")
	if len(entries) != 1 || entries[0]["level"] != "error" {
		t.Errorf("log %v, want one ERROR line", entries)
	}
}

// FeathersJS' $select shapes every answer, the preflight's read included:
// an all-or-nothing write that kept it would put back half an item and
// answer rolled_back. The gateway refuses it before anything is sent;
// reads and partial batches keep the client's query.
func TestRepresentationQueryOnAFrameworkThatShapesAnswers(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/users", SelectParam: "$select[]", Seed: []map[string]any{
		{"id": 29, "name": "ann", "email": "ann@example.com"},
		{"id": 37, "name": "ben", "email": "ben@example.com"},
	}})
	g := startGateway(t, api, `
	batch {
		allow_override
		restore_deleted post
		resource /users {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	before := api.Items("/users")
	for _, tt := range []struct{ method, path, body string }{
		{"PATCH", "/users?$select[]=name", `[{"id": 29, "name": "x"}, {"id": 37, "email": "bad"}]`},
		{"DELETE", "/users?ids=29,37&$select[]=name", ""},
	} {
		api.ResetLog()
		body := optionalBody(tt.body)
		b := checkProblem(t, g.do(t, tt.method, tt.path, body), 400)
		if !strings.Contains(b.Detail, `"$select[]"`) || !strings.Contains(b.Detail, "scope_query") {
			t.Errorf("%s %s: detail %q does not name the parameter and the option", tt.method, tt.path, b.Detail)
		}
		if reqs := api.Requests(); len(reqs) != 0 {
			t.Errorf("%s %s: the legacy API received %s", tt.method, tt.path, describeRequests(reqs))
		}
		sameState(t, api, "/users", before)
	}

	b := checkEnvelope(t, g.do(t, "GET", "/users?ids=29,37&$select[]=name", nil), 200, "succeeded")
	if !sameJSON(t, b.Items[0].Body, map[string]any{"id": 29, "name": "ann"}) {
		t.Errorf("batch GET item 0 is %s, want it shaped by the client's $select", b.Items[0].Body)
	}
	checkEnvelope(t, g.do(t, "PATCH", "/users?$select[]=name", `[{"id": 29, "name": "x"}]`, "Prefer", "atomicity=partial"), 200, "succeeded")
	holds(t, api, "", "29", map[string]any{"id": 29, "name": "x", "email": "ann@example.com"})
}

// Django's ConditionalGetMiddleware puts a strong ETag on every GET and
// ignores If-None-Match on writes. A re-create after a failed batch
// DELETE is then proved by a read: a direct writer's new item at that id
// is left as it is, where the condition alone would have overwritten it.
func TestUnenforcedETagsAreNoProof(t *testing.T) {
	api := usersAPI(legacyapi.Collection{ContentETags: true, PutCreates: true}, 2)
	held, release := heldUntilReleased(legacyapi.Fault{Method: "DELETE", Path: "/users/2", Status: 500, Body: htmlError})
	api.Inject(held)
	g := startGateway(t, api, usersSite(slowSaga...))

	a := start(g.URL, "DELETE", "/users?ids=1,2", "")
	eventually(t, 5*time.Second, "the batch's failing DELETE to be in flight", func() bool { return received(api, "DELETE", "/users/2") })
	if r := g.direct(t, "POST", "/users", `{"id": 1, "name": "theirs"}`); r.Status != http.StatusCreated {
		t.Fatalf("the direct re-create: %s", r)
	}
	release()
	r := a.answer(t)

	holds(t, api, "", "1", user(1, "theirs"))
	holds(t, api, "", "2", user(2, "u2"))
	checkLeftBehind(t, r, 0, "exists again")
	for _, req := range sent(api, "PUT", "/users/1") {
		t.Errorf("an undo was sent over the direct writer's item: PUT %s %s", req.Path, req.Body)
	}
}

// Django REST framework's router redirects /api/authors/1 to
// /api/authors/1/ (301), for writes too, carrying nothing out. Declared
// without the slash, every item fails (a write that was redirected is not
// unknown), and the answer and a WARN line say how to declare it; declared
// with it, batches work and roll back.
func TestTrailingSlashRedirect(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/authors", TrailingSlash: true, Seed: records("a", 1, 3)})
	before := api.Items("/api/authors")
	t.Run("declared without the slash", func(t *testing.T) {
		g := startGateway(t, api, `
	batch {
		resource /api/authors {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
		// The advice changes the side that redirected: the collection
		// for a create, the items for the preflight's reads
		// (docs/legacy-apis.md, "Trailing slashes").
		for _, tt := range []struct{ method, path, body, advice string }{
			{"POST", "/api/authors", `[{"name": "x"}, {"name": "y"}]`, "`resource /api/authors/ { item_path /api/authors/{id} }`"},
			{"PATCH", "/api/authors", `[{"id": 1, "name": "x"}]`, "`resource /api/authors { item_path /api/authors/{id}/ }`"},
			{"DELETE", "/api/authors?ids=1,2", "", "`resource /api/authors { item_path /api/authors/{id}/ }`"},
		} {
			testLogs.reset()
			body := optionalBody(tt.body)
			b := checkProblem(t, g.do(t, tt.method, tt.path, body), 502)
			if b.Outcome != "failed" {
				t.Errorf("%s: outcome %q, want failed (nothing was written)", tt.method, b.Outcome)
			}
			if !strings.Contains(b.Detail, tt.advice) {
				t.Errorf("%s: detail %q does not say how to declare the resource", tt.method, b.Detail)
			}
			warned := false
			for _, e := range testLogs.entries("http.handlers.batch") {
				warned = warned || e["level"] == "warn" && strings.Contains(fmt.Sprint(e["fix"]), tt.advice)
			}
			if !warned {
				t.Errorf("%s: no WARN line with the fix in %v", tt.method, testLogs.entries("http.handlers.batch"))
			}
			sameState(t, api, "/api/authors", before)
		}
	})
	t.Run("declared with the slash", func(t *testing.T) {
		g := startGateway(t, api, `
	batch {
		resource /api/authors/ {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
		api.ResetLog()
		b := checkEnvelope(t, g.do(t, "GET", "/api/authors/?ids=1,2", nil), 200, "succeeded")
		if len(b.Items) != 2 || !strings.Contains(string(b.Items[1].Body), "a2") {
			t.Errorf("batch GET: %+v", b.Items)
		}
		b = checkProblem(t, g.do(t, "PATCH", "/api/authors/", `[{"id": 1, "name": "x"}, {"id": 2, "name": ""}]`), 422)
		if b.Outcome != "rolled_back" {
			t.Errorf("update: outcome %q, want rolled_back", b.Outcome)
		}
		checkEnvelope(t, g.do(t, "POST", "/api/authors/", `[{"name": "new"}]`), 201, "succeeded")
		for _, r := range api.Requests() {
			if !strings.HasSuffix(r.Path, "/") {
				t.Errorf("%s %s was sent without the slash", r.Method, r.Path)
			}
		}
		if n := len(api.Items("/api/authors")); n != 4 {
			t.Errorf("%d authors, want 4", n)
		}
	})
}

// An API whose ORM casts the path's id to an integer reads /3, /03 and
// /3.json as one row. Under id_format any, a batch that names 3 and 03
// takes two writes to that row under two locks, both answered succeeded;
// under id_format integer the two spellings are one id, and the batch is
// refused before anything is sent.
func TestTwoSpellingsOfOneID(t *testing.T) {
	const body = `[{"id": 3, "name": "first"}, {"id": "03", "name": "second"}]`
	t.Run("id_format any: the trap", func(t *testing.T) {
		api := widgetsAPI(legacyapi.Collection{LenientIDs: true}, 3)
		g := startGateway(t, api, listSite(""))
		checkEnvelope(t, g.do(t, "PATCH", "/api/widgets", body), 200, "succeeded")
		if n := len(writes(api.AppliedWrites())); n != 2 {
			t.Errorf("%d writes applied to row 3, want the two this test warns of", n)
		}
	})
	t.Run("id_format integer", func(t *testing.T) {
		api := widgetsAPI(legacyapi.Collection{LenientIDs: true}, 3)
		g := startGateway(t, api, listSite("", "id_format integer"))
		before := api.Items("/api/widgets")
		b := checkProblem(t, g.do(t, "PATCH", "/api/widgets", body), 400)
		if !strings.Contains(b.Detail, `items 0 and 1 both have id "3"`) {
			t.Errorf("detail %q", b.Detail)
		}
		if reqs := api.Requests(); len(reqs) != 0 {
			t.Errorf("the legacy API received:%s", describeRequests(reqs))
		}
		sameState(t, api, "/api/widgets", before)
		b2 := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids=03,3", nil), 200, "succeeded")
		if len(api.Requests()) != 1 || b2.Items[0].ID != "3" {
			t.Errorf("a GET of 03 and 3: ids %v, requests:%s; want one GET of 3", b2.IDs(), describeRequests(api.Requests()))
		}
	})
}
