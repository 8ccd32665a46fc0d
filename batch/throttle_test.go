package batch

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/slots"
	"github.com/caddy-batch/caddy-batch/policy"
)

// sendTimes keeps when each sub-request reached the fake, by "METHOD
// path", in order: what "never sooner than asked" is judged on.
type sendTimes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newSendTimes() *sendTimes { return &sendTimes{at: map[string][]time.Time{}} }

// stamp wraps an answer so that its request's arrival is kept.
func (s *sendTimes) stamp(a answer) answer {
	a.hook = func(_ context.Context, req *SubRequest) {
		s.mu.Lock()
		defer s.mu.Unlock()
		k := req.Method + " " + req.Path
		s.at[k] = append(s.at[k], time.Now())
	}
	return a
}

func (s *sendTimes) of(key string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at[key]...)
}

// throttle is a 429 answer that asks for a pause of one second.
func throttle() answer { return reply(429, `{"error":"slow down"}`, "Retry-After", "1") }

func maxThrottleWait(d time.Duration) specMod {
	return settings(func(s *policy.Settings) { s.MaxThrottleWait = d })
}

// runWith runs a plan with a runtime of the test's own (shared throttles,
// a client, slots).
func runWith(ctx context.Context, t testing.TB, r *http.Request, rt Runtime, mods ...specMod) *Result {
	t.Helper()
	return newBatchRun(mustPlan(t, r, mods...), rt, noBackoff).do(ctx)
}

// A 429 with Retry-After is sent again once the pause it asked for has
// passed, never sooner, and the batch succeeds.
func TestThrottledItemIsSentAgainAfterItsDelay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		times := newSendTimes()
		f := newFake().seed("1", "2")
		f.on("GET", "/widgets/1", times.stamp(throttle()), times.stamp(answer{}))
		res := run1(t, "GET", "/widgets?ids=1,2", "", f)
		w := write(t, res)
		equal(t, "batch status", w.Code, 200)
		equal(t, "item 0 status", w.Items[0].Status, 200)
		at := times.of("GET /widgets/1")
		if len(at) != 2 {
			t.Fatalf("GET /widgets/1 sent %d times, want 2 (the throttled one, then again)", len(at))
		}
		if gap := at[1].Sub(at[0]); gap < time.Second {
			t.Errorf("sent again %s after the 429, sooner than its Retry-After: 1", gap)
		}
	})
}

// A pause longer than the batch's deadline allows fails the item at
// once, not sent again, with the upstream's status and its Retry-After
// lifted; an all-or-nothing batch is undone, and its undo, within its own
// budget, waits for the pause too.
func TestThrottleBeyondTheDeadlineFailsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		times := newSendTimes()
		f := newFake().seed("1", "2")
		f.on("PATCH", "/widgets/2", times.stamp(reply(429, `{}`, "Retry-After", "2")))
		f.on("PUT", "/widgets/1", times.stamp(answer{}))
		res := run1(t, "PATCH", "/widgets", `[{"id":"1","name":"x"},{"id":"2","name":"y"}]`, f,
			concurrency(1), batchTimeout(time.Second))
		w := write(t, res)
		equal(t, "batch status", w.Code, 429)
		equal(t, "batch outcome", w.Outcome, "rolled_back")
		equal(t, "batch Retry-After", w.Header.Get("Retry-After"), "2")
		equal(t, "item 1 Retry-After", w.Items[1].Headers["Retry-After"], "2")
		equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 2) // item 2's once
		equal(t, "item 1 restored", f.state()["/widgets/1"], `{"color":"red","id":"1","name":"widget 1"}`)
		throttled, undo := times.of("PATCH /widgets/2"), times.of("PUT /widgets/1")
		if len(undo) != 1 || undo[0].Sub(throttled[0]) < 2*time.Second {
			t.Errorf("the undo was sent at %v, before the moment the 429 at %v asked for", undo, throttled)
		}
	})
}

