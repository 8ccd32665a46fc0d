package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// atomicJobsSite is jobsSite with every operation all-or-nothing: a job
// that writes is undone whole when one of its items fails or it is
// cancelled.
const atomicJobsSite = `
	batch {
		atomicity all_or_nothing
		jobs /api/jobs
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

// atomicJobItems is more than two of a job's 256-item windows, so that a
// failure in the third one undoes two whole windows before it.
const atomicJobItems = 600

// jobClient are the headers of a JSON Lines job start by client-a.
var jobClient = []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a"}

// startJob starts a job of the JSON Lines body, failing the test unless
// it is answered 202.
func startJob(t *testing.T, g *gateway, method, path, body string, header ...string) jobAnswer {
	t.Helper()
	r := g.do(t, method, path, body, append(append([]string(nil), jobClient...), header...)...)
	if r.Status != 202 {
		t.Fatalf("start of the %s job: %d %s, want 202", method, r.Status, r.Body)
	}
	return decodeJob(t, r)
}

// jobReason is the reason and outcome the job's status gives.
func jobReason(t *testing.T, g *gateway, job jobAnswer) (outcome, reason string) {
	t.Helper()
	var st struct {
		Outcome string `json:"outcome"`
		Reason  string `json:"reason"`
	}
	r := g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...)
	if err := json.Unmarshal(r.Body, &st); err != nil {
		t.Fatalf("status %d %s: %v", r.Status, r.Body, err)
	}
	return st.Outcome, st.Reason
}

// jobResultLines reads the job's results as JSON Lines, checking that
// they come in request order from item 0.
func jobResultLines(t *testing.T, g *gateway, job jobAnswer) []batchwire.Item {
	t.Helper()
	r := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
	if r.Status != 200 || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-ndjson") {
		t.Fatalf("results: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	var items []batchwire.Item
	for line := range bytes.Lines(r.Body) {
		var it batchwire.Item
		if err := json.Unmarshal(line, &it); err != nil {
			t.Fatalf("result line %d: %v: %s", len(items), err, line)
		}
		if it.Index != len(items) {
			t.Fatalf("result line %d is item %d: results must come in request order", len(items), it.Index)
		}
		items = append(items, it)
	}
	return items
}

// renameLines is a JSON Lines body of PATCHes renaming widgets 1 to n.
func renameLines(n int) string {
	var b strings.Builder
	for id := 1; id <= n; id++ {
		fmt.Fprintf(&b, "{\"id\":%d,\"name\":\"renamed-%d\"}\n", id, id)
	}
	return b.String()
}

// namedLines is a JSON Lines body of n widgets to create, named
// prefix0 to prefix<n-1>.
func namedLines(prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"name\":\"%s%d\"}\n", prefix, i)
	}
	return b.String()
}

// failedLine is the one result line that failed; the test fails unless
// there is exactly one.
func failedLine(t *testing.T, items []batchwire.Item) batchwire.Item {
	t.Helper()
	var failed []batchwire.Item
	for _, it := range items {
		if it.Outcome == "failed" {
			failed = append(failed, it)
		}
	}
	if len(failed) != 1 {
		t.Fatalf("%d result lines failed, want exactly the one the API refused: %+v", len(failed), failed)
	}
	return failed[0]
}

// TestJobsAtomicUpdateRolledBack: an all-or-nothing PATCH job over 600
// widgets whose item 540 (in its third window) the API refuses with an
// HTML 422 ends rolled_back, its reason naming item 540, and every
// widget reads as before the job; its results show item 540 failed and
// every item before it rolled_back, and the whole answer (Accept:
// application/json) says the same.
func TestJobsAtomicUpdateRolledBack(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, atomicJobItems)})
	g := startGateway(t, api, atomicJobsSite)
	const failing = 540 // widget 541, in the window of items 512 to 767
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + strconv.Itoa(failing+1), Status: 422, Body: htmlError})
	before := api.Items("/api/widgets")

	job := startJob(t, g, "PATCH", "/api/widgets", renameLines(atomicJobItems))
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" || !strings.Contains(reason, "item "+strconv.Itoa(failing)+" ") {
		t.Fatalf("job ended %+v, outcome %q, reason %q; want rolled_back, the reason naming item %d", st, outcome, reason, failing)
	}
	sameState(t, api, "/api/widgets", before)
	if w := api.Writes(); w.Applied < 2*256 {
		t.Errorf("the API applied %d writes: the job should have renamed two whole windows before it failed", w.Applied)
	}

	items := jobResultLines(t, g, job)
	if len(items) <= failing {
		t.Fatalf("%d result lines, want at least %d: up to the failed item", len(items), failing+1)
	}
	if it := failedLine(t, items); it.Index != failing || it.Status != 422 {
		t.Errorf("the failed line is %+v, want item %d answered 422", it, failing)
	}
	for _, it := range items[:failing] {
		if it.Outcome != "rolled_back" {
			t.Fatalf("item %d ended %s (%d), want rolled_back: it was sent before item %d failed", it.Index, it.Outcome, it.Status, failing)
		}
	}
	for _, it := range items[failing+1:] {
		if it.Outcome != "rolled_back" && it.Outcome != "not_attempted" {
			t.Errorf("item %d after the failed one ended %s, want rolled_back or not_attempted", it.Index, it.Outcome)
		}
	}

	r := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, append(bearerOf(job.Token), "Accept", "application/json")...)
	if r.Status != 200 || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("the whole answer: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
	var whole batchwire.Response
	if err := json.Unmarshal(r.Body, &whole); err != nil {
		t.Fatal(err)
	}
	if whole.Atomicity != "all_or_nothing" || whole.Outcome != "rolled_back" || len(whole.Items) != atomicJobItems {
		t.Fatalf("the whole answer is %s with %s and %d items, want all_or_nothing rolled_back with %d",
			whole.Atomicity, whole.Outcome, len(whole.Items), atomicJobItems)
	}
	for i, it := range whole.Items {
		if i < len(items) && (it.Index != i || it.Outcome != items[i].Outcome) {
			t.Fatalf("item %d of the whole answer is %d %s, the JSON Lines say %s", i, it.Index, it.Outcome, items[i].Outcome)
		}
		if i >= len(items) && it.Outcome != "not_attempted" {
			t.Fatalf("item %d of the whole answer is %s, past the JSON Lines: want not_attempted", i, it.Outcome)
		}
	}
}

// TestJobsAtomicCreate: an all-or-nothing create job of 600 widgets
// succeeds with each created once; the same job with the API refusing
// one create in its last window ends rolled_back, the API holding
// exactly what it held before it.
func TestJobsAtomicCreate(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, atomicJobsSite)
	seeded := len(api.Items("/api/widgets"))

	job := startJob(t, g, "POST", "/api/widgets", namedLines("made-", atomicJobItems))
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Succeeded != atomicJobItems {
		t.Fatalf("job ended %+v, want succeeded with %d items", st, atomicJobItems)
	}
	made := map[string]int{}
	items := api.Items("/api/widgets")
	for _, w := range items {
		made[fmt.Sprint(w["name"])]++
	}
	if len(items) != seeded+atomicJobItems {
		t.Errorf("the API holds %d widgets, want %d", len(items), seeded+atomicJobItems)
	}
	for i := range atomicJobItems {
		if c := made[fmt.Sprintf("made-%d", i)]; c != 1 {
			t.Fatalf("made-%d was created %d times, want once", i, c)
		}
	}

	// The API refuses the 581st create it receives: one in the window
	// of items 512 on (the job sends a window's items several at a
	// time, so which one is not fixed).
	before := api.Items("/api/widgets")
	api.Inject(passThrough("POST", "/api/widgets", 580))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 422, Body: htmlError, Times: 1})
	job = startJob(t, g, "POST", "/api/widgets", namedLines("again-", atomicJobItems))
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" {
		t.Fatalf("job ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	sameState(t, api, "/api/widgets", before)
	failed := failedLine(t, jobResultLines(t, g, job))
	if failed.Index < 512 || !strings.Contains(reason, "item "+strconv.Itoa(failed.Index)+" ") {
		t.Errorf("item %d failed, reason %q: want an item of the last window, the reason naming it", failed.Index, reason)
	}
}

// TestJobsAtomicCancelled: DELETE of a running all-or-nothing create
// job undoes it: it ends rolled_back and no widget it created is left.
func TestJobsAtomicCancelled(t *testing.T) {
	api := seededAPI()
	// A lease of 3s: the running job sees the cancel within a second.
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+t.TempDir()+"\n\tbatch {\n\t\tlease 3s\n\t}", atomicJobsSite)
	before := api.Items("/api/widgets")
	// Each create takes 50ms: 600 of them, 8 at a time, take near 4s.
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Delay: 50 * time.Millisecond})

	job := startJob(t, g, "POST", "/api/widgets", namedLines("cancelled-", atomicJobItems))
	eventually(t, 30*time.Second, "the job to create 50 widgets", func() bool {
		return len(api.Items("/api/widgets")) >= len(before)+50
	})
	cancel := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...)
	if cancel.Status != 202 {
		t.Fatalf("cancel: %d %s, want 202", cancel.Status, cancel.Body)
	}
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" {
		t.Fatalf("the cancelled job ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	if w := api.Writes(); w.Applied >= 2*atomicJobItems {
		t.Errorf("the API applied %d writes: the cancel came after the job had created every widget, the test proves nothing", w.Applied)
	}
	sameState(t, api, "/api/widgets", before)
	for _, it := range jobResultLines(t, g, job) {
		if it.Outcome != "rolled_back" && it.Outcome != "not_attempted" {
			t.Errorf("item %d of the cancelled job ended %s, want rolled_back or not_attempted", it.Index, it.Outcome)
		}
	}
}

// TestJobsAtomicTooLarge: past max_atomic_job_items an all-or-nothing
// job is refused 413 naming the option, nothing stored or sent; the
// same lines run as a partial job when the client asks for it and the
// site allows the override, and a job at the bound runs all-or-nothing.
func TestJobsAtomicTooLarge(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, strings.Replace(atomicJobsSite, "jobs /api/jobs\n",
		"jobs /api/jobs\n\t\tmax_atomic_job_items 100\n\t\tallow_override\n", 1))

	r := g.do(t, "POST", "/api/widgets", namedLines("big-", 101), jobClient...)
	if r.Status != 413 || !bytes.Contains(r.Body, []byte("max_atomic_job_items")) {
		t.Fatalf("a 101-item all-or-nothing job: %d %s, want 413 naming max_atomic_job_items", r.Status, r.Body)
	}
	if keys := storedJobKeys(t, g.storageDir(t)); len(keys) != 0 {
		t.Errorf("the refused job left keys in storage: %v", keys)
	}
	if reqs := api.Requests(); len(reqs) != 0 {
		t.Errorf("the refused job sent %d requests to the API:%s", len(reqs), describeRequests(reqs))
	}

	partial := startJob(t, g, "POST", "/api/widgets", namedLines("big-", 101), "Prefer", "respond-async, atomicity=partial")
	if st := pollJob(t, g, partial, time.Minute); st.State != "succeeded" || st.Succeeded != 101 {
		t.Errorf("the partial job ended %+v, want succeeded with 101 items", st)
	}
	var atomicity struct {
		Atomicity string `json:"atomicity"`
	}
	_ = json.Unmarshal(g.do(t, "GET", "/api/jobs/"+partial.ID, nil, bearerOf(partial.Token)...).Body, &atomicity)
	if atomicity.Atomicity != "partial" {
		t.Errorf("the job asked partial runs %q", atomicity.Atomicity)
	}

	atBound := startJob(t, g, "POST", "/api/widgets", namedLines("bound-", 100))
	if st := pollJob(t, g, atBound, time.Minute); st.State != "succeeded" || st.Succeeded != 100 {
		t.Errorf("a job of max_atomic_job_items items ended %+v, want succeeded", st)
	}
}

// TestJobsAtomicSingleWriteWaits: a single PATCH of a widget an
// all-or-nothing job renamed in its first window, sent while the job is
// in its third, waits for the job's end (the job holds that widget's
// lock to its end, so that its undo would find its own write): it is
// answered only after the job ended, and its write, the later, stands.
func TestJobsAtomicSingleWriteWaits(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, atomicJobItems)})
	g := startGateway(t, api, strings.Replace(atomicJobsSite, "atomicity all_or_nothing\n",
		"atomicity all_or_nothing\n\t\tbatch_timeout 60s\n", 1))
	// The job's last item waits at the API until the test lets it go.
	held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + strconv.Itoa(atomicJobItems)})
	api.Inject(held)
	defer release()

	job := startJob(t, g, "PATCH", "/api/widgets", renameLines(atomicJobItems))
	eventually(t, 30*time.Second, "the job to reach its last item", func() bool {
		return received(api, "PATCH", "/api/widgets/"+strconv.Itoa(atomicJobItems))
	})

	type answer struct {
		r   response
		err error
		at  time.Time
	}
	single := make(chan answer, 1)
	go func() {
		r, err := g.try("PATCH", "/api/widgets/1", map[string]string{"name": "single"}, "Authorization", "Bearer client-b")
		single <- answer{r, err, time.Now()}
	}()
	select {
	case a := <-single:
		t.Fatalf("the single PATCH was answered (%v %v) while the job, which wrote widget 1, runs", a.r, a.err)
	case <-time.After(time.Second):
	}
	patches := 0
	for _, r := range api.Requests() {
		if r.Method == "PATCH" && r.Path == "/api/widgets/1" {
			patches++
		}
	}
	if patches != 1 {
		t.Errorf("the API received %d PATCHes of widget 1 while the job runs, want the job's one", patches)
	}

	release()
	st := pollJob(t, g, job, time.Minute)
	if st.State != "succeeded" {
		t.Fatalf("job ended %+v, want succeeded", st)
	}
	var ended struct {
		Ended time.Time `json:"ended"`
	}
	_ = json.Unmarshal(g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...).Body, &ended)
	var a answer
	select {
	case a = <-single:
	case <-time.After(30 * time.Second):
		t.Fatal("the single PATCH was not answered within 30s of the job's end")
	}
	if a.err != nil || a.r.Status != 200 {
		t.Fatalf("the single PATCH: %v %v, want 200", a.r, a.err)
	}
	if a.at.Before(ended.Ended) {
		t.Errorf("the single PATCH was answered at %s, before the job ended at %s", a.at, ended.Ended)
	}
	if w, _ := api.Item("/api/widgets", "1"); w["name"] != "single" {
		t.Errorf("widget 1 is %v, want the single PATCH's name: it came after the job's", w)
	}
	if w, _ := api.Item("/api/widgets", "2"); w["name"] != "renamed-2" {
		t.Errorf("widget 2 is %v, want the job's name", w)
	}
}

// TestJobsAtomicQueuedCancelled: an all-or-nothing create job queued
// behind max_jobs, its first item created at its start, and cancelled
// while it waits, is undone when an instance takes it from the queue:
// it ends rolled_back, its first widget deleted and no other created.
// (Its claim used to miss the cancel mark until the lease's first
// renewal, and a short job ran to succeeded.)
func TestJobsAtomicQueuedCancelled(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, strings.Replace(atomicJobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tmax_jobs 1\n", 1))
	// The first job holds the one place until the test lets its last
	// item go.
	held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/20"})
	api.Inject(held)
	defer release()
	first := startJob(t, g, "PATCH", "/api/widgets", renameLines(20))
	eventually(t, 30*time.Second, "the first job to reach its last item", func() bool {
		return received(api, "PATCH", "/api/widgets/20")
	})
	before := api.Items("/api/widgets")

	r := g.do(t, "POST", "/api/widgets", namedLines("queued-", 50),
		"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-b")
	if r.Status != 202 {
		t.Fatalf("start of the second job: %d %s, want 202", r.Status, r.Body)
	}
	second := decodeJob(t, r)
	if second.State != "queued" || len(api.Items("/api/widgets")) != len(before)+1 {
		t.Fatalf("the second job is %s with %d widgets made; want queued, its first item made at its start",
			second.State, len(api.Items("/api/widgets"))-len(before))
	}
	if c := g.do(t, "DELETE", "/api/jobs/"+second.ID, nil, bearerOf(second.Token)...); c.Status != 202 {
		t.Fatalf("cancel of the queued job: %d %s, want 202", c.Status, c.Body)
	}
	release()
	if st := pollJob(t, g, first, time.Minute); st.State != "succeeded" {
		t.Fatalf("the first job ended %+v, want succeeded", st)
	}
	st := pollJob(t, g, second, time.Minute)
	outcome, reason := jobReason(t, g, second)
	if st.State != "rolled_back" || outcome != "rolled_back" {
		t.Errorf("the queued job cancelled ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	after := api.Items("/api/widgets")
	for id, w := range after {
		if name := fmt.Sprint(w["name"]); strings.HasPrefix(name, "queued-") || name != "renamed-"+id {
			t.Errorf("widget %s is %v after both jobs: want the first job's rename, nothing of the cancelled one", id, w)
		}
	}
	if len(after) != len(before) {
		t.Errorf("the API holds %d widgets, want the %d it held before the cancelled job", len(after), len(before))
	}
	posts := 0
	for _, w := range api.AppliedWrites() {
		if w.Method == "POST" {
			posts++
		}
	}
	if posts != 1 {
		t.Errorf("the API created %d widgets, want the one of the job's start: nothing after the cancel", posts)
	}
}

// TestJobsAtomicTimedOut: an all-or-nothing create job still running at
// its job_timeout is undone: it ends rolled_back, nothing it created
// left.
func TestJobsAtomicTimedOut(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, strings.Replace(atomicJobsSite, "jobs /api/jobs\n",
		"jobs /api/jobs\n\t\titem_timeout 1s\n\t\tjob_timeout 2s\n", 1))
	before := api.Items("/api/widgets")
	// 600 creates of 50ms, 8 at a time, take near 4s: past job_timeout.
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Delay: 50 * time.Millisecond})
	job := startJob(t, g, "POST", "/api/widgets", namedLines("late-", atomicJobItems))
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" {
		t.Fatalf("the job past job_timeout ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	if w := api.Writes(); w.Applied == 0 || w.Applied >= 2*atomicJobItems {
		t.Errorf("the API applied %d writes: want some creates, and their deletes, not the whole job", w.Applied)
	}
	sameState(t, api, "/api/widgets", before)
}

// TestJobsAtomicFirstItemFails: the API refusing the item a job sends at
// its start (not an authentication's refusal) makes a job all the same,
// which ends rolled_back with nothing more sent.
func TestJobsAtomicFirstItemFails(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, atomicJobsSite)
	before := api.Items("/api/widgets")
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 422, Body: htmlError, Times: 1})
	job := startJob(t, g, "POST", "/api/widgets", namedLines("first-", 300))
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" || !strings.Contains(reason, "item 0 ") {
		t.Fatalf("job ended %+v, outcome %q, reason %q; want rolled_back, naming item 0", st, outcome, reason)
	}
	if reqs := writes(api.Requests()); len(reqs) != 1 {
		t.Errorf("the API received %d writes, want the refused first one alone:%s", len(reqs), describeRequests(reqs))
	}
	sameState(t, api, "/api/widgets", before)
}

// TestJobsAtomicPreflightRefused: an all-or-nothing update naming, in
// its third window, a widget the API does not have fails that window's
// preflight read: the two windows before it are undone, the widget's
// result naming the read, and no write of that window is sent.
func TestJobsAtomicPreflightRefused(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, atomicJobItems)})
	g := startGateway(t, api, atomicJobsSite)
	before := api.Items("/api/widgets")
	const missing = 549 // item 549 names widget 9999
	body := strings.Replace(renameLines(atomicJobItems), `{"id":550,`, `{"id":9999,`, 1)
	job := startJob(t, g, "PATCH", "/api/widgets", body)
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" || !strings.Contains(reason, "item 549 ") || !strings.Contains(reason, "GET /api/widgets/9999") {
		t.Fatalf("job ended %+v, outcome %q, reason %q; want rolled_back, naming item %d and its read", st, outcome, reason, missing)
	}
	sameState(t, api, "/api/widgets", before)
	for _, r := range writes(api.Requests()) {
		if id, _ := strconv.Atoi(strings.TrimPrefix(r.Path, "/api/widgets/")); id > 512 && r.Method == "PATCH" && !bytes.Contains(r.Body, []byte(`"w`)) {
			t.Errorf("%s %s %s was sent: the third window's preflight failed before any of its writes", r.Method, r.Path, r.Body)
		}
	}
}

