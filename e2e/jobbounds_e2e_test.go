package e2e

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestJobsConcurrencyBound: a job never has more than job_concurrency
// requests at the legacy API at once, however high concurrency is, and
// does run that many side by side.
func TestJobsConcurrencyBound(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 3), WriteDelay: 20 * time.Millisecond})
	meter := &inFlightMeter{Handler: api, counts: func(r *http.Request) bool { return r.Method == http.MethodPost }}
	upstream := httptest.NewServer(meter)
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	g := startGatewayTo(t, api, upstream.Listener.Addr().String(),
		strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tconcurrency 8\n\t\tjob_concurrency 3\n", 1))
	const n = 90
	start := g.do(t, "POST", "/api/widgets", widgetLines(n),
		"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	if st := pollJob(t, g, decodeJob(t, start), time.Minute); st.State != "succeeded" || st.Succeeded != n {
		t.Fatalf("job ended %+v, want succeeded", st)
	}
	if peak := meter.peakInFlight(); peak != 3 {
		t.Errorf("the job had %d requests in flight at once, want job_concurrency's 3", peak)
	}

	// The same items as a batch take concurrency's 8: the bound is the
	// job's alone.
	meter.resetPeak()
	elements := make([]map[string]string, 40)
	for i := range elements {
		elements[i] = map[string]string{"name": "batch"}
	}
	if r := g.do(t, "POST", "/api/widgets", elements); r.Status != 201 {
		t.Fatalf("batch: %d %s", r.Status, r.Body)
	}
	if peak := meter.peakInFlight(); peak <= 3 {
		t.Errorf("a batch had at most %d requests in flight at once, want more than job_concurrency's 3 (concurrency 8)", peak)
	}
}

// TestJobsWaitOutThrottling: while the legacy API throttles (429 with
// Retry-After: 2), a synchronous batch under max_throttle_wait 1s fails
// its items at once, and a job, under job_throttle_wait's default 1m,
// waits the API out and succeeds, every item created once.
func TestJobsWaitOutThrottling(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tmax_throttle_wait 1s\n", 1))
	before := len(api.Items("/api/widgets"))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: http.StatusTooManyRequests,
		Header: http.Header{"Retry-After": {"2"}}, ContentType: "application/json", Body: `{"error":"slow down"}`})
	throttledUntil := time.Now().Add(3 * time.Second)
	defer time.AfterFunc(3*time.Second, api.ClearFaults).Stop()

	sync := g.do(t, "POST", "/api/widgets", []map[string]string{{"name": "sync-a"}, {"name": "sync-b"}})
	if b := checkEnvelope(t, sync, 207, "failed"); b.Failed != 2 {
		t.Errorf("the batch: %d %s, want its 2 items failed with 429", sync.Status, sync.Body)
	}
	if time.Now().After(throttledUntil) {
		t.Fatal("the batch took past the throttling: it waited instead of failing")
	}

	const n = 10
	start := g.do(t, "POST", "/api/widgets", widgetLines(n),
		"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	st := pollJob(t, g, decodeJob(t, start), time.Minute)
	if st.State != "succeeded" || st.Succeeded != n {
		t.Fatalf("job ended %+v, want succeeded: it waits the throttling out", st)
	}
	if made := len(api.Items("/api/widgets")) - before; made != n {
		t.Errorf("the legacy API made %d widgets, want the job's %d", made, n)
	}
	if w := api.Writes(); w.Applied != n {
		t.Errorf("the legacy API applied %d writes, want %d: each item once", w.Applied, n)
	}
}
