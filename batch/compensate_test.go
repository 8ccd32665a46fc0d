package batch

// Compensation: what each undo sends, in which order, how often, and
// that it runs whatever the client does (docs/all-or-nothing.md).

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Compensations run in reverse order of start (concurrency 1: index order).
func TestCompensationReverseStartOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method, target, body string
		mods                       []specMod
		fake                       func() *fakeAPI
		undo                       []string
	}{
		{name: "create", method: "POST", target: "/widgets", body: elements(5),
			fake: func() *fakeAPI {
				return newFake().on("POST", "/widgets", answer{}, answer{}, answer{}, reply(422, `{}`))
			},
			undo: []string{"DELETE /widgets/1002", "DELETE /widgets/1001", "DELETE /widgets/1000"}},
		{name: "update", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1},{"id":"4","v":1}]`,
			fake: func() *fakeAPI {
				return newFake().seed("1", "2", "3", "4").on("PATCH", "/widgets/4", reply(422, `{}`))
			},
			undo: []string{"PUT /widgets/3", "PUT /widgets/2", "PUT /widgets/1"}},
		{name: "delete", method: "DELETE", target: "/widgets?ids=1,2,3,4",
			fake: func() *fakeAPI {
				return newFake().seed("1", "2", "3", "4").on("DELETE", "/widgets/4", reply(423, `{}`))
			},
			undo: []string{"PUT /widgets/3", "PUT /widgets/2", "PUT /widgets/1"}},
		{name: "delete, restore_deleted post", method: "DELETE", target: "/widgets?ids=1,2,3,4", mods: []specMod{restoreByPost},
			fake: func() *fakeAPI {
				return newFake().seed("1", "2", "3", "4").on("DELETE", "/widgets/4", reply(423, `{}`))
			},
			undo: []string{"POST /widgets", "POST /widgets", "POST /widgets"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake()
			before := f.state()
			run1(t, tt.method, tt.target, tt.body, f, append(tt.mods, concurrency(1))...)
			sent := f.sent()
			firstUndo := slices.IndexFunc(f.log(), func(c call) bool { return c.Method == undoMethod(tt.undo[0]) })
			if firstUndo < 0 {
				t.Fatalf("no compensation sent: %q", sent)
			}
			equalSlices(t, "compensations, in order", withoutReads(sent[firstUndo:]), tt.undo)
			if tt.method == "DELETE" && strings.HasPrefix(tt.undo[0], "POST") {
				// POST bodies say which item each re-creates.
				var order []string
				for _, c := range f.sentWith("POST") {
					var rec struct{ ID string }
					_ = json.Unmarshal([]byte(c.Body), &rec)
					order = append(order, rec.ID)
				}
				equalSlices(t, "re-created ids, in order", order, []string{"3", "2", "1"})
			}
			f.checkUnchanged(t, before)
		})
	}
}

func undoMethod(s string) string { m, _, _ := strings.Cut(s, " "); return m }

// withoutReads drops the GETs (the proofs) from a list of "METHOD /path".
func withoutReads(sent []string) []string {
	return slices.DeleteFunc(slices.Clone(sent), func(s string) bool { return strings.HasPrefix(s, "GET ") })
}

// A created item is undone by DELETE of its id: the last segment of its
// Location, else the body's id field, else the element's own id.
func TestCompensateCreateFindsTheCreatedID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string // the batch
		created answer // the upstream's answer to the first element
		id      string // the created id the item reports
		path    string // the compensating DELETE
	}{
		{name: "absolute Location", body: `[{"name":"a"},{"name":"b"}]`,
			created: reply(201, `{"id":999,"name":"a"}`, "Location", "http://legacy.internal:3000/widgets/1000"),
			id:      "1000", path: "/widgets/1000"},
		{name: "relative Location with a trailing slash and a query", body: `[{"name":"a"},{"name":"b"}]`,
			created: reply(201, ``, "Location", "/widgets/abc/?x=1"),
			id:      "abc", path: "/widgets/abc"},
		{name: "escaped Location", body: `[{"name":"a"},{"name":"b"}]`,
			created: reply(201, ``, "Location", "http://h/widgets/a%20b"),
			id:      "a b", path: "/widgets/a%20b"},
		{name: "no Location: the body's id", body: `[{"name":"a"},{"name":"b"}]`,
			created: reply(201, `{"id":77,"name":"a"}`),
			id:      "77", path: "/widgets/77"},
		{name: "no Location, no id in the body: the element's id", body: `[{"id":"e1","name":"a"},{"name":"b"}]`,
			created: reply(201, `{"name":"a"}`),
			id:      "e1", path: "/widgets/e1"},
		{name: "no Location, a body that is not JSON: the element's id", body: `[{"id":5,"name":"a"},{"name":"b"}]`,
			created: reply(200, `created`),
			id:      "5", path: "/widgets/5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The upstream holds what it said it created, so the undo's
			// proof read finds it as the create left it.
			stored := tt.created.body
			if !json.Valid([]byte(stored)) {
				stored = `{"name":"a"}`
			}
			reads := []answer{reply(200, stored)}
			if strings.Contains(tt.body, `"id"`) {
				// The element's id is first checked free.
				reads = append([]answer{reply(404, `{}`)}, reads...)
			}
			f := newFake().on("POST", "/widgets", tt.created, reply(409, `{}`)).on("DELETE", tt.path, reply(204, ``)).
				on("GET", tt.path, reads...)
			res := run1(t, "POST", "/widgets", tt.body, f, concurrency(1))
			w := write(t, res)
			equal(t, "item 0 id", w.Items[0].ID, tt.id)
			equalSlices(t, "compensations", pathsOf(f.sentWith("DELETE")), []string{tt.path})
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
			c := w.Items[0].Compensation
			if c == nil || !reflect.DeepEqual(*c, batchwire.Compensation{Method: "DELETE", Path: tt.path, Status: 204, Attempts: 1}) {
				t.Errorf("compensation = %+v", c)
			}
			equal(t, "status", w.Code, 409)
			equal(t, "outcome", w.Outcome, "rolled_back")
			equal(t, "Result.Compensations", res.Compensations, 1)
		})
	}
}

// A created id that could reach another path is not used: the item
// cannot be undone, and the batch says so.
func TestCompensateCreateRefusesAHostileCreatedID(t *testing.T) {
	t.Parallel()
	f := newFake().on("POST", "/widgets", reply(201, `{"id":"../7"}`, "Location", "http://h/widgets/%2e%2e"), reply(409, `{}`))
	w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
	equalSlices(t, "sent", f.sent(), []string{"POST /widgets", "POST /widgets"})
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
	equal(t, "status", w.Code, 500)
	equal(t, "outcome", w.Outcome, "rollback_failed")
}

// An update is undone by putting the pre-image back: PUT of the whole
// pre-image, or PATCH of the changed fields' old values (null where the
// field did not exist).
func TestCompensateUpdate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mods   []specMod
		method string
		body   func(preimage string) string
	}{
		{name: "restore_updated put", method: "PUT", body: func(pre string) string { return pre }},
		{name: "restore_updated patch", mods: []specMod{restoreByPatch}, method: "PATCH",
			body: func(string) string { return `{"name":"old","size":null}` }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake().seed("2")
			f.put(widget("1"), map[string]any{"id": "1", "name": "old", "color": "red", "tags": []any{"a"}})
			f.on("PATCH", "/widgets/2", reply(422, `{}`))
			before := f.state()
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"new","size":3},{"id":"2","name":"x"}]`, f, append(tt.mods, concurrency(1))...))
			log := f.log()
			equalSlices(t, "sent", f.sent(), []string{
				"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "GET /widgets/1", tt.method + " /widgets/1",
			})
			if len(log) != 6 {
				t.FailNow()
			}
			preimage := before["/widgets/1"]
			undo := log[5]
			jsonEqual(t, "compensation body", undo.Body, tt.body(preimage))
			if tt.method == "PUT" && undo.Body != preimage {
				t.Errorf("PUT body %s is not the pre-image byte for byte: %s", undo.Body, preimage)
			}
			equal(t, "compensation Content-Type", undo.Header.Get("Content-Type"), "application/json")
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
			f.checkUnchanged(t, before)
		})
	}
}

