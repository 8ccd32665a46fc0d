package batch

// Envelopes run: operations across resources in the order their
// dependencies allow, each item locked, and undone dependents first
// (docs/envelope.md).

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

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

func TestEnvelopeRollsBackDependentsFirst(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7, "name": "grace", "email": "g@old"})
	api.on("POST", "/users/100/posts", answer{status: 422, body: `{"error":"title too short"}`}, answer{})
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
	api.checkUnchanged(t, before)
	writes := api.writes()
	equalSlices(t, "writes in the order carried out", writes, []string{"PATCH /users/7", "POST /users/100", "DELETE /users/100", "PUT /users/7"})
}

func TestEnvelopeUndoesDependentsBeforeWhatTheyDependOn(t *testing.T) {
	t.Parallel()
	// Two posts of a new user, then a failure: whatever the concurrency,
	// both posts go before their user.
	for range 20 {
		api := newShopAPI("/users", "/users/100/posts")
		api.on("GET", "/reports/1", answer{status: 503, body: "down"}, answer{})
		api.put("/reports/1", map[string]any{"id": 1})
		body := `{"operations": [
			{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
			{"id": "p1", "method": "POST", "url": "/users/$u/posts", "body": {"title": "a"}},
			{"id": "p2", "method": "POST", "url": "/users/$u/posts", "body": {"title": "b"}},
			{"id": "r", "method": "GET", "url": "/reports/1", "depends_on": ["p1", "p2"]}
		]}`
		w := runEnvelope(t, shop(t), body, api)
		equal(t, "outcome", w.Outcome, "rolled_back")
		writes := api.writes()
		user := slices.Index(writes, "DELETE /users/100")
		for _, post := range []string{"DELETE /users/100/posts/101", "DELETE /users/100/posts/102"} {
			if k := slices.Index(writes, post); k < 0 || k > user {
				t.Fatalf("writes %v: %s must come before the user's delete", writes, post)
			}
		}
	}
}

func TestEnvelopeAcrossResourcesRolledBack(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/9/posts").
		put("/users/7", map[string]any{"id": 7, "name": "grace"}).
		put("/users/9", map[string]any{"id": 9, "name": "linus"}).
		put("/users/9/posts/3", map[string]any{"id": 3, "title": "old"})
	api.on("POST", "/users/9/posts", answer{status: 500, body: "<h1>boom</h1>", header: http.Header{"Content-Type": {"text/html"}}}, answer{})
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
	api.checkUnchanged(t, before)
	writes := api.writes()
	equalSlices(t, "writes", writes, []string{"PATCH /users/7", "DELETE /users/9/posts/3", "POST /users/9/posts/3", "PUT /users/7"})
}

