package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/stop"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Through runs work once through the routes of the running config, as
// the job's start request went (rec.Origin), giving it the Site of the
// handler that serves the job; cred are the headers the job forwards.
// A reload takes effect at the next window, since each is its own trip.
type Through func(ctx context.Context, rec *JobRecord, cred http.Header, work func(batch.Site) error) error

// jobWindowItems is the most items one window runs: what the driver
// holds of the input at once, and how far a carry-on goes back.
const jobWindowItems = 256

// cancelPoll is how often a running window looks for a cancel mark,
// which the lease's renewals list (HeldJob.CancelAsked).
const cancelPoll = time.Second

// partialJob is the atomicity of a job whose items stand on their own,
// as JobRecord.Atomicity names it.
const partialJob = "partial"

// Run drives the job to its end, a window of at most 256 items at a
// time, carrying on from what its results and log already say: before
// each window it checks for a cancel (the job then ends cancelled, what
// was done standing), the job's deadline (it ends partial, or failed
// when nothing succeeded, with the reason), a refusal of the job's
// credentials (the job is paused: its progress stored as paused, the
// refused item not among the results, and its lease released, for a
// resume to claim), stop (the job is handed over: its progress stored
// and its lease released, for another instance to claim at once) and
// the lease. Each window runs through
// through; its results and the job's progress are stored after it.
// Once the lease is lost Run writes nothing more, and returns the
// *batch.LeaseLost. On any other error (storage, a window that cannot
// run here, ctx done) it releases the lease, leaving the job to whoever
// claims it next, and returns the error. An all-or-nothing job that
// writes is a saga in windows (jobundo.go): one that fails, is
// cancelled or runs out of time is undone, its last window first.
func (hj *HeldJob) Run(ctx context.Context, through Through, stop <-chan struct{}) error {
	jobsRunning.Add(1)
	defer jobsRunning.Add(-1)
	err := hj.run(ctx, through, stop)
	var lost *batch.LeaseLost
	if err == nil || errors.As(err, &lost) {
		return err
	}
	if rerr := hj.Release(context.WithoutCancel(ctx)); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// run is Run, but for what an error leaves behind.
func (hj *HeldJob) run(ctx context.Context, through Through, stop <-chan struct{}) error {
	var d *driver
	err := hj.retried(ctx, func() (err error) {
		d, err = hj.newDriver(ctx)
		return err
	})
	if err != nil {
		return err
	}
	d.through, d.handOver = through, stop
	defer d.held.Release()
	defer d.drops.Wait()
	if err := hj.retried(ctx, func() error { return hj.WriteProgress(ctx, d.p) }); err != nil {
		return err
	}
	if d.p.Undoing {
		return d.undo(ctx)
	}
	for c, first := range d.chunks {
		end := d.chunkEnd(c)
		if end <= d.p.Cursor {
			continue
		}
		var items []batch.ItemSnapshot
		err := hj.retried(ctx, func() (err error) {
			items, err = hj.ReadChunk(ctx, first)
			return err
		})
		if err != nil {
			return err
		}
		for w := first; w < end; w += jobWindowItems {
			wend := min(w+jobWindowItems, end)
			for d.p.Cursor < wend {
				if why := d.halt(stop); why != "" {
					return d.finish(ctx, why)
				}
				from := d.p.Cursor
				if err := d.window(ctx, through, stop, w, items[w-first:wend-first]); err != nil {
					return err
				}
				if d.p.Undoing {
					return d.undo(ctx)
				}
				if d.p.Cursor >= wend {
					break
				}
				if d.unsent {
					if err := d.again(ctx, d.p.Cursor > from); err != nil {
						return err
					}
					continue
				}
				// The window stopped before its end.
				why := d.halt(stop)
				if why == "" && ctx.Err() != nil {
					return ctx.Err()
				}
				if why == "" {
					why = haltDeadline
				}
				return d.finish(ctx, why)
			}
		}
	}
	return d.finish(ctx, haltNone)
}

// again waits a moment before the window is run again from the first
// item whose write its storage failed (nothing was sent): the blip
// passes meanwhile. A lease of runs again that finish no item is no
// blip, and ends the run (the job released for whoever claims it).
func (d *driver) again(ctx context.Context, progressed bool) error {
	length := d.hj.lease.length
	switch {
	case progressed || d.unsentSince.IsZero():
		d.unsentSince = now()
	case now().Sub(d.unsentSince) >= length:
		return fmt.Errorf("job %s: the storage did not record the writes from item %d for %s (the lease's length), so none was sent", d.hj.rec.ID, d.p.Cursor, length)
	}
	return d.hj.retryPause(ctx)
}

// driver is a job being run: its progress, and where its input lies.
type driver struct {
	hj *HeldJob
	// through is how its windows run; handOver, once closed, hands the
	// job over (Run's stop).
	through  Through
	handOver <-chan struct{}
	cred     http.Header
	p        JobProgress
	// atomic says the job is a saga in windows (jobundo.go): all or
	// nothing, and it writes. held are its items' locks, kept from the
	// window that took them to the run's end; relocked, once those of
	// the items an earlier run wrote are taken again.
	atomic   bool
	held     itemlock.Held
	relocked bool
	// envelope says the job is an envelope's operations (jobenvelope.go).
	envelope bool
	// chunks are the job index of each input chunk's first item, in
	// order.
	chunks []int
	// paused, once set, says why the job pauses (pauseReason): an item's
	// credentials were refused.
	paused string
	// unsent says the last window stopped at an item its storage failed
	// (batch.WindowResult.Unsent), and unsentSince since when the
	// windows run again finish nothing (again).
	unsent      bool
	unsentSince time.Time
	// drops are the deletion of the last finished window's log
	// (dropLater).
	drops sync.WaitGroup
}

func (hj *HeldJob) newDriver(ctx context.Context) (*driver, error) {
	v, err := viewJob(ctx, hj.jobs.storage, hj.rec)
	if err != nil {
		return nil, err
	}
	cred, err := hj.Credentials(ctx)
	if err != nil {
		return nil, err
	}
	chunks, err := hj.chunkFirsts(ctx)
	if err != nil {
		return nil, err
	}
	d := &driver{hj: hj, cred: cred, p: v.progress, chunks: chunks, atomic: hj.rec.atomic(),
		envelope: hj.rec.Op == policy.OpEnvelope.String()}
	if !d.p.Started.IsZero() && v.epoch < hj.epoch && d.p.State == JobRunning {
		// It ran before under another epoch, and was neither paused nor
		// queued (its first item sent at its start) by its owner.
		d.p.Takeovers++
	}
	if d.p.Started.IsZero() {
		d.p.Started = now().UTC()
	}
	if d.p.Undoing {
		// Its undo goes on, for the reason it began.
		if d.p.State != JobCancelling {
			d.p.State = JobRunning
		}
		return d, nil
	}
	if d.p.State == JobPaused {
		// Claimed without a resume (to end it past its deadline): it
		// stays paused, and sends nothing.
		d.paused = d.p.Reason
		return d, nil
	}
	d.p.State, d.p.Reason = JobRunning, ""
	return d, nil
}

// chunkFirsts lists the job's input chunks by their first item.
func (hj *HeldJob) chunkFirsts(ctx context.Context) ([]int, error) {
	names, err := listNames(ctx, hj.jobs.storage, path.Join(jobDir(hj.rec.ID), inputName))
	if err != nil {
		return nil, fmt.Errorf("listing the input of job %s: %w", hj.rec.ID, err)
	}
	firsts := make([]int, 0, len(names))
	for _, name := range names {
		if n, err := strconv.Atoi(name); err == nil {
			firsts = append(firsts, n)
		}
	}
	slices.Sort(firsts)
	if len(firsts) == 0 && hj.rec.Items > 0 || len(firsts) > 0 && firsts[0] != 0 {
		return nil, fmt.Errorf("job %s's input is not whole: its chunks begin at %v", hj.rec.ID, firsts)
	}
	return firsts, nil
}

// chunkEnd is the job index just past chunk c.
func (d *driver) chunkEnd(c int) int {
	if c+1 < len(d.chunks) {
		return d.chunks[c+1]
	}
	return d.hj.rec.Items
}

// Why a job stops going on, as halt tells.
const (
	haltNone     = "done"
	haltCancel   = "cancel"
	haltDeadline = "deadline"
	haltStop     = "stop"
	haltLease    = "lease"
	haltPause    = "pause"
)

// halt says why no new window may start, or "" when one may: a lost
// lease first (nothing may be written), then a cancel (the client's
// word), the deadline, a pause (another instance would be refused the
// same), a hand-over (handOver closed).
func (d *driver) halt(handOver <-chan struct{}) string {
	switch {
	case d.hj.lease.lostErr() != nil:
		return haltLease
	case d.hj.CancelAsked():
		return haltCancel
	case !now().Before(d.hj.rec.Deadline):
		return haltDeadline
	case d.paused != "":
		return haltPause
	case stop.Asked(handOver):
		return haltStop
	}
	return ""
}

// window runs the items of the window that begins at job index first
// (its input, items), from the first one its results page does not hold.
func (d *driver) window(ctx context.Context, through Through, stop <-chan struct{}, first int, items []batch.ItemSnapshot) error {
	hj := d.hj
	var done int
	err := hj.retried(ctx, func() (err error) {
		done, err = d.carriedOn(ctx, first)
		return err
	})
	if err != nil {
		return err
	}
	base := first + done
	if d.envelope {
		// Its window runs whole, carried on or not: the indexes its log
		// names its operations' dependencies by stay the same.
		base = first
	}
	if done < len(items) {
		snap := d.snapshot(base, slices.Clone(items[base-first:]))
		var before map[int]batch.ItemResult
		if d.envelope {
			err := hj.retried(ctx, func() (err error) {
				before, err = d.resultsBefore(ctx, first, snap.Items)
				return err
			})
			if err != nil {
				return err
			}
		}
		if err := hj.retried(ctx, func() error { return hj.readLog(ctx, first, base, snap.Items) }); err != nil {
			return err
		}
		if err := d.finishedBefore(snap.Items[:first+done-base]); err != nil {
			return err
		}
		res, err := d.run(ctx, through, stop, first, snap, before)
		if err != nil {
			return err
		}
		if len(res.Refused) > 0 && d.paused == "" {
			d.paused = d.pauseReason(res.Refused[0], res.Items[res.Refused[0]-base].Status)
		}
		if err := hj.retried(ctx, func() error { return hj.recordStands(ctx) }); err != nil {
			return err
		}
		if why := d.failure(res); why != "" {
			// Undone from its log, as every window before it.
			return d.beginUndo(ctx, why, false)
		}
		finished := d.finished(res, stop)
		// An all-or-nothing window starts no item once its storage failed
		// one, so items it never started may come before that one: the
		// window stopped for its storage all the same, and runs again.
		d.unsent = len(finished) < len(res.Items) && len(res.Unsent) > 0
		// An envelope's window ran whole: its results page holds the
		// first done of them already.
		finished = finished[min(first+done-base, len(finished)):]
		stored := len(hj.page.lines)
		if err := hj.retried(ctx, func() error { return hj.AppendResults(ctx, first, finished) }); err != nil {
			return err
		}
		d.p.ResultsBytes += int64(len(hj.page.lines) - stored)
		d.p.Tally(finished)
		hj.jobs.hooks.finished(finished)
		done += len(finished)
	}
	d.p.Cursor = first + done
	if err := hj.retried(ctx, func() error { return hj.WriteProgress(ctx, d.p) }); err != nil {
		return err
	}
	if done == len(items) && !d.atomic {
		// An all-or-nothing job's logs are its undo journal: they stay
		// to its end.
		d.dropLater(ctx, first)
	}
	return nil
}

// dropLater deletes the log of the window at first, which ran whole
// and whose results and progress are stored, while the next window
// runs: nothing reads a log before the cursor, and deleting one key by
// key took a tenth of a job's time on the file system when the next
// window waited for it. One drop at a time; the run waits for the last
// before it ends, so that its end's own sweep of the logs (End) and a
// later owner find no drop of this one's still going. A drop that fails
// leaves the log to that sweep.
func (d *driver) dropLater(ctx context.Context, first int) {
	d.drops.Wait()
	d.drops.Go(func() {
		if err := d.hj.dropLog(context.WithoutCancel(ctx), first); err != nil {
			d.hj.jobs.logger.Warn("a job's finished window's log could not be deleted; the job's end deletes it",
				zap.String("job", d.hj.rec.ID), zap.Int("window", first), zap.Error(err))
		}
	})
}

// recordStands makes sure the job's record is still in storage before
// the owner stores a window's results and progress: gone (the storage
// forgot the job, or an operator deleted it), the lease is lost for good
// and nothing is stored, so that no results page or progress stands in
// a folder with no job. One call a window; the renewal that finds the
// lease gone looks too.
func (hj *HeldJob) recordStands(ctx context.Context) error {
	l := hj.lease
	if missing, err := gone(ctx, l.storage, l.folder.guard); !missing {
		return err
	}
	l.lost(l.folder.guardGone().why)
	return l.lostErr()
}

// retryPauses is how many pauses between the tries of a driver's
// storage step a lease holds (retried).
const retryPauses = 10

// retried runs step, a storage call of the driver, again after a failure
// while the job's lease stands, for at most a lease: a storage blip
// shorter than the lease (its renewals failing too, the lease unproven
// meanwhile, and the writes among the steps waiting for it proven
// again) then ends no run and hands no job over. A lost lease, ctx done,
// a value this build cannot read or a key that is gone ends the tries at
// once; so does a lease's time of failures, which is no blip.
func (hj *HeldJob) retried(ctx context.Context, step func() error) error {
	giveUp := now().Add(hj.lease.length)
	for {
		err := step()
		var lost *batch.LeaseLost
		switch {
		case err == nil, errors.As(err, &lost), ctx.Err() != nil, errors.Is(err, errUnreadable), errors.Is(err, fs.ErrNotExist):
			return err
		case hj.lease.lostErr() != nil:
			return hj.lease.lostErr()
		case !now().Before(giveUp):
			return err
		}
		hj.jobs.logger.Warn("a job's storage call failed; it is made again while the job's lease stands",
			zap.String("job", hj.rec.ID), zap.Int("epoch", hj.epoch), zap.Error(err))
		if hj.retryPause(ctx) != nil {
			return err
		}
	}
}

// retryPause waits a tenth of the lease (retryPauses) before a driver's
// step is tried again, or until ctx is done, whose error it returns.
func (hj *HeldJob) retryPause(ctx context.Context) error {
	t := time.NewTimer(hj.lease.length / retryPauses)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// finished is what of a window's items (its run's) the results keep:
// all of them once it ran whole. A window that stopped keeps its prefix
// that started, the rest to be run again on a hand-over or a resume,
// and a paused one its prefix before the first item refused, which was
// not processed (the items after it that went out stay in the window's
// log, as carried on); on a cancel or the deadline, the job ends, and
// the results keep every item up to the last one that started: one the
// deadline held back while later ones went out stays not_attempted
// among them.
func (d *driver) finished(res *batch.WindowResult, stop <-chan struct{}) []batch.ItemResult {
	items := res.Items
	notStarted := func(it batch.ItemResult) bool { return it.Outcome == batch.NotAttempted }
	if why := d.halt(stop); why == haltCancel || why == haltDeadline {
		for len(items) > 0 && notStarted(items[len(items)-1]) {
			items = items[:len(items)-1]
		}
		return items
	}
	unsent := func(it batch.ItemResult) bool { return slices.Contains(res.Unsent, it.Index) }
	i := slices.IndexFunc(items, func(it batch.ItemResult) bool { return notStarted(it) || refusedItem(it) || unsent(it) })
	if i < 0 {
		return items
	}
	return items[:i]
}

// run runs a window through through, its writes recorded in its log, no
// item started once stop closes, a cancel is seen, or the deadline
// passes.
func (d *driver) run(ctx context.Context, through Through, stop <-chan struct{}, first int, snap *batch.Snapshot, before map[int]batch.ItemResult) (*batch.WindowResult, error) {
	hj := d.hj
	halted := make(chan struct{})
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(halted)
		tick := time.NewTicker(cancelPoll)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-watchCtx.Done():
				return
			case <-tick.C:
				if hj.CancelAsked() || hj.lease.lostErr() != nil {
					return
				}
			}
		}
	}()
	var res *batch.WindowResult
	err := through(ctx, hj.rec, d.cred, func(site batch.Site) error {
		// A job's requests take slots below every synchronous batch's.
		log := hj.windowLog(first, snap.Base)
		site.Runtime.Journal, site.Runtime.Background = log, true
		if d.atomic {
			site.Runtime.Locks = d.held.Through(site.Runtime.Locks)
			if refusal, err := d.relock(ctx, site, first); err != nil || refusal != "" {
				res = &batch.WindowResult{Refusal: refusal}
				return err
			}
		}
		var err error
		res, err = batch.ExecuteWindow(ctx, snap, site, batch.WindowOpts{Stop: halted, Deadline: hj.rec.Deadline, KeepBody: ResultBodyLimit, Done: before, AllOrNothing: d.atomic})
		if err == nil && (d.atomic || res.Stopped || len(res.Refused) > 0 || len(res.Unsent) > 0) {
			// An all-or-nothing window's log is its undo's journal:
			// every answer in it.
			// Stopped short, or paused: what the results will not say,
			// the log must (or, its store failed, a carry-on resolves).
			err = hj.retried(ctx, func() error { return log.flush(ctx) })
		}
		return err
	})
	if err == nil && res == nil {
		err = errors.New("no handler ran the window")
	}
	if err != nil {
		return nil, fmt.Errorf("running job %s from item %d: %w", hj.rec.ID, snap.Base, err)
	}
	return res, nil
}

