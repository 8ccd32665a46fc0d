package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fencingJournal is a journal whose lease a test decides: Fence answers
// what lease says, for each write the saga asks about; AwaitEnd answers
// the new owner's end, once, as end says.
type fencingJournal struct {
	NoJournal
	mu     sync.Mutex
	fences int
	// lease answers the nth call of Fence (from 1).
	lease func(n int) error
	// end is how the new owner ended the saga; nil: it has not.
	end *Outcome
	// orphaned: the journal is gone, and no other instance took it over.
	orphaned bool
	kept     *Snapshot
	keptAs   *Result
	// keeps are how many items each KeepLost call kept, in order, with
	// the writes the upstream had seen at that moment.
	keeps []string
	f     *fakeAPI
}

func (j *fencingJournal) Fence(context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.fences++
	if j.lease == nil {
		return nil
	}
	return j.lease(j.fences)
}

func (j *fencingJournal) Saga() string { return "saga-1" }

func (j *fencingJournal) KeepLost(_ context.Context, _ string, snap *Snapshot, res *Result) (string, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil {
		j.keeps = append(j.keeps, fmt.Sprintf("%d left after %d PUTs", len(res.LeftBehind), len(j.f.sentWith("PUT"))))
	}
	if len(res.LeftBehind) == 0 {
		return "", nil
	}
	j.kept, j.keptAs = snap, res
	return "saga-2", nil
}

func (j *fencingJournal) AwaitEnd(context.Context) (bool, Outcome, []string, bool) {
	if j.end == nil {
		return false, "", nil, j.orphaned
	}
	return true, *j.end, nil, false
}

// lostAfter is a lease lost from the nth fence on, proven before.
func lostAfter(n int, proven time.Time) func(int) error {
	return func(i int) error {
		if i >= n {
			return &LeaseLost{Why: "another instance took the saga over (lease epoch 1)", Proven: proven}
		}
		return nil
	}
}

// A saga whose lease is lost at its third write sends no write after
// that; it is never answered succeeded; the new owner's rollback, once
// seen, is what its client is told (503: the gateway's own failure),
// with the saga named.
func TestLostLeaseSendsNothingMore(t *testing.T) {
	t.Parallel()
	rolledBack := RolledBack
	f := newFake().seed("1", "2", "3", "4")
	j := &fencingJournal{lease: lostAfter(3, time.Now().Add(time.Hour)), end: &rolledBack}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1},{"id":"4","v":1}]`), concurrency(1))
	res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	w := write(t, res)
	equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 2)
	equal(t, "PUTs sent (the new owner undoes)", len(f.sentWith("PUT")), 0)
	equal(t, "status", w.Code, http.StatusServiceUnavailable)
	equal(t, "outcome", w.Outcome, string(RolledBack))
	equal(t, "saga", w.Saga, "saga-1")
	if w.Header.Get("Retry-After") == "" || !res.LeaseLost {
		t.Errorf("Retry-After %q, LeaseLost %v", w.Header.Get("Retry-After"), res.LeaseLost)
	}
	for _, it := range w.Items {
		if it.Outcome == string(Succeeded) {
			t.Errorf("item %d told succeeded", it.Index)
		}
	}
}

// A lease lost after every write went, found by the last look before
// the answer, still keeps the client from hearing succeeded: the new
// owner has not ended the saga, so every item it touched is unknown and
// the answer is 503 naming the saga.
func TestLostLeaseFoundAtTheEnd(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	j := &fencingJournal{lease: lostAfter(3, time.Now().Add(time.Hour))}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background()))
	equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 2)
	equal(t, "status", w.Code, http.StatusServiceUnavailable)
	equal(t, "outcome", w.Outcome, string(Failed))
	for _, it := range w.Items {
		equal(t, "item outcome", it.Outcome, string(Unknown))
	}
	if !strings.Contains(w.Detail, "saga-1") {
		t.Errorf("detail %q does not name the saga", w.Detail)
	}
}

// What a saga that lost its lease wrote after its lease was last proven,
// the new owner may not know of: the saga undoes it itself, with the
// proof every undo has, and leaves the rest to the new owner (unknown).
// Where the item changed since (the new owner put it back, another writer
// changed it), the undo is not sent.
func TestLostLeaseUndoesItsOwnRecentWrites(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3")
	var proven time.Time
	f.on("PATCH", "/widgets/2", answer{hook: func(context.Context, *SubRequest) { proven = time.Now() }})
	j := &fencingJournal{lease: lostAfter(4, time.Time{})}
	j.lease = func(n int) error {
		if n >= 4 {
			return &LeaseLost{Why: "the saga's lease is gone from storage", Proven: proven}
		}
		return nil
	}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`), concurrency(1))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background()))
	// Widget 2's write came back after the last proof, widget 3's too:
	// both undone; widget 1's before it: the new owner's.
	state := f.state()
	if !strings.Contains(state["/widgets/1"], `"v":1`) || strings.Contains(state["/widgets/2"], `"v":1`) || strings.Contains(state["/widgets/3"], `"v":1`) {
		t.Errorf("store %v: want widget 1 as the batch wrote it (the new owner's to undo), 2 and 3 put back", state)
	}
	equal(t, "item 0", w.Items[0].Outcome, string(Unknown))
	equal(t, "item 1", w.Items[1].Outcome, string(RolledBack))
	equal(t, "item 2", w.Items[2].Outcome, string(RolledBack))
	equal(t, "status", w.Code, http.StatusServiceUnavailable)
	if j.kept != nil {
		t.Error("kept a saga of its own with nothing of its own left behind")
	}
}