// max_throttle_wait 0 keeps the old behaviour: a 429 fails its item.
func TestMaxThrottleWaitZeroFailsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	f.on("GET", "/widgets/1", throttle(), answer{})
	w := write(t, run1(t, "GET", "/widgets?ids=1", "", f, maxThrottleWait(0)))
	equal(t, "batch status", w.Code, 429)
	equal(t, "GETs sent", len(f.sentWith("GET")), 1)
}

// A 503 without Retry-After may be an outage, not a throttle: it fails
// as it always did. A 503 with one is waited out.
func TestServiceUnavailable(t *testing.T) {
	t.Parallel()
	t.Run("without Retry-After fails", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFake().seed("1")
			f.on("GET", "/widgets/1", reply(503, ``), answer{})
			w := write(t, run1(t, "GET", "/widgets?ids=1", "", f))
			equal(t, "batch status", w.Code, 502)
			equal(t, "GETs sent", len(f.sentWith("GET")), 1)
		})
	})
	t.Run("with Retry-After is sent again", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFake().seed("1")
			f.on("GET", "/widgets/1", reply(503, ``, "Retry-After", "1"), answer{})
			w := write(t, run1(t, "GET", "/widgets?ids=1", "", f))
			equal(t, "batch status", w.Code, 200)
			equal(t, "GETs sent", len(f.sentWith("GET")), 2)
		})
	})
}

// A POST answered 503 may have been processed half way: it goes again
// only to an upstream that honours Idempotency-Key, and with the same
// key. After a 429 it always goes again.
func TestThrottledCreate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		first      answer
		idempotent bool
		posts      int
		status     int
	}{
		{"503 without idempotent_upstream", reply(503, ``, "Retry-After", "1"), false, 1, 502},
		{"503 with idempotent_upstream", reply(503, ``, "Retry-After", "1"), true, 2, 201},
		{"429", throttle(), false, 2, 201},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFake()
				f.on("POST", "/widgets", tt.first, answer{})
				j := &recordingJournal{f: f}
				p := mustPlan(t, newRequest("POST", "/widgets", `[{"name":"a"}]`), settings(func(s *policy.Settings) { s.IdempotentUpstream = tt.idempotent }))
				res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
				w := write(t, res)
				equal(t, "batch status", w.Code, tt.status)
				posts := f.sentWith("POST")
				equal(t, "POSTs sent", len(posts), tt.posts)
				if len(posts) == 2 {
					equal(t, "the resend's Idempotency-Key", posts[1].Header.Get("Idempotency-Key"), posts[0].Header.Get("Idempotency-Key"))
				}
				// The journal sees one write and its last answer: no unknown.
				sending := 0
				for _, e := range j.events {
					if strings.HasPrefix(e, "sending") {
						sending++
					}
				}
				equal(t, "sending transitions", sending, 1)
				equal(t, "item outcome", w.Items[0].Outcome, map[bool]string{true: "succeeded", false: "failed"}[tt.status == 201])
			})
		})
	}
}