// carriedOn reads the results page of the window at first, which an
// earlier owner may have begun: how many items it holds, each of those
// past the progress's cursor tallied (stored before that owner's
// progress was).
func (d *driver) carriedOn(ctx context.Context, first int) (int, error) {
	hj := d.hj
	page, err := loadPage(ctx, hj.jobs.storage, hj.rec.ID, first)
	if err != nil {
		return 0, err
	}
	hj.page = page
	err = page.eachLine(hj.rec.ID, func(line ResultLine, size int) bool {
		if line.Index >= d.p.Cursor {
			// Stored before the progress that counts it was: counted
			// now, as the results' size is, with its newline.
			d.p.Tally([]batch.ItemResult{line.ItemResult})
			d.p.ResultsBytes += int64(size + 1)
		}
		return true
	})
	return page.head.Count, err
}

// finish ends the job as why says, or hands it over: stop stores the
// progress and releases the lease (nothing is undone); a lost lease
// writes nothing.
func (d *driver) finish(ctx context.Context, why string) error {
	d.drops.Wait()
	hj, p := d.hj, d.p
	switch why {
	case haltLease:
		return hj.lease.lostErr()
	case haltStop:
		if err := hj.WriteProgress(ctx, p); err != nil {
			return err
		}
		return hj.Release(ctx)
	case haltPause:
		return hj.pause(ctx, p, d.paused)
	case haltCancel:
		if d.atomic {
			return d.undoNow(ctx, "the job was cancelled", true)
		}
		p.State, p.Outcome, p.Reason = JobCancelled, "", ""
	case haltDeadline:
		if d.atomic {
			why := fmt.Sprintf("job_timeout passed (the job had to end by %s) with %d of its %d items done",
				hj.rec.Deadline.UTC().Format(time.RFC3339), p.Done, hj.rec.Items)
			if d.paused != "" {
				why += "; it was paused: " + d.paused
			}
			return d.undoNow(ctx, why, false)
		}
		p.State = partialEnd(p, hj.rec.Items)
		p.Outcome = p.State
		p.Reason = fmt.Sprintf("job_timeout passed (the job had to end by %s) with %d of its %d items done: the rest were not sent",
			hj.rec.Deadline.UTC().Format(time.RFC3339), p.Done, hj.rec.Items)
		if d.paused != "" {
			p.Reason += "; it was paused: " + d.paused
		}
	default:
		p.State = partialEnd(p, hj.rec.Items)
		if p.State == JobPartial && hj.rec.Atomicity != partialJob {
			// An all-or-nothing read fails whole when an item fails.
			p.State = JobFailed
		}
		p.Outcome = p.State
	}
	p.Ended = now().UTC()
	return hj.End(ctx, p)
}

// partialEnd is the end state of a partial job of items items that
// ran out its items or its time: failed when nothing succeeded,
// succeeded when every item did, partial otherwise.
func partialEnd(p JobProgress, items int) string {
	switch {
	case p.Succeeded == 0 && items > 0:
		return JobFailed
	case p.Succeeded == items:
		return JobSucceeded
	}
	return JobPartial
}