// A deleted item is re-created from its pre-image: PUT on the item, or
// POST on the collection with the id included.
func TestCompensateDelete(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mods []specMod
		undo string
	}{
		{name: "restore_deleted put", undo: "PUT /widgets/1"},
		{name: "restore_deleted post", mods: []specMod{restoreByPost}, undo: "POST /widgets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake().seed("1", "2").on("DELETE", "/widgets/2", reply(409, `{}`))
			before := f.state()
			w := write(t, run1(t, "DELETE", "/widgets?ids=1,2&dry=no", "", f, append(tt.mods, concurrency(1), scopeQuery("dry"))...))
			equalSlices(t, "sent", f.sent(), []string{
				"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "DELETE /widgets/2", "GET /widgets/1", tt.undo,
			})
			undo := f.log()[5]
			equal(t, "compensation body", undo.Body, before["/widgets/1"])
			jsonEqual(t, "compensation body", undo.Body, `{"id":"1","name":"widget 1","color":"red"}`)
			equal(t, "compensation query", undo.RawQuery, "dry=no")
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
			equal(t, "status", w.Code, 409)
			f.checkUnchanged(t, before)
		})
	}
}

// Each compensation has its own retries: a retryable failure (5xx, 408,
// 429, no answer, a timeout) is sent again up to compensation_retries
// times; a non-retryable 4xx is not; a DELETE answered 404 or 410 is as
// good as done.
func TestCompensationRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		retries  int
		answers  []answer
		outcome  string
		attempts int
		status   int // the compensation's last status
		batch    int
	}{
		{name: "503 twice, then done", retries: 3, answers: []answer{reply(503, ``), reply(503, ``), reply(204, ``)},
			outcome: "rolled_back", attempts: 3, status: 204, batch: 409},
		{name: "no answer, then done", retries: 3, answers: []answer{{err: errLost}, reply(204, ``)},
			outcome: "rolled_back", attempts: 2, status: 204, batch: 409},
		{name: "timed out, then done", retries: 3, answers: []answer{{hang: true}, reply(204, ``)},
			outcome: "rolled_back", attempts: 2, status: 204, batch: 409},
		{name: "429, then done", retries: 3, answers: []answer{reply(429, ``), reply(200, `{}`)},
			outcome: "rolled_back", attempts: 2, status: 200, batch: 409},
		{name: "always 503", retries: 2, answers: []answer{reply(503, ``)},
			outcome: "rollback_failed", attempts: 3, status: 503, batch: 500},
		{name: "always 503, no retries", retries: 0, answers: []answer{reply(503, ``)},
			outcome: "rollback_failed", attempts: 1, status: 503, batch: 500},
		{name: "400 is not retried", retries: 3, answers: []answer{reply(400, ``), reply(204, ``)},
			outcome: "rollback_failed", attempts: 1, status: 400, batch: 500},
		{name: "403 is not retried", retries: 3, answers: []answer{reply(403, ``), reply(204, ``)},
			outcome: "rollback_failed", attempts: 1, status: 403, batch: 500},
		{name: "404 on the DELETE counts as undone", retries: 3, answers: []answer{reply(404, ``)},
			outcome: "rolled_back", attempts: 1, status: 404, batch: 409},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake().on("POST", "/widgets", answer{}, reply(409, `{}`)).on("DELETE", "/widgets/1000", tt.answers...)
			s := settings(func(s *policy.Settings) {
				s.CompensationRetries = tt.retries
				s.CompensationTimeout = 50 * time.Millisecond
			})
			res := run1(t, "POST", "/widgets", elements(2), f, concurrency(1), s)
			w := write(t, res)
			equal(t, "item outcome", w.Items[0].Outcome, tt.outcome)
			c := w.Items[0].Compensation
			if c == nil {
				t.Fatal("no compensation reported")
			}
			equal(t, "attempts", c.Attempts, tt.attempts)
			equal(t, "compensation status", c.Status, tt.status)
			equal(t, "DELETEs sent", len(f.sentWith("DELETE")), tt.attempts)
			equal(t, "Result.Compensations", res.Compensations, tt.attempts)
			equal(t, "batch status", w.Code, tt.batch)
			if tt.outcome == "rollback_failed" {
				equal(t, "batch outcome", w.Outcome, "rollback_failed")
				if len(res.LeftBehind) != 1 || !strings.HasPrefix(res.LeftBehind[0], `item 0 (id "1000"): `) {
					t.Errorf("LeftBehind = %q, want item 0 with its reason", res.LeftBehind)
				}
				if !strings.Contains(w.Detail, `item 0 (id "1000")`) {
					t.Errorf("detail %q does not name the item left behind", w.Detail)
				}
				if c.Error == "" {
					t.Error("a failed compensation has no error")
				}
			} else {
				equal(t, "batch outcome", w.Outcome, "rolled_back")
				if len(res.LeftBehind) != 0 {
					t.Errorf("LeftBehind = %q", res.LeftBehind)
				}
			}
		})
	}
}

