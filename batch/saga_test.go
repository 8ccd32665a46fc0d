package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/policy"
)

// ---------------------------------------------------------------------
// Order and concurrency.

// Items come back in request order, index 0..n-1, whatever order the
// upstream answers in.
func TestItemsInRequestOrder(t *testing.T) {
	const n = 24
	for attempt := range 15 {
		f := newFake()
		f.jitter = 2 * time.Millisecond
		var want []string
		for i := range n {
			if i%3 != 0 { // every third id is missing: failures in the mix
				f.seed(fmt.Sprint(i))
			}
			want = append(want, fmt.Sprint(i))
		}
		w := write(t, runCtx(context.Background(), mustPlan(t, newRequest("GET", "/widgets?ids="+ids(n, 0), ""), partial), f))
		w.checkIndices(t, n)
		equalSlices(t, fmt.Sprintf("run %d: ids", attempt), w.IDs(), want)
		for i, it := range w.Items {
			wantStatus := 200
			if i%3 == 0 {
				wantStatus = 404
			}
			if it.Status != wantStatus {
				t.Fatalf("run %d: items[%d].status = %d, want %d", attempt, i, it.Status, wantStatus)
			}
			if wantStatus == 200 && !strings.Contains(string(it.Body), fmt.Sprintf(`"id":"%d"`, i)) {
				t.Fatalf("run %d: items[%d].body = %s", attempt, i, it.Body)
			}
		}
	}
	for attempt := range 10 {
		f := newFake()
		f.jitter = 2 * time.Millisecond
		w := write(t, run1(t, "POST", "/widgets", elements(n), f, partial))
		w.checkIndices(t, n)
		for i, it := range w.Items {
			var body struct{ Name string }
			if err := json.Unmarshal(it.Body, &body); err != nil || body.Name != fmt.Sprintf("w%d", i) {
				t.Fatalf("run %d: items[%d] is the answer to another element: %s", attempt, i, it.Body)
			}
			if !strings.HasSuffix(it.Headers["Location"], "/"+it.ID) {
				t.Fatalf("run %d: items[%d] id %q, Location %q", attempt, i, it.ID, it.Headers["Location"])
			}
		}
	}
}

func run1(t testing.TB, method, target, body string, f *fakeAPI, mods ...specMod) *Result {
	t.Helper()
	return run(mustPlan(t, newRequest(method, target, body), mods...), f)
}

// At most concurrency sub-requests are in flight, in every phase.
func TestConcurrencyBound(t *testing.T) {
	t.Run("batch GET reaches and never passes the bound", func(t *testing.T) {
		f := newFake()
		f.jitter = time.Millisecond
		arrived, release := make(chan struct{}), make(chan struct{})
		hold := answer{hook: func(context.Context, *SubRequest) { arrived <- struct{}{}; <-release }}
		for i := range 20 {
			f.seed(fmt.Sprint(i))
		}
		f.on("GET", "/widgets/0", hold).on("GET", "/widgets/1", hold).on("GET", "/widgets/2", hold)
		go func() {
			defer close(release)
			for range 3 {
				select {
				case <-arrived:
				case <-time.After(5 * time.Second):
					t.Error("three sub-requests were never in flight together")
					return
				}
			}
		}()
		w := write(t, run1(t, "GET", "/widgets?ids="+ids(20, 0), "", f, concurrency(3)))
		equal(t, "outcome", w.Outcome, "succeeded")
		equal(t, "max in flight", f.maxConcurrent(), 3)
		equal(t, "sub-requests", len(f.log()), 20)
	})
	t.Run("preflight and writes", func(t *testing.T) {
		f := newFake()
		f.jitter = time.Millisecond
		var body []string
		for i := range 20 {
			f.seed(fmt.Sprint(i))
			body = append(body, fmt.Sprintf(`{"id":"%d","v":1}`, i))
		}
		w := write(t, run1(t, "PATCH", "/widgets", "["+strings.Join(body, ",")+"]", f, concurrency(3)))
		equal(t, "outcome", w.Outcome, "succeeded")
		if got := f.maxConcurrent(); got > 3 || got < 1 {
			t.Errorf("max in flight = %d, want 1..3", got)
		}
		equal(t, "sub-requests", len(f.log()), 40)
	})
}

