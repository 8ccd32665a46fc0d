package batch

// A batch's run as a whole: items in request order, the concurrency
// bound, all-or-nothing's stop after a failure, batch_timeout, and what
// the engine asks of a Sender.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Items come back in request order, index 0..n-1, whatever order the
// upstream answers in.
func TestItemsInRequestOrder(t *testing.T) {
	t.Parallel()
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

// At most concurrency sub-requests are in flight, in every phase.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
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

// After the first failure nothing new starts; the rest are not_attempted
// and never sent.
func TestAllOrNothingStartsNothingAfterFailure(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

func TestBatchTimeout(t *testing.T) {
	t.Parallel()
	bt := batchTimeout(100 * time.Millisecond)
	t.Run("all_or_nothing create: the deadline stops new starts, not a write in flight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
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
	})
	t.Run("all_or_nothing create: a write in flight runs to item_timeout, not batch_timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
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
	})
	t.Run("all_or_nothing update: batch_timeout during the preflight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFake().seed("1", "2").on("GET", "/widgets/1", answer{lateAnswer: true})
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1), bt))
			equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1"})
			equalSlices(t, "outcomes", w.Outcomes(), []string{"not_attempted", "not_attempted"})
			equal(t, "status", w.Code, 504)
			equal(t, "outcome", w.Outcome, "failed")
		})
	})
	t.Run("all_or_nothing GET", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFake().seed("1", "2", "3").on("GET", "/widgets/1", answer{lateAnswer: true})
			w := write(t, run1(t, "GET", "/widgets?ids=1,2,3", "", f, concurrency(1), bt))
			equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1"})
			equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "not_attempted", "not_attempted"})
			equal(t, "status", w.Code, 504)
			equal(t, "outcome", w.Outcome, "failed")
		})
	})
	t.Run("partial GET", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The status table has no row for a partial batch cut short by
			// batch_timeout; the engine answers 207 with the items not started
			// as not_attempted.
			f := newFake().seed("1", "2", "3").on("GET", "/widgets/1", answer{lateAnswer: true})
			w := write(t, run1(t, "GET", "/widgets?ids=1,2,3", "", f, concurrency(1), bt, partial))
			equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "not_attempted", "not_attempted"})
			equal(t, "status", w.Code, 207)
			equal(t, "outcome", w.Outcome, "partial")
		})
	})
}

// An answer whose body could not be read whole keeps its status.
func TestStatusStandsWhenTheBodyIsCut(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