// Every compensation carries an Idempotency-Key of its own, distinct from
// every item's; its retries carry the same key (they are the same request).
func TestCompensationIdempotencyKeys(t *testing.T) {
	t.Parallel()
	f := newFake().on("POST", "/widgets", answer{}, answer{}, reply(409, `{}`)).
		on("DELETE", "/widgets/1001", reply(503, ``), reply(204, ``))
	run1(t, "POST", "/widgets", elements(3), f, concurrency(1), settings(func(s *policy.Settings) { s.CompensationRetries = 1 }))
	itemKeys := map[string]bool{}
	for _, c := range f.sentWith("POST") {
		itemKeys[c.Header.Get("Idempotency-Key")] = true
	}
	deletes := f.sentWith("DELETE")
	equalSlices(t, "compensations", pathsOf(deletes), []string{"/widgets/1001", "/widgets/1001", "/widgets/1000"})
	if len(deletes) != 3 {
		t.FailNow()
	}
	k0, k0retry, k1 := deletes[0].Header.Get("Idempotency-Key"), deletes[1].Header.Get("Idempotency-Key"), deletes[2].Header.Get("Idempotency-Key")
	for _, k := range []string{k0, k1} {
		if k == "" || itemKeys[k] {
			t.Errorf("compensation key %q is empty or an item's (%v)", k, itemKeys)
		}
	}
	if k0 == k1 {
		t.Errorf("two compensations share the key %q", k0)
	}
	equal(t, "retry's key", k0retry, k0)
}

