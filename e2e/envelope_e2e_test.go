package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The envelope through Caddy (docs/envelope.md), in front of the fake
// legacy API: users, the posts of any user, and notes that take no PUT.
// Each test reads the API's final state, and the order in which it
// carried writes out.

// shopAPI serves users (whose PUT cannot create) and every user's posts.
func shopAPI() *legacyapi.API {
	return legacyapi.NewRecording(
		legacyapi.Collection{Path: "/api/users", Seed: records("u", 1, 3)},
		legacyapi.Collection{Path: "/api/users/1/posts", Seed: records("p", 1, 2)},
		legacyapi.Collection{Path: "/api/users/*/posts"},
	)
}

// shopSite is a batch handler with an envelope over users and their posts.
const shopSite = `
	batch /api/* {
		envelope /api/batch` + shopResources + `
	}
	reverse_proxy UPSTREAM`

// shopResources are shopAPI's users and their posts, as resources of a
// batch block.
const shopResources = `
		resource /api/users {
			collection GET POST
			item GET PUT PATCH DELETE
			restore_deleted post
		}
		resource /api/users/{user}/posts {
			collection GET POST
			item GET DELETE
			restore_deleted post
		}`

const userWithPostsEnvelope = `{"operations": [
	{"id": "u",  "method": "POST", "url": "/api/users", "body": {"name": "ada"}},
	{"id": "p1", "method": "POST", "url": "/api/users/$u/posts", "body": {"title": "hello", "author_id": "$u#/id"}},
	{"id": "p2", "method": "POST", "url": "/api/users/$u/posts", "body": {"title": "again", "author_id": "$u#/id"}}
]}`

// appliedWrites lists the writes the API carried out, as "METHOD path".
func appliedWrites(api *legacyapi.API) []string {
	var out []string
	for _, r := range api.AppliedWrites() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

func TestEnvelopeUserWithPosts(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, shopSite)
	b := checkEnvelope(t, g.do(t, "POST", "/api/batch", userWithPostsEnvelope), 200, "succeeded")
	user := b.Items[0].ID
	if user == "" || b.Items[0].Op != "u" || b.Items[1].URL != "/api/users/"+user+"/posts" || b.Items[2].Method != "POST" {
		t.Fatalf("items %+v", b.Items)
	}
	if _, ok := api.Item("/api/users", user); !ok {
		t.Errorf("user %s was not created", user)
	}
	posts := api.Items("/api/users/" + user + "/posts")
	if len(posts) != 2 {
		t.Fatalf("posts of user %s: %v", user, posts)
	}
	for _, p := range posts {
		if fmt.Sprint(p["author_id"]) != user {
			t.Errorf("post %v: author_id is not the user's id %s as a number", p, user)
		}
	}
}

func TestEnvelopeRolledBackInOrder(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, strings.Replace(shopSite, "envelope /api/batch", "envelope /api/batch\n\t\tconcurrency 1", 1))
	// The last post is refused, with an HTML page.
	api.Inject(passThrough("POST", "/api/users/1000/posts", 1))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/users/1000/posts", Status: 422, Body: "<h1>title taken</h1>"})
	users := api.Items("/api/users")
	b := checkProblem(t, g.do(t, "POST", "/api/batch", userWithPostsEnvelope), 422)
	if b.Outcome != "rolled_back" || !strings.Contains(b.Detail, `operation "p2"`) {
		t.Errorf("outcome %s, detail %q", b.Outcome, b.Detail)
	}
	sameState(t, api, "/api/users", users)
	if posts := api.Items("/api/users/1000/posts"); len(posts) != 0 {
		t.Errorf("posts left behind: %v", posts)
	}
	equalWrites(t, appliedWrites(api), []string{
		"POST /api/users", "POST /api/users/1000/posts", // the user, the first post
		"DELETE /api/users/1000/posts/1000", "DELETE /api/users/1000", // undone: the post before its user
	})
}

