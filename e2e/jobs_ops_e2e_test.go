package e2e

// The operator's surface of bulk jobs (docs/jobs.md, "Operations"): the
// admin API, the metrics, the event and the log lines of a job's life.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// startJobsAdminGateway serves jobsSite with the admin endpoint on, the
// storage in dir, a lease of 3s (a cancel is seen within a second), the
// jobs counted every 100ms, and batch.job.finished handled by the tap
// "jobs".
func startJobsAdminGateway(t *testing.T, api *legacyapi.API, dir string) *gateway {
	t.Helper()
	g := &gateway{API: api, client: gatewayClient(t, 60*time.Second), addr: freeAddr(t), upstream: newUpstream(t, api),
		storage: "storage file_system " + dir, admin: freeAddr(t),
		globals: "\tbatch {\n\t\tlease 3s\n\t\trecovery_interval 100ms\n\t}\n\tevents {\n\t\ton batch.job.finished batchtest_events jobs\n\t}"}
	g.start(t, jobsSite)
	return g
}

// listJobs reads GET /batch/jobs with query: the ids and states, newest
// first, and the raw answer.
func listJobs(t *testing.T, g *gateway, query string) ([]jobAnswer, string) {
	t.Helper()
	r := g.adminDo(t, "GET", "/batch/jobs"+query, nil)
	var list []jobAnswer
	if r.Status != 200 || json.Unmarshal(r.Body, &list) != nil || list == nil {
		t.Fatalf("GET /batch/jobs%s: %s, want a JSON array", query, r)
	}
	return list, string(r.Body)
}

func jobIDs(list []jobAnswer) string {
	ids := make([]string, len(list))
	for i, j := range list {
		ids[i] = j.ID
	}
	return strings.Join(ids, ",")
}

// awaitJobEvent waits for the batch.job.finished event of job id.
func awaitJobEvent(t *testing.T, id string) heard {
	t.Helper()
	var got heard
	eventually(t, 5*time.Second, "batch.job.finished of job "+id, func() bool {
		heardEvents.mu.Lock()
		defer heardEvents.mu.Unlock()
		for _, e := range heardEvents.all {
			if e.Event == "batch.job.finished" && e.Data["id"] == id {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// TestJobsOperatedThroughAdmin: an operator lists the jobs newest first,
// by state and a page at a time, reads one, and cancels a running one
// (202, and it ends cancelled) but not an ended one (409), all without
// a token and never shown one; the jobs gauge counts them by state, the
// items counter counts what they did; each job's end is an event and a
// log line with its counts, and no line or event holds a token.
func TestJobsOperatedThroughAdmin(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 3), WriteDelay: 20 * time.Millisecond})
	g := startJobsAdminGateway(t, api, t.TempDir())
	itemsBefore := metricValue(t, "job_items_total", "outcome", "succeeded")
	start := func(n int, client string) jobAnswer {
		t.Helper()
		r := g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer "+client)
		if r.Status != 202 {
			t.Fatalf("start: %d %s", r.Status, r.Body)
		}
		return decodeJob(t, r)
	}

	if list, _ := listJobs(t, g, ""); len(list) != 0 {
		t.Fatalf("jobs before any: %+v", list)
	}
	short := start(20, "client-a")
	if st := pollJob(t, g, short, time.Minute); st.State != "succeeded" {
		t.Fatalf("the short job ended %s", st.State)
	}
	long := start(2000, "client-b")
	eventually(t, 10*time.Second, "the long job running", func() bool {
		list, _ := listJobs(t, g, "?state=running")
		return jobIDs(list) == long.ID
	})

	list, raw := listJobs(t, g, "")
	if jobIDs(list) != long.ID+","+short.ID || list[1].State != "succeeded" || list[1].Done != 20 {
		t.Errorf("listed %+v, want the long job then the short one", list)
	}
	if strings.Contains(raw, short.Token) || strings.Contains(raw, long.Token) || strings.Contains(raw, `"token"`) {
		t.Errorf("a listing shows a token: %s", raw)
	}
	if list, _ := listJobs(t, g, "?state=succeeded"); jobIDs(list) != short.ID {
		t.Errorf("succeeded jobs: %+v", list)
	}
	if list, _ := listJobs(t, g, "?limit=1"); jobIDs(list) != long.ID {
		t.Errorf("the first page of 1: %+v", list)
	}
	if list, _ := listJobs(t, g, "?limit=1&after="+long.ID); jobIDs(list) != short.ID {
		t.Errorf("the page after the long job: %+v", list)
	}
	r := g.adminDo(t, "GET", "/batch/jobs/"+short.ID, nil)
	if st := decodeJob(t, r); r.Status != 200 || st.ID != short.ID || st.State != "succeeded" || st.Token != "" {
		t.Errorf("GET a job: %s", r)
	}

	if r := g.adminDo(t, "POST", "/batch/jobs/"+short.ID+"/cancel", nil); r.Status != 409 || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("cancel of an ended job: %s, want a 409 problem", r)
	}
	r = g.adminDo(t, "POST", "/batch/jobs/"+long.ID+"/cancel", nil)
	if st := decodeJob(t, r); r.Status != 202 || (st.State != "cancelling" && st.State != "cancelled") {
		t.Fatalf("cancel of a running job: %s, want 202 cancelling", r)
	}
	ended := pollJob(t, g, long, time.Minute)
	if ended.State != "cancelled" || ended.Done >= 2000 {
		t.Fatalf("the cancelled job ended %+v", ended)
	}

	eventually(t, 10*time.Second, "the jobs gauge", func() bool {
		return metricValue(t, "jobs", "state", "succeeded") == 1 && metricValue(t, "jobs", "state", "cancelled") == 1 &&
			metricValue(t, "jobs", "state", "running") == 0
	})
	eventually(t, 10*time.Second, "the job items counted", func() bool {
		return metricValue(t, "job_items_total", "outcome", "succeeded")-itemsBefore == float64(20+ended.Succeeded)
	})

	e := awaitJobEvent(t, short.ID)
	if e.Data["state"] != "succeeded" || e.Data["outcome"] != "succeeded" || e.Data["items"] != 20.0 || e.Data["done"] != 20.0 ||
		e.Data["succeeded"] != 20.0 || e.Data["op"] != "create" || e.Data["resource"] != "/api/widgets" || e.Data["takeovers"] != 0.0 {
		t.Errorf("finished %+v", e.Data)
	}
	if c := awaitJobEvent(t, long.ID); c.Data["state"] != "cancelled" || c.Data["done"] != float64(ended.Done) {
		t.Errorf("finished %+v", c.Data)
	}

	var endLine map[string]any
	// A job's run is the batch app's (the handler only starts it).
	for _, l := range append(testLogs.entries("http.handlers.batch"), testLogs.entries("batch")...) {
		if l["job"] == short.ID && l["msg"] == "bulk job ended" {
			endLine = l
		}
		if b := fmt.Sprint(l); strings.Contains(b, short.Token) || strings.Contains(b, long.Token) || strings.Contains(b, "job-1") {
			t.Errorf("a log line holds a token or a body: %v", l)
		}
	}
	if endLine == nil || endLine["outcome"] != "succeeded" || endLine["state"] != "succeeded" || endLine["done"] != 20.0 ||
		endLine["succeeded"] != 20.0 || endLine["failed"] != 0.0 {
		t.Errorf("the end line %v", endLine)
	}
	heardEvents.mu.Lock()
	for _, e := range heardEvents.all {
		if b := fmt.Sprint(e.Data); strings.Contains(b, short.Token) || strings.Contains(b, long.Token) {
			t.Errorf("an event holds a token: %v", e.Data)
		}
	}
	heardEvents.mu.Unlock()
	var audit map[string]any
	for _, l := range testLogs.entries("batch") {
		if l["job"] == long.ID && l["msg"] == "bulk job cancelled by an operator" {
			audit = l
		}
	}
	if audit == nil || !strings.Contains(fmt.Sprint(audit["caller"]), "127.0.0.1") {
		t.Errorf("the operator's cancel line %v", audit)
	}
}

// TestJobsAdminErrors: unknown ids and actions are 404, a bad query or a
// wrong method is refused, all as problems.
func TestJobsAdminErrors(t *testing.T) {
	g := startJobsAdminGateway(t, seededAPI(), t.TempDir())
	unknown := "0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/batch/jobs/" + unknown, 404},
		{"GET", "/batch/jobs/..%2f..%2fetc", 404},
		{"POST", "/batch/jobs/" + unknown + "/cancel", 404},
		{"POST", "/batch/jobs/" + unknown + "/retry", 404},
		{"GET", "/batch/jobs/" + unknown + "/cancel", 405},
		{"DELETE", "/batch/jobs/" + unknown, 405},
		{"GET", "/batch/jobs?state=done", 400},
		{"GET", "/batch/jobs?limit=0", 400},
		{"GET", "/batch/jobs?after=nope", 400},
		{"GET", "/batch/jobs?after=" + unknown, 400},
		{"POST", "/batch/jobs", 405},
	} {
		if r := g.adminDo(t, c.method, c.path, nil); r.Status != c.status || r.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %s, want a %d problem", c.method, c.path, r, c.status)
		}
	}
}

