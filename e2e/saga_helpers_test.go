package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// The end-to-end tests of the saga's promises (docs/all-or-nothing.md), from the
// issue "All-or-nothing you can trust": every one of them was a bug
// reproduced through Caddy. Another writer, through the gateway or
// straight at the legacy API, meets an all-or-nothing batch in the window
// that used to lose data; each test then asserts the legacy API's final
// state first, and the batch's answer second.

// usersAPI serves /users, with users 1..n named u1..un, in the habits c
// gives.
func usersAPI(c legacyapi.Collection, n int) *legacyapi.API {
	c.Path, c.Seed = "/users", records("u", 1, n)
	return legacyapi.NewRecording(c)
}

// usersSite is a gateway in front of /users with the given batch options,
// one per line.
func usersSite(options ...string) string {
	return `
	batch {
		` + strings.Join(options, "\n\t\t") + `
		resource /users {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
}

// slowSaga runs one item at a time, with an item_timeout long enough for
// the slow faults the tests aim at an item, so that another writer meets
// the batch in a window of about a second.
var slowSaga = []string{"concurrency 1", "item_timeout 5s", "compensation_retries 1"}

// sagaOptions are slowSaga's, with conditional_writes when the legacy API
// enforces its ETags' conditions: the conditions are then the proofs.
func sagaOptions(enforcedETags bool) []string {
	if enforcedETags {
		return append(slices.Clone(slowSaga), "conditional_writes")
	}
	return slowSaga
}

// inFlight is a request the test sent on another goroutine.
type inFlight struct {
	done       chan struct{}
	r          response
	err        error
	sent, came time.Time // when it was sent, and when its answer came
}

// start sends a request to base on another goroutine; body "" is none.
func start(base, method, path, body string) *inFlight {
	f := &inFlight{done: make(chan struct{}), sent: time.Now()}
	client := &http.Client{Timeout: 30 * time.Second}
	go func() {
		defer close(f.done)
		f.r, f.err = send(client, base, method, path, body)
		f.came = time.Now()
	}()
	return f
}

// answer waits for the request's answer.
func (f *inFlight) answer(t testing.TB) response {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30s")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f.r
}

func (f *inFlight) answered() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// overlapped fails the test unless b was sent well before a's answer
// came: b met a while a held its items, so any order the test finds
// between them is a's locks at work, not chance.
func overlapped(t testing.TB, a, b *inFlight) {
	t.Helper()
	if lead := a.came.Sub(b.sent); lead < 500*time.Millisecond {
		t.Fatalf("B was sent %s before A answered, want at least 500ms: the window was missed", lead)
	}
}

// direct sends a request straight to the legacy API, past the gateway:
// the other writer the gateway cannot lock out.
func (g *gateway) direct(t testing.TB, method, path, body string) response {
	t.Helper()
	r, err := send(g.client, "http://"+g.upstream, method, path, body)
	if err != nil {
		t.Fatalf("%s %s at the upstream: %v", method, path, err)
	}
	return r
}

// holds fails the test unless the tenant's record id of /users is want;
// a nil want means the record must not exist.
func holds(t testing.TB, api *legacyapi.API, tenant, id string, want map[string]any) {
	t.Helper()
	rec, ok := api.TenantItem("/users", tenant, id)
	switch {
	case want == nil && ok:
		t.Errorf("user %s (tenant %q) is %v, want it absent", id, tenant, rec)
	case want != nil && !ok:
		t.Errorf("user %s (tenant %q) is absent, want %v", id, tenant, want)
	case want != nil && !sameJSON(t, rec, want):
		t.Errorf("user %s (tenant %q) is %v, want %v", id, tenant, rec, want)
	}
}

func user(id int, name string) map[string]any { return map[string]any{"id": id, "name": name} }

// found returns what the proof read of item i found instead of what the
// batch left (compensation.found), decoded; nil if none.
func found(t testing.TB, r response, i int) map[string]any {
	t.Helper()
	var raw struct {
		Items []struct {
			Compensation *struct {
				Found json.RawMessage `json:"found"`
			} `json:"compensation"`
		} `json:"items"`
	}
	if err := json.Unmarshal(r.Body, &raw); err != nil || i >= len(raw.Items) {
		t.Fatalf("no item %d in %s", i, r.Body)
	}
	c := raw.Items[i].Compensation
	if c == nil || len(c.Found) == 0 {
		return nil
	}
	m, _ := decodeJSON(t, c.Found).(map[string]any)
	return m
}

// sent lists the requests of method on path, in arrival order.
func sent(api *legacyapi.API, method, path string) []legacyapi.Request {
	var out []legacyapi.Request
	for _, r := range api.Requests() {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// arrival is the position among the API's requests of the first one that
// match accepts, or -1.
func arrival(api *legacyapi.API, match func(legacyapi.Request) bool) int {
	return slices.IndexFunc(api.Requests(), match)
}

// checkLeftBehind checks a 500 rollback_failed answer whose detail names
// item i, with the reason its compensation gives, which must hold why.
func checkLeftBehind(t testing.TB, r response, i int, why string) batchAnswer {
	t.Helper()
	b := checkProblem(t, r, 500)
	if b.Outcome != "rollback_failed" {
		t.Errorf("outcome %q, want rollback_failed", b.Outcome)
	}
	if !mentionsItem(b.Detail, i) {
		t.Errorf("detail %q does not name item %d", b.Detail, i)
	}
	it := b.Items[i]
	if it.Outcome != "rollback_failed" || it.Compensation == nil || !strings.Contains(it.Compensation.Error, why) {
		t.Errorf("item %d: outcome %q compensation %+v, want rollback_failed with a reason holding %q", i, it.Outcome, it.Compensation, why)
	} else if !strings.Contains(b.Detail, it.Compensation.Error) {
		t.Errorf("detail %q does not give item %d's reason %q", b.Detail, i, it.Compensation.Error)
	}
	return b
}

// checkRepairLog checks the batch's ERROR log line (docs/operations.md,
// "The log line"): it names item i as left behind, and the kept saga, which gives
// its pre-image, so that an operator can repair it by hand; the line
// itself holds no pre-image.
func checkRepairLog(t testing.TB, g *gateway, i int, preimage map[string]any) {
	t.Helper()
	entries := testLogs.entries("http.handlers.batch")
	if len(entries) != 1 || entries[0]["level"] != "error" || entries[0]["outcome"] != "rollback_failed" {
		t.Fatalf("batch log %v, want one ERROR rollback_failed line", entries)
	}
	e := entries[0]
	if lb := fmt.Sprint(e["left_behind"]); !mentionsItem(lb, i) {
		t.Errorf("left_behind %s does not name item %d", lb, i)
	}
	if e["preimages"] != nil {
		t.Errorf("the log line holds pre-images: %v", e["preimages"])
	}
	saga, _ := e["saga"].(string)
	if saga == "" {
		t.Fatalf("the log line names no kept saga: %v", e)
	}
	// The kept saga as an operator's tools read it from the storage.
	storage := batchapp.DurableStorage(&certmagic.FileStorage{Path: g.storageDir(t)})
	v, err := durable.NewJournals(storage, durable.NewLeases(time.Minute), zap.NewNop()).Saga(context.Background(), saga)
	if err != nil {
		t.Fatalf("the kept saga %s: %v", saga, err)
	}
	if !sameJSON(t, v.Items[i].Preimage, preimage) {
		t.Errorf("the kept saga gives item %d's pre-image as %s, want %v", i, v.Items[i].Preimage, preimage)
	}
}
