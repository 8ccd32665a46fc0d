package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestSagaQueryOnEverySubRequest (case 4): the client's query reaches
// every request of the saga. On a multi-tenant API a failed delete in
// tenant t2 is undone in t2, and the default tenant, which holds the same
// ids, is never touched; on an API keyed by ?api_key= the preflight and
// the undo carry the key too.
func TestSagaQueryOnEverySubRequest(t *testing.T) {
	api := legacyapi.NewRecording(
		legacyapi.Collection{Path: "/users", Tenants: true, PutCreates: true, Seed: records("u", 1, 2)},
		legacyapi.Collection{Path: "/keyed", APIKey: "k3y", Seed: records("k", 1, 2)},
	)
	g := startGateway(t, api, `
	batch {
		concurrency 1
		scope_query tenant api_key
		resource /users {`+resourceMethods+`
		}
		resource /keyed {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	everyQuery := func(t *testing.T, query string, want []string) {
		t.Helper()
		var got []string
		for _, r := range api.Requests() {
			got = append(got, r.Method+" "+r.Path)
			if r.RawQuery != query {
				t.Errorf("%s %s?%s, want the client's query %q", r.Method, r.Path, r.RawQuery, query)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("the upstream received %v, want %v", got, want)
		}
	}

	t.Run("tenant=t2: the rollback brings t2's user 1 back, the default tenant untouched", func(t *testing.T) {
		for _, id := range []string{"1", "2"} {
			if r := g.direct(t, "PUT", "/users/"+id+"?tenant=t2", `{"name": "t2-`+id+`"}`); r.Status != 201 {
				t.Fatalf("seeding t2: %v", r)
			}
		}
		t2, defaults := api.TenantItems("/users", "t2"), api.Items("/users")
		api.ResetLog()
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/2", Status: 500, Body: htmlError, Times: 1})

		r := g.do(t, "DELETE", "/users?ids=1,2&tenant=t2", nil)

		holds(t, api, "t2", "1", user(1, "t2-1"))
		if after := api.TenantItems("/users", "t2"); !sameJSON(t, after, t2) {
			t.Errorf("tenant t2 holds %v, want %v", after, t2)
		}
		sameState(t, api, "/users", defaults)
		b := checkProblem(t, r, 502)
		if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
			t.Errorf("outcome %q items %v, want rolled_back [rolled_back failed]", b.Outcome, got)
		}
		everyQuery(t, "tenant=t2", []string{
			"GET /users/1", "GET /users/2", // preflight
			"DELETE /users/1", "DELETE /users/2",
			"GET /users/1", // the proof that user 1 is absent
			"PUT /users/1", // the undo
		})
	})

	t.Run("api_key: an all-or-nothing update succeeds", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "PATCH", "/keyed?api_key=k3y", `[{"id": 1, "name": "x"}, {"id": 2, "name": "y"}]`)
		checkEnvelope(t, r, 200, "succeeded")
		for id, name := range map[string]string{"1": "x", "2": "y"} {
			if rec, _ := api.Item("/keyed", id); rec["name"] != name {
				t.Errorf("keyed %s is %v, want name %q", id, rec, name)
			}
		}
		everyQuery(t, "api_key=k3y", []string{"GET /keyed/1", "GET /keyed/2", "PATCH /keyed/1", "PATCH /keyed/2"})
	})

	t.Run("api_key: a failed create is undone, no orphan", func(t *testing.T) {
		before := api.Items("/keyed")
		api.ResetLog()
		r := g.do(t, "POST", "/keyed?api_key=k3y", `[{"name": "new"}, {"name": ""}]`)

		if after := api.Items("/keyed"); !sameJSON(t, after, before) {
			t.Errorf("/keyed holds %v, want %v: an orphan or a loss", after, before)
		}
		b := checkProblem(t, r, 422)
		if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
			t.Errorf("outcome %q items %v, want rolled_back [rolled_back failed]", b.Outcome, got)
		}
		created := "/keyed/" + b.Items[0].ID
		everyQuery(t, "api_key=k3y", []string{"POST /keyed", "POST /keyed", "GET " + created, "DELETE " + created})
	})
}

// TestSagaUndoDeletesOnlyWhatItCreated (case 5): an undo never deletes
// an item the batch did not create, whatever the create's answer
// (a 202 naming a job, a bare 201) or the id its element carried.
func TestSagaUndoDeletesOnlyWhatItCreated(t *testing.T) {
	site := usersSite(slowSaga...)

	t.Run("202 with Location /jobs/2: the job's number is not an id", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{CreateAnswer: legacyapi.AnswerAccepted}, 2)
		g := startGateway(t, api, site)
		if r := g.direct(t, "POST", "/users", `{"name": "earlier"}`); r.Status != 202 {
			t.Fatalf("an earlier create: %v", r) // job 1, so the batch's is job 2
		}
		before := api.Items("/users")
		api.ResetLog()

		r := g.do(t, "POST", "/users", `[{"name": "new"}, {"name": ""}]`)

		after := api.Items("/users")
		for id, rec := range before {
			if !sameJSON(t, after[id], rec) {
				t.Errorf("user %s is %v, want %v", id, after[id], rec)
			}
		}
		var left []map[string]any
		for id, rec := range after {
			if _, ok := before[id]; !ok {
				left = append(left, rec)
			}
		}
		if len(left) != 1 || left[0]["name"] != "new" {
			t.Errorf("created and left %v, want the one user the batch created", left)
		}
		b := checkLeftBehind(t, r, 0, "named no id")
		if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
			t.Errorf("item outcomes %v", got)
		}
		if it := b.Items[0]; it.Status != 202 || it.ID != "" || !strings.HasSuffix(it.Headers["Location"], "/jobs/2") {
			t.Errorf("item 0: %+v, want 202, no id, Location /jobs/2", it)
		}
		if w := writes(api.Requests()); len(w) != 2 {
			t.Errorf("writes:%s; want the two creates and no DELETE", describeRequests(w))
		}
	})

	bare := legacyapi.Collection{AssignIDs: true, CreateAnswer: legacyapi.AnswerBare, PutCreates: true}

	t.Run("ids assigned, bare 201: the element's id 3 is not where the item went", func(t *testing.T) {
		api := usersAPI(bare, 2)
		g := startGateway(t, api, site)
		before := api.Items("/users")

		r := g.do(t, "POST", "/users", `[{"id": 3, "name": "batch"}, {"name": ""}]`)

		holds(t, api, "", "3", nil)
		holds(t, api, "", "1000", user(1000, "batch")) // the upstream's id, which no answer named
		if len(api.Items("/users")) != len(before)+1 {
			t.Errorf("users %v, want the seeds and 1000", api.Items("/users"))
		}
		b := checkLeftBehind(t, r, 0, "gone")
		if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
			t.Errorf("item outcomes %v", got)
		}
		if dels := writes(api.Requests()); len(dels) != 2 {
			t.Errorf("writes:%s; want the two creates and no DELETE", describeRequests(dels))
		}
	})

	t.Run("ids assigned, bare 201: a user 3 someone else made meanwhile is not deleted", func(t *testing.T) {
		api := usersAPI(bare, 2)
		g := startGateway(t, api, site)
		api.Inject(passThrough("POST", "/users", 1))
		held, release := heldUntilReleased(legacyapi.Fault{Method: "POST", Path: "/users", Status: 500, Body: htmlError, Times: 1})
		api.Inject(held)

		a := start(g.URL, "POST", "/users", `[{"id": 3, "name": "batch"}, {"name": "second"}]`)
		eventually(t, 5*time.Second, "the second create", func() bool { return len(sent(api, "POST", "/users")) == 2 })
		if r := g.direct(t, "PUT", "/users/3", `{"name": "B"}`); r.Status != 201 {
			t.Fatalf("B's PUT at the upstream: %v, want 201", r)
		}
		if a.answered() {
			t.Fatal("A answered before B's write: the window was missed")
		}
		release()
		r := a.answer(t)

		holds(t, api, "", "3", user(3, "B"))
		holds(t, api, "", "1000", user(1000, "batch"))
		checkLeftBehind(t, r, 0, `another writer changed "name"`)
		if f := found(t, r, 0); !sameJSON(t, f, user(3, "B")) {
			t.Errorf("compensation.found %v, want B's user 3", f)
		}
		if dels := sent(api, "DELETE", "/users/3"); len(dels) > 0 {
			t.Errorf("B's user 3 was sent a DELETE:%s", describeRequests(dels))
		}
	})

	t.Run("an element's id that exists fails 409 before anything is sent", func(t *testing.T) {
		api := usersAPI(bare, 3)
		g := startGateway(t, api, site)
		before := api.Items("/users")

		r := g.do(t, "POST", "/users", `[{"id": 3, "name": "imposter"}, {"name": "second"}]`)

		sameState(t, api, "/users", before)
		b := checkProblem(t, r, 409)
		if got := b.Outcomes(); b.Outcome != "failed" || !slices.Equal(got, []string{"failed", "not_attempted"}) {
			t.Errorf("outcome %q items %v, want failed [failed not_attempted]", b.Outcome, got)
		}
		if w := writes(api.Requests()); len(w) > 0 {
			t.Errorf("writes reached the upstream:%s", describeRequests(w))
		}
	})

	t.Run("an existing id whose 409 would be lost: checked first, never sent", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{}, 2)
		g := startGateway(t, api, site)
		// The oldest engine sent the create, lost its 409, read user 1,
		// found it and deleted it. The drop is armed for any create.
		api.Inject(legacyapi.Fault{Method: "POST", Path: "/users", Drop: true})
		before := api.Items("/users")

		r := g.do(t, "POST", "/users", `[{"name": "new"}, {"id": 1, "name": "imposter"}]`)

		// Every id a create names is checked before anything is written:
		// nothing was created, so there is nothing to undo.
		sameState(t, api, "/users", before)
		b := checkProblem(t, r, 409)
		if got := b.Outcomes(); b.Outcome != "failed" || !slices.Equal(got, []string{"not_attempted", "failed"}) {
			t.Errorf("outcome %q items %v, want failed [not_attempted failed]", b.Outcome, got)
		}
		if posts := sent(api, "POST", "/users"); len(posts) != 0 {
			t.Errorf("creates sent:%s; want none", describeRequests(posts))
		}
		if w := sent(api, "DELETE", "/users/1"); len(w) > 0 {
			t.Errorf("user 1 was sent a DELETE:%s", describeRequests(w))
		}
	})
}

// TestSagaRestoreDeletedPostOnAssignedIDs (case 6): restore_deleted post
// on an API that assigns ids re-creates the deleted user under a new id
// (1000). That is not rolled_back: the answer names the new id.
func TestSagaRestoreDeletedPostOnAssignedIDs(t *testing.T) {
	api := usersAPI(legacyapi.Collection{AssignIDs: true}, 4)
	g := startGateway(t, api, usersSite(append(slowSaga, "restore_deleted post")...))
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})

	r := g.do(t, "DELETE", "/users?ids=3,4", nil)

	holds(t, api, "", "3", nil)
	holds(t, api, "", "1000", user(1000, "u3"))
	holds(t, api, "", "4", user(4, "u4"))
	b := checkLeftBehind(t, r, 0, `"1000"`)
	if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
		t.Errorf("item outcomes %v", got)
	}
	if !strings.Contains(b.Detail, "1000") {
		t.Errorf("detail %q does not name the new id 1000", b.Detail)
	}
}

// TestSagaCreateAnsweredSeeOther (case 7): a create answered 303 may
// have been applied, or may point at an item that was there before, as
// equivalent to what was sent (RFC 9110 §9.3.3): the saga reads the item
// its Location names, and since a read cannot tell the two apart, it
// leaves it, rollback_failed naming it, never deleting it.
func TestSagaCreateAnsweredSeeOther(t *testing.T) {
	api := usersAPI(legacyapi.Collection{CreateAnswer: legacyapi.AnswerSeeOther}, 2)
	g := startGateway(t, api, usersSite(slowSaga...))

	r := g.do(t, "POST", "/users", `[{"name": "new"}, {"name": ""}]`)

	b := checkProblem(t, r, 500)
	if got := b.Outcomes(); b.Outcome != "rollback_failed" || !slices.Equal(got, []string{"rollback_failed", "not_attempted"}) {
		t.Errorf("outcome %q items %v, want rollback_failed [rollback_failed not_attempted]", b.Outcome, got)
	}
	if it := b.Items[0]; it.Status != 303 || it.ID != "1000" {
		t.Errorf("item 0: status %d id %q, want 303 and the id its Location names (1000)", it.Status, it.ID)
	}
	if reads, dels := sent(api, "GET", "/users/1000"), sent(api, "DELETE", "/users/1000"); len(reads) == 0 || len(dels) != 0 {
		t.Errorf("reads%s\ndeletes%s\nwant the item read, never deleted", describeRequests(reads), describeRequests(dels))
	}
	if _, ok := api.Item("/users", "1000"); !ok {
		t.Error("the item the Location names is gone")
	}
}

// TestSagaIdempotentUpstreamResend: with idempotent_upstream, an update
// applied whose answer was lost is sent again with the same
// Idempotency-Key during compensation; the API replays its answer,
// applying nothing twice, and the saga undoes the item: the API ends as
// it began.
func TestSagaIdempotentUpstreamResend(t *testing.T) {
	api := usersAPI(legacyapi.Collection{HonorKeys: true}, 2)
	g := startGateway(t, api, usersSite(append(slowSaga, "idempotent_upstream")...))
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/users/2", AfterApply: true, Drop: true, Times: 1})
	before := api.Items("/users")

	r := g.do(t, "PATCH", "/users", `[{"id": 1, "name": "x"}, {"id": 2, "name": "y"}]`)

	sameState(t, api, "/users", before)
	patches := sent(api, "PATCH", "/users/2")
	if len(patches) != 2 || patches[0].Header.Get("Idempotency-Key") == "" ||
		patches[0].Header.Get("Idempotency-Key") != patches[1].Header.Get("Idempotency-Key") {
		t.Errorf("PATCH /users/2 sent:%s, want twice with the same Idempotency-Key", describeRequests(patches))
	}
	if w := api.Writes(); w.Replayed != 1 || w.Applied != 4 {
		t.Errorf("writes %+v, want 1 replayed and 4 applied: two updates, two undos", w)
	}
	b := checkProblem(t, r, 502)
	if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "rolled_back"}) {
		t.Errorf("outcome %q items %v, want rolled_back [rolled_back rolled_back]", b.Outcome, got)
	}
}