func equalWrites(t testing.TB, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("writes carried out:\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

func TestEnvelopeAcrossResourcesRolledBack(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, shopSite)
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/users/3/posts", Status: 500, Body: "<h1>boom</h1>"})
	users, posts := api.Items("/api/users"), api.Items("/api/users/1/posts")
	b := checkProblem(t, g.do(t, "POST", "/api/batch", `{"operations": [
		{"id": "m", "method": "PATCH", "url": "/api/users/2", "body": {"name": "B"}},
		{"id": "d", "method": "DELETE", "url": "/api/users/1/posts/2", "depends_on": ["m"]},
		{"id": "c", "method": "POST", "url": "/api/users/3/posts", "body": {"title": "moved"}, "depends_on": ["d"]}
	]}`), 502)
	if b.Outcome != "rolled_back" {
		t.Errorf("outcome %s: %s", b.Outcome, b.Detail)
	}
	sameState(t, api, "/api/users", users)
	sameState(t, api, "/api/users/1/posts", posts)
	equalWrites(t, appliedWrites(api), []string{
		"PATCH /api/users/2", "DELETE /api/users/1/posts/2",
		"POST /api/users/1/posts", "PUT /api/users/2", // re-created by POST (restore_deleted post), restored by PUT
	})
}

func TestEnvelopePartialFailedDependency(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, strings.Replace(shopSite, "envelope /api/batch", "envelope /api/batch\n\t\tatomicity partial", 1))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/users", Status: 422, Body: "<h1>name taken</h1>"})
	r := g.do(t, "POST", "/api/batch", `{"operations": [
		{"id": "u", "method": "POST", "url": "/api/users", "body": {"name": "ada"}},
		{"id": "p", "method": "POST", "url": "/api/users/$u/posts", "body": {"title": "x"}},
		{"id": "m", "method": "PATCH", "url": "/api/users/2", "body": {"name": "B"}}
	]}`)
	b := checkEnvelope(t, r, 207, "partial")
	var got []string
	for _, it := range b.Items {
		got = append(got, fmt.Sprintf("%s %s %d", it.Op, it.Outcome, it.Status))
	}
	want := []string{"u failed 422", "p not_attempted 424", "m succeeded 200"}
	if !slices.Equal(got, want) {
		t.Errorf("items %v, want %v", got, want)
	}
	if u, _ := api.Item("/api/users", "2"); u["name"] != "B" {
		t.Errorf("user 2 %v: the operation that stands alone did not run", u)
	}
	equalWrites(t, appliedWrites(api), []string{"PATCH /api/users/2"})
}

func TestEnvelopeBadInput(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, strings.Replace(shopSite, "envelope /api/batch", "envelope /api/batch\n\t\tmax_items 3\n\t\tmax_body_size 1KiB", 1))
	create := `{"id": "u", "method": "POST", "url": "/api/users", "body": {"name": "a"}}`
	ops := func(list ...string) string { return `{"operations": [` + strings.Join(list, ",") + `]}` }
	for _, tt := range []struct {
		name, method, body string
		header             []string
		status             int
		detail             string
	}{
		{"not JSON", "POST", `{"operations": [`, nil, 400, "not valid"},
		{"not a JSON body", "POST", `x`, []string{"Content-Type", "text/plain"}, 415, "JSON"},
		{"duplicate operation id", "POST", ops(create, create), nil, 400, `both have id "u"`},
		{"forward reference", "POST", ops(`{"id": "p", "method": "POST", "url": "/api/users/$u/posts", "body": {}}`, create), nil, 400, "no earlier operation"},
		{"url of no resource", "POST", ops(`{"id": "a", "method": "GET", "url": "/api/orders/1"}`), nil, 400, "matches no resource"},
		{"url outside the gateway", "POST", ops(`{"id": "a", "method": "GET", "url": "http://other.test/api/users/1"}`), nil, 400, "must be a path"},
		{"POST on an item", "POST", ops(`{"id": "a", "method": "POST", "url": "/api/users/1", "body": {}}`), nil, 400, "goes to a collection"},
		{"method the map refuses", "POST", ops(`{"id": "a", "method": "PATCH", "url": "/api/users/1/posts/1", "body": {}}`), nil, 405, "PATCH is not allowed"},
		{"hostile id", "POST", ops(`{"id": "a", "method": "DELETE", "url": "/api/users/%2e%2e"}`), nil, 400, "dot segment"},
		{"unscoped query", "POST", ops(`{"id": "a", "method": "PATCH", "url": "/api/users/1?fields=name", "body": {}}`), nil, 400, "scope_query"},
		{"atomicity without allow_override", "POST", `{"atomicity": "partial", "operations": [` + create + `]}`, nil, 400, "allow_override"},
		{"more operations than max_items", "POST", ops(create, `{"id": "b", "method": "GET", "url": "/api/users/1"}`,
			`{"id": "c", "method": "GET", "url": "/api/users/2"}`, `{"id": "d", "method": "GET", "url": "/api/users/3"}`), nil, 413, "max_items"},
		{"body over max_body_size", "POST", ops(`{"id": "a", "method": "POST", "url": "/api/users", "body": {"name": "` + strings.Repeat("x", 1100) + `"}}`), nil, 413, "max_body_size"},
		{"GET on the envelope", "GET", "", nil, 405, "POST"},
		{"a method override", "POST", ops(create), []string{"X-HTTP-Method-Override", "DELETE"}, 405, "POST alone"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			r := g.do(t, tt.method, "/api/batch", optionalBody(tt.body), tt.header...)
			b := checkProblem(t, r, tt.status)
			if !strings.Contains(b.Detail, tt.detail) {
				t.Errorf("detail %q, want it to say %q", b.Detail, tt.detail)
			}
			if tt.status == 405 && r.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			if reqs := api.Requests(); len(reqs) != 0 {
				t.Errorf("the legacy API received %s", describeRequests(reqs))
			}
		})
	}
	t.Run("OPTIONS", func(t *testing.T) {
		r := g.do(t, "OPTIONS", "/api/batch", nil)
		if r.Status != 204 || r.Header.Get("Allow") != "OPTIONS, POST" || r.Header.Get("Accept-Patch") != "" {
			t.Errorf("%d Allow %q Accept-Patch %q", r.Status, r.Header.Get("Allow"), r.Header.Get("Accept-Patch"))
		}
	})
	t.Run("CORS preflight passes through", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "OPTIONS", "/api/batch", nil, "Origin", "http://app.example", "Access-Control-Request-Method", "POST")
		if r.Header.Get("Allow") == "OPTIONS, POST" || len(api.Requests()) != 1 {
			t.Errorf("%d Allow %q: the gateway answered; the legacy API received %s", r.Status, r.Header.Get("Allow"), describeRequests(api.Requests()))
		}
	})
}

