package durable

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A window's write-ahead records are batch/v1/jobs/<id>/log/<window
// first %08d>/seg.<epoch %08d>.<seq %08d>, each a segment of the
// transitions its store took, stored by that epoch's owner before the
// writes they record leave: an owner that carries the window on reads
// them back, in name order (the later epoch and, within one, the later
// segment wins), over the window's input, so that a write that may have
// been sent is resolved, not sent blindly again (docs/durability.md,
// "Bulk jobs in storage"). The writes about to leave together are
// recorded in one store, as a saga's are (groupCommit). They are deleted
// once the window's results are stored, which then say the same.

const logName = "log"

// logSegment is one store of a window's log: the transitions it took,
// each by the item's index in the job.
type logSegment struct {
	Version int         `json:"v"`
	Records []logRecord `json:"records"`
}

type logRecord struct {
	Index int                `json:"index"`
	Item  batch.ItemSnapshot `json:"item"`
}

// windowLog is the batch.Journal of one window of a job held under one
// epoch: it keeps each transition, and stores what it kept, once the
// job's lease is proven, when a write waits for its record; it fences
// the window's writes by that lease.
type windowLog struct {
	hj    *HeldJob
	first int // the window's first item in the job: its folder
	base  int // the job index of the run's item 0
	seq   *atomic.Int64

	mu   sync.Mutex
	kept []logRecord
	groupCommit
}

func (hj *HeldJob) windowLog(first, base int) *windowLog {
	l := &windowLog{hj: hj, first: first, base: base, seq: &hj.logSeq}
	l.groupCommit = newGroupCommit(&l.mu, maxStores(hj.jobs.storage), l.storeKept, func() bool { return false })
	l.groupCommit.gather = true
	return l
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

// WatchLocks makes the job's lease stand on the item locks it holds
// (batch.LockWatcher): an all-or-nothing job's, kept to its end, which
// in storage are leases too; one lost is the job's lease lost, and the
// next owner takes them again.
func (l *windowLog) WatchLocks(lost func() error) { l.hj.locksLost.Store(&lost) }

// Record keeps t, and, for a write about to leave, returns once a store
// holds it (with everything kept before it): an owner that lost the job
// stores nothing, so nothing it records can mislead the next. Other
// transitions go with the next store: one that never lands leaves its
// write to be resolved by a carry-on.
func (l *windowLog) Record(ctx context.Context, t batch.Transition) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kept = append(l.kept, logRecord{Index: l.base + t.Index, Item: t.Item})
	l.stores.kept++
	if t.Phase != batch.PhaseSending && t.Phase != batch.PhaseUndoing {
		return nil
	}
	if err := l.commit(ctx); err != nil {
		return fmt.Errorf("recording item %d of job %s: %w", l.base+t.Index, l.hj.rec.ID, err)
	}
	return nil
}

// flush stores what is kept and no store took: the answers of the
// writes that finished after the window's last write left, so that a
// window that stopped short (a pause, a hand-over, a cancel) leaves in
// its log what became of every write it sent.
func (l *windowLog) flush(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.kept) == 0 {
		return nil
	}
	if err := l.commit(ctx); err != nil {
		return fmt.Errorf("recording the answers of job %s's window from item %d: %w", l.hj.rec.ID, l.first, err)
	}
	return nil
}

// storeKept stores the records kept as a segment, once the lease is
// proven. l.mu is held, and let go meanwhile. The records of a store
// that fails are not kept again: the writes waiting for them are not
// sent.
func (l *windowLog) storeKept(ctx context.Context, _ uint64) error {
	records := l.kept
	l.kept = nil
	key := path.Join(logDir(l.hj.rec.ID, l.first), fmt.Sprintf("seg.%08d.%08d", l.hj.epoch, l.seq.Add(1)))
	l.mu.Unlock()
	defer l.mu.Lock()
	if err := l.hj.fence(ctx); err != nil {
		return err
	}
	b, err := json.Marshal(logSegment{Version: 1, Records: records})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	return l.hj.jobs.storage.Store(ctx, key, b)
}

// readLog reads the records of the window at first, and lays each item's
// last one over items, the window's input from job index base: but for
// an answer refusing the job's credentials, which paused the job and
// was not processed, for an item settled not attempted (recorded as
// about to be sent while it waited its turn, and not sent: the window
// halted first), and for one the gateway's storage failed before it was
// sent (ItemSnapshot.Unsent), so that the item is sent, as its input
// says.
func (hj *HeldJob) readLog(ctx context.Context, first, base int, items []batch.ItemSnapshot) error {
	input := slices.Clone(items)
	s, dir := hj.jobs.storage, logDir(hj.rec.ID, first)
	names, err := listNames(ctx, s, dir)
	if err != nil {
		return fmt.Errorf("listing the log of job %s from item %d: %w", hj.rec.ID, first, err)
	}
	slices.Sort(names) // seg.<epoch>.<seq>, both zero-padded: in the order written
	for _, name := range names {
		var seg logSegment
		found, err := loadJSON(ctx, s, path.Join(dir, name), &seg)
		if err != nil {
			return err
		}
		if !found || seg.Version != 1 {
			continue
		}
		for _, rec := range seg.Records {
			i := rec.Index - base
			switch {
			case i < 0 || i >= len(items):
			case rec.Item.Outcome == batch.Failed && batch.CredentialsRefused(rec.Item.Status), rec.Item.Unsent,
				rec.Item.Outcome == batch.NotAttempted && rec.Item.Phase >= batch.PhaseAnswered:
				items[i] = input[i]
			default:
				items[i] = rec.Item
			}
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