// ---------------------------------------------------------------------
// All-or-nothing execution (docs/all-or-nothing.md).

// After the first failure nothing new starts; the rest are not_attempted
// and never sent.
func TestAllOrNothingStartsNothingAfterFailure(t *testing.T) {
	f := newFake().on("POST", "/widgets", answer{}, answer{}, reply(409, `{"error":"dup"}`))
	w := write(t, run1(t, "POST", "/widgets", elements(5), f, concurrency(1)))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "failed", "not_attempted", "not_attempted"})
	equal(t, "POSTs sent", len(f.sentWith("POST")), 3)
	equalSlices(t, "sent", f.sent(), []string{
		"POST /widgets", "POST /widgets", "POST /widgets",
		"GET /widgets/1001", "DELETE /widgets/1001", "GET /widgets/1000", "DELETE /widgets/1000",
	})
	equal(t, "status", w.Code, 409)
	equal(t, "store after", len(f.state()), 0)
}

// Items already in flight when another fails are let finish, and then
// undone.
func TestAllOrNothingLetsInFlightFinish(t *testing.T) {
	f := newFake().seed("1", "2", "3")
	arrived, failed := make(chan struct{}, 2), make(chan struct{})
	inFlight := answer{hook: func(context.Context, *SubRequest) { arrived <- struct{}{}; <-failed }}
	f.on("PATCH", "/widgets/2", inFlight).on("PATCH", "/widgets/3", inFlight)
	f.on("PATCH", "/widgets/1", answer{status: 409, body: `{}`, hook: func(context.Context, *SubRequest) {
		<-arrived
		<-arrived
		close(failed)
	}})
	before := f.state()
	w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2},{"id":"3","v":3}]`, f, concurrency(3)))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "rolled_back", "rolled_back"})
	equalSlices(t, "statuses", w.Statuses(), []int{409, 200, 200})
	for _, c := range f.sentWith("PATCH") {
		if c.CtxErr != nil {
			t.Errorf("%s was cancelled while in flight: %v", c, c.CtxErr)
		}
	}
	equal(t, "status", w.Code, 409)
	// The undos run in parallel (concurrency 3): their order is free.
	equalSlices(t, "compensations", slices.Sorted(slices.Values(pathsOf(f.sentWith("PUT")))), []string{"/widgets/2", "/widgets/3"})
	f.checkUnchanged(t, before)
}

// ---------------------------------------------------------------------
// Compensation (docs/all-or-nothing.md).

// Compensations run in reverse order of start (concurrency 1: index order).
func TestCompensationReverseStartOrder(t *testing.T) {
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFake().on("POST", "/widgets", answer{}, answer{hook: func(context.Context, *SubRequest) {
		cancel()
		// The engine learns of the cancellation through context.AfterFunc,
		// which runs in a goroutine of its own and offers no hook; give it
		// a moment before this in-flight write answers.
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
}

// ---------------------------------------------------------------------
// Preflight (docs/all-or-nothing.md).

func TestPreflight(t *testing.T) {
	tests := []struct {
		name, method, target, body string
		mods                       []specMod
		fake                       func() *fakeAPI
		status                     int
		items                      []string
		detail                     []string
	}{
		{name: "update, a target missing", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`,
			fake:   func() *fakeAPI { return newFake().seed("1", "3") },
			status: 404, items: []string{"not_attempted", "failed", "not_attempted"}, detail: []string{"item 1", `"2"`, "404"}},
		{name: "delete, a target missing", method: "DELETE", target: "/widgets?ids=1,2,3",
			fake:   func() *fakeAPI { return newFake().seed("1", "3") },
			status: 404, items: []string{"not_attempted", "failed", "not_attempted"}, detail: []string{"item 1", `"2"`}},
		{name: "delete, the first by index of two missing", method: "DELETE", target: "/widgets?ids=1,2,3", mods: []specMod{concurrency(3)},
			fake: func() *fakeAPI {
				second := make(chan struct{})
				return newFake().seed("1").
					on("GET", "/widgets/2", answer{status: 410, body: `{}`, hook: func(context.Context, *SubRequest) { <-second }}).
					on("GET", "/widgets/3", answer{status: 404, body: `{}`, hook: func(context.Context, *SubRequest) { close(second) }})
			},
			status: 410, items: []string{"not_attempted", "failed", "failed"}, detail: []string{"item 1"}},
		{name: "update, a pre-image that is a JSON array", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", reply(200, `[1,2]`)) },
			status: 502, items: []string{"not_attempted", "failed"}, detail: []string{"item 1", "JSON object"}},
		{name: "update, a pre-image that is a JSON object but not UTF-8", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			fake: func() *fakeAPI {
				return newFake().seed("1").on("GET", "/widgets/2", reply(200, "{\"name\":\"\xff\"}"))
			},
			status: 502, items: []string{"not_attempted", "failed"}, detail: []string{"item 1", "JSON object"}},
		{name: "delete, a pre-image that is HTML", method: "DELETE", target: "/widgets?ids=1,2",
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", reply(200, `<html>ok</html>`)) },
			status: 502, items: []string{"not_attempted", "failed"}, detail: []string{"item 1"}},
		{name: "update, a pre-image read fails with 500", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", reply(500, `boom`)) },
			status: 502, items: []string{"not_attempted", "failed"}},
		{name: "update, a pre-image read times out", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			mods:   []specMod{itemTimeout(50 * time.Millisecond)},
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", answer{hang: true}) },
			status: 504, items: []string{"not_attempted", "failed"}},
		{name: "delete, a pre-image read unanswered", method: "DELETE", target: "/widgets?ids=1,2",
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", answer{err: errLost}) },
			status: 502, items: []string{"not_attempted", "failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake()
			before := f.state()
			w := write(t, run1(t, tt.method, tt.target, tt.body, f, tt.mods...))
			for _, c := range f.log() {
				if c.Method != "GET" {
					t.Errorf("%s was sent, but a failed preflight must stop the batch before any write", c)
				}
				if c.Header.Get("Idempotency-Key") != "" {
					t.Errorf("preflight %s carries an Idempotency-Key", c)
				}
			}
			equal(t, "status", w.Code, tt.status)
			equal(t, "outcome", w.Outcome, "failed")
			equal(t, "Content-Type", w.ContentType, "application/problem+json")
			equalSlices(t, "outcomes", w.Outcomes(), tt.items)
			for _, s := range tt.detail {
				if !strings.Contains(w.Detail, s) {
					t.Errorf("detail %q does not contain %q", w.Detail, s)
				}
			}
			f.checkUnchanged(t, before)
		})
	}
}

