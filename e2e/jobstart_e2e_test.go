package e2e

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// checkMadeOnce fails unless the legacy API holds each of the widgets
// job-0 to job-<n-1> exactly once.
func checkMadeOnce(t *testing.T, api *legacyapi.API, n int) {
	t.Helper()
	names := map[string]int{}
	for _, it := range api.Items("/api/widgets") {
		if name, _ := it["name"].(string); strings.HasPrefix(name, "job-") {
			names[name]++
		}
	}
	for i := range n {
		if c := names[fmt.Sprintf("job-%d", i)]; c != 1 {
			t.Fatalf("widget job-%d was created %d times, want once", i, c)
		}
	}
	if len(names) != n {
		t.Errorf("the legacy API holds %d job widgets, want %d", len(names), n)
	}
}

// storedJobs counts the jobs kept in the file system storage in dir.
func storedJobs(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	for _, key := range storedJobKeys(t, dir) {
		if strings.HasPrefix(key, "jobs"+string(filepath.Separator)) && filepath.Base(key) == "job" {
			n++
		}
	}
	return n
}

// TestJobsIdempotentStart: a start sent again with its Idempotency-Key
// answers the same job (same id, same token, its status now), never a
// second one, while the job lives; once it is removed, 410; the same key
// with another body, 422.
func TestJobsIdempotentStart(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsSite)
	dir := g.storageDir(t)
	before := len(api.Items("/api/widgets"))
	const n = 50
	client := []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a", "Idempotency-Key", "import-1"}

	start := g.do(t, "POST", "/api/widgets", widgetLines(n), client...)
	if start.Status != 202 {
		t.Fatalf("start: %d %s", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	if start.Header.Get("Idempotent-Replayed") != "" {
		t.Error("the first start says it was replayed")
	}

	checkReplay := func(t *testing.T, r response) jobAnswer {
		t.Helper()
		if r.Status != 202 {
			t.Fatalf("the start again: %d %s, want 202", r.Status, r.Body)
		}
		again := decodeJob(t, r)
		if again.ID != job.ID || again.Token != job.Token {
			t.Errorf("the start again answered job %s, want the same job %s with the same token", again.ID, job.ID)
		}
		for name, want := range map[string]string{"Idempotent-Replayed": "true", "Location": "/api/jobs/" + job.ID,
			"Preference-Applied": "respond-async", "Retry-After": "5", "Cache-Control": "no-store"} {
			if got := r.Header.Get(name); got != want {
				t.Errorf("%s %q, want %q", name, got, want)
			}
		}
		return again
	}
	checkReplay(t, g.do(t, "POST", "/api/widgets", widgetLines(n), client...))

	status := pollJob(t, g, job, time.Minute)
	if status.State != "succeeded" {
		t.Fatalf("job ended %+v", status)
	}
	if again := checkReplay(t, g.do(t, "POST", "/api/widgets", widgetLines(n), client...)); again.State != "succeeded" || again.Done != n {
		t.Errorf("the replay after the end says %s, %d done; want the job's status now: succeeded, %d", again.State, again.Done, n)
	}
	// The same elements as a JSON array are the same start.
	var array []map[string]string
	for i := range n {
		array = append(array, map[string]string{"name": fmt.Sprintf("job-%d", i)})
	}
	checkReplay(t, g.do(t, "POST", "/api/widgets", array, append(client[2:], "Content-Type", "application/json")...))

	t.Run("another body with the key: 422", func(t *testing.T) {
		r := g.do(t, "POST", "/api/widgets", widgetLines(n+1), client...)
		if r.Status != 422 || !bytes.Contains(r.Body, []byte("idempotency-key-reused")) {
			t.Errorf("another body: %d %s, want 422 idempotency-key-reused", r.Status, r.Body)
		}
	})

	if jobs := storedJobs(t, dir); jobs != 1 {
		t.Errorf("%d jobs in storage, want the one", jobs)
	}
	if made := len(api.Items("/api/widgets")) - before; made != n {
		t.Errorf("the legacy API made %d widgets, want %d", made, n)
	}
	checkMadeOnce(t, api, n)

	t.Run("after DELETE: 410, and no second job", func(t *testing.T) {
		if r := g.do(t, "DELETE", "/api/jobs/"+job.ID, nil, bearerOf(job.Token)...); r.Status != 204 {
			t.Fatalf("DELETE: %d %s", r.Status, r.Body)
		}
		r := g.do(t, "POST", "/api/widgets", widgetLines(n), client...)
		if r.Status != 410 || !bytes.Contains(r.Body, []byte("job-gone")) {
			t.Errorf("the start after its job was removed: %d %s, want 410 job-gone", r.Status, r.Body)
		}
		if jobs := storedJobs(t, dir); jobs != 0 {
			t.Errorf("%d jobs in storage, want none", jobs)
		}
		time.Sleep(200 * time.Millisecond) // a job made would have begun
		if made := len(api.Items("/api/widgets")) - before; made != n {
			t.Errorf("the legacy API made %d widgets, want %d", made, n)
		}
	})
}

// TestJobsStartKeyInFlight: a start with the key of another still
// reading its body is 409; the first is answered 202 once its body ends,
// and makes the one job.
func TestJobsStartKeyInFlight(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsSite)
	dir := g.storageDir(t)
	const n = 20
	client := []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a", "Idempotency-Key", "import-2"}

	body, feed := io.Pipe()
	req, err := http.NewRequest("POST", g.URL+"/api/widgets", body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(client); i += 2 {
		req.Header.Set(client[i], client[i+1])
	}
	answered := make(chan response, 1)
	go func() {
		resp, err := g.client.Do(req)
		if err != nil {
			answered <- response{Body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	}()
	lines := widgetLines(n)
	half := strings.Index(lines, "job-10")
	if _, err := io.WriteString(feed, lines[:half]); err != nil {
		t.Fatal(err)
	}
	// The key is claimed before the body is read.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if records, _ := os.ReadDir(filepath.Join(dir, "batch", "v1", "idem")); len(records) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the start's key was not claimed while its body was read")
		}
		time.Sleep(20 * time.Millisecond)
	}

	r := g.do(t, "POST", "/api/widgets", lines, client...)
	if r.Status != 409 || !bytes.Contains(r.Body, []byte("idempotency-key-in-use")) || r.Header.Get("Retry-After") == "" {
		t.Errorf("the same key while the first start reads its body: %d %s, want 409 idempotency-key-in-use with Retry-After", r.Status, r.Body)
	}

	if _, err := io.WriteString(feed, lines[half:]); err != nil {
		t.Fatal(err)
	}
	feed.Close()
	first := <-answered
	if first.Status != 202 {
		t.Fatalf("the first start: %d %s, want 202", first.Status, first.Body)
	}
	job := decodeJob(t, first)
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Done != n {
		t.Fatalf("job ended %+v", st)
	}
	again := g.do(t, "POST", "/api/widgets", lines, client...)
	if again.Status != 202 || decodeJob(t, again).ID != job.ID {
		t.Errorf("the start again once answered: %d %s, want its job replayed", again.Status, again.Body)
	}
	checkMadeOnce(t, api, n)
}

// jobsBehindAuthSite is jobsSite with basic_auth after the batch
// handler: a job's requests go through it, as its start would.
var jobsBehindAuthSite = strings.Replace(jobsSite, "\treverse_proxy UPSTREAM", `
	basic_auth {
		admin `+adminHash+`
	}
	reverse_proxy UPSTREAM`, 1)

func basicAuth(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// TestJobsStartRefusedByAuth: the route's authentication, after the
// batch handler, refuses a job's first request: its 401 is the start's
// answer, challenge and all, and nothing is kept or made; with the
// right credentials the job runs, its first item made once.
func TestJobsStartRefusedByAuth(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsBehindAuthSite)
	dir := g.storageDir(t)
	before := len(api.Items("/api/widgets"))
	const n = 30
	start := func(authorization string, key string) response {
		return g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson",
			"Prefer", "respond-async", "Authorization", authorization, "Idempotency-Key", key)
	}

	wrong := start(basicAuth("admin", "wrong"), "auth-1")
	if wrong.Status != 401 || !strings.HasPrefix(wrong.Header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("wrong credentials: %d WWW-Authenticate %q %s, want basic_auth's 401 and its challenge",
			wrong.Status, wrong.Header.Get("WWW-Authenticate"), wrong.Body)
	}
	if bytes.Contains(wrong.Body, []byte(`"token"`)) {
		t.Errorf("the refused start answered a job: %s", wrong.Body)
	}
	if keys := storedJobKeys(t, dir); len(keys) != 0 {
		t.Errorf("a start refused by authentication left %v in storage", keys)
	}
	if w := api.Writes(); w.Applied != 0 || len(api.Items("/api/widgets")) != before {
		t.Errorf("the legacy API applied %d writes for a refused start, want none", w.Applied)
	}
	// Its key was given back: the start is not answered 401 for ever.
	if again := start(basicAuth("admin", "wrong"), "auth-1"); again.Status != 401 {
		t.Errorf("the refused start again: %d %s, want 401 again", again.Status, again.Body)
	}

	right := start(basicAuth("admin", adminPassword), "auth-2")
	if right.Status != 202 {
		t.Fatalf("right credentials: %d %s, want 202", right.Status, right.Body)
	}
	job := decodeJob(t, right)
	if job.Done < 1 {
		t.Errorf("the 202 says %d items done, want the first one, sent before the answer", job.Done)
	}
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" || st.Succeeded != n {
		t.Fatalf("job ended %+v, want %d items succeeded", st, n)
	}
	checkMadeOnce(t, api, n)
}