// TestEnvelopeOperationRefusedByAuth: basic_auth after batch guards the
// creation of posts. An envelope that creates a user and a post without
// credentials gets basic_auth's 401 for the post, and the user it created
// is undone: every operation is authorized as the same request alone is.
func TestEnvelopeOperationRefusedByAuth(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, strings.Replace(shopSite, "\treverse_proxy UPSTREAM", `
	@newPost {
		method POST
		path /api/users/*/posts
	}
	basic_auth @newPost {
		admin `+adminHash+`
	}
	reverse_proxy UPSTREAM`, 1))
	users := api.Items("/api/users")
	r := g.do(t, "POST", "/api/batch", userWithPostsEnvelope)
	b := checkProblem(t, r, 401)
	if b.Outcome != "rolled_back" || r.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("outcome %s, WWW-Authenticate %q", b.Outcome, r.Header.Get("WWW-Authenticate"))
	}
	sameState(t, api, "/api/users", users)
	equalWrites(t, appliedWrites(api), []string{"POST /api/users", "DELETE /api/users/1000"})

	api.ResetLog()
	checkEnvelope(t, g.do(t, "POST", "/api/batch", userWithPostsEnvelope, "Authorization", adminAuth), 200, "succeeded")
	if len(api.Items("/api/users/1001/posts")) != 2 {
		t.Errorf("with credentials, the posts were not created: %s", describeRequests(api.Requests()))
	}
}

func TestEnvelopeIdempotencyReplay(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, shopSite)
	first := g.do(t, "POST", "/api/batch", userWithPostsEnvelope, "Idempotency-Key", "env-1")
	checkEnvelope(t, first, 200, "succeeded")
	n := len(api.AppliedWrites())
	again := g.do(t, "POST", "/api/batch", userWithPostsEnvelope, "Idempotency-Key", "env-1")
	if again.Status != 200 || again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
		t.Errorf("replay: %v, Idempotent-Replayed %q", again, again.Header.Get("Idempotent-Replayed"))
	}
	if len(api.AppliedWrites()) != n {
		t.Errorf("the replay wrote: %v", appliedWrites(api)[n:])
	}
	other := g.do(t, "POST", "/api/batch", strings.Replace(userWithPostsEnvelope, "ada", "bob", 1), "Idempotency-Key", "env-1")
	checkProblem(t, other, http.StatusUnprocessableEntity)
	// A batch on a collection with the same key is another scope.
	checkEnvelope(t, g.do(t, "POST", "/api/users", `[{"name": "cy"}]`, "Idempotency-Key", "env-1"), 201, "succeeded")
}

func TestEnvelopeObserved(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, shopSite)
	checkEnvelope(t, g.do(t, "POST", "/api/batch", userWithPostsEnvelope), 200, "succeeded")
	var line map[string]any
	for _, e := range testLogs.entries("http.handlers.batch") {
		if e["msg"] == "batch" {
			line = e
		}
	}
	if line["op"] != "envelope" || line["resource"] != "/api/batch" || line["items"] != float64(3) || line["outcome"] != "succeeded" {
		t.Errorf("log line %v", line)
	}
	if n := metricValue(t, "requests_total", "operation", "envelope"); n < 1 {
		t.Errorf("batches counted under operation envelope: %v", n)
	}
}