// While one item waits out a throttle, the same client's sub-requests to
// that resource in other batches wait too — the upstream sees none of
// them before the moment — and another client's go at once. The waiting
// item holds no slot of max_in_flight meanwhile.
func TestThrottleHoldsTheClientAcrossBatches(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		times := newSendTimes()
		f := newFake().seed("1", "2", "3")
		throttled := make(chan struct{})
		first := throttle()
		first.hook = func(context.Context, *SubRequest) { close(throttled) }
		f.on("GET", "/widgets/1", first, times.stamp(answer{}))
		f.on("GET", "/widgets/2", times.stamp(answer{}))
		f.on("GET", "/widgets/3", times.stamp(answer{}))
		throttles, fifo := NewThrottles(nil), slots.NewFIFO(1)
		var wg sync.WaitGroup
		var sameRes *Result
		wg.Go(func() {
			rt := Runtime{Send: f, Throttles: throttles, Client: "ada", Slots: fifo}
			equal(t, "throttled batch", write(t, runWith(context.Background(), t, newRequest("GET", "/widgets?ids=1", ""), rt)).Code, 200)
		})
		<-throttled
		// Until the first batch waits out its throttle, the hold is not
		// recorded yet.
		synctest.Wait()
		moment := time.Now().Add(time.Second)
		wg.Go(func() {
			rt := Runtime{Send: f, Throttles: throttles, Client: "ada", Slots: fifo}
			sameRes = runWith(context.Background(), t, newRequest("GET", "/widgets?ids=2", ""), rt)
		})
		// Another client's batch goes at once, through the one slot the
		// waiting item gave up.
		rt := Runtime{Send: f, Throttles: throttles, Client: "bob", Slots: fifo}
		equal(t, "another client's batch", write(t, runWith(context.Background(), t, newRequest("GET", "/widgets?ids=3", ""), rt)).Code, 200)
		if at := times.of("GET /widgets/3"); len(at) != 1 || !at[0].Before(moment.Add(-500*time.Millisecond)) {
			t.Errorf("another client's GET was sent at %v: it waited for a throttle that was not its own", at)
		}
		wg.Wait()
		equal(t, "the same client's other batch", write(t, sameRes).Code, 200)
		if at := times.of("GET /widgets/2"); len(at) != 1 || at[0].Before(moment.Add(-50*time.Millisecond)) {
			t.Errorf("the same client's GET was sent at %v, before the moment the upstream asked for (%v)", at, moment)
		}
	})
}

// A hold past another batch's deadline fails that batch's items at once,
// not sent, with the status and Retry-After of the answer that throttled
// the client.
func TestHeldPastTheDeadlineIsNotSent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake().seed("1", "2")
		throttles := NewThrottles(nil)
		throttles.hold("ada", "/widgets", throttleHold{until: time.Now().Add(3 * time.Second), delay: 3 * time.Second, status: 429, retryAfter: "3"}, time.Now())
		rt := Runtime{Send: f, Throttles: throttles, Client: "ada"}
		w := write(t, runWith(context.Background(), t, newRequest("GET", "/widgets?ids=1,2", ""), rt, batchTimeout(time.Second)))
		equal(t, "batch status", w.Code, 429)
		equal(t, "Retry-After", w.Header.Get("Retry-After"), "3")
		equal(t, "GETs sent", len(f.sentWith("GET")), 0)
		if !strings.Contains(w.Items[0].Error, "not sent") {
			t.Errorf("item error %q does not say the request was not sent", w.Items[0].Error)
		}
	})
}

// An undo waits for the throttle too, within its own budget, and the
// batch is rolled back.
func TestUndoWaitsForTheThrottle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		times := newSendTimes()
		f := newFake().on("POST", "/widgets", answer{}, reply(409, `{}`))
		f.on("DELETE", "/widgets/1000", times.stamp(throttle()), times.stamp(answer{}))
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equal(t, "batch outcome", w.Outcome, "rolled_back")
		equal(t, "item 0", w.Items[0].Outcome, "rolled_back")
		at := times.of("DELETE /widgets/1000")
		if len(at) != 2 || at[1].Sub(at[0]) < time.Second {
			t.Errorf("undo sent at %v: want twice, a second apart", at)
		}
	})
}

// A throttled LIST of the list filter is sent again after its delay, and
// never replaced by one GET per id.
func TestThrottledListIsSentAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake().seed("1", "2", "3")
		f.on("GET", "/widgets", throttle(), answer{})
		w := write(t, run1(t, "GET", "/widgets?ids=1,2,3", "", f, listFilter(policy.ListFilterSpec{})))
		equal(t, "batch status", w.Code, 200)
		equal(t, "LISTs sent", len(f.sentWith("GET")), 2)
		for _, c := range f.log() {
			if c.Path != "/widgets" {
				t.Errorf("%s sent: a throttled LIST fell back to single GETs", c)
			}
		}
	})
}

