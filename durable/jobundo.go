package durable

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/stop"
	"github.com/caddy-batch/caddy-batch/policy"
)

// An all-or-nothing job that writes is one saga run in windows
// (docs/jobs.md, "All-or-nothing jobs"). Each window locks and
// preflights its items before it sends any (batch.WindowOpts.AllOrNothing),
// and the job keeps every lock it took to its end (driver.held); each
// write is recorded in its window's log with its pre-image and its undo,
// and the logs stay to the job's end: they are its undo journal. A
// window in which an item fails, a cancel, or job_timeout makes the job
// undone: the progress records that it is (Undoing), then each window
// is undone from its log, the last first, and its results page
// rewritten with what its undo did, the progress recording after each
// which window is next (UndoNext). An owner that takes the job over
// mid-undo goes on with it from there; one that takes it over going
// forward carries it on, as a partial job is, once it has locked again
// the items the job wrote so far.

// atomic reports whether the job runs as a saga in windows: all or
// nothing, and it writes. An all-or-nothing read runs as a partial one
// does, and fails whole when an item fails.
func (rec *JobRecord) atomic() bool {
	if rec.Atomicity != policy.AllOrNothing.String() {
		return false
	}
	if rec.Op == policy.OpEnvelope.String() {
		return true // what its reads did needs no undo
	}
	op, err := policy.ParseOp(rec.Op)
	return err == nil && op.Writes()
}

// failure is why an all-or-nothing job must be undone after the window
// that gave res: its locks refused, or an item that failed or whose
// write's outcome is unknown; "" when it goes on (every item
// succeeded, or those that did not are to be sent again: refused for
// the job's credentials, which pauses it, or failed by the gateway's
// storage). A partial job is never undone.
func (d *driver) failure(res *batch.WindowResult) string {
	if !d.atomic {
		return ""
	}
	if res.Refusal != "" {
		return "the job's items could not be locked: " + res.Refusal
	}
	for _, it := range res.Items {
		switch {
		case slices.Contains(res.Unsent, it.Index), it.Outcome == batch.Failed && batch.CredentialsRefused(it.Status):
		case it.Outcome == batch.Failed, it.Outcome == batch.Unknown:
			why := fmt.Sprintf("item %d %s (status %d)", it.Index, it.Outcome, it.Status)
			if it.Error != "" {
				why += ": " + it.Error
			}
			return why
		}
	}
	return ""
}

// beginUndo records that the job is to be undone, and why, from the
// window that holds its cursor (begun or not) back to its first: from
// here on, every owner undoes it. The counts start again from nothing,
// as each window undone is counted with what its undo did.
func (d *driver) beginUndo(ctx context.Context, why string, cancelled bool) error {
	p := &d.p
	p.Undoing, p.UndoNext, p.Reason = true, -1, why
	if first, _, ok := d.windowAt(min(p.Cursor, d.hj.rec.Items-1)); ok {
		p.UndoNext = first
	}
	p.State = JobRunning
	if cancelled {
		p.State = JobCancelling
	}
	p.Done, p.Succeeded, p.Failed, p.ResultsBytes = 0, 0, 0, 0
	return d.hj.retried(ctx, func() error { return d.hj.WriteProgress(ctx, *p) })
}

// undoNow begins the job's undo and runs it.
func (d *driver) undoNow(ctx context.Context, why string, cancelled bool) error {
	if err := d.beginUndo(ctx, why, cancelled); err != nil {
		return err
	}
	return d.undo(ctx)
}

