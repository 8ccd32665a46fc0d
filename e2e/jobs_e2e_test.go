package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// jobsSite serves /api/widgets with partial creates, its bulk jobs'
// monitors under /api/jobs.
const jobsSite = `
	batch {
		atomicity partial
		jobs /api/jobs
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

// widgetLines is a JSON Lines body of n widgets to create, named
// job-0 to job-<n-1>.
func widgetLines(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"name\":\"job-%d\"}\n", i)
	}
	return b.String()
}

// jobAnswer is what a job's start and status answer.
type jobAnswer struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Items     int    `json:"items"`
	Done      int    `json:"done"`
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"`
	Results   string `json:"results"`
	Token     string `json:"token"`
}

func decodeJob(t *testing.T, r response) jobAnswer {
	t.Helper()
	var j jobAnswer
	if err := json.Unmarshal(r.Body, &j); err != nil {
		t.Fatalf("answer %d %s: %v", r.Status, r.Body, err)
	}
	return j
}

// bearerOf is the header pair of a job's token.
func bearerOf(token string) []string { return []string{"Authorization", "Bearer " + token} }

// storedJobKeys lists every key of the jobs' storage layout a file
// system storage in dir holds: a job's folder, and its index entries.
func storedJobKeys(t *testing.T, dir string) []string {
	t.Helper()
	root := filepath.Join(dir, "batch", "v1")
	dirs, _ := filepath.Glob(filepath.Join(root, "job*"))
	var keys []string
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				keys = append(keys, strings.TrimPrefix(path, root+string(filepath.Separator)))
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestJobsPartialCreate runs a 2,000-line JSON Lines create as a bulk
// job: answered 202 with its token, polled to its end, its results in
// request order, and the legacy API holding each widget once.
func TestJobsPartialCreate(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsSite)
	before := len(api.Items("/api/widgets"))
	const n = 2000

	start := g.do(t, "POST", "/api/widgets", widgetLines(n),
		"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if start.Status != 202 {
		t.Fatalf("start: %d %s, want 202", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	if job.Token == "" || job.ID == "" || job.Items != n {
		t.Fatalf("start answered %s, want the job of %d items with its token", start.Body, n)
	}
	if loc := start.Header.Get("Location"); loc != "/api/jobs/"+job.ID {
		t.Errorf("Location %q, want /api/jobs/%s", loc, job.ID)
	}
	if start.Header.Get("Preference-Applied") != "respond-async" || start.Header.Get("Retry-After") != "5" || start.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("headers %v, want Preference-Applied: respond-async, Retry-After: 5 and Cache-Control: no-store", start.Header)
	}
	if strings.Contains(fmt.Sprint(start.Header), job.Token) {
		t.Error("the token is in a header of the start's answer: only its body may carry it")
	}

	status := pollJob(t, g, job, 2*time.Minute)
	if status.State != "succeeded" || status.Done != n || status.Succeeded != n {
		t.Fatalf("job ended %+v, want succeeded with %d items done", status, n)
	}

	results := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
	if results.Status != 200 || !strings.HasPrefix(results.Header.Get("Content-Type"), "application/x-ndjson") {
		t.Fatalf("results: %d %s", results.Status, results.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(bytes.NewReader(results.Body))
	sc.Buffer(nil, 1<<20)
	lines := 0
	for sc.Scan() {
		var it struct {
			Index   int    `json:"index"`
			Status  int    `json:"status"`
			Outcome string `json:"outcome"`
			ID      string `json:"id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &it); err != nil {
			t.Fatalf("result line %d: %v: %s", lines, err, sc.Bytes())
		}
		if it.Index != lines || it.Status != 201 || it.Outcome != "succeeded" || it.ID == "" {
			t.Fatalf("result line %d: %s, want item %d created", lines, sc.Bytes(), lines)
		}
		lines++
	}
	if lines != n {
		t.Errorf("%d result lines, want %d", lines, n)
	}

	items := api.Items("/api/widgets")
	if len(items) != before+n {
		t.Errorf("the legacy API holds %d widgets, want %d", len(items), before+n)
	}
	names := map[string]int{}
	for _, it := range items {
		if name, _ := it["name"].(string); strings.HasPrefix(name, "job-") {
			names[name]++
		}
	}
	for i := range n {
		if c := names[fmt.Sprintf("job-%d", i)]; c != 1 {
			t.Fatalf("widget job-%d was created %d times, want once", i, c)
		}
	}

	t.Run("a wrong or missing token is 404, as an unknown job", func(t *testing.T) {
		for _, header := range [][]string{bearerOf("not-the-token"), nil, bearerOf(job.Token + "x")} {
			for _, path := range []string{"/api/jobs/" + job.ID, "/api/jobs/" + job.ID + "/results"} {
				if r := g.do(t, "GET", path, nil, header...); r.Status != 404 || bytes.Contains(r.Body, []byte(`"state"`)) {
					t.Errorf("GET %s with %v: %d %s, want 404", path, header, r.Status, r.Body)
				}
			}
			if r := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, header...); r.Status != 404 {
				t.Errorf("DELETE with %v: %d, want 404", header, r.Status)
			}
		}
		if r := g.do(t, "GET", "/api/jobs/0123456789abcdef0123456789abcdef", nil, bearerOf(job.Token)...); r.Status != 404 {
			t.Errorf("an unknown id: %d, want 404", r.Status)
		}
		if r := g.do(t, "PUT", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); r.Status != 405 || r.Header.Get("Allow") != "DELETE, GET" {
			t.Errorf("PUT: %d Allow %q, want 405 with DELETE, GET", r.Status, r.Header.Get("Allow"))
		}
	})

	t.Run("DELETE of the ended job removes it", func(t *testing.T) {
		if r := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); r.Status != 204 {
			t.Fatalf("DELETE: %d %s, want 204", r.Status, r.Body)
		}
		if r := g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); r.Status != 404 {
			t.Errorf("GET after DELETE: %d, want 404", r.Status)
		}
	})
}

// pollJob reads the job's status until it ends, or fails the test past
// within.
func pollJob(t *testing.T, g *gateway, job jobAnswer, within time.Duration) jobAnswer {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r := g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...)
		if r.Status != 200 {
			for _, e := range testLogs.entries("http.handlers.batch") {
				if e["level"] == "error" {
					t.Logf("the handler logged %v", e)
				}
			}
			t.Fatalf("status: %d %s", r.Status, r.Body)
		}
		st := decodeJob(t, r)
		switch st.State {
		case "queued", "running", "cancelling":
			if r.Header.Get("Retry-After") != "5" {
				t.Errorf("a running job's status has Retry-After %q, want 5", r.Header.Get("Retry-After"))
			}
		default:
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job still %s (%d of %d done) after %s", st.State, st.Done, st.Items, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestJobsRefusedStarts: a start that cannot be a job is refused before
// anything is stored or sent.
func TestJobsRefusedStarts(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsSite)
	before := len(api.Items("/api/widgets"))

	t.Run("anonymous: 403", func(t *testing.T) {
		r := g.do(t, "POST", "/api/widgets", widgetLines(3), "Content-Type", "application/x-ndjson", "Prefer", "respond-async")
		if r.Status != 403 || !bytes.Contains(r.Body, []byte("job-needs-identity")) {
			t.Errorf("anonymous start: %d %s, want 403 job-needs-identity", r.Status, r.Body)
		}
	})

	t.Run("a bad line: 400 naming it", func(t *testing.T) {
		body := widgetLines(5) + "{\"name\":\n" + widgetLines(2)
		r := g.do(t, "POST", "/api/widgets", body, "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
		if r.Status != 400 || !bytes.Contains(r.Body, []byte("line 6")) {
			t.Errorf("a bad sixth line: %d %s, want 400 naming line 6", r.Status, r.Body)
		}
	})

	if keys := storedJobKeys(t, g.storageDir(t)); len(keys) != 0 {
		t.Errorf("refused starts left keys in storage: %v", keys)
	}
	if n := len(api.Items("/api/widgets")); n != before {
		t.Errorf("the legacy API holds %d widgets, want %d: a refused start sent nothing", n, before)
	}
	if w := api.Writes(); w.Applied != 0 {
		t.Errorf("the legacy API applied %d writes, want none", w.Applied)
	}
}

// TestJobsOffRunsSynchronously: without jobs, Prefer: respond-async is
// ignored and the batch runs as it would without it.
func TestJobsOffRunsSynchronously(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, strings.Replace(jobsSite, "jobs /api/jobs\n", "", 1))
	r := g.do(t, "POST", "/api/widgets", []map[string]string{{"name": "sync-a"}, {"name": "sync-b"}},
		"Prefer", "respond-async", "Authorization", "Bearer client-a")
	b := checkEnvelope(t, r, 201, "succeeded")
	if b.Succeeded != 2 || r.Header.Get("Preference-Applied") != "" {
		t.Errorf("answer %d %s (Preference-Applied %q), want the synchronous 201 of 2 items, no preference applied",
			r.Status, r.Body, r.Header.Get("Preference-Applied"))
	}
}

// TestJobsCancelAndQuota: a client past max_jobs_per_client is refused
// 429 with nothing stored; DELETE of its running job cancels it, which
// ends cancelled with what was done standing, and frees the quota.
func TestJobsCancelAndQuota(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 3), WriteDelay: 20 * time.Millisecond})
	dir := t.TempDir()
	// A lease of 3s: the running job sees the cancel within a second.
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+dir+"\n\tbatch {\n\t\tlease 3s\n\t}",
		strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tmax_jobs_per_client 1\n", 1))
	client := []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a"}
	const n = 2000

	start := g.do(t, "POST", "/api/widgets", widgetLines(n), client...)
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	// The running job writes keys of its own meanwhile: count the others.
	othersThan := func(id string) int {
		n := 0
		for _, k := range storedJobKeys(t, dir) {
			if !strings.Contains(k, id) {
				n++
			}
		}
		return n
	}
	keys := othersThan(job.ID)

	again := g.do(t, "POST", "/api/widgets", widgetLines(3), client...)
	if again.Status != 429 || again.Header.Get("Retry-After") != "60" || !bytes.Contains(again.Body, []byte("max_jobs_per_client")) {
		t.Errorf("a second job of the client: %d Retry-After %q %s, want 429 naming max_jobs_per_client, Retry-After 60",
			again.Status, again.Header.Get("Retry-After"), again.Body)
	}
	if now := othersThan(job.ID); now > keys {
		t.Errorf("the refused start stored %d keys", now-keys)
	}

	cancel := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...)
	if cancel.Status != 202 {
		t.Fatalf("cancel: %d %s, want 202", cancel.Status, cancel.Body)
	}
	if st := decodeJob(t, cancel); st.State != "cancelling" && st.State != "cancelled" {
		t.Errorf("cancel answered state %s, want cancelling", st.State)
	}
	status := pollJob(t, g, job, time.Minute)
	if status.State != "cancelled" || status.Done >= n {
		t.Fatalf("job ended %+v, want cancelled before its end", status)
	}
	if made := len(api.Items("/api/widgets")) - 3; made != status.Succeeded {
		t.Errorf("the legacy API made %d widgets, the job says %d succeeded", made, status.Succeeded)
	}

	// The quota is freed a moment after the status shows the end: the
	// end is stored first, then the job's entries are removed.
	next := g.do(t, "POST", "/api/widgets", widgetLines(3), client...)
	for tries := 0; next.Status == 429 && tries < 20; tries++ {
		time.Sleep(100 * time.Millisecond)
		next = g.do(t, "POST", "/api/widgets", widgetLines(3), client...)
	}
	if next.Status != 202 {
		t.Fatalf("a job after the cancelled one ended: %d %s, want 202", next.Status, next.Body)
	}
	if st := pollJob(t, g, decodeJob(t, next), time.Minute); st.State != "succeeded" {
		t.Errorf("the next job ended %s, want succeeded", st.State)
	}
}

// TestJobsSweptPastTTL: an ended job is answered 404 once past job_ttl,
// and the app's sweep deletes every key of it.
func TestJobsSweptPastTTL(t *testing.T) {
	api := seededAPI()
	dir := t.TempDir()
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+dir+"\n\tbatch {\n\t\tsweep_interval 100ms\n\t}",
		strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tjob_ttl 1s\n", 1))
	start := g.do(t, "POST", "/api/widgets", widgetLines(10),
		"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" {
		t.Fatalf("job ended %s, want succeeded", st.State)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(storedJobKeys(t, dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("30s after its job_ttl of 1s the job is still in storage: %v", storedJobKeys(t, dir))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); r.Status != 404 {
		t.Errorf("a swept job: %d, want 404", r.Status)
	}
}

// TestJobsUpdateGetDelete: an array update, and a GET and a DELETE whose
// ids are in the query, run as jobs; their results name the items in
// request order, and the legacy API holds what they did.
func TestJobsUpdateGetDelete(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsSite)
	client := []string{"Prefer", "respond-async", "Authorization", "Bearer client-a"}
	run := func(method, path string, body any, want int) []map[string]any {
		t.Helper()
		start := g.do(t, method, path, body, client...)
		if start.Status != 202 {
			t.Fatalf("%s %s: %d %s, want 202", method, path, start.Status, start.Body)
		}
		job := decodeJob(t, start)
		if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Items != want {
			t.Fatalf("%s %s ended %+v, want %d items succeeded", method, path, st, want)
		}
		r := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
		var lines []map[string]any
		for line := range bytes.Lines(r.Body) {
			var it map[string]any
			if err := json.Unmarshal(line, &it); err != nil {
				t.Fatalf("result %s: %v", line, err)
			}
			lines = append(lines, it)
		}
		return lines
	}

	var updates []map[string]any
	for id := 1; id <= 20; id++ {
		updates = append(updates, map[string]any{"id": id, "name": fmt.Sprintf("renamed-%d", id)})
	}
	for i, it := range run("PATCH", "/api/widgets", updates, 20) {
		if it["id"] != fmt.Sprint(i+1) || it["status"] != float64(200) {
			t.Errorf("update result %d: %v, want widget %d updated", i, it, i+1)
		}
	}
	for id := 1; id <= 20; id++ {
		if rec, _ := api.Item("/api/widgets", fmt.Sprint(id)); rec["name"] != fmt.Sprintf("renamed-%d", id) {
			t.Errorf("widget %d is %v, want renamed", id, rec)
		}
	}

	for i, it := range run("GET", "/api/widgets?ids=3,1,2", nil, 3) {
		want := []string{"3", "1", "2"}[i]
		if it["id"] != want || it["status"] != float64(200) || !strings.Contains(fmt.Sprint(it["body"]), "renamed-"+want) {
			t.Errorf("read result %d: %v, want widget %s", i, it, want)
		}
	}

	run("DELETE", "/api/widgets?ids=4,5", nil, 2)
	for _, id := range []string{"4", "5"} {
		if _, ok := api.Item("/api/widgets", id); ok {
			t.Errorf("widget %s is still there after the delete job", id)
		}
	}
	if _, ok := api.Item("/api/widgets", "6"); !ok {
		t.Error("widget 6 went with the delete job")
	}
}

// jobStatus reads the job's status once.
func jobStatus(t *testing.T, g *gateway, job jobAnswer) jobAnswer {
	t.Helper()
	r := g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...)
	if r.Status != 200 {
		t.Fatalf("status: %d %s", r.Status, r.Body)
	}
	return decodeJob(t, r)
}

// TestJobsQueuedPastMaxJobs: past max_jobs a start is not refused but
// answered 202 queued, and the job runs once one ends (the app's scan,
// nudged by that end): both run to their end, one after the other, each
// widget made once.
func TestJobsQueuedPastMaxJobs(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 5 * time.Millisecond})
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+t.TempDir(),
		strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tmax_jobs 1\n", 1))
	start := func(client string, n int) jobAnswer {
		r := g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer "+client)
		if r.Status != 202 {
			t.Fatalf("start of %s: %d %s, want 202", client, r.Status, r.Body)
		}
		return decodeJob(t, r)
	}
	first := start("client-a", 300)
	second := start("client-b", 20)
	if second.State != "queued" || second.Done != 1 {
		t.Errorf("the second job past max_jobs 1 answered %s, want queued", second.State)
	}
	if st := jobStatus(t, g, first); st.State == "running" {
		// Its first item went at its start, through the route's
		// authentication: the rest waits.
		if st2 := jobStatus(t, g, second); st2.State != "queued" || st2.Done != 1 {
			t.Errorf("while the first job runs, the second is %s with %d done, want queued, its first item done", st2.State, st2.Done)
		}
	}
	for _, job := range []jobAnswer{first, second} {
		if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Done != job.Items {
			t.Errorf("job ended %+v, want succeeded with every item done", st)
		}
	}
	made := map[string]int{}
	for _, w := range api.Items("/api/widgets") {
		made[fmt.Sprint(w["name"])]++
	}
	// Both jobs name their widgets job-0 on: the first 20 names twice.
	for i := range 300 {
		want := 1
		if i < 20 {
			want = 2
		}
		if c := made[fmt.Sprintf("job-%d", i)]; c != want {
			t.Errorf("job-%d made %d times, want %d", i, c, want)
		}
	}
}

// TestJobsHandedOverAtAReload: a config reload stops the old config's
// app, which hands its running job over (its progress stored, its lease
// released, nothing undone); the new config's scan takes it at once and
// carries it on through the new routes: each widget made once.
func TestJobsHandedOverAtAReload(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 5 * time.Millisecond})
	dir := t.TempDir()
	storage := "storage file_system " + dir
	site := strings.Replace(jobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\tconcurrency 4\n", 1)
	g := startGatewayStorage(t, api, newUpstream(t, api), storage, site)
	const n = 1500
	r := g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if r.Status != 202 {
		t.Fatalf("start: %d %s", r.Status, r.Body)
	}
	job := decodeJob(t, r)
	for jobStatus(t, g, job).Done < 200 {
		time.Sleep(20 * time.Millisecond)
	}
	g.reload(t, site+"\n\theader X-Reloaded yes\n")
	mid := jobStatus(t, g, job)
	if mid.Done >= n {
		t.Fatalf("the job ended before the reload was seen (%d done): the test needs it mid-run", mid.Done)
	}
	st := pollJob(t, g, job, 2*time.Minute)
	if st.State != "succeeded" || st.Done != n || st.Succeeded != n {
		t.Fatalf("job ended %+v, want succeeded with %d items", st, n)
	}
	var takeovers struct {
		Takeovers int `json:"takeovers"`
	}
	_ = json.Unmarshal(g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...).Body, &takeovers)
	if takeovers.Takeovers != 1 {
		t.Errorf("takeovers %d, want 1: the new config took the job over once", takeovers.Takeovers)
	}
	made := map[string]int{}
	for _, w := range api.Items("/api/widgets") {
		made[fmt.Sprint(w["name"])]++
	}
	for i := range n {
		if c := made[fmt.Sprintf("job-%d", i)]; c != 1 {
			t.Errorf("job-%d made %d times, want once", i, c)
		}
	}
}

// TestJobsPausedAndResumed: the legacy API stops accepting the client's
// token in the middle of a job, which pauses, each item it did
// standing, the refused one not among the results; POST .../resume
// with the refreshed token carries it on, and every widget is created
// exactly once, those after the pause with the new token.
func TestJobsPausedAndResumed(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", BearerTokens: []string{"old"}, WriteDelay: 10 * time.Millisecond})
	g := startGateway(t, api, jobsSite)
	const n = 600
	start := g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer old")
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	for deadline := time.Now().Add(time.Minute); len(api.Items("/api/widgets")) < 100; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the job created fewer than 100 widgets in a minute")
		}
	}
	api.RevokeToken("old")

	paused := pollJob(t, g, job, time.Minute)
	r := g.do(t, "GET", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...)
	var reason struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(r.Body, &reason)
	if paused.State != "paused" || paused.Done >= n || paused.Done != paused.Succeeded || !strings.Contains(reason.Reason, " 401 ") {
		t.Fatalf("after the token expired: %+v, reason %q; want paused with what was done standing, the reason naming the 401", paused, reason.Reason)
	}
	if r.Header.Get("Retry-After") != "5" {
		t.Errorf("a paused job's status has Retry-After %q, want 5: it has not ended", r.Header.Get("Retry-After"))
	}
	results := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
	if lines := bytes.Count(results.Body, []byte("\n")); lines != paused.Done || bytes.Contains(results.Body, []byte(`"status":401`)) {
		t.Errorf("results of the paused job: %d lines for %d done; want exactly the done ones, no 401 among them", lines, paused.Done)
	}

	resume := map[string]any{"headers": map[string]string{"Authorization": "Bearer new"}}
	if r := g.do(t, "POST", "/api/jobs/"+job.ID+"/resume", resume, bearerOf("not-the-token")...); r.Status != 404 {
		t.Errorf("resume with a wrong token: %d, want 404", r.Status)
	}
	bad := map[string]any{"headers": map[string]string{"Connection": "close"}}
	if r := g.do(t, "POST", "/api/jobs/"+job.ID+"/resume", bad, bearerOf(job.Token)...); r.Status != 400 {
		t.Errorf("resume setting a hop-by-hop header: %d %s, want 400", r.Status, r.Body)
	}
	api.AcceptToken("new")
	resumed := g.do(t, "POST", "/api/jobs/"+job.ID+"/resume", resume, bearerOf(job.Token)...)
	if st := decodeJob(t, resumed); resumed.Status != 202 || (st.State != "queued" && st.State != "running" && st.State != "succeeded") {
		t.Fatalf("resume: %d %s, want 202 with the job queued or running", resumed.Status, resumed.Body)
	}
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Done != n {
		t.Fatalf("the resumed job ended %+v, want succeeded with %d done", st, n)
	}
	if r := g.do(t, "POST", "/api/jobs/"+job.ID+"/resume", resume, bearerOf(job.Token)...); r.Status != 409 {
		t.Errorf("resume of an ended job: %d %s, want 409", r.Status, r.Body)
	}
	names := map[string]int{}
	for _, w := range api.AppliedWrites() {
		var body struct{ Name string }
		_ = json.Unmarshal(w.Body, &body)
		names[body.Name]++
		// The writes in flight at the revocation (concurrency, 8, of
		// them) may have passed with the old token; none after them.
		if i, _ := strconv.Atoi(strings.TrimPrefix(body.Name, "job-")); i >= paused.Done+8 && w.Header.Get("Authorization") != "Bearer new" {
			t.Errorf("%s was created with %q, want the new token", body.Name, w.Header.Get("Authorization"))
		}
	}
	for i := range n {
		if c := names[fmt.Sprintf("job-%d", i)]; c != 1 {
			t.Fatalf("widget job-%d was created %d times, want once", i, c)
		}
	}
	waitEndWritten(t, g.storageDir(t), job.ID)
}

// waitEndWritten waits for the end of job id, which its status shows
// first, to be written whole (its lease, the last of it, deleted), so
// that no write of it races the test's removal of the storage folder.
func waitEndWritten(t *testing.T, dir, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		leases, _ := filepath.Glob(filepath.Join(dir, "batch", "v1", "jobs", id, "lease*"))
		if len(leases) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the job ended its lease keys are still stored: %v", leases)
		}
	}
}