// Every target is read before the first write; partial mode reads none.
func TestPreflightOrder(t *testing.T) {
	for _, tt := range []struct {
		name, method, target, body string
		write                      string
	}{
		{"update", "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1},{"id":"4","v":1}]`, "PATCH"},
		{"delete", "DELETE", "/widgets?ids=1,2,3,4", "", "DELETE"},
	} {
		t.Run(tt.name+", all_or_nothing", func(t *testing.T) {
			f := newFake().seed("1", "2", "3", "4")
			f.jitter = time.Millisecond
			w := write(t, run1(t, tt.method, tt.target, tt.body, f))
			equal(t, "outcome", w.Outcome, "succeeded")
			log := f.log()
			firstWrite := slices.IndexFunc(log, func(c call) bool { return c.Method != "GET" })
			gets := pathsOf(log[:firstWrite])
			slices.Sort(gets)
			equalSlices(t, "reads before the first write", gets, []string{"/widgets/1", "/widgets/2", "/widgets/3", "/widgets/4"})
			for _, c := range log[firstWrite:] {
				if c.Method != tt.write {
					t.Errorf("%s after the first write", c)
				}
			}
		})
		t.Run(tt.name+", partial", func(t *testing.T) {
			f := newFake().seed("1", "2", "3", "4")
			w := write(t, run1(t, tt.method, tt.target, tt.body, f, partial))
			equal(t, "outcome", w.Outcome, "succeeded")
			for _, c := range f.log() {
				if c.Method != tt.write {
					t.Errorf("partial mode sent %s", c)
				}
			}
			equal(t, "sub-requests", len(f.log()), 4)
		})
	}
}

// ---------------------------------------------------------------------
// unknown: sent, but no answer came.

func TestUnknown(t *testing.T) {
	t.Run("partial: no answer is 502, a hang past item_timeout is 504", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{err: errLost}, answer{hang: true}, answer{})
		w := write(t, run1(t, "POST", "/widgets", elements(3), f, partial, concurrency(1), itemTimeout(50*time.Millisecond)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"unknown", "unknown", "succeeded"})
		equalSlices(t, "statuses", w.Statuses(), []int{502, 504, 201})
		equal(t, "status", w.Code, 207)
		equal(t, "outcome", w.Outcome, "partial")
		equal(t, "sub-requests", len(f.log()), 3)
		for _, it := range w.Items[:2] {
			if it.Error == "" {
				t.Errorf("item %d: unknown without an error", it.Index)
			}
			if strings.Contains(it.Error, "connection reset") {
				t.Errorf("item %d: the client is told the raw transport error %q", it.Index, it.Error)
			}
		}
	})
	t.Run("an unknown update is compensated", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/2", answer{effectThenErr: errLost})
		before := f.state()
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back"})
		equalSlices(t, "statuses", w.Statuses(), []int{200, 502})
		equalSlices(t, "compensations", pathsOf(f.sentWith("PUT")), []string{"/widgets/2", "/widgets/1"})
		equal(t, "status", w.Code, 502)
		equal(t, "outcome", w.Outcome, "rolled_back")
		f.checkUnchanged(t, before)
	})
	t.Run("an unknown delete is re-created (restore_deleted put)", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", answer{effectThenErr: errLost})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		// The read that learns the delete happened is the re-create's proof.
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1", "PUT /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
		equal(t, "status", w.Code, 502)
		f.checkUnchanged(t, before)
	})
	t.Run("restore_deleted post: an unknown delete that did not happen is probed, not re-created", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", answer{err: errLost})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), restoreByPost))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1"})
		// The item's own write failed and did not take effect: nothing
		// was changed.
		equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "not_attempted"})
		equal(t, "status", w.Code, 502)
		equal(t, "outcome", w.Outcome, "failed")
		if !strings.Contains(w.Items[0].Error, "did not take effect") {
			t.Errorf("item 0's error %q does not say the read showed no effect", w.Items[0].Error)
		}
		f.checkUnchanged(t, before)
	})
	t.Run("restore_deleted post: an unknown delete that happened is re-created", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", answer{effectThenErr: errLost})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), restoreByPost))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1", "POST /widgets"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
		f.checkUnchanged(t, before)
	})
	t.Run("an unknown create whose element has an id is deleted", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{effectThenErr: errLost})
		w := write(t, run1(t, "POST", "/widgets", `[{"id":"e1","name":"a"}]`, f))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/e1", "POST /widgets", "GET /widgets/e1", "DELETE /widgets/e1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back"})
		equal(t, "status", w.Code, 502)
		equal(t, "store after", len(f.state()), 0)
	})
	t.Run("an unknown create with no id: rollback_failed", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{effectThenErr: errLost}, answer{})
		res := run1(t, "POST", "/widgets", elements(3), f, concurrency(1))
		w := write(t, res)
		equalSlices(t, "sent", f.sent(), []string{"POST /widgets", "POST /widgets", "GET /widgets/1000", "DELETE /widgets/1000"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rollback_failed", "not_attempted"})
		equal(t, "status", w.Code, 500)
		equal(t, "outcome", w.Outcome, "rollback_failed")
		if len(res.LeftBehind) != 1 || !strings.HasPrefix(res.LeftBehind[0], "item 1: ") || !strings.Contains(res.LeftBehind[0], "cannot be learned") {
			t.Errorf("LeftBehind = %q, want item 1 and why", res.LeftBehind)
		}
		if !strings.Contains(w.Detail, "item 1") {
			t.Errorf("detail %q does not name item 1", w.Detail)
		}
	})
	t.Run("an update a proxy answered 502 after it was applied is read, and undone", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/2", answer{effectThenStatus: 502})
		before := f.state()
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "GET /widgets/2", "PUT /widgets/2", "GET /widgets/1", "PUT /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back"})
		equalSlices(t, "statuses", w.Statuses(), []int{200, 502})
		equal(t, "status", w.Code, 502)
		if !strings.Contains(w.Items[1].Error, "may have taken effect") {
			t.Errorf("item 1's error %q does not say the write may have taken effect", w.Items[1].Error)
		}
		f.checkUnchanged(t, before)
	})
	t.Run("a delete answered 504 that did not take effect is failed, after a read", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", reply(504, "<h1>Gateway Timeout</h1>"))
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "not_attempted"})
		equal(t, "status", w.Code, 504)
		equal(t, "outcome", w.Outcome, "failed")
		f.checkUnchanged(t, before)
	})
	t.Run("a create with no id a proxy answered 502: rollback_failed", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{effectThenStatus: 502})
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rollback_failed"})
		equal(t, "status", w.Code, 500)
	})
	t.Run("partial: a write answered 504 is unknown, and left", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/2", answer{effectThenStatus: 504})
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "unknown"})
		equal(t, "status", w.Code, 207)
		equal(t, "sub-requests", len(f.log()), 2)
	})
	t.Run("the upstream's own 500 and 503 are failures, not unknown", func(t *testing.T) {
		for _, status := range []int{500, 503} {
			f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(status, "down"))
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, concurrency(1)))
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
			equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "GET /widgets/1", "PUT /widgets/1"})
		}
	})
	t.Run("a read answered 502 is failed, not unknown", func(t *testing.T) {
		f := newFake().seed("1", "2").on("GET", "/widgets/2", reply(502, "<h1>Bad Gateway</h1>"))
		w := write(t, run1(t, "GET", "/widgets?ids=1,2", "", f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "failed"})
	})
	t.Run("ErrNotSent is failed, not unknown, and not compensated", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{err: notSent()})
		w := write(t, run1(t, "POST", "/widgets", `[{"name":"a"},{"id":"b","name":"b"},{"name":"c"}]`, f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/b", "POST /widgets", "POST /widgets", "GET /widgets/1000", "DELETE /widgets/1000"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed", "not_attempted"})
		equalSlices(t, "statuses", w.Statuses(), []int{201, 502, 0})
		equal(t, "status", w.Code, 502)
		if strings.Contains(w.Items[1].Error, "10.0.0.1") {
			t.Errorf("the client is told an internal address: %q", w.Items[1].Error)
		}
	})
	t.Run("ErrNotSent in partial mode", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/2", answer{err: notSent()})
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "failed"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 502})
		equal(t, "status", w.Code, 207)
	})
}