// TestEnvelopeInFrontOfARealAPI: the legacy API picks the tenant by
// query, normalises what it stores (trims, lower-cases the email, stamps
// updated_at), assigns its own ids whatever the client sends, and puts
// ETags it does not enforce on its answers. An envelope in tenant b that
// patches a user, creates a user naming an id of its own and a post of
// that user, then fails, leaves tenant b as it was and never touches the
// default tenant; the created user is found under the id the API chose.
func TestEnvelopeInFrontOfARealAPI(t *testing.T) {
	real := func(c legacyapi.Collection) legacyapi.Collection {
		c.Tenants, c.Normalize, c.AssignIDs, c.ContentETags = true, true, true, true
		return c
	}
	api := legacyapi.NewRecording(
		real(legacyapi.Collection{Path: "/api/users", Seed: records("u", 1, 3)}),
		real(legacyapi.Collection{Path: "/api/users/*/posts"}),
	)
	g := startGateway(t, api, strings.Replace(shopSite, "envelope /api/batch", "envelope /api/batch\n\t\tscope_query tenant", 1))
	// Tenant b has its own user 1.
	checkEnvelope(t, g.do(t, "POST", "/api/users?tenant=b", `[{"id": 1, "name": "b-one"}]`), 201, "succeeded")
	tenantB, defaults := api.TenantItems("/api/users", "b"), api.Items("/api/users")
	api.ResetLog()
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/users/1001/posts", Status: 422, Body: "<h1>no</h1>"})
	b := checkProblem(t, g.do(t, "POST", "/api/batch?tenant=b", `{"operations": [
		{"id": "m", "method": "PATCH", "url": "/api/users/1000", "body": {"name": "  B One ", "email": "B@Example.COM"}},
		{"id": "u", "method": "POST", "url": "/api/users", "body": {"id": 77, "name": " cy "}},
		{"id": "p", "method": "POST", "url": "/api/users/$u/posts", "body": {"title": "x", "author": "$u#/name"}}
	]}`), 422)
	if b.Outcome != "rolled_back" || b.Items[1].ID != "1001" || b.Items[2].URL != "/api/users/1001/posts?tenant=b" {
		t.Fatalf("outcome %s, items %+v", b.Outcome, b.Items)
	}
	for _, r := range api.Requests() {
		if !strings.Contains(r.RawQuery, "tenant=b") {
			t.Errorf("%s %s?%s lost the tenant", r.Method, r.Path, r.RawQuery)
		}
	}
	// A rollback puts the data back, not the clock (withoutStamp).
	got := api.TenantItems("/api/users", "b")
	if len(got) != len(tenantB) {
		t.Errorf("tenant b %v, want it as it was: %v", got, tenantB)
	}
	for id, rec := range tenantB {
		if !sameJSON(t, withoutStamp(got[id]), withoutStamp(rec)) {
			t.Errorf("tenant b's user %s: %v, want %v", id, got[id], rec)
		}
	}
	sameState(t, api, "/api/users", defaults)
}

// An envelope of reads only changes nothing, so its Idempotency-Key is
// not recorded: the same envelope again with the same key reads anew
// (what a single GET with the key would do), and is not told a replay.
// An envelope with a write among its operations is recorded
// (TestEnvelopeIdempotencyReplay).
func TestEnvelopeOfReadsIsNotRecorded(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, shopSite)
	reads := `{"operations": [{"id": "u", "method": "GET", "url": "/api/users/1"}, {"id": "p", "method": "GET", "url": "/api/users/1/posts/1"}]}`
	first := g.do(t, "POST", "/api/batch", reads, "Idempotency-Key", "reads-1")
	checkEnvelope(t, first, 200, "succeeded")
	if r := g.do(t, "PATCH", "/api/users/1", `{"name": "changed"}`); r.Status != 200 {
		t.Fatalf("the write between the two reads: %v", r)
	}
	again := g.do(t, "POST", "/api/batch", reads, "Idempotency-Key", "reads-1")
	checkEnvelope(t, again, 200, "succeeded")
	if again.Header.Get("Idempotent-Replayed") != "" || !strings.Contains(string(again.Body), "changed") {
		t.Errorf("the envelope of reads was replayed, not read anew: %v, Idempotent-Replayed %q", again, again.Header.Get("Idempotent-Replayed"))
	}
}
