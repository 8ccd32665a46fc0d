package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// A saga that lost its lease (docs/durability.md, "A
// saga never writes after it lost its lease") sends no new write: another
// instance may be finishing it already. It undoes only what that
// instance may not know of — the writes answered after the last moment
// its lease was proven, each under its lock taken afresh and with the
// proofs every undo has (an item the new owner already restored, or
// another writer changed, is left) — keeps what it knows under a saga of
// its own when something of its own is left behind, and answers its
// client only an outcome it saw: the new owner's end, within the batch's
// time, or 503 with every item it touched unknown.

// errFence wraps the error of a write the saga's journal would not let
// go (Journal.Fence): its lease is unproven, or lost.
var errFence = errors.New("the saga's lease does not let the write go")

// LostKeeper is a Journal that can keep what a saga that lost its lease
// knows, and learn how the instance that took the saga over ended it.
type LostKeeper interface {
	// KeepLost keeps snap, as the saga that lost its lease ended it
	// (res), under a saga of its own linked to the lost one (kept, if
	// one was kept already; a new one when kept is empty), and names it;
	// with nothing left behind in res, it forgets kept instead.
	KeepLost(ctx context.Context, kept string, snap *Snapshot, res *Result) (saga string, err error)
	// Saga names the saga.
	Saga() string
	// AwaitEnd waits, until ctx is done, for the instance that took the
	// saga over to end it, looking at least once; ended is false if it
	// has not. The outcome is RolledBack or RollbackFailed, with the
	// items left behind. orphaned says that nobody will: the journal's
	// beginning is gone and no other instance's lease showed (the
	// storage forgot the saga).
	AwaitEnd(ctx context.Context) (ended bool, outcome Outcome, leftBehind []string, orphaned bool)
}

// leaseLost reports whether err says the saga's lease is lost, and if so
// records it: the saga starts nothing more.
func (run *batchRun) leaseLost(err error) bool {
	var lost *LeaseLost
	if !errors.As(err, &lost) {
		return false
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	if run.lost == nil {
		run.lost = lost
	}
	return true
}

func (run *batchRun) lostLease() *LeaseLost {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.lost
}

// fenced fails item i, whose write the lease did not let go: nothing
// was sent.
func (run *batchRun) fenced(ctx context.Context, i int, err error) {
	reason := "the saga's lease in storage could not be proven in time (the storage did not answer), so the write was not sent"
	if run.leaseLost(err) {
		reason = "the saga's lease was lost (" + run.lostLease().Why + "): another instance finishes the saga, so the write was not sent"
	}
	run.failByGateway(ctx, i, reason, err)
}

// checkLease is the last look at the lease before a saga that did not
// lose it answers: an answer says what happened only while no other
// instance may be acting on the saga. It waits at most the batch's
// timeout for a lease that is unproven.
func (run *batchRun) checkLease(ctx context.Context) {
	if !run.isSaga() || run.lostLease() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), run.batchSettings.BatchTimeout)
	defer cancel()
	if err := run.rt.Journal.Fence(ctx); err != nil && !run.leaseLost(err) {
		run.leaseLost(&LeaseLost{Why: err.Error()})
	}
}

// endLost ends a saga that lost its lease, as the comment above says. A
// saga whose journal the storage forgot, and that no other instance
// took over (orphaned), is this saga's alone to finish: it keeps what it
// may have changed first, as a journal would, undoes all of it, and
// keeps what is left (or forgets the kept copy, if nothing is).
func (run *batchRun) endLost(ctx, batchCtx context.Context, lost *LeaseLost) *Result {
	detached := context.WithoutCancel(ctx)
	lk, _ := run.rt.Journal.(LostKeeper)
	var end lostEnd
	since := lost.Proven
	if lk != nil {
		look, cancel := context.WithCancel(ctx)
		cancel() // one look, now
		_, _, _, end.orphaned = lk.AwaitEnd(look)
	}
	if end.orphaned {
		since = time.Time{}
		end.kept = run.keepLost(detached, lk, "", run.written(), nil)
	}
	run.undoOwnSince(detached, since)
	res := run.report(ctx, batchCtx)
	res.LeaseLost = true
	if lk == nil {
		run.answerLost(res, lost, end)
		return res
	}
	res.Saga = lk.Saga()
	if !end.orphaned {
		waitCtx, cancel := context.WithCancel(batchCtx)
		defer cancel()
		end.ended, end.outcome, end.left, end.orphaned = lk.AwaitEnd(waitCtx)
	}
	end.own = run.ownLeftBehind(end.orphaned)
	if len(end.own) > 0 || end.kept != "" {
		end.kept = run.keepLost(detached, lk, end.kept, end.own, res)
	}
	res.Kept = end.kept
	run.answerLost(res, lost, end)
	return res
}

// keepLost keeps (again, under kept when that is set) what a saga that
// lost its lease left behind, left, as res says (the saga as it stands
// when res is nil): a left-behind saga of its own, linked to the lost
// one; nothing left forgets a copy kept before. It returns the kept
// saga's id, empty when nothing is kept.
func (run *batchRun) keepLost(ctx context.Context, lk LostKeeper, kept string, left []string, res *Result) string {
	if res == nil {
		res = &Result{Op: run.plan.Op, Atomicity: run.plan.Atomicity, Outcome: RollbackFailed, Items: run.items,
			Detail: "this gateway lost the saga's lease: its journal is gone from storage, and no other instance took it over; the items it may have changed are kept here while it undoes them"}
	}
	own := *res
	own.LeftBehind = left
	id, err := lk.KeepLost(ctx, kept, run.snapshot(), &own)
	if err != nil {
		res.Errors = append(res.Errors, "keeping what the saga that lost its lease left behind: "+err.Error())
		return kept
	}
	return id
}

