package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// envelopeJobsSite is shopSite with bulk jobs, the envelope of the
// atomicity given.
func envelopeJobsSite(atomicity string) string {
	return strings.Replace(shopSite, "envelope /api/batch", "atomicity "+atomicity+"\n\t\tjobs /api/jobs\n\t\tenvelope /api/batch", 1)
}

// usersWithPosts is JSON Lines of n user creates, then n post creates,
// each under its user by a reference made a window or more before it;
// then, when last is given, that operation.
func usersWithPosts(n int, last string) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id":"u%d","method":"POST","url":"/api/users","body":{"name":"bulk-%d"}}`+"\n", i, i)
	}
	for i := range n {
		fmt.Fprintf(&b, `{"id":"p%d","method":"POST","url":"/api/users/$u%d/posts","body":{"title":"hello","author_id":"$u%d#/id"}}`+"\n", i, i, i)
	}
	if last != "" {
		b.WriteString(last + "\n")
	}
	return b.String()
}

// startEnvelopeJob starts body as an envelope job and waits for its end.
func runEnvelopeJob(t *testing.T, g *gateway, body string) jobAnswer {
	t.Helper()
	start := g.do(t, "POST", "/api/batch", body,
		"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a")
	if start.Status != 202 {
		t.Fatalf("start: %d %s, want 202", start.Status, start.Body)
	}
	job := decodeJob(t, start)
	ended := pollJob(t, g, job, 2*time.Minute)
	ended.Token = job.Token
	return ended
}

// A partial envelope job of 600 operations through Caddy: each post is
// made under the user a create two windows before it made, naming it.
func TestJobsEnvelopeAcrossWindows(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, envelopeJobsSite("partial"))
	const n = 300
	job := runEnvelopeJob(t, g, usersWithPosts(n, ""))
	if job.State != "succeeded" || job.Succeeded != 2*n {
		r := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
		_, failed, _ := strings.Cut(string(r.Body), `"outcome":"failed"`)
		first, _, _ := strings.Cut(failed, "\n")
		t.Fatalf("job ended %+v, want succeeded, %d operations; a failed one: %s", job, 2*n, first)
	}
	made := 0
	for _, u := range api.Items("/api/users") {
		if !strings.HasPrefix(fmt.Sprint(u["name"]), "bulk-") {
			continue
		}
		made++
		id := fmt.Sprint(u["id"])
		posts := api.Items("/api/users/" + id + "/posts")
		if len(posts) != 1 {
			r := g.do(t, "GET", "/api/jobs/"+job.ID+"/results", nil, bearerOf(job.Token)...)
			for _, l := range strings.Split(string(r.Body), "\n") {
				if strings.Contains(l, "/"+id+"/") || strings.Contains(l, fmt.Sprint(u["name"])+`"`) {
					t.Logf("%s", l)
				}
			}
			t.Fatalf("user %s (%v) has posts %v, want one", id, u, posts)
		}
		for _, p := range posts {
			if fmt.Sprint(p["author_id"]) != id {
				t.Fatalf("user %s's post %v, want it to name the user", id, p)
			}
		}
	}
	if made != n {
		t.Errorf("the API holds %d users of the job, want %d", made, n)
	}
}

// An all-or-nothing envelope job whose last operation fails, two windows
// after most of what it made, is undone whole: the API holds what it
// held before.
func TestJobsEnvelopeAllOrNothingRolledBack(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, envelopeJobsSite("all_or_nothing"))
	before, _ := json.Marshal(api.Items("/api/users"))
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/users/2", Status: 422, Body: "<p>no</p>"})
	job := runEnvelopeJob(t, g, usersWithPosts(300, `{"id":"last","method":"PATCH","url":"/api/users/2","body":{"name":"x"}}`))
	if job.State != "rolled_back" {
		t.Fatalf("job ended %+v, want rolled_back", job)
	}
	if after, _ := json.Marshal(api.Items("/api/users")); string(after) != string(before) {
		t.Errorf("users after the undo:\n%s\nwant as before:\n%s", after, before)
	}
	for id := range api.Items("/api/users") {
		if posts := api.Items("/api/users/" + id + "/posts"); len(posts) > 0 && id != "1" {
			t.Errorf("user %s has posts %v after the undo", id, posts)
		}
	}
}

// An envelope job's start sent again with its Idempotency-Key answers the
// same job, never a second: each user is made once; the same key with
// other operations, or the same ones all-or-nothing, is 422.
func TestJobsEnvelopeIdempotentStart(t *testing.T) {
	api := shopAPI()
	g := startGateway(t, api, envelopeJobsSite("partial\n\t\tallow_override"))
	client := []string{"Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer client-a", "Idempotency-Key", "ops-1"}
	body := usersWithPosts(3, "")
	first := g.do(t, "POST", "/api/batch", body, client...)
	again := g.do(t, "POST", "/api/batch", body, client...)
	if first.Status != 202 || again.Status != 202 || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("start %d, again %d (replayed %q); want 202 twice, the second replayed", first.Status, again.Status, again.Header.Get("Idempotent-Replayed"))
	}
	job, replayed := decodeJob(t, first), decodeJob(t, again)
	if replayed.ID != job.ID || replayed.Token != job.Token {
		t.Errorf("the start again answered job %s, want %s with its token", replayed.ID, job.ID)
	}
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" {
		t.Fatalf("job ended %+v", st)
	}
	if other := g.do(t, "POST", "/api/batch", usersWithPosts(4, ""), client...); other.Status != 422 {
		t.Errorf("the key with other operations: %d %s, want 422", other.Status, other.Body)
	}
	// The same operations all-or-nothing are another start.
	atomic := `{"atomicity":"all_or_nothing","operations":[` + strings.Join(strings.Split(strings.TrimSpace(body), "\n"), ",") + `]}`
	objectClient := append(slices.Clone(client), "Content-Type", "application/json")
	if other := g.do(t, "POST", "/api/batch", atomic, objectClient...); other.Status != 422 {
		t.Errorf("the key with the same operations all-or-nothing: %d %s, want 422", other.Status, other.Body)
	}
	made := 0
	for _, u := range api.Items("/api/users") {
		if strings.HasPrefix(fmt.Sprint(u["name"]), "bulk-") {
			made++
		}
	}
	if made != 3 {
		t.Errorf("the API holds %d users of the job, want 3: one job", made)
	}
}