// A throttled LIST whose pause the batch cannot wait out fails the items
// it would have read at once, with its status and Retry-After, as
// throttled GETs do: one GET per id is the very load the API asked to
// be spared.
func TestThrottledListIsNeverReplacedByGets(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		answer     answer
		mods       []specMod
		status     int // each item's: the LIST's
		batch      int // the batch's: a 5xx of the upstream's is a 502
		retryAfter string
	}{
		{"a pause longer than max_throttle_wait", reply(429, `{"error":"slow down"}`, "Retry-After", "30"), nil, 429, 429, "30"},
		{"a 429 without Retry-After past the deadline", reply(429, `{}`), []specMod{batchTimeout(500 * time.Millisecond)}, 429, 429, ""},
		{"a 503 whose Retry-After is longer than max_throttle_wait", reply(503, ``, "Retry-After", "30"), nil, 503, 502, "30"},
		{"max_throttle_wait 0", throttle(), []specMod{maxThrottleWait(0)}, 429, 429, "1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFake().seed("1", "2", "3")
				before := f.state()
				f.on("GET", "/widgets", tt.answer)
				res := run1(t, "GET", "/widgets?ids=1,2,3", "", f, append(tt.mods, listFilter(policy.ListFilterSpec{}))...)
				w := write(t, res)
				equal(t, "batch status", w.Code, tt.batch)
				equal(t, "Retry-After", w.Header.Get("Retry-After"), tt.retryAfter)
				equalSlices(t, "statuses", w.Statuses(), []int{tt.status, tt.status, tt.status})
				equalSlices(t, "sent", f.sent(), []string{"GET /widgets"})
				equal(t, "fallbacks", res.ListFallbacks, 0)
				equal(t, "LISTs counted as failed (read one by one)", len(res.ListFailures), 0)
				if !strings.Contains(w.Items[0].Error, "throttled the LIST") {
					t.Errorf("item error %q does not say the LIST was throttled", w.Items[0].Error)
				}
				f.checkUnchanged(t, before)
			})
		})
	}
	t.Run("held past the deadline, the LIST is not sent", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFake().seed("1", "2")
			throttles := NewThrottles(nil)
			throttles.hold("ada", "/widgets", throttleHold{until: time.Now().Add(3 * time.Second), delay: 3 * time.Second, status: 429, retryAfter: "3"}, time.Now())
			rt := Runtime{Send: f, Throttles: throttles, Client: "ada"}
			w := write(t, runWith(context.Background(), t, newRequest("GET", "/widgets?ids=1,2", ""), rt, batchTimeout(time.Second), listFilter(policy.ListFilterSpec{})))
			equal(t, "batch status", w.Code, 429)
			equal(t, "Retry-After", w.Header.Get("Retry-After"), "3")
			equalSlices(t, "sent", f.sent(), nil)
			if !strings.Contains(w.Items[0].Error, "LIST") || !strings.Contains(w.Items[0].Error, "not sent") {
				t.Errorf("item error %q does not say the LIST was not sent", w.Items[0].Error)
			}
		})
	})
	t.Run("a preflight LIST fails the batch before anything is written", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFake().seed("1", "2", "3")
			before := f.state()
			f.on("GET", "/widgets", reply(429, `{}`, "Retry-After", "30"))
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2},{"id":"3","v":3}]`, f,
				listFilter(policy.ListFilterSpec{Preflight: true})))
			equal(t, "batch status", w.Code, 429)
			equal(t, "Retry-After", w.Header.Get("Retry-After"), "30")
			equalSlices(t, "sent", f.sent(), []string{"GET /widgets"})
			f.checkUnchanged(t, before)
		})
	})
}

// Held requests are released spread over up to a quarter of the pause
// (at most a second), never before the moment.
func TestThrottleReleaseIsJittered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		for _, d := range []time.Duration{0, 100 * time.Millisecond, time.Second, 10 * time.Second} {
			span := min(d/4, time.Second)
			seen := map[time.Duration]bool{}
			for range 200 {
				j := jitter(d)
				if j < 0 || (span > 0 && j >= span) || (span == 0 && j != 0) {
					t.Fatalf("jitter(%s) = %s, want within [0, %s)", d, j, span)
				}
				seen[j] = true
			}
			if span > 0 && len(seen) < 100 {
				t.Errorf("jitter(%s) took only %d values in 200 draws: held requests would go together", d, len(seen))
			}
		}
		throttles := NewThrottles(nil)
		moment := time.Now().Add(200 * time.Millisecond)
		throttles.hold("ada", "/widgets", throttleHold{until: moment, delay: 200 * time.Millisecond, status: 429, retryAfter: "1"}, time.Now())
		if _, err := throttles.wait(context.Background(), "ada", "/widgets"); err != nil || time.Now().Before(moment) {
			t.Errorf("wait returned %v at %v, before the moment %v", err, time.Now(), moment)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		throttles.hold("bob", "/widgets", throttleHold{until: time.Now().Add(time.Second), delay: time.Second, status: 429, retryAfter: "1"}, time.Now())
		var held *HeldBack
		if _, err := throttles.wait(ctx, "bob", "/widgets"); !errors.As(err, &held) || held.Status != 429 || held.RetryAfter != "1" {
			t.Errorf("a hold past the deadline: %v, want a HeldBack with 429 and Retry-After 1", err)
		}
	})
}

// A request of the same client's already waiting for the slot when the
// upstream throttles the client honours the hold too: it does not slip
// through the slot the throttled request gives up.
func TestThrottleHoldsARequestWaitingForASlot(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		times := newSendTimes()
		f := newFake().seed("1", "2")
		sent, answer := make(chan struct{}), make(chan struct{})
		first := throttle()
		first.hook = func(context.Context, *SubRequest) { close(sent); <-answer }
		f.on("GET", "/widgets/1", first, times.stamp(reply(200, `{"id":"1"}`)))
		f.on("GET", "/widgets/2", times.stamp(reply(200, `{"id":"2"}`)))
		throttles, fifo := NewThrottles(nil), slots.NewFIFO(1)
		rt := Runtime{Send: f, Throttles: throttles, Client: "ada", Slots: fifo}
		var wg sync.WaitGroup
		wg.Go(func() { runWith(context.Background(), t, newRequest("GET", "/widgets?ids=1", ""), rt) })
		<-sent
		wg.Go(func() { runWith(context.Background(), t, newRequest("GET", "/widgets?ids=2", ""), rt) })
		synctest.Wait() // the second batch waits for the slot the first holds
		moment := time.Now().Add(time.Second)
		close(answer)
		wg.Wait()
		if at := times.of("GET /widgets/2"); len(at) != 1 || at[0].Before(moment) {
			t.Errorf("the same client's GET was sent at %v, before the moment the upstream asked for (%v)", at, moment)
		}
	})
}

// observations are what a Runtime's Observer was told, in order: whether
// each attempt showed the upstream pushing back.
type observations struct {
	mu         sync.Mutex
	overloaded []bool
}

func (o *observations) Observe(_ time.Duration, overloaded bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.overloaded = append(o.overloaded, overloaded)
}

// A refusal of the request's credentials is not told to the Runtime's
// Observer: it says nothing of the API's pace (an authenticating handler
// after batch answers it in microseconds, and such answers held the
// adaptive limit at its least for every client).
func TestObserverNotToldCredentialRefusals(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	f.on("GET", "/widgets/1", reply(401, `{}`))
	o := &observations{}
	res := runWith(context.Background(), t, newRequest("GET", "/widgets?ids=1", ""), Runtime{Send: f, Observer: o})
	equal(t, "item 0 status", write(t, res).Items[0].Status, 401)
	equal(t, "attempts observed", len(o.overloaded), 0)
}

// The Runtime's Observer is told every attempt, a throttled one as the
// upstream pushing back, and the one sent again after it as not.
func TestObserverToldEveryAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake().seed("1")
		f.on("GET", "/widgets/1", throttle(), answer{})
		o := &observations{}
		res := runWith(context.Background(), t, newRequest("GET", "/widgets?ids=1", ""), Runtime{Send: f, Observer: o})
		equal(t, "item 0 status", write(t, res).Items[0].Status, 200)
		equalSlices(t, "overloaded, by attempt", o.overloaded, []bool{true, false})
	})
}
