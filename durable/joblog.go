package durable

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sync/atomic"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A window's write-ahead records are batch/v1/jobs/<id>/log/<window
// first %08d>/seg.<epoch %08d>.<seq %08d>, one transition each, stored by
// that epoch's owner before the write it records leaves: an owner that
// carries the window on reads them back, in name order (the later epoch
// and, within one, the later record wins), over the window's input, so
// that a write that may have been sent is resolved, not sent blindly
// again (docs/durability.md, "Bulk jobs in storage"). They are deleted
// once the window's results are stored, which then say the same.

const logName = "log"

// logRecord is one transition of one item, by its index in the job.
type logRecord struct {
	Version int                `json:"v"`
	Index   int                `json:"index"`
	Item    batch.ItemSnapshot `json:"item"`
}

// windowLog is the batch.Journal of one window of a job held under one
// epoch: it stores each transition as a record of its own, once the
// job's lease is proven, and fences the window's writes by that lease.
type windowLog struct {
	hj    *HeldJob
	first int // the window's first item in the job: its folder
	base  int // the job index of the run's item 0
	seq   *atomic.Int64
}

func (hj *HeldJob) windowLog(first, base int) *windowLog {
	return &windowLog{hj: hj, first: first, base: base, seq: &hj.logSeq}
}

func logDir(id string, first int) string {
	return path.Join(jobDir(id), logName, fmt.Sprintf("%08d", first))
}

// Begin and End record nothing: a window's intent is the job's input,
// and its end its results page.
func (l *windowLog) Begin(context.Context, *batch.Plan) error { return nil }
func (l *windowLog) End(context.Context, *batch.Result)       {}

// Fence returns once the job's lease is proven.
func (l *windowLog) Fence(ctx context.Context) error { return l.hj.fence(ctx) }

// Record stores t, once the job's lease is proven: an owner that lost
// the job records nothing, so nothing it records can mislead the next.
func (l *windowLog) Record(ctx context.Context, t batch.Transition) error {
	if err := l.hj.fence(ctx); err != nil {
		return err
	}
	b, err := json.Marshal(logRecord{Version: 1, Index: l.base + t.Index, Item: t.Item})
	if err != nil {
		return err
	}
	key := path.Join(logDir(l.hj.rec.ID, l.first), fmt.Sprintf("seg.%08d.%08d", l.hj.epoch, l.seq.Add(1)))
	if err := l.hj.jobs.storage.Store(ctx, key, b); err != nil {
		return fmt.Errorf("recording item %d of job %s: %w", l.base+t.Index, l.hj.rec.ID, err)
	}
	return nil
}

// readLog reads the records of the window at first, and lays each item's
// last one over items, the window's input from job index base: but for
// an answer refusing the job's credentials, which paused the job and
// was not processed, so that the item is sent again, as its input says.
func (hj *HeldJob) readLog(ctx context.Context, first, base int, items []batch.ItemSnapshot) error {
	input := slices.Clone(items)
	s, dir := hj.jobs.storage, logDir(hj.rec.ID, first)
	names, err := listNames(ctx, s, dir)
	if err != nil {
		return fmt.Errorf("listing the log of job %s from item %d: %w", hj.rec.ID, first, err)
	}
	slices.Sort(names) // seg.<epoch>.<seq>, both zero-padded: in the order written
	for _, name := range names {
		var rec logRecord
		found, err := loadJSON(ctx, s, path.Join(dir, name), &rec)
		if err != nil {
			return err
		}
		i := rec.Index - base
		switch {
		case !found || rec.Version != 1 || i < 0 || i >= len(items):
		case rec.Item.Outcome == batch.Failed && batch.CredentialsRefused(rec.Item.Status):
			items[i] = input[i]
		default:
			items[i] = rec.Item
		}
	}
	return nil
}

// dropLog deletes the log of the window at first, whose results are
// stored: a leftover is only more to read on a carry-on, and goes with
// the job.
func (hj *HeldJob) dropLog(ctx context.Context, first int) error {
	return deleteFolder(ctx, hj.jobs.storage, logDir(hj.rec.ID, first))
}

// deleteLogs deletes every window's log of job id, key by key, then the
// log folder: what a crash between a window's results and its log's
// deletion left, at the job's end or removal.
func deleteLogs(ctx context.Context, s Storage, id string) error {
	dir := path.Join(jobDir(id), logName)
	windows, err := listNames(ctx, s, dir)
	if err != nil {
		return err
	}
	for _, w := range windows {
		if err := deleteFolder(ctx, s, path.Join(dir, w)); err != nil {
			return err
		}
	}
	return removeEmptyFolder(ctx, s, dir)
}