// TestResentWrite holds the engine to what a resent write means: the
// answer is to the second copy, and the first may have done the work.
func TestResentWrite(t *testing.T) {
	t.Run("a resent delete answered 404 is unknown, and undone", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/2", answer{resent: true})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 404})
		equal(t, "outcome", w.Outcome, "rolled_back")
		if !strings.Contains(w.Items[1].Error, "sent twice") {
			t.Errorf("item 1 error %q does not say it was sent twice", w.Items[1].Error)
		}
		f.checkUnchanged(t, before)
	})
	t.Run("declarative: a resent delete answered 404 succeeds, and is undone with the batch", func(t *testing.T) {
		f := newFake().seed("1", "2", "3").
			on("DELETE", "/widgets/1", answer{resent: true}).
			on("DELETE", "/widgets/3", reply(500, "down"))
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2,3", "", f, concurrency(1), declarative))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "failed"})
		equalSlices(t, "compensations", pathsOf(f.sentWith("PUT")), []string{"/widgets/2", "/widgets/1"})
		f.checkUnchanged(t, before)
	})
	t.Run("a resent write answered 2xx stands", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/1", answer{resent: true})
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded"})
		equal(t, "status", w.Code, 200)
	})
}

// ---------------------------------------------------------------------
// batch_timeout.

