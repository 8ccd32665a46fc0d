package durable

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// A job whose credentials the upstream refuses (401, 403, 407) pauses
// (docs/jobs.md, "Paused jobs"): every later item would be refused
// alike, and a job that outlives its client's token is the case jobs
// are for. The driver stores its progress as paused, with the refused
// item not among the results, and releases its lease; the latest
// progress's state, "paused", is what tells every instance not to run
// it. A resume replaces the credentials and claims it; a cancel ends it
// at once; past its job_timeout, EndPausedPastDeadline ends it as the
// deadline ends a running job.

// ErrJobNotPaused refuses the resume of a job that is not paused
// (409): it runs, waits, or ended.
var ErrJobNotPaused = errors.New("the job is not paused: only a job paused for its credentials is resumed")

// refusedItem reports whether a window's item was refused for the job's
// credentials: it pauses the job and is sent again on resume.
func refusedItem(it batch.ItemResult) bool {
	return it.Outcome == batch.Failed && batch.CredentialsRefused(it.Status)
}

// pauseReason says why the job pauses, item index refused with status:
// no body, no header, no token.
func (d *driver) pauseReason(index, status int) string {
	rec := d.hj.rec
	return fmt.Sprintf("the upstream answered item %d %d %s, refusing the credentials the job forwards: the job is paused, item %d not processed and no item started after its refusal; "+
		"resume it with new credentials (POST %s/resume with {\"headers\": {...}}) before job_timeout (%s), or cancel it",
		index, status, http.StatusText(status), index, path.Join(rec.JobsPath, rec.ID), rec.Deadline.UTC().Format(time.RFC3339))
}

// pause stores p as paused for why and releases the lease: the job then
// waits for a resume, its cancel, or its deadline. A cancel asked while
// the lease was still held found the job running and left it to its
// owner: it is ended here, once the lease is released, since no owner
// is left to see it.
func (hj *HeldJob) pause(ctx context.Context, p JobProgress, why string) error {
	p.State, p.Reason = JobPaused, why
	if err := hj.WriteProgress(ctx, p); err != nil {
		return err
	}
	hj.jobs.logger.Info("bulk job paused: the upstream refused its credentials", zap.String("job", hj.rec.ID), zap.String("reason", why))
	if err := hj.Release(ctx); err != nil {
		return err
	}
	v, err := viewJob(ctx, hj.jobs.storage, hj.rec)
	if err == nil && v.cancelled {
		_, err = hj.jobs.cancelQueued(ctx, v)
	}
	return err
}

// JobPaused reports whether job id is paused, by its latest progress's
// state, and whether it is past its job_timeout: a scan that claims
// released jobs to run them leaves a paused one alone, but for ending
// one past its deadline (EndPausedPastDeadline).
func (js *Jobs) JobPaused(ctx context.Context, id string) (paused, pastDeadline bool, err error) {
	rec, err := readJob(ctx, js.storage, id)
	if err != nil {
		return false, false, err
	}
	v, err := viewJob(ctx, js.storage, rec)
	if err != nil {
		return false, false, err
	}
	return v.progress.State == JobPaused, !now().Before(rec.Deadline), nil
}

// Resume carries on job id, paused, for the holder of token: header's
// values replace those of the same names among the headers the job
// forwards (a name with no value removes it), its progress says queued,
// and it is answered held under the next epoch, for the caller to run
// (HeldJob.Run) or release for a scan to claim. ErrUnknownJob as for
// every monitor; ErrJobNotPaused for a job that is not paused (or whose
// cancel is asked, which ends it, or that is past its job_timeout,
// which Resume then ends as EndPausedPastDeadline does, an all-or-nothing
// one left to a scan); ErrJobHeld while another instance claims it.
func (js *Jobs) Resume(ctx context.Context, id, token string, header http.Header) (*HeldJob, error) {
	v, err := js.open(ctx, id, token)
	if err != nil {
		return nil, err
	}
	if !resumable(v) {
		return nil, ErrJobNotPaused
	}
	if !now().Before(v.rec.Deadline) {
		// Too late to carry on: it ends as its deadline ends it.
		_, err := js.EndPausedPastDeadline(ctx, id)
		return nil, errors.Join(ErrJobNotPaused, err)
	}
	name := jobLock(id)
	lctx, cancel := context.WithTimeout(ctx, sweepLockWait)
	unlock, err := Lock(lctx, js.storage, name, LockPoll, js.unlockFailed(name))
	cancel()
	if errors.Is(err, itemlock.ErrLocked) {
		return nil, ErrJobHeld
	}
	if err != nil {
		return nil, fmt.Errorf("locking job %s to resume it: %w", id, err)
	}
	defer unlock()
	if v, err = viewJob(ctx, js.storage, v.rec); err != nil {
		return nil, err
	}
	if !resumable(v) {
		return nil, ErrJobNotPaused
	}
	held, err := js.claimLocked(ctx, v.rec, nil)
	if err != nil {
		return nil, err
	}
	p := v.progress
	p.State, p.Reason = JobQueued, ""
	err = held.replaceCredentials(ctx, header)
	if err == nil {
		err = held.WriteProgress(ctx, p)
	}
	if err != nil {
		// Still paused: a resume again stores the credentials.
		return nil, errors.Join(err, held.Release(context.WithoutCancel(ctx)))
	}
	return held, nil
}

// resumable reports whether v is a paused job no cancel was asked for.
func resumable(v *jobView) bool {
	return !v.ended() && !v.cancelled && v.progress.State == JobPaused
}