// lostEnd is what a saga that lost its lease learnt of its end: whether
// the instance that took it over ended it (with its outcome and what it
// left behind), whether nobody will (orphaned), what this saga left
// behind of its own, and the saga it kept that under.
type lostEnd struct {
	ended, orphaned bool
	outcome         Outcome
	left, own       []string
	kept            string
}

// written names the items whose writes took effect, or may have, and
// are not undone yet.
func (run *batchRun) written() []string {
	var out []string
	for i, it := range run.items {
		if run.state[i].applied && !run.undone(i) {
			out = append(out, it.describe()+": written by the batch, not undone yet")
		}
	}
	return out
}

// ownLeftBehind names the items this saga could not undo of its own;
// with orphaned (no instance took the saga over, and its journal is
// gone: the storage forgot it), every item it may have changed, since
// nobody else will undo them.
func (run *batchRun) ownLeftBehind(orphaned bool) []string {
	var out []string
	for _, it := range run.items {
		if it.Outcome == RollbackFailed || orphaned && it.Outcome == Unknown {
			out = append(out, it.describeLeft())
		}
	}
	return out
}

// undoOwnSince undoes, with every proof, the writes answered after
// proven (or never answered): the instance that took the saga over read
// its journal before they may have landed. Each is locked afresh first
// (a storage lock may have lapsed with the lease). The journal keeps
// these undos in memory only: it is the new owner's now.
func (run *batchRun) undoOwnSince(ctx context.Context, proven time.Time) {
	var own []int
	for _, i := range run.started {
		st := &run.state[i]
		if !st.applied || run.undone(i) || !st.answeredAt.IsZero() && !st.answeredAt.After(proven) {
			continue
		}
		st.resumed = true // the new owner may have undone it already
		own = append(own, i)
	}
	run.selfUndo.Store(true)
	for _, i := range own {
		if key := writeKey(run.state[i].tgt, run.items[i].ID); key != "" && run.rt.Locks != nil {
			run.locks.drop(key)
			lockCtx, cancel := context.WithTimeout(ctx, run.budget(i))
			unlock, err := run.rt.Locks.Lock(lockCtx, key)
			cancel()
			if err != nil {
				run.settle(ctx, i, RollbackFailed, "the saga's lease was lost, and the item's lock could not be taken again to undo the write it sent since ("+err.Error()+")", nil)
				continue
			}
			run.locks.add(key, unlock)
		}
		run.undoItem(ctx, i)
	}
	for _, i := range run.started {
		if st := &run.state[i]; st.applied && !run.undone(i) && run.items[i].Outcome != Failed {
			run.mu.Lock()
			run.items[i].Outcome = Unknown
			run.items[i].Error = joinReasons(run.items[i].Error, "the saga's lease was lost: the instance that took it over decides this item")
			run.mu.Unlock()
		}
	}
}

// answerLost makes res what the client of a saga that lost its lease is
// told: the new owner's end, if it came, else 503 with the saga named
// and every item the saga touched unknown; rollback_failed wherever
// something is left behind, this saga's own kept under a saga of its own.
func (run *batchRun) answerLost(res *Result, lost *LeaseLost, end lostEnd) {
	res.RetryAfter = gatewayRetryAfter
	why := fmt.Sprintf("this gateway lost the saga's lease (%s)", lost.Why)
	if !end.orphaned {
		why += fmt.Sprintf(", and another instance of the cluster finishes saga %s", res.Saga)
	}
	if end.kept != "" {
		why += fmt.Sprintf("; what this gateway could not undo of its own is kept as saga %s (caddy batch saga %s)", end.kept, end.kept)
	}
	left := append(slices.Clone(end.own), end.left...)
	switch {
	case end.orphaned && len(left) == 0:
		res.Outcome, res.Status = RolledBack, http.StatusServiceUnavailable
		res.Detail = why + "; its journal is gone from storage and no other instance took it over, so this gateway undid what the batch did: nothing of it stands"
	case len(left) > 0 && (end.ended || end.kept != ""):
		res.Outcome, res.Status, res.LeftBehind = RollbackFailed, http.StatusInternalServerError, left
		res.Detail = why + "; items are left behind: " + strings.Join(left, "; ")
	case end.ended:
		res.Outcome, res.Status = RolledBack, http.StatusServiceUnavailable
		res.Detail = why + "; it ended the saga rolled back: nothing the batch did stands"
		for i := range res.Items {
			if o := res.Items[i].Outcome; o == Unknown || o == Succeeded {
				res.Items[i].Outcome = RolledBack
			}
		}
	default:
		res.Outcome, res.Status, res.LeftBehind = Failed, http.StatusServiceUnavailable, nil
		res.Detail = why + "; the saga has not ended yet, so what became of the items is unknown: see GET /batch/sagas/" + res.Saga + " on the admin endpoint, or retry with the same Idempotency-Key later"
		for i := range res.Items {
			if res.Items[i].Outcome == Succeeded {
				res.Items[i].Outcome = Unknown
			}
		}
	}
}

// gatewayRetryAfter is the Retry-After of an answer the gateway's own
// storage caused (503): long enough for a blip to pass.
const gatewayRetryAfter = "2"

// snapshot is the saga as it stands, for a journal to keep.
func (run *batchRun) snapshot() *Snapshot {
	snap := run.plan.Snapshot()
	run.mu.Lock()
	defer run.mu.Unlock()
	for i := range snap.Items {
		snap.Items[i] = snapshotItem(&run.items[i], &run.state[i], &run.plan.Items[i])
	}
	return snap
}