func TestBatchTimeout(t *testing.T) {
	bt := batchTimeout(100 * time.Millisecond)
	t.Run("all_or_nothing create: the deadline stops new starts, not a write in flight", func(t *testing.T) {
		// The first item's answer comes after batch_timeout passed: it is
		// let finish, and undone; nothing new starts.
		for attempt := range 5 {
			f := newFake().on("POST", "/widgets", answer{delay: 60 * time.Millisecond}, answer{})
			res := run1(t, "POST", "/widgets", elements(3), f, concurrency(1), batchTimeout(20*time.Millisecond))
			w := write(t, res)
			equalSlices(t, "sent", f.sent(), []string{"POST /widgets", "GET /widgets/1000", "DELETE /widgets/1000"})
			if c := f.sentWith("POST")[0]; c.CtxErr != nil {
				t.Errorf("the write in flight was cut: %v", c.CtxErr)
			}
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted", "not_attempted"})
			equal(t, "outcome", w.Outcome, "rolled_back")
			if w.Code != 504 || !strings.Contains(w.Detail, "batch_timeout") {
				t.Fatalf("run %d: status %d, detail %q; want 504 and a detail that says batch_timeout", attempt, w.Code, w.Detail)
			}
		}
	})
	t.Run("all_or_nothing create: a write in flight runs to item_timeout, not batch_timeout", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{hang: true})
		start := time.Now()
		w := write(t, run1(t, "POST", "/widgets", `[{"name":"a"},{"id":"b"},{"name":"c"}]`, f, concurrency(1), bt, itemTimeout(300*time.Millisecond)))
		if took := time.Since(start); took < 300*time.Millisecond {
			t.Errorf("the hanging write was cut after %s, before its item_timeout", took)
		}
		// Item 1's id was checked free before anything was written, and
		// read after: nothing is there, but only its element named that
		// id, so what the create made, if anything, may be elsewhere.
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/b", "POST /widgets", "POST /widgets", "GET /widgets/b", "GET /widgets/1000", "DELETE /widgets/1000"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rollback_failed", "not_attempted"})
		equalSlices(t, "statuses", w.Statuses(), []int{201, 504, 0})
		if !strings.Contains(w.Items[1].Error, "item_timeout") {
			t.Errorf("item 1's error %q does not name item_timeout", w.Items[1].Error)
		}
		if c := w.Items[1].Compensation; c == nil || !strings.Contains(c.Error, "an id of its own") {
			t.Errorf("item 1's compensation %+v does not say the item may be elsewhere", c)
		}
		equal(t, "status", w.Code, 500)
	})
	t.Run("all_or_nothing update: batch_timeout during the preflight", func(t *testing.T) {
		f := newFake().seed("1", "2").on("GET", "/widgets/1", answer{lateAnswer: true})
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1), bt))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"not_attempted", "not_attempted"})
		equal(t, "status", w.Code, 504)
		equal(t, "outcome", w.Outcome, "failed")
	})
	t.Run("all_or_nothing GET", func(t *testing.T) {
		f := newFake().seed("1", "2", "3").on("GET", "/widgets/1", answer{lateAnswer: true})
		w := write(t, run1(t, "GET", "/widgets?ids=1,2,3", "", f, concurrency(1), bt))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "not_attempted", "not_attempted"})
		equal(t, "status", w.Code, 504)
		equal(t, "outcome", w.Outcome, "failed")
	})
	t.Run("partial GET", func(t *testing.T) {
		// The status table has no row for a partial batch cut short by
		// batch_timeout; the engine answers 207 with the items not started
		// as not_attempted.
		f := newFake().seed("1", "2", "3").on("GET", "/widgets/1", answer{lateAnswer: true})
		w := write(t, run1(t, "GET", "/widgets?ids=1,2,3", "", f, concurrency(1), bt, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "not_attempted", "not_attempted"})
		equal(t, "status", w.Code, 207)
		equal(t, "outcome", w.Outcome, "partial")
	})
}