// TestJobsCLI runs caddy batch jobs, job and cancel against a running
// Caddy: the table and --json, a watch of an ended job (one plain line,
// exit 0 for a job that succeeded), and a cancel refused for an ended
// job (exit 1, naming the 409).
func TestJobsCLI(t *testing.T) {
	bin := caddyBinary(t)
	g := startJobsAdminGateway(t, seededAPI(), t.TempDir())
	if out, code := runCLI(t, bin, g, "batch", "jobs"); code != 0 || !strings.Contains(out, "no jobs") {
		t.Errorf("jobs with none: exit %d\n%s", code, out)
	}
	r := g.do(t, "POST", "/api/widgets", widgetLines(5), "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if r.Status != 202 {
		t.Fatalf("start: %d %s", r.Status, r.Body)
	}
	job := decodeJob(t, r)
	pollJob(t, g, job, time.Minute)

	if out, code := runCLI(t, bin, g, "batch", "jobs"); code != 0 || !strings.Contains(out, job.ID) || !strings.Contains(out, "5/5") {
		t.Errorf("jobs: exit %d\n%s", code, out)
	}
	out, code := runCLI(t, bin, g, "batch", "jobs", "--json", "--state", "succeeded")
	var list []jobAnswer
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || jobIDs(list) != job.ID {
		t.Errorf("jobs --json: exit %d\n%s", code, out)
	}
	if out, code := runCLI(t, bin, g, "batch", "job", job.ID); code != 0 || !strings.Contains(out, "5 done of 5") {
		t.Errorf("job: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, bin, g, "batch", "job", job.ID, "--watch")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 1 || !strings.HasSuffix(lines[0], "succeeded 5/5 done, 5 succeeded, 0 failed, ended: outcome succeeded") {
		t.Errorf("job --watch of an ended job: exit %d\n%s", code, out)
	}
	if out, code := runCLI(t, bin, g, "batch", "cancel", job.ID); code != 1 || !strings.Contains(out, "409") {
		t.Errorf("cancel of an ended job: exit %d\n%s", code, out)
	}
}
