package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
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

// EndLoser is a Journal whose End may find the saga's lease lost (its
// removal is guarded by the lease): LostAtEnd says so, nil otherwise.
type EndLoser interface {
	LostAtEnd() *LeaseLost
}

// lostAtEnd is what j's End found of the saga's lease: lost, or nil.
func lostAtEnd(j Journal) *LeaseLost {
	if el, ok := j.(EndLoser); ok {
		return el.LostAtEnd()
	}
	return nil
}

// leaseWatch is what a run learnt of its saga's lease: lost, once a
// fence said so.
type leaseWatch struct {
	mu   sync.Mutex
	lost *LeaseLost
}

// saw reports whether err says the saga's lease is lost, and if so
// records it (the first loss stands): the saga starts nothing more.
func (w *leaseWatch) saw(err error) bool {
	var lost *LeaseLost
	if !errors.As(err, &lost) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost == nil {
		w.lost = lost
	}
	return true
}

// loss is the lease's loss, nil while it is not known lost.
func (w *leaseWatch) loss() *LeaseLost {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

// keepLost keeps (again, under kept when that is set) what a saga that
// lost its lease left behind, left, as snap and res say: a left-behind
// saga of its own, linked to the lost one; nothing left forgets a copy
// kept before. It returns the kept saga's id, empty when nothing is kept.
func keepLost(ctx context.Context, lk LostKeeper, kept string, snap *Snapshot, left []string, res *Result) string {
	own := *res
	own.LeftBehind = left
	id, err := lk.KeepLost(ctx, kept, snap, &own)
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

// orphanedResult is what an orphaned saga (endLost) keeps while it
// undoes what it may have changed.
func orphanedResult(p *Plan, items []ItemResult) *Result {
	return &Result{Op: p.Op, Atomicity: p.Atomicity, Outcome: RollbackFailed, Items: items,
		Detail: "this gateway lost the saga's lease: its journal is gone from storage, and no other instance took it over; the items it may have changed are kept here while it undoes them"}
}

// written names the items whose writes took effect, or may have, and
// are not undone yet.
func written(items []ItemResult, state []itemState) []string {
	var out []string
	for i, it := range items {
		if state[i].applied && !it.undone() {
			out = append(out, it.describe()+": written by the batch, not undone yet")
		}
	}
	return out
}

// ownLeftBehind names the items this saga could not undo of its own;
// with orphaned (no instance took the saga over, and its journal is
// gone: the storage forgot it), every item it may have changed, since
// nobody else will undo them.
func ownLeftBehind(items []ItemResult, orphaned bool) []string {
	var out []string
	for _, it := range items {
		if it.Outcome == RollbackFailed || orphaned && it.Outcome == Unknown {
			out = append(out, it.describeLeft())
		}
	}
	return out
}

// answerLost makes res what the client of a saga that lost its lease is
// told: the new owner's end, if it came, else 503 with the saga named
// and every item the saga touched unknown; rollback_failed wherever
// something is left behind, this saga's own kept under a saga of its own.
func answerLost(res *Result, lost *LeaseLost, end lostEnd) {
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
