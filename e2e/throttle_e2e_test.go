package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// throttleSite serves the seeded API's resources one item at a time, so
// that a fault aimed at an item finds the items before it applied.
const throttleSite = `
	batch {
		concurrency 1
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/gizmos {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

// throttled is a fault answering 429 with Retry-After, once.
func throttled(method, path, retryAfter string) legacyapi.Fault {
	return legacyapi.Fault{Method: method, Path: path, Status: http.StatusTooManyRequests, Times: 1,
		Body: "slow down", Header: http.Header{"Retry-After": {retryAfter}}}
}

// sentAt returns when the API received each request of method on path.
func sentAt(api *legacyapi.API, method, path string) []time.Time {
	var at []time.Time
	for _, r := range api.Requests() {
		if r.Method == method && r.Path == path {
			at = append(at, r.At)
		}
	}
	return at
}

// A 429 with Retry-After: 1 is sent again a second later, and the batch
// succeeds; the wait is counted by resource.
func TestThrottledSubRequestIsSentAgainE2E(t *testing.T) {
	g := startGateway(t, seededAPI(), throttleSite)
	g.API.Inject(throttled("GET", "/api/widgets/2", "1"))
	before := throttledWaits(t, "/api/widgets")
	resp := g.do(t, "GET", "/api/widgets?ids=1,2,3", nil)
	if resp.Status != 200 {
		t.Fatalf("batch: %s", resp)
	}
	at := sentAt(g.API, "GET", "/api/widgets/2")
	if len(at) != 2 || at[1].Sub(at[0]) < time.Second {
		t.Errorf("GET /api/widgets/2 received at %v: want twice, a second apart at least", at)
	}
	if n := throttledWaits(t, "/api/widgets") - before; n != 1 {
		t.Errorf("caddy_http_batch_throttled_total{resource=/api/widgets} grew by %v, want 1", n)
	}
}

// A Retry-After past the batch's deadline fails the item at once, with
// the status and Retry-After lifted, not sent again; the all-or-nothing
// batch is undone, and its undo waits for the pause the API asked for.
func TestThrottleBeyondTheDeadlineE2E(t *testing.T) {
	site := `
	batch {
		concurrency   1
		batch_timeout 1s
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
	g := startGateway(t, seededAPI(), site)
	g.API.Inject(throttled("PATCH", "/api/widgets/2", "2"))
	resp := g.do(t, "PATCH", "/api/widgets", `[{"id":1,"name":"one"},{"id":2,"name":"two"},{"id":3,"name":"three"}]`)
	if resp.Status != 429 || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("batch: %d Retry-After %q, want 429 with Retry-After 2\n%s", resp.Status, resp.Header.Get("Retry-After"), resp.Body)
	}
	if out := resp.JSON(t)["outcome"]; out != "rolled_back" {
		t.Errorf("outcome %v, want rolled_back", out)
	}
	if rec, _ := g.API.Item("/api/widgets", "1"); rec["name"] != "w1" {
		t.Errorf("item 1 is %v, not restored", rec)
	}
	if n := len(sentAt(g.API, "PATCH", "/api/widgets/2")); n != 1 {
		t.Errorf("the throttled PATCH was received %d times, want once", n)
	}
	throttledAt, undo := sentAt(g.API, "PATCH", "/api/widgets/2"), sentAt(g.API, "PUT", "/api/widgets/1")
	if len(undo) != 1 || undo[0].Sub(throttledAt[0]) < 2*time.Second {
		t.Errorf("the undo of item 1 was received at %v, before the moment the 429 at %v asked for", undo, throttledAt)
	}
}

// A 503 without Retry-After may be an outage: the item fails as it
// always did, sent once.
func TestServiceUnavailableWithoutRetryAfterE2E(t *testing.T) {
	g := startGateway(t, seededAPI(), throttleSite)
	g.API.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/2", Status: 503, Times: 1})
	resp := g.do(t, "GET", "/api/widgets?ids=1,2", nil)
	if resp.Status != 502 {
		t.Fatalf("batch: %s, want 502", resp)
	}
	if n := len(sentAt(g.API, "GET", "/api/widgets/2")); n != 1 {
		t.Errorf("GET /api/widgets/2 received %d times, want once", n)
	}
}

// A POST answered 503 may have been processed half way: without
// idempotent_upstream it is not sent again, and nothing is created.
func TestCreateAnswered503IsNotSentAgainE2E(t *testing.T) {
	g := startGateway(t, seededAPI(), throttleSite)
	g.API.Inject(legacyapi.Fault{Method: "POST", Path: "/api/gizmos", Status: 503, Times: 1, Header: http.Header{"Retry-After": {"1"}}})
	resp := g.do(t, "POST", "/api/gizmos", `[{"name":"new"}]`)
	if resp.Status != 502 {
		t.Fatalf("batch: %s, want 502", resp)
	}
	if n := len(sentAt(g.API, "POST", "/api/gizmos")); n != 1 {
		t.Errorf("the POST was received %d times, want once", n)
	}
	if n := len(g.API.Items("/api/gizmos")); n != 3 {
		t.Errorf("%d gizmos, want the 3 seeded", n)
	}
}

