package e2e

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// keysOf is the sorted member names of a JSON object.
func keysOf(t *testing.T, raw json.RawMessage) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, raw)
	}
	return slices.Sorted(maps.Keys(m))
}

// wholeAnswer is a batch's whole answer, its items as they came.
type wholeAnswer struct {
	Atomicity string            `json:"atomicity"`
	Outcome   string            `json:"outcome"`
	Succeeded int               `json:"succeeded"`
	Failed    int               `json:"failed"`
	Items     []json.RawMessage `json:"items"`
}

func decodeWhole(t *testing.T, r response) wholeAnswer {
	t.Helper()
	var a wholeAnswer
	if err := json.Unmarshal(r.Body, &a); err != nil {
		t.Fatalf("answer %d %s: %v", r.Status, r.Body, err)
	}
	return a
}

// TestJobsResultsWhole reads a job's results as one JSON answer (Accept:
// application/json): 409 with Retry-After while the job runs, then the
// synchronous batch's answer of the same items, member for member; 413
// past max_response_size, while JSON Lines still reads them.
func TestJobsResultsWhole(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tmax_response_size 4KiB\n", 1))
	client := []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a"}
	const n = 5
	whole := func(job jobAnswer) response {
		return g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, append(bearerOf(job.Token), "Accept", "application/json")...)
	}

	// The first item answers before the 202; the others wait at the API
	// until the test has read the running job's results.
	api.Inject(passThrough("POST", "/api/widgets", 1))
	held, release := heldUntilReleased(legacyapi.Fault{Method: "POST", Path: "/api/widgets"})
	api.Inject(held)
	defer release()
	start := g.do(t, "POST", "/api/widgets", widgetLines(n), client...)
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	job := decodeJob(t, start)

	r := whole(job)
	if r.Status != 409 || r.Header.Get("Retry-After") != "5" || !bytes.Contains(r.Body, []byte("job-not-ended")) {
		t.Errorf("the whole answer of a running job: %d Retry-After %q %s, want 409 job-not-ended with Retry-After 5",
			r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	if lines := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, append(bearerOf(job.Token), "Accept", "application/x-ndjson")...); lines.Status != 200 ||
		!strings.HasPrefix(lines.Header.Get("Content-Type"), "application/x-ndjson") {
		t.Errorf("the JSON Lines of a running job: %d %s, want 200", lines.Status, lines.Header.Get("Content-Type"))
	}
	release()
	api.ClearFaults()
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" {
		t.Fatalf("job ended %+v, want succeeded", st)
	}

	r = whole(job)
	if r.Status != 200 || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("the whole answer of an ended job: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	got := decodeWhole(t, r)

	// The same items as a synchronous batch: the same members, items
	// alike but for the ids the API gave.
	var elements []map[string]string
	for line := range strings.Lines(widgetLines(n)) {
		var e map[string]string
		_ = json.Unmarshal([]byte(line), &e)
		elements = append(elements, e)
	}
	sync := g.do(t, "POST", "/api/widgets", elements)
	want := decodeWhole(t, sync)
	if !slices.Equal(keysOf(t, r.Body), keysOf(t, sync.Body)) {
		t.Errorf("the whole answer has members %v, a synchronous batch's %v", keysOf(t, r.Body), keysOf(t, sync.Body))
	}
	if got.Atomicity != want.Atomicity || got.Outcome != want.Outcome || got.Succeeded != want.Succeeded || got.Failed != want.Failed || len(got.Items) != len(want.Items) {
		t.Fatalf("the whole answer %s, want as the synchronous batch's %s", r.Body, sync.Body)
	}
	for i := range got.Items {
		if g, w := keysOf(t, got.Items[i]), keysOf(t, want.Items[i]); !slices.Equal(g, w) {
			t.Errorf("item %d has members %v, the synchronous batch's %v", i, g, w)
		}
		var gi, wi struct {
			Index   int    `json:"index"`
			Status  int    `json:"status"`
			Outcome string `json:"outcome"`
		}
		_ = json.Unmarshal(got.Items[i], &gi)
		_ = json.Unmarshal(want.Items[i], &wi)
		if gi != wi || gi.Index != i {
			t.Errorf("item %d: %s, want as the synchronous batch's %s", i, got.Items[i], want.Items[i])
		}
	}

	t.Run("past max_response_size: 413 pointing at JSON Lines", func(t *testing.T) {
		big := g.do(t, "POST", "/api/widgets", widgetLines(80), client...)
		if big.Status != 202 {
			t.Fatalf("start: %d %s", big.Status, big.Body)
		}
		job := decodeJob(t, big)
		if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" {
			t.Fatalf("job ended %+v, want succeeded", st)
		}
		r := whole(job)
		if r.Status != 413 || !bytes.Contains(r.Body, []byte("results-too-large")) || !bytes.Contains(r.Body, []byte("Accept: application/x-ndjson")) {
			t.Errorf("the whole answer past max_response_size: %d %s, want 413 naming Accept: application/x-ndjson", r.Status, r.Body)
		}
		lines := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
		if lines.Status != 200 || bytes.Count(lines.Body, []byte("\n")) != 80 {
			t.Errorf("its JSON Lines: %d, %d lines, want 200 with 80", lines.Status, bytes.Count(lines.Body, []byte("\n")))
		}
	})

	t.Run("a wrong token: 404", func(t *testing.T) {
		r := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, append(bearerOf(job.Token+"x"), "Accept", "application/json")...)
		if r.Status != 404 || !bytes.Contains(r.Body, []byte("unknown-job")) {
			t.Errorf("a wrong token: %d %s, want 404 unknown-job", r.Status, r.Body)
		}
	})
}

