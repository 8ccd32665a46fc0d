package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// TestSagaBatchTimeoutLetsWritesFinish (case 8): batch_timeout stops new
// starts, never a write in flight. Creates take 1.4s each, one at a time,
// within a 2s batch_timeout: the second is in flight at the deadline and
// is let finish, the third never starts, and both created users are
// deleted again: 504 rolled_back, nothing left.
func TestSagaBatchTimeoutLetsWritesFinish(t *testing.T) {
	api := usersAPI(legacyapi.Collection{WriteDelay: 1400 * time.Millisecond}, 2)
	g := startGateway(t, api, usersSite("concurrency 1", "batch_timeout 2s"))
	before := api.Items("/users")

	r := g.do(t, "POST", "/users", `[{"name": "c1"}, {"name": "c2"}, {"name": "c3"}]`)

	sameState(t, api, "/users", before)
	b := checkProblem(t, r, 504)
	if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "rolled_back", "not_attempted"}) {
		t.Errorf("outcome %q items %v, want rolled_back [rolled_back rolled_back not_attempted]", b.Outcome, got)
	}
	if it := b.Items[1]; it.Status != 201 || it.ID == "" {
		t.Errorf("item 1, in flight at the deadline: status %d id %q, want its own 201", it.Status, it.ID)
	}
	posts := sent(api, "POST", "/users")
	if len(posts) != 2 {
		t.Errorf("creates sent:%s; want two", describeRequests(posts))
	}
	for _, p := range posts {
		if strings.Contains(string(p.Body), "c3") {
			t.Error("the third create was sent after batch_timeout")
		}
	}
	if w := api.Writes(); w.Applied != 4 {
		t.Errorf("%d writes applied, want 4: two creates and their two deletes", w.Applied)
	}
}

// TestSagaUndoTimeBounded (case 9): five undos that hang, with
// compensation_timeout 1s and compensation_retries 2, run side by side:
// the batch answers within one compensation's budget (3×1s plus 300ms of
// backoff) of its failure, not five of them in a row.
func TestSagaUndoTimeBounded(t *testing.T) {
	api := usersAPI(legacyapi.Collection{}, 6)
	puts := &inFlightMeter{Handler: api, counts: func(r *http.Request) bool { return r.Method == "PUT" }}
	upstream := httptest.NewServer(puts)
	t.Cleanup(func() {
		api.Close() // the hanging PUTs end before the server closes
		upstream.Close()
	})
	g := startGatewayTo(t, api, upstream.Listener.Addr().String(), usersSite(
		"concurrency 6", "batch_timeout 3s", "compensation_timeout 1s", "compensation_retries 2"))
	for id := 1; id <= 5; id++ {
		api.Inject(legacyapi.Fault{Method: "PUT", Path: "/users/" + strconv.Itoa(id), Hang: true})
	}
	// Late enough that all six writes are sent before it fails.
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/users/6", Delay: 300 * time.Millisecond, Status: 500, Body: htmlError})

	begin := time.Now()
	r := g.do(t, "PATCH", "/users", `[{"id": 1, "name": "A"}, {"id": 2, "name": "A"}, {"id": 3, "name": "A"},
		{"id": 4, "name": "A"}, {"id": 5, "name": "A"}, {"id": 6, "name": "A"}]`)
	took := time.Since(begin)

	for id := 1; id <= 5; id++ {
		holds(t, api, "", strconv.Itoa(id), user(id, "A")) // left as the batch made it, and named
	}
	holds(t, api, "", "6", user(6, "u6"))
	if took > 9*time.Second {
		t.Errorf("the batch answered after %s, want within batch_timeout and one compensation's budget (about 3.3s)", took)
	}
	if n := puts.peakInFlight(); n != 5 {
		t.Errorf("at most %d undo PUTs in flight at once, want all 5 side by side", n)
	}
	b := checkProblem(t, r, 500)
	if got := b.Outcomes(); b.Outcome != "rollback_failed" || !slices.Equal(got, []string{"rollback_failed", "rollback_failed", "rollback_failed", "rollback_failed", "rollback_failed", "failed"}) {
		t.Errorf("outcome %q items %v", b.Outcome, got)
	}
	for i, it := range b.Items[:5] {
		if c := it.Compensation; c == nil || c.Method != "PUT" || c.Attempts != 3 || c.Error == "" {
			t.Errorf("item %d compensation %+v, want 3 attempts of a PUT, with the reason it failed", i, c)
		}
		if !mentionsItem(b.Detail, i) {
			t.Errorf("detail %q does not name item %d", b.Detail, i)
		}
	}
}

// TestSagaSingleWriteLockedOut: a single write that a batch keeps waiting
// longer than item_timeout is answered 409 problem+json with
// Retry-After, and writes nothing.
func TestSagaSingleWriteLockedOut(t *testing.T) {
	api := usersAPI(legacyapi.Collection{}, 4)
	g := startGateway(t, api, usersSite("concurrency 1", "item_timeout 1s"))
	for _, id := range []string{"2", "3", "4"} {
		api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/users/" + id, Delay: 600 * time.Millisecond})
	}

	a := start(g.URL, "PATCH", "/users", `[{"id": 1, "name": "A"}, {"id": 2, "name": "A"}, {"id": 3, "name": "A"}, {"id": 4, "name": "A"}]`)
	eventually(t, 5*time.Second, "the batch's write to user 2", func() bool { return received(api, "PATCH", "/users/2") })
	begin := time.Now()
	r := g.do(t, "PATCH", "/users/1", `{"name": "B"}`)
	waited := time.Since(begin)
	ra := a.answer(t)

	holds(t, api, "", "1", user(1, "A"))
	for _, req := range api.Requests() {
		if strings.Contains(string(req.Body), `"B"`) {
			t.Errorf("the refused write reached the upstream: %s %s %s", req.Method, req.Path, req.Body)
		}
	}
	if r.Status != 409 || r.Header.Get("Content-Type") != problem.ContentType || r.Header.Get("Retry-After") == "" {
		t.Fatalf("the single write: %v (Content-Type %q, Retry-After %q), want 409 problem+json with Retry-After",
			r, r.Header.Get("Content-Type"), r.Header.Get("Retry-After"))
	}
	if p := r.JSON(t); p["status"] != float64(409) || !strings.Contains(fmt.Sprint(p["detail"]), "/users/1") {
		t.Errorf("problem %s, want status 409 and a detail naming /users/1", r.Body)
	}
	if waited < 900*time.Millisecond {
		t.Errorf("refused after %s, want after waiting item_timeout (1s)", waited)
	}
	checkEnvelope(t, ra, 200, "succeeded")
}