// Compensation runs detached from the client: a client that goes away
// while a write is in flight does not cut that write, nothing new starts,
// and what happened is undone.
func TestClientGoneStillUndoes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f := newFake().on("POST", "/widgets", answer{}, answer{hook: func(context.Context, *SubRequest) {
			cancel()
			// The engine learns of the cancellation through context.AfterFunc,
			// which runs in a goroutine of its own and offers no hook; in the
			// bubble, this sleep ends only once that goroutine has run.
			time.Sleep(50 * time.Millisecond)
		}})
		res := runCtx(ctx, mustPlan(t, newRequest("POST", "/widgets", elements(4)), concurrency(1)), f)
		w := write(t, res)
		posts := f.sentWith("POST")
		equal(t, "POSTs sent", len(posts), 2)
		for _, c := range posts {
			if c.CtxErr != nil {
				t.Errorf("an in-flight write was cancelled: %v", c.CtxErr)
			}
		}
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "not_attempted", "not_attempted"})
		equalSlices(t, "statuses", w.Statuses(), []int{201, 201, 0, 0})
		equalSlices(t, "compensations", pathsOf(f.sentWith("DELETE")), []string{"/widgets/1001", "/widgets/1000"})
		for _, c := range f.sentWith("DELETE") {
			if c.CtxErr != nil {
				t.Errorf("compensation ran under the client's cancelled context: %v", c.CtxErr)
			}
		}
		equal(t, "outcome", w.Outcome, "rolled_back")
		equal(t, "store after", len(f.state()), 0)
		// The contract says nothing of the status of a batch whose client
		// left; the engine answers 499, Caddy's code for it (no one reads it).
		equal(t, "status", w.Code, 499)
	})
}

func TestDeclarativeDelete(t *testing.T) {
	t.Parallel()
	t.Run("partial: a DELETE answered 404 succeeded with 204", func(t *testing.T) {
		f := newFake().seed("1")
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,9", "", f, partial, declarative))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 204})
		equal(t, "status", w.Code, 200)
		if w.Items[1].Body != nil {
			t.Errorf("the 404's body is kept: %s", w.Items[1].Body)
		}
	})
	t.Run("partial imperative: the 404 stands", func(t *testing.T) {
		f := newFake().seed("1")
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,9", "", f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "failed"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 404})
		equal(t, "status", w.Code, 207)
	})
	t.Run("all_or_nothing: a missing target is not deleted", func(t *testing.T) {
		f := newFake().seed("1", "2")
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,9,2", "", f, declarative, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/9", "GET /widgets/2", "DELETE /widgets/1", "DELETE /widgets/2"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded", "succeeded"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 204, 204})
		equal(t, "status", w.Code, 200)
		equal(t, "outcome", w.Outcome, "succeeded")
	})
	t.Run("all_or_nothing: a DELETE answered 404 is not compensated", func(t *testing.T) {
		f := newFake().seed("1", "2", "3").
			on("DELETE", "/widgets/2", reply(404, `{}`)).
			on("DELETE", "/widgets/3", reply(500, `{}`))
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2,3", "", f, declarative, concurrency(1)))
		equalSlices(t, "compensations", withoutReads(f.sent()[6:]), []string{"PUT /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "succeeded", "failed"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 204, 500})
		equal(t, "status", w.Code, 502)
	})
}