// replaceCredentials stores the job's forwarded headers with header's
// over them, once the lease is proven.
func (hj *HeldJob) replaceCredentials(ctx context.Context, header http.Header) error {
	cred, err := hj.Credentials(ctx)
	if err != nil {
		return err
	}
	if cred == nil {
		cred = http.Header{}
	}
	for name, values := range header {
		if len(values) == 0 {
			cred.Del(name)
			continue
		}
		cred[http.CanonicalHeaderKey(name)] = values
	}
	if err := hj.fence(ctx); err != nil {
		return err
	}
	return storeCredentials(ctx, hj.jobs.storage, hj.rec.ID, cred)
}

// EndPausedPastDeadline ends job id, paused past its job_timeout, as the
// deadline ends a running job: partial, or failed when nothing
// succeeded, with the reason (the pause's in it). It claims the job's
// released lease, so that a resume or a cancel racing it finds the job
// held, or ended. It reports whether it ended the job; false, with no
// error, for a job not paused or not past its deadline, or another
// instance's claim, and for an all-or-nothing job: its undo sends
// requests, which only a run has the routes for, so a scan claims it
// and runs it (jobscan.go), and its run undoes it.
func (js *Jobs) EndPausedPastDeadline(ctx context.Context, id string) (bool, error) {
	if !validJobID(id) {
		return false, ErrUnknownJob
	}
	name := jobLock(id)
	unlock, err := Lock(ctx, js.storage, name, 0, js.unlockFailed(name))
	if errors.Is(err, itemlock.ErrLocked) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("locking job %s to end it: %w", id, err)
	}
	defer unlock()
	rec, err := readJob(ctx, js.storage, id)
	if err != nil {
		return false, err
	}
	v, err := viewJob(ctx, js.storage, rec)
	if err != nil || v.ended() || v.progress.State != JobPaused || now().Before(rec.Deadline) || rec.atomic() {
		return false, err
	}
	held, err := js.claimLocked(ctx, rec, nil)
	if errors.Is(err, ErrJobHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	err = held.endPaused(ctx, haltDeadline)
	var lost *batch.LeaseLost
	if err != nil && !errors.As(err, &lost) {
		// As Run leaves a job it could not drive: released, still paused.
		err = errors.Join(err, held.Release(context.WithoutCancel(ctx)))
	}
	return err == nil, err
}

// endPaused ends the job, paused, as why (haltCancel, haltDeadline)
// says: first the answers of its pausing window's log laid into its
// results (the items that were in flight when it paused finished, and
// count), then as the driver ends a job.
func (hj *HeldJob) endPaused(ctx context.Context, why string) error {
	d, err := hj.newDriver(ctx)
	if err != nil {
		return err
	}
	if err := d.settleLogged(ctx); err != nil {
		return err
	}
	return d.finish(ctx, why)
}

// settleLogged stores, in the results of the window at the cursor, what
// its log says of the items past the results' prefix, up to the last
// one that went out: answered items as answered, a write with no answer
// recorded as unknown, the rest (the refused item among them)
// not_attempted.
func (d *driver) settleLogged(ctx context.Context) error {
	hj := d.hj
	first, end, ok := d.windowAt(d.p.Cursor)
	if !ok {
		return nil
	}
	chunk, err := d.chunkAt(d.p.Cursor)
	if err != nil {
		return err
	}
	done, err := d.carriedOn(ctx, first)
	if err != nil {
		return err
	}
	base := first + done
	items, err := hj.ReadChunk(ctx, chunk)
	if err != nil {
		return err
	}
	if base >= end {
		return nil
	}
	logged := slices.Clone(items[base-chunk : end-chunk])
	if err := hj.readLog(ctx, first, base, logged); err != nil {
		return err
	}
	results := make([]batch.ItemResult, len(logged))
	last := -1
	for i, it := range logged {
		results[i] = loggedResult(base+i, it)
		if results[i].Outcome != batch.NotAttempted {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	results = results[:last+1]
	stored := len(hj.page.lines)
	if err := hj.AppendResults(ctx, first, results); err != nil {
		return err
	}
	d.p.ResultsBytes += int64(len(hj.page.lines) - stored)
	d.p.Tally(results)
	d.p.Cursor = base + len(results)
	return nil
}

// windowAt is the window that holds job index i: its first item and
// the index past its last; ok false past the job's items.
func (d *driver) windowAt(i int) (first, end int, ok bool) {
	for c, chunk := range d.chunks {
		if cend := d.chunkEnd(c); i < cend && i >= chunk {
			first = chunk + (i-chunk)/jobWindowItems*jobWindowItems
			return first, min(first+jobWindowItems, cend), true
		}
	}
	return 0, 0, false
}

// chunkAt is the first item of the input chunk that holds job index i,
// which windowAt found.
func (d *driver) chunkAt(i int) (int, error) {
	for c, chunk := range d.chunks {
		if i >= chunk && i < d.chunkEnd(c) {
			return chunk, nil
		}
	}
	return 0, fmt.Errorf("job %s has no input chunk holding item %d", d.hj.rec.ID, i)
}

// loggedResult is the result of job item index as its log's last record
// (it, or its input when none) says.
func loggedResult(index int, it batch.ItemSnapshot) batch.ItemResult {
	res := batch.ItemResult{Index: index, ID: it.ID, Outcome: batch.NotAttempted}
	switch {
	case it.Phase == batch.PhaseSending, it.Phase >= batch.PhaseAnswered && it.Outcome == batch.Unknown:
		res.Outcome, res.Status = batch.Unknown, http.StatusBadGateway
		res.Error = "the job paused, then ended, before this write's answer was recorded: it may have taken effect"
	case it.Phase >= batch.PhaseAnswered && it.Outcome != "":
		res.Outcome, res.Status, res.Error = it.Outcome, it.Status, it.Error
	}
	return res
}