// While one item of a client waits out a throttle, that client's other
// batches to the resource wait too — the API receives none of their
// requests before the moment — and another client's batches do not. A
// client is its Authorization, a header named in scope_headers, or a
// query parameter named in scope_query (an API keyed by ?api_key=).
func TestThrottleHoldsTheClientE2E(t *testing.T) {
	keyed := strings.Replace(throttleSite, "concurrency 1", "concurrency 1\n\t\tscope_headers X-API-Key", 1)
	queried := strings.Replace(throttleSite, "concurrency 1", "concurrency 1\n\t\tscope_query api_key", 1)
	for _, tt := range []struct {
		name, site string
		ada, bob   throttledClient
	}{
		{"Authorization", throttleSite, throttledClient{header: []string{"Authorization", "Bearer ada"}}, throttledClient{header: []string{"Authorization", "Bearer bob"}}},
		{"scope_headers", keyed, throttledClient{header: []string{"X-API-Key", "ada"}}, throttledClient{header: []string{"X-API-Key", "bob"}}},
		{"scope_query", queried, throttledClient{query: "&api_key=ada"}, throttledClient{query: "&api_key=bob"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			holdsTheClient(t, tt.site, tt.ada, tt.bob)
		})
	}
}

// throttledClient is how a client of holdsTheClient says who it is: a
// header (name, value), or a query to add to its batches' URIs.
type throttledClient struct {
	header []string
	query  string
}

// holdsTheClient throttles ada's first GET, and shows ada's next batch
// held until the moment and bob's not.
func holdsTheClient(t *testing.T, site string, ada, bob throttledClient) {
	g := startGateway(t, seededAPI(), site)
	g.API.Inject(throttled("GET", "/api/widgets/1", "1"))
	waits := throttledWaits(t, "/api/widgets")
	first := make(chan response, 1)
	go func() {
		r, err := g.try("GET", "/api/widgets?ids=1"+ada.query, nil, ada.header...)
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		first <- r
	}()
	// The hold is in place once the gateway counts the wait.
	for deadline := time.Now().Add(5 * time.Second); throttledWaits(t, "/api/widgets") == waits; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first batch's GET was never throttled")
		}
	}
	throttledAt := sentAt(g.API, "GET", "/api/widgets/1")[0]
	if resp := g.do(t, "GET", "/api/widgets?ids=3"+bob.query, nil, bob.header...); resp.Status != 200 {
		t.Errorf("another client's batch: %s", resp)
	}
	if resp := g.do(t, "GET", "/api/widgets?ids=2"+ada.query, nil, ada.header...); resp.Status != 200 {
		t.Errorf("the same client's other batch: %s", resp)
	}
	if resp := <-first; resp.Status != 200 {
		t.Errorf("the throttled batch: %s", resp)
	}
	moment := throttledAt.Add(time.Second)
	if at := sentAt(g.API, "GET", "/api/widgets/3"); len(at) != 1 || !at[0].Before(moment) {
		t.Errorf("another client's GET received at %v: it waited for a throttle not its own (moment %v)", at, moment)
	}
	if at := sentAt(g.API, "GET", "/api/widgets/2"); len(at) != 1 || at[0].Before(moment) {
		t.Errorf("the same client's GET received at %v, before the moment %v", at, moment)
	}
}

// throttledWaits reads caddy_http_batch_throttled_total of resource.
func throttledWaits(t testing.TB, resource string) float64 {
	t.Helper()
	return metricValue(t, "throttled_total", "resource", resource)
}

// Two clients told apart only by ?api_key= (scope_query), each sending
// an envelope whose operation's url carries its key, are two clients to
// the upstream's throttles: ada's 429 does not hold bob's envelope. The
// key counts wherever the client wrote it, in the batch's URI or in an
// operation's url.
func TestThrottleHoldsTheClientOfAnEnvelopeOperationE2E(t *testing.T) {
	site := strings.Replace(throttleSite, "concurrency 1", "concurrency 1\n\t\tscope_query api_key\n\t\tenvelope /api/batch", 1)
	g := startGateway(t, seededAPI(), site)
	g.API.Inject(throttled("GET", "/api/widgets/1", "1"))
	waits := throttledWaits(t, "/api/widgets")
	env := func(id, key string) string {
		return `{"operations": [{"id": "g", "method": "GET", "url": "/api/widgets/` + id + `?api_key=` + key + `"}]}`
	}
	hdr := []string{"Content-Type", "application/json"}
	first := make(chan response, 1)
	go func() {
		r, err := g.try("POST", "/api/batch", env("1", "ada"), hdr...)
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		first <- r
	}()
	for deadline := time.Now().Add(5 * time.Second); throttledWaits(t, "/api/widgets") == waits; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("ada's GET was never throttled")
		}
	}
	throttledAt := sentAt(g.API, "GET", "/api/widgets/1")[0]
	if resp := g.do(t, "POST", "/api/batch", env("3", "bob"), hdr...); resp.Status != 200 {
		t.Errorf("bob's envelope: %s", resp)
	}
	<-first
	moment := throttledAt.Add(time.Second)
	if at := sentAt(g.API, "GET", "/api/widgets/3"); len(at) != 1 || !at[0].Before(moment) {
		t.Errorf("bob's GET (api_key=bob) received at %v: it waited out ada's throttle (api_key=ada, moment %v)", at, moment)
	}
}