func TestEnvelopePartialFailedDependency(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"})
	api.on("POST", "/users", answer{status: 422, body: `{"error":"name taken"}`}, answer{})
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

func TestEnvelopeLocksEveryItemItWrites(t *testing.T) {
	t.Parallel()
	// A known item is locked before anything is sent; a created one as
	// soon as it is known, and the item a reference names before it is
	// written.
	api := newShopAPI("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7})
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
	t.Parallel()
	// The item a PATCH names through a reference is read before it is
	// written, so that its undo puts back what was there.
	api := newShopAPI("/users").put("/users/5", map[string]any{"id": 5, "name": "old", "boss": 7}).put("/users/7", map[string]any{"id": 7, "name": "b"})
	api.on("DELETE", "/users/7", answer{status: 409, body: `{"error":"has reports"}`}, answer{})
	before := api.state()
	body := `{"operations": [
		{"id": "g", "method": "GET", "url": "/users/7"},
		{"id": "e", "method": "PATCH", "url": "/users/5", "body": {"name": "new"}},
		{"id": "b", "method": "PATCH", "url": "/users/$g", "body": {"name": "boss"}, "depends_on": ["e"]},
		{"id": "d", "method": "DELETE", "url": "/users/$g", "depends_on": ["b"]}
	]}`
	w := runEnvelope(t, shop(t), body, api)
	equal(t, "outcome", w.Outcome, "rolled_back")
	api.checkUnchanged(t, before)
}

func TestEnvelopeWritesOneItemInOrder(t *testing.T) {
	t.Parallel()
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
		api := newShopAPI("/users").put("/users/7", map[string]any{"id": 7, "name": "grace"})
		api.on("GET", "/reports/1", answer{status: 503, body: "down"}, answer{})
		before := api.state()
		w := runEnvelope(t, shop(t), `{"operations": [
			{"id": "a", "method": "PATCH", "url": "/users/7", "body": {"name": "G"}},
			{"id": "b", "method": "PATCH", "url": "/users/7", "body": {"name": "GG"}, "depends_on": ["a"]},
			{"id": "r", "method": "GET", "url": "/reports/1", "depends_on": ["b"]}
		]}`, api)
		equal(t, "outcome", w.Outcome, "rolled_back")
		api.checkUnchanged(t, before)
		writes := api.writes()
		equalSlices(t, "writes", writes, []string{"PATCH /users/7", "PATCH /users/7", "PUT /users/7", "PUT /users/7"})
	})
	t.Run("a delete, then a create of the same id", func(t *testing.T) {
		api := newShopAPI("/users").put("/users/9", map[string]any{"id": 9, "name": "old"})
		w := runEnvelope(t, shop(t), `{"operations": [
			{"id": "d", "method": "DELETE", "url": "/users/9"},
			{"id": "c", "method": "POST", "url": "/users", "body": {"id": 9, "name": "new"}, "depends_on": ["d"]}
		]}`, api)
		equal(t, "outcome", w.Outcome, "succeeded")
		equal(t, "user 9", api.state()["/users/9"], `{"id":9,"name":"new"}`)
	})
	t.Run("two writes named by references must be ordered", func(t *testing.T) {
		api := newShopAPI("/users")
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

// An operation's url in the answer is the request that reached the
// legacy API: the id canonical under id_format, references filled, and
// the query it carried, the envelope's included.
func TestEnvelopeAnswersTheURLAsSent(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/100/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"})
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
	calls := api.sent()
	if !slices.Contains(calls, "PATCH /users/7") {
		t.Errorf("calls %v: the PATCH did not go to /users/7", calls)
	}
}

// TestEnvelopeOperationMethodOverrideNeverForwarded: an operation's url
// may not tell the upstream another method with _method (Rails, Laravel
// and Symfony would obey it and turn a GET into a DELETE). One that names
// another method than the operation's is refused before anything is
// sent; one that names the same method is dropped, as are the envelope's
// own _method and override headers.
func TestEnvelopeOperationMethodOverrideNeverForwarded(t *testing.T) {
	t.Parallel()
	partial := func(s *policy.Settings) { s.ScopeQuery = []string{"tenant"} }
	for name, op := range map[string]string{
		"GET named DELETE":             `{"id": "g", "method": "GET", "url": "/users/7?_method=DELETE"}`,
		"POST named DELETE":            `{"id": "g", "method": "POST", "url": "/users?_method=DELETE", "body": {"name": "x"}}`,
		"lower case":                   `{"id": "g", "method": "GET", "url": "/users/7?_method=delete"}`,
		"percent-encoded name":         `{"id": "g", "method": "GET", "url": "/users/7?%5Fmethod=DELETE"}`,
		"two that disagree":            `{"id": "g", "method": "GET", "url": "/users/7?_method=GET&_method=DELETE"}`,
		"with a reference in its path": `{"id": "g", "method": "DELETE", "url": "/users/$u?_method=PUT"}`,
	} {
		t.Run(name, func(t *testing.T) {
			api := newShopAPI("/users").put("/users/7", map[string]any{"id": 7, "name": "grace"})
			before := api.state()
			body := `{"operations": [{"id": "u", "method": "GET", "url": "/users/7"}, ` + op + `]}`
			_, prob := admitEnvelope(t, shop(t, partial), body)
			if prob == nil {
				t.Fatal("admitted an operation whose url names another method")
			}
			equal(t, "status", prob.Status, 400)
			if !strings.HasSuffix(prob.Type, "#problem-invalid-method-override") {
				t.Errorf("type %q, want invalid-method-override", prob.Type)
			}
			if !strings.Contains(prob.Detail, `operation "g"`) {
				t.Errorf("detail %q does not name the operation", prob.Detail)
			}
			equal(t, "requests sent", len(api.log()), 0)
			api.checkUnchanged(t, before)
		})
	}
	t.Run("the same method, dropped", func(t *testing.T) {
		api := newShopAPI("/users").put("/users/7", map[string]any{"id": 7, "name": "grace"})
		w := runEnvelope(t, shop(t, partial), `{"operations": [
			{"id": "g", "method": "GET", "url": "/users/7?_method=get&tenant=a"},
			{"id": "m", "method": "PATCH", "url": "/users/7?_method=PATCH&tenant=a", "body": {"name": "Grace"}, "depends_on": ["g"]}
		]}`, api, "X-HTTP-Method-Override", "POST", "X-HTTP-Method", "POST", "X-Method-Override", "POST")
		equal(t, "outcome", w.Outcome, "succeeded")
		for i := range w.Items {
			equal(t, fmt.Sprintf("item %d's url", i), w.Items[i].URL, "/users/7?tenant=a")
		}
		calls := api.log()
		equal(t, "requests sent", strings.Join(api.sent(), ", "), "GET /users/7, GET /users/7, PATCH /users/7")
		for _, c := range calls {
			if policy.HasParam(c.RawQuery, policy.MethodParam) {
				t.Errorf("%s?%s reached the upstream with a method override", c, c.RawQuery)
			}
			for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"} {
				if v := c.Header.Get(h); v != "" {
					t.Errorf("%s reached the upstream with %s: %s", c, h, v)
				}
			}
		}
		equal(t, "the item", api.state()["/users/7"], `{"id":7,"name":"Grace"}`)
	})
}

// An envelope create whose body's id is null is refused, as a batch
// element's is: null is neither a string nor an integer, and the client
// may have meant an id it failed to fill in.
func TestEnvelopeCreateNullIDIsRefused(t *testing.T) {
	t.Parallel()
	body := `{"operations": [{"id": "u", "method": "POST", "url": "/users", "body": {"id": null, "name": "x"}}]}`
	_, prob := admitEnvelope(t, shop(t), body)
	if prob == nil || prob.Status != http.StatusBadRequest || !strings.Contains(prob.Detail, "is null") {
		t.Fatalf("an envelope create whose body's id is null: %+v, want 400 saying the id is null", prob)
	}
}

// PHP, which Laravel and Symfony read the query through, drops a
// parameter name's leading spaces and reads its spaces and dots as
// underscores: ?.method=DELETE, ?%2Emethod=DELETE and ?+_method=DELETE
// are ?_method=DELETE there, which turns a POST into a DELETE. An
// operation's url carrying one is refused as one carrying _method is.
func TestEnvelopeOperationMethodOverrideAsPHPSpellsIt(t *testing.T) {
	t.Parallel()
	for _, q := range []string{".method=DELETE", "%2Emethod=DELETE", "+_method=DELETE", "%20_method=DELETE", "_method=DELETE"} {
		t.Run(q, func(t *testing.T) {
			body := `{"operations": [{"id": "g", "method": "POST", "url": "/users?` + q + `", "body": {"name": "x"}}]}`
			e := shop(t)
			e.Atomicity = policy.Partial // a partial envelope: no scope_query check
			p, prob := admitEnvelope(t, e, body)
			if prob == nil {
				t.Fatalf("admitted; the operation is sent as POST /users?%s", p.Items[0].tgt.query)
			}
			equal(t, "status", prob.Status, 400)
		})
	}
}