// TestJobsAtomicHandedOverKeepsItsLocks: a reload hands a running
// all-or-nothing update over (its locks let go with the old config's
// run); the new config's run takes again the locks of what the job
// wrote before it carries the job on: a single PATCH of a widget the
// job renamed before the reload, sent while the job is in its last
// window, waits for the job's end. Every widget is renamed once.
func TestJobsAtomicHandedOverKeepsItsLocks(t *testing.T) {
	const n = 800
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, n), WriteDelay: 2 * time.Millisecond})
	site := strings.Replace(atomicJobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tconcurrency 4\n", 1)
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+t.TempDir(), site)
	held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + strconv.Itoa(n)})
	api.Inject(held)
	defer release()

	job := startJob(t, g, "PATCH", "/api/widgets", renameLines(n))
	eventually(t, 30*time.Second, "the job to rename 100 widgets", func() bool { return jobStatus(t, g, job).Done >= 100 })
	g.reload(t, site+"\n\theader X-Reloaded yes\n")
	if mid := jobStatus(t, g, job); mid.Done >= n-256 {
		t.Fatalf("the job was in its last window (%d done) at the reload: the test needs it earlier", mid.Done)
	}
	eventually(t, 30*time.Second, "the job to reach its last item", func() bool {
		return received(api, "PATCH", "/api/widgets/"+strconv.Itoa(n))
	})
	var takeovers struct {
		Takeovers int `json:"takeovers"`
	}
	_ = json.Unmarshal(g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...).Body, &takeovers)
	if takeovers.Takeovers != 1 {
		t.Fatalf("takeovers %d, want 1: the new config carries the job on", takeovers.Takeovers)
	}

	single := make(chan response, 1)
	go func() {
		r, err := g.try("PATCH", "/api/widgets/1", map[string]string{"name": "single"}, "Authorization", "Bearer client-b")
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		single <- r
	}()
	select {
	case r := <-single:
		t.Fatalf("the single PATCH of widget 1 was answered (%v) while the carried-on job runs", r)
	case <-time.After(time.Second):
	}
	release()
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Succeeded != n {
		t.Fatalf("job ended %+v, want succeeded with %d items", st, n)
	}
	select {
	case r := <-single:
		if r.Status != 200 {
			t.Errorf("the single PATCH: %v, want 200", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the single PATCH was not answered within 30s of the job's end")
	}
	patched := map[string]int{}
	for _, w := range api.AppliedWrites() {
		if w.Method == "PATCH" {
			patched[w.Path]++
		}
	}
	for id := 2; id <= n; id++ {
		if c := patched["/api/widgets/"+strconv.Itoa(id)]; c != 1 {
			t.Fatalf("widget %d was patched %d times, want once", id, c)
		}
	}
	if w, _ := api.Item("/api/widgets", "1"); w["name"] != "single" || patched["/api/widgets/1"] != 2 {
		t.Errorf("widget 1 is %v after %d PATCHes, want the single PATCH's name, after the job's", w, patched["/api/widgets/1"])
	}
}

// TestJobsAtomicRollbackFailed: an all-or-nothing create job whose undo
// of one widget the API refuses ends rollback_failed, its reason saying
// how many items could not be undone: that widget alone is left, its
// result rollback_failed, every other widget the job created deleted.
func TestJobsAtomicRollbackFailed(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, atomicJobsSite)
	before := api.Items("/api/widgets")
	api.Inject(passThrough("POST", "/api/widgets", 290))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 422, Body: htmlError, Times: 1})
	// The API gives created widgets ids from 1000 on: the sixth stays.
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/1005", Status: 422, Body: htmlError})
	job := startJob(t, g, "POST", "/api/widgets", namedLines("kept-", 300))
	st := pollJob(t, g, job, time.Minute)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rollback_failed" || outcome != "rollback_failed" || !strings.Contains(reason, "1 of its items could not be undone") {
		t.Fatalf("job ended %+v, outcome %q, reason %q; want rollback_failed, one item left", st, outcome, reason)
	}
	after := api.Items("/api/widgets")
	left, ok := after["1005"]
	if !ok || len(after) != len(before)+1 {
		t.Fatalf("the API holds %d widgets (1005: %v), want the %d before and widget 1005, whose undo it refused", len(after), left, len(before))
	}
	delete(after, "1005")
	for id, w := range after {
		if _, was := before[id]; !was {
			t.Errorf("widget %s (%v) the job created is left, want it deleted", id, w)
		}
	}
	for _, it := range jobResultLines(t, g, job) {
		if (it.ID == "1005") != (it.Outcome == "rollback_failed") {
			t.Errorf("item %d (widget %s) ended %s: want rollback_failed for widget 1005 alone", it.Index, it.ID, it.Outcome)
		}
	}
}