// An undo that a saga that lost its lease cannot prove is kept, under a
// saga of its own linked to the lost one, and its client is told 500
// rollback_failed naming it.
func TestLostLeaseKeepsWhatItCouldNotUndo(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	f.on("PATCH", "/widgets/1", answer{}, answer{})
	// Another writer changes widget 1 after the batch's write.
	f.on("GET", "/widgets/1", answer{}, reply(200, `{"id":"1","v":"theirs"}`))
	j := &fencingJournal{lease: lostAfter(2, time.Time{})}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1}]`), concurrency(1))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background()))
	equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
	equal(t, "status", w.Code, http.StatusInternalServerError)
	equal(t, "outcome", w.Outcome, string(RollbackFailed))
	if j.kept == nil || !strings.Contains(w.Detail, "saga-2") {
		t.Errorf("kept %v; detail %q", j.kept != nil, w.Detail)
	}
}

// A lease unproven for a while (a storage blip) holds the write back
// until a renewal proves it again: nothing is lost, the batch succeeds.
func TestUnprovenLeaseWaits(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	var waited bool
	j := &fencingJournal{lease: func(n int) error {
		if n == 1 {
			waited = true // a fence that waits returns nil once proven
		}
		return nil
	}}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1}]`))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background()))
	equal(t, "status", w.Code, http.StatusOK)
	if !waited {
		t.Error("the write did not ask the lease")
	}
	// One that stays unproven past the batch's time fails its item,
	// with nothing sent, 503.
	f2 := newFake().seed("1")
	j2 := &fencingJournal{lease: func(int) error { return errors.Join(ErrLeaseUnproven, context.DeadlineExceeded) }}
	p2 := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1}]`))
	w2 := write(t, newBatchRun(p2, Runtime{Send: f2, Journal: j2}, noBackoff).do(context.Background()))
	equal(t, "PATCHes sent", len(f2.sentWith("PATCH")), 0)
	equal(t, "status", w2.Code, http.StatusServiceUnavailable)
}

// A saga whose journal the storage forgot, and that no other instance
// took over, is its own to finish: it keeps what it may have changed
// before it undoes anything (a kill in the middle leaves it listed), then
// undoes every write, those before its last proof too, forgets the kept
// copy once nothing is left, and answers the rollback it did itself.
func TestOrphanedSagaUndoesEverythingKeepingItFirst(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3")
	before := f.state()
	j := &fencingJournal{lease: lostAfter(3, time.Now().Add(time.Hour)), orphaned: true, f: f}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`), concurrency(1))
	res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	w := write(t, res)
	equal(t, "orphaned: the answer is the saga's end, which settles its key", res.Orphaned, true)
	equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 2)
	equalSlices(t, "keeps", j.keeps, []string{"2 left after 0 PUTs", "0 left after 2 PUTs"})
	f.checkUnchanged(t, before)
	equal(t, "status", w.Code, http.StatusServiceUnavailable)
	equal(t, "outcome", w.Outcome, string(RolledBack))
}

// An undo whose proof finds the item already as it was before the batch
// (the instance that took the saga over put it back, or this one before
// it lost its lease: both undo the same item) sends nothing and counts
// it rolled back: no false rollback_failed for a race of two undoers.
func TestUndoFindsTheItemPutBack(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	before := f.state()
	f.on("PATCH", "/widgets/2", reply(500, ``))
	f.on("GET", "/widgets/1", answer{}, reply(200, before["/widgets/1"]))
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1))
	w := write(t, newBatchRun(p, Runtime{Send: f}, noBackoff).do(context.Background()))
	equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
	equal(t, "item 0", w.Items[0].Outcome, string(RolledBack))
	equal(t, "outcome", w.Outcome, string(RolledBack))
}

// A partial batch journals nothing, but a keyed one stands on its
// Idempotency-Key claim: once the claim is lost (a retry of the batch
// may be running), it sends no further write; the items left fail with
// 503, saying why, and those done stand.
func TestPartialBatchSendsNothingOnceItsClaimIsLost(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3", "4")
	j := &fencingJournal{lease: lostAfter(3, time.Now())}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":1,"name":"a"},{"id":2,"name":"b"},{"id":3,"name":"c"},{"id":4,"name":"d"}]`), partial, concurrency(1))
	w := write(t, Run(context.Background(), p, Runtime{Send: f, Journal: j}))
	equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 2)
	equal(t, "status", w.Code, http.StatusMultiStatus)
	for i, want := range []string{"succeeded", "succeeded", "failed", "failed"} {
		equal(t, fmt.Sprintf("item %d", i), w.Items[i].Outcome, want)
	}
	if e := w.Items[2].Error; !strings.Contains(e, "Idempotency-Key was lost") {
		t.Errorf("item 2's error %q does not say its claim was lost", e)
	}
	equal(t, "item 2's status", w.Items[2].Status, http.StatusServiceUnavailable)
}
