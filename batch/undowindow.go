package batch

import (
	"context"
	"fmt"
	"net/url"
	"slices"

	"github.com/caddy-batch/caddy-batch/policy"
)

// An all-or-nothing job is one saga in windows (docs/jobs.md,
// "All-or-nothing jobs"): each window is executed by a run of its own
// (ExecuteWindow), its items' locks kept by the job to its end and every
// write recorded in the window's log with its pre-image and its undo; a
// job that fails is undone window by window, the last first, each from
// its log, as Resume finishes a saga from its journal.

// UndoWindow undoes what w, a window of an all-or-nothing job as its log
// recorded it, did, through site: every item whose write took effect, or
// may have (recorded as being sent with no answer), is undone with the
// proofs of a saga's undo, in reverse order of index, at most the
// resource's concurrency at once, each undo recorded in
// site.Runtime.Journal and fenced by it. An item never recorded stays
// not_attempted. The items' locks are taken first through
// site.Runtime.Locks (held already by the job, they are not waited
// for); one that cannot be had leaves its item to its proof, which is
// what guards it from a writer. A lost lease returns a *LeaseLost with
// what was undone so far: the rest is the next owner's.
func UndoWindow(ctx context.Context, w *Snapshot, site Site, o WindowOpts) (*WindowResult, error) {
	p, err := planWindow(w, site, o, true, false)
	if err != nil {
		return nil, err
	}
	run := newBatchRun(p, site.Runtime, compensationBackoff)
	ctx, span := run.trace.windowSpan(ctx, site.Parent, w.Base, len(w.Items))
	run.recorded(w.Items)
	lockCtx, cancel := context.WithTimeout(ctx, run.batchSettings.BatchTimeout)
	run.lock(ctx, lockCtx)
	cancel()
	defer func() { run.locks.release() }()
	if run.lockRecordedCreates(ctx) {
		run.compensate(context.WithoutCancel(ctx))
	}
	res := &WindowResult{Items: run.items}
	endWindow(span, res)
	if lost := run.lease.loss(); lost != nil {
		return res, lost
	}
	return res, nil
}

// WindowKeys are the lock keys of w's items that name an id (a created
// item by the id its result names), sorted: what a job that carries on
// takes again of the windows an earlier run of it wrote.
func WindowKeys(w *Snapshot, lookup func(string) (policy.Match, bool)) ([]string, error) {
	if w.Op == policy.OpEnvelope.String() {
		return operationKeys(w, lookup)
	}
	p, err := windowPlan(w, lookup, 0, true)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, it := range p.Items {
		if it.ID != "" {
			keys = append(keys, it.tgt.paths.Key(it.ID))
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// operationKeys is WindowKeys of an envelope job's window: each
// operation that writes, by the url it was sent to (Method and URL, as
// its result has them) and the id of its item.
func operationKeys(w *Snapshot, lookup func(string) (policy.Match, bool)) ([]string, error) {
	var keys []string
	for _, s := range w.Items {
		kind, ok := operationKinds[s.Method]
		if !ok || !kind.Writes() || s.ID == "" {
			continue
		}
		u, err := url.Parse(s.URL)
		if err != nil {
			return nil, fmt.Errorf("%w: operation %q's url %q: %v", ErrNotResumable, s.OperationID, s.URL, err)
		}
		m, ok := lookup(u.EscapedPath())
		if !ok {
			return nil, fmt.Errorf("%w: operation %q's url %s names no resource configured here", ErrNotResumable, s.OperationID, s.URL)
		}
		eo := &envelopeOperation{kind: kind, method: s.Method}
		t, _, err := eo.target(m)
		if err != nil {
			return nil, err
		}
		keys = append(keys, t.paths.Key(s.ID))
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}