// ---------------------------------------------------------------------
// delete_semantics declarative.

func TestDeclarativeDelete(t *testing.T) {
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

// An answer whose body could not be read whole keeps its status.
func TestStatusStandsWhenTheBodyIsCut(t *testing.T) {
	cut := errors.New("unexpected EOF")
	t.Run("a read", func(t *testing.T) {
		f := newFake().on("GET", "/widgets/1", answer{status: 200, body: `{"id":"1","na`, readErr: cut})
		w := write(t, run1(t, "GET", "/widgets?ids=1", "", f))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded"})
		equalSlices(t, "statuses", w.Statuses(), []int{200})
		if w.Items[0].Error == "" {
			t.Error("the cut body is not reported")
		}
	})
	t.Run("a write that took effect is undone", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{status: 201, body: `{"id":"5"`, header: http.Header{"Location": {"/widgets/5"}}, readErr: cut}, reply(409, `{}`)).
			on("GET", "/widgets/5", reply(200, `{"id":"5","name":"w0"}`))
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
		equalSlices(t, "compensations", pathsOf(f.sentWith("DELETE")), []string{"/widgets/5"})
	})
}

// A sender may change the header of the request it is given: no other
// sub-request, and no retry, sees the change.
func TestSenderMayChangeTheHeader(t *testing.T) {
	mutate := func(_ context.Context, req *SubRequest) {
		req.Header.Set("Authorization", "changed")
		req.Header.Set("X-Mutated", "1")
		req.Header.Del("Idempotency-Key")
	}
	f := newFake().seed("1", "2", "3").
		on("GET", "/widgets/1", answer{hook: mutate}).
		on("PATCH", "/widgets/1", answer{hook: mutate}).
		on("PATCH", "/widgets/3", reply(409, `{}`)).
		on("PUT", "/widgets/2", answer{status: 503, hook: mutate}, answer{})
	run(mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`, "Authorization", "Bearer a"), concurrency(1)), f)
	equalSlices(t, "sent", f.sent(), []string{
		"GET /widgets/1", "GET /widgets/2", "GET /widgets/3", "PATCH /widgets/1", "PATCH /widgets/2", "PATCH /widgets/3",
		"GET /widgets/2", "PUT /widgets/2", "PUT /widgets/2", "GET /widgets/1", "PUT /widgets/1",
	})
	log := f.log()
	for _, c := range log {
		if c.Header.Get("Authorization") != "Bearer a" || c.Header.Get("X-Mutated") != "" {
			t.Errorf("%s saw another request's change: %v", c, c.Header)
		}
		if c.Method != "GET" && c.Header.Get("Idempotency-Key") == "" {
			t.Errorf("%s lost its Idempotency-Key to another request's change", c)
		}
	}
}

// Every sub-request, the saga's reads and compensations included, keeps
// the client context's values (the Caddy glue finds its server, replacer
// and vars there).
func TestSubRequestsKeepContextValues(t *testing.T) {
	ctx := context.WithValue(context.Background(), ctxKey{}, "client")
	f := newFake().seed("1", "2").on("DELETE", "/widgets/2", reply(500, ``))
	runCtx(ctx, mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), concurrency(1)), f)
	equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "DELETE /widgets/2", "GET /widgets/1", "PUT /widgets/1"})
	for _, c := range f.log() {
		if c.CtxValue != "client" {
			t.Errorf("%s: context value %v", c, c.CtxValue)
		}
	}
}