// TestJobsResultsWholeCancelled: the whole answer of a cancelled job
// holds every item, as a synchronous batch's does: those the job never
// started not_attempted.
func TestJobsResultsWholeCancelled(t *testing.T) {
	api := seededAPI()
	// A lease of 3s: the running job sees the cancel within a second.
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+t.TempDir()+"\n\tbatch {\n\t\tlease 3s\n\t}", jobsSite)
	client := []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a"}
	whole := func(job jobAnswer) response {
		return g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, append(bearerOf(job.Token), "Accept", "application/json")...)
	}
	const n = 300
	api.Inject(passThrough("POST", "/api/widgets", 1))
	held, release := heldUntilReleased(legacyapi.Fault{Method: "POST", Path: "/api/widgets"})
	api.Inject(held)
	defer release()
	start := g.do(t, "POST", "/api/widgets", widgetLines(n), client...)
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	if r := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); r.Status != 202 {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	time.Sleep(2500 * time.Millisecond) // the run sees the cancel within a third of lease
	release()
	api.ClearFaults()
	st := pollJob(t, g, job, time.Minute)
	if st.State != "cancelled" || st.Done >= n {
		t.Fatalf("job ended %+v, want cancelled before its end", st)
	}
	r := whole(job)
	if r.Status != 200 {
		t.Fatalf("the whole answer: %d %s", r.Status, r.Body)
	}
	a := decodeWhole(t, r)
	if a.Outcome != "cancelled" || a.Succeeded != st.Succeeded || len(a.Items) != n {
		t.Fatalf("the whole answer: outcome %s, %d succeeded, %d items; want cancelled, %d, %d", a.Outcome, a.Succeeded, len(a.Items), st.Succeeded, n)
	}
	for i, raw := range a.Items {
		var it struct {
			Index   int    `json:"index"`
			Outcome string `json:"outcome"`
		}
		_ = json.Unmarshal(raw, &it)
		if it.Index != i || (i >= st.Done) != (it.Outcome == "not_attempted") {
			t.Fatalf("item %d: %s, want index %d, not_attempted past the %d done", i, raw, i, st.Done)
		}
	}
}