// undo undoes the job's windows from UndoNext back to the first, then
// ends the job rolled_back, or rollback_failed when an item could not
// be undone: that job's logs, with each such item's pre-image, stay with
// it until it expires or is removed, and an ERROR line says how many
// were left. A hand-over between two windows stores where the undo
// stands and releases the lease: the next owner goes on with it.
func (d *driver) undo(ctx context.Context) error {
	hj := d.hj
	for d.p.UndoNext >= 0 {
		if err := hj.lease.lostErr(); err != nil {
			return err
		}
		if stop.Asked(d.handOver) {
			return d.finish(ctx, haltStop)
		}
		first := d.p.UndoNext
		_, end, ok := d.windowAt(first)
		if !ok {
			return fmt.Errorf("job %s has no window at item %d to undo", hj.rec.ID, first)
		}
		var res *batch.WindowResult
		err := hj.retried(ctx, func() (err error) {
			res, err = d.undoWindow(ctx, first, end)
			return err
		})
		if err != nil {
			return err
		}
		items := res.Items
		for len(items) > 0 && items[len(items)-1].Outcome == batch.NotAttempted {
			items = items[:len(items)-1]
		}
		if err := hj.retried(ctx, func() error { return hj.ReplaceResults(ctx, first, items) }); err != nil {
			return err
		}
		d.p.ResultsBytes += int64(len(hj.page.lines))
		d.p.Tally(items)
		hj.jobs.hooks.finished(items)
		for _, it := range items {
			if it.Outcome == batch.RollbackFailed {
				d.p.LeftBehind++
			}
		}
		d.p.UndoNext = -1
		if first > 0 {
			d.p.UndoNext, _, _ = d.windowAt(first - 1)
		}
		if err := hj.retried(ctx, func() error { return hj.WriteProgress(ctx, d.p) }); err != nil {
			return err
		}
	}
	p := d.p
	p.State = JobRolledBack
	if p.LeftBehind > 0 {
		p.State = JobRollbackFailed
		p.Reason += fmt.Sprintf("; %d of its items could not be undone (each one's result says why)", p.LeftBehind)
		hj.jobs.logger.Error("an all-or-nothing bulk job could not undo all it did; its windows' logs, with each item's pre-image, are kept with it",
			zap.String("job", hj.rec.ID), zap.Int("left_behind", p.LeftBehind), zap.String("reason", p.Reason))
	}
	p.Outcome, p.Ended = p.State, now().UTC()
	return hj.End(ctx, p)
}

// undoWindow undoes the window [first, end) from its log, through the
// job's routes, each undo recorded in the window's log and fenced by
// the lease.
func (d *driver) undoWindow(ctx context.Context, first, end int) (*batch.WindowResult, error) {
	hj := d.hj
	chunk, err := d.chunkAt(first)
	if err != nil {
		return nil, err
	}
	input, err := hj.ReadChunk(ctx, chunk)
	if err != nil {
		return nil, err
	}
	items := slices.Clone(input[first-chunk : end-chunk])
	if err := hj.readLog(ctx, first, first, items); err != nil {
		return nil, err
	}
	snap := d.snapshot(first, items)
	var res *batch.WindowResult
	err = d.through(ctx, hj.rec, d.cred, func(site batch.Site) error {
		log := hj.windowLog(first, first)
		site.Runtime.Journal, site.Runtime.Background = log, true
		site.Runtime.Locks = d.held.Through(site.Runtime.Locks)
		if err := d.relockForUndo(ctx, site, first); err != nil {
			return err
		}
		var err error
		res, err = batch.UndoWindow(ctx, snap, site, batch.WindowOpts{KeepBody: ResultBodyLimit})
		if ferr := log.flush(ctx); err == nil {
			err = ferr
		}
		return err
	})
	if err == nil && res == nil {
		err = fmt.Errorf("undoing job %s from item %d: no handler ran the window", hj.rec.ID, first)
	}
	return res, err
}

