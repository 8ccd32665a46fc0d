package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestJobsAtomicNormalisingAPI: in front of an API that trims what it
// stores, lower-cases emails and stamps updated_at on every save, an
// all-or-nothing job that fails in its third window is undone whole,
// and ends rolled_back, not rollback_failed: each undo proves the item
// against what the job's write answered (the record as the API stored
// it), not against what the job sent. An UPDATE job leaves every
// widget's name and email as they were; a CREATE job leaves no widget
// it made.
func TestJobsAtomicNormalisingAPI(t *testing.T) {
	var seed []map[string]any
	for n := 1; n <= atomicJobItems; n++ {
		seed = append(seed, map[string]any{"id": n, "name": "w" + strconv.Itoa(n), "email": fmt.Sprintf("w%d@example.com", n)})
	}
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Normalize: true, Seed: seed})
	g := startGateway(t, api, strings.Replace(atomicJobsSite, "jobs /api/jobs", "jobs /api/jobs\n\t\trestore_updated patch", 1))

	var lines strings.Builder
	for n := 1; n <= atomicJobItems; n++ {
		fmt.Fprintf(&lines, "{\"id\":%d,\"name\":\"  Renamed-%d  \",\"email\":\"RENAMED-%d@EXAMPLE.COM\"}\n", n, n, n)
	}
	const failing = 540
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + strconv.Itoa(failing+1), Status: 422, Body: htmlError})
	job := startJob(t, g, "PATCH", "/api/widgets", lines.String())
	st := pollJob(t, g, job, time.Minute)
	if outcome, reason := jobReason(t, g, job); st.State != "rolled_back" || outcome != "rolled_back" {
		t.Fatalf("the update job ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	if w := api.Writes(); w.Applied < 2*256 {
		t.Fatalf("the API applied %d writes: the job should have renamed two whole windows before it failed", w.Applied)
	}
	for _, w := range api.Items("/api/widgets") {
		n := fmt.Sprint(w["id"])
		if w["name"] != "w"+n || w["email"] != "w"+n+"@example.com" {
			t.Fatalf("widget %s is %v after the undo, want its name and email as seeded", n, w)
		}
	}

	before := api.Items("/api/widgets")
	api.Inject(passThrough("POST", "/api/widgets", 580))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 422, Body: htmlError, Times: 1})
	lines.Reset()
	for i := range atomicJobItems {
		fmt.Fprintf(&lines, "{\"name\":\"  Made-%d \",\"email\":\" MADE-%d@EXAMPLE.COM\"}\n", i, i)
	}
	job = startJob(t, g, "POST", "/api/widgets", lines.String())
	st = pollJob(t, g, job, time.Minute)
	if outcome, reason := jobReason(t, g, job); st.State != "rolled_back" || outcome != "rolled_back" {
		t.Fatalf("the create job ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	sameState(t, api, "/api/widgets", before)
}