// TestJobsAtomicPausedCancelled: an all-or-nothing job paused by a 401
// and then cancelled is undone by a scan that the cancel asks for at
// once (nobody runs a paused job): it ends rolled_back, nothing it
// created left.
func TestJobsAtomicPausedCancelled(t *testing.T) {
	api := seededAPI()
	// No scan comes by itself within the test: the cancel's must.
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+t.TempDir()+"\n\tbatch {\n\t\trecovery_interval 1h\n\t}", atomicJobsSite)
	before := api.Items("/api/widgets")
	api.Inject(passThrough("POST", "/api/widgets", 300))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 401, Body: htmlError, Times: 1})
	job := startJob(t, g, "POST", "/api/widgets", namedLines("paused-", atomicJobItems))
	st := pollJob(t, g, job, time.Minute)
	if _, reason := jobReason(t, g, job); st.State != "paused" || !strings.Contains(reason, " 401 ") {
		t.Fatalf("after the 401: %+v, reason %q; want paused", st, reason)
	}
	if made := len(api.Items("/api/widgets")) - len(before); made < 300 {
		t.Fatalf("the paused job made %d widgets, want at least 300: the test undoes them", made)
	}
	if c := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); c.Status != 202 {
		t.Fatalf("cancel of the paused job: %d %s, want 202", c.Status, c.Body)
	}
	st = pollJob(t, g, job, 30*time.Second)
	outcome, reason := jobReason(t, g, job)
	if st.State != "rolled_back" || outcome != "rolled_back" {
		t.Fatalf("the paused job cancelled ended %+v, outcome %q, reason %q; want rolled_back", st, outcome, reason)
	}
	sameState(t, api, "/api/widgets", before)
}