// relockForUndo takes again, before a run's first undo, the locks of
// the items the job wrote in the windows before first, which the undo
// reaches later: a run that begins undoing (a takeover mid-undo, a
// paused job cancelled or past its job_timeout) holds none, and a single
// write through the gateway must not slip in before their undo. Locks
// that cannot be had within batch_timeout do not stop the undo: its
// proofs leave an item another writer changed, and say so.
func (d *driver) relockForUndo(ctx context.Context, site batch.Site, first int) error {
	if d.relocked {
		return nil
	}
	refusal, err := d.relock(ctx, site, first)
	if err != nil {
		return err
	}
	if refusal != "" {
		d.hj.jobs.logger.Warn("an all-or-nothing bulk job being undone could not lock again all it wrote; its undo goes on, each item proved before it is undone",
			zap.String("job", d.hj.rec.ID), zap.String("why", refusal))
	}
	d.relocked = true
	return nil
}

// snapshot is the window of the job from job index base, its items as
// given: what a window's run is given.
func (d *driver) snapshot(base int, items []batch.ItemSnapshot) *batch.Snapshot {
	rec := d.hj.rec
	// The job's requests carry the headers it forwards, as a
	// synchronous batch's carry its client's.
	return &batch.Snapshot{Version: batch.SnapshotVersion, Op: rec.Op, Path: rec.Path, Query: rec.Query,
		Header: d.cred, Key: rec.Key, KeyQuoted: rec.KeyQuoted, Base: base, Items: items}
}

// relock takes again, once a run, the locks of the items the job wrote
// before the window at first (and of those of that window its results
// hold): an earlier run, or RunFirst, let them go when it ended. Locks
// that cannot be had within the resource's batch_timeout are a refusal,
// which fails the job.
func (d *driver) relock(ctx context.Context, site batch.Site, first int) (string, error) {
	if d.relocked {
		return "", nil
	}
	hj := d.hj
	timeout, err := d.batchTimeout(site)
	if err != nil {
		return "", err
	}
	for c, chunk := range d.chunks {
		for w := chunk; w < d.chunkEnd(c) && w <= first; w += jobWindowItems {
			page, err := loadPage(ctx, hj.jobs.storage, hj.rec.ID, w)
			if err != nil {
				return "", err
			}
			var items []batch.ItemSnapshot
			err = page.eachLine(hj.rec.ID, func(line ResultLine, _ int) bool {
				items = append(items, batch.ItemSnapshot{ID: line.ID, OperationID: line.OperationID, Method: line.Method, URL: line.URL})
				return true
			})
			if err != nil {
				return "", err
			}
			keys, err := batch.WindowKeys(d.snapshot(w, items), site.Lookup)
			if err != nil {
				return "", err
			}
			lockCtx, cancel := context.WithTimeout(ctx, timeout)
			_, failed, err := itemlock.LockAll(lockCtx, site.Runtime.Locks, keys)
			cancel()
			if err != nil {
				return fmt.Sprintf("%s, which the job wrote before, could not be locked again within batch_timeout (%s): %v",
					keys[max(failed, 0)], timeout, err), nil
			}
		}
	}
	d.relocked = true
	return "", nil
}

// batchTimeout is the batch_timeout of the job's resource, or of the
// envelope for an envelope job, as site has it.
func (d *driver) batchTimeout(site batch.Site) (time.Duration, error) {
	if d.envelope {
		if site.Envelope == nil {
			return 0, fmt.Errorf("%w: no envelope is configured at %s", batch.ErrNotResumable, d.hj.rec.Path)
		}
		return site.Envelope.Settings.BatchTimeout, nil
	}
	m, ok := site.Lookup(d.hj.rec.Path)
	if !ok {
		return 0, fmt.Errorf("%w: no resource is configured for %s", batch.ErrNotResumable, d.hj.rec.Path)
	}
	return m.Resource.Settings.BatchTimeout, nil
}

// ReplaceResults stores the results page of the window at windowFirst
// anew, holding items (from the window's first item on): what the
// window's undo did.
func (hj *HeldJob) ReplaceResults(ctx context.Context, windowFirst int, items []batch.ItemResult) error {
	hj.page = resultsPage{loaded: true, head: pageHead{Version: 1, First: windowFirst}}
	return hj.AppendResults(ctx, windowFirst, items)
}
