package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
)

// HeldJob is a job as the instance that owns it writes it: under one
// lease epoch, whose number names every key it writes (progress.<epoch>),
// so that what an earlier owner writes late never covers a later one's.
type HeldJob struct {
	jobs  *Jobs
	rec   *JobRecord
	epoch int
	lease *fencedLease
	// page is the results page of the window being written, as stored
	// (jobresults.go).
	page resultsPage
	// logSeq numbers the log records this epoch stores (joblog.go).
	logSeq atomic.Int64
	// final is the job's status once End stored its end.
	final atomic.Pointer[JobStatus]
	// stored is the last progress this epoch stored, for the end of the
	// run's span (Stored).
	stored atomic.Pointer[JobProgress]
	// locksLost says why one of the item locks the job holds is lost
	// (windowLog.WatchLocks); nil while none is watched.
	locksLost atomic.Pointer[func() error]
}

// Record is the job as it was started.
func (hj *HeldJob) Record() *JobRecord { return hj.rec }

// Epoch is the lease epoch the job is held under.
func (hj *HeldJob) Epoch() int { return hj.epoch }

// WriteProgress stores p as this epoch's progress, once the lease is
// proven: not at all once it is lost.
func (hj *HeldJob) WriteProgress(ctx context.Context, p JobProgress) error {
	if err := hj.fence(ctx); err != nil {
		return err
	}
	p.Version = 1
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := hj.jobs.storage.Store(ctx, progressKey(hj.rec.ID, hj.epoch), b); err != nil {
		return fmt.Errorf("storing the progress of job %s: %w", hj.rec.ID, err)
	}
	hj.stored.Store(&p)
	return nil
}

// Stored is the last progress this epoch stored (ok false before any):
// what the run leaves the job as, when it ends it, hands it over or
// pauses it.
func (hj *HeldJob) Stored() (p JobProgress, ok bool) {
	if s := hj.stored.Load(); s != nil {
		return *s, true
	}
	return JobProgress{}, false
}

// End ends the job with final (its state one a job ends in, Ended set),
// in an order a crash at any point leaves sweepable: the final progress
// first (monitors see the end), then the expiry entry at Ended + ttl
// (instead of the one at Deadline + ttl), the job-index entry renamed to
// the end state, the job-active and job-clients entries removed (the
// quota freed), and last what the job needs no more: its credentials,
// input, windows' logs and lease (its renewals stopped first). The cancel mark and the results stay for the monitors, until
// the job expires or is removed. Once the final progress is stored, the
// rest is written whether or not the lease still stands: the job ended,
// and an owner that took it over meanwhile finds it so.
func (hj *HeldJob) End(ctx context.Context, final JobProgress) error {
	if !jobEnded(final.State) || final.Ended.IsZero() {
		return fmt.Errorf("ending job %s as %q at %v: the end needs an end state and a time", hj.rec.ID, final.State, final.Ended)
	}
	s, rec := hj.jobs.storage, hj.rec
	if err := hj.WriteProgress(ctx, final); err != nil {
		return err
	}
	// The job ended with its progress stored, whatever the rest does:
	// its status and hook say so once, after the rest is tidied.
	st := (&jobView{rec: rec, progress: final}).status()
	hj.final.Store(st)
	defer hj.jobs.hooks.ended(st)
	expires := final.Ended.Add(rec.TTL)
	if err := fileJobExpiry(ctx, s, rec.ID, expires, rec.TTL); err != nil {
		return err
	}
	if err := s.Store(ctx, rec.indexKey(final.State), rec.entry()); err != nil {
		return fmt.Errorf("indexing job %s as %s: %w", rec.ID, final.State, err)
	}
	var errs []error
	if lapses := jobExpiryKey(rec.ID, rec.lapses(), rec.TTL); lapses != jobExpiryKey(rec.ID, expires, rec.TTL) {
		errs = append(errs, deleteKey(ctx, s, lapses))
	}
	for _, key := range []string{rec.indexKey(jobIndexActive), rec.activeKey(), rec.clientKey(), jobKey(rec.ID, credentialsName)} {
		errs = append(errs, deleteKey(ctx, s, key))
	}
	errs = append(errs, deleteFolder(ctx, s, path.Join(jobDir(rec.ID), inputName)))
	if final.State != JobRollbackFailed {
		// A job that left items behind keeps its logs, which hold each
		// one's pre-image, for whoever repairs them.
		errs = append(errs, deleteLogs(ctx, s, rec.ID))
	}
	hj.lease.end("the job ended")
	errs = append(errs, deleteLeases(ctx, s, rec.ID))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clearing job %s after its end: %w", rec.ID, err)
	}
	return nil
}

// FinalStatus is the job's status as End stored it, for the line that
// logs its end; nil before End stored it (a job handed over, or lost).
func (hj *HeldJob) FinalStatus() *JobStatus { return hj.final.Load() }

// deleteLeases deletes the job's lease keys, lease and lease.<epoch>.<tag>.
func deleteLeases(ctx context.Context, s Storage, id string) error {
	names, err := listNames(ctx, s, jobDir(id))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if name == leaseName || strings.HasPrefix(name, leaseName+".") {
			errs = append(errs, deleteKey(ctx, s, jobKey(id, name)))
		}
	}
	return errors.Join(errs...)
}

// deleteFolder deletes the keys right under dir one by one (a Redis
// storage deletes no folder whole), then the emptied folder.
func deleteFolder(ctx context.Context, s Storage, dir string) error {
	names, err := listNames(ctx, s, dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := deleteKey(ctx, s, path.Join(dir, name)); err != nil {
			return err
		}
	}
	return removeEmptyFolder(ctx, s, dir)
}

// Queue gives the job up to wait for an instance with room (its client
// started or resumed it where every max_jobs runs): its progress stored
// queued, what it did standing, then its lease released for the next
// scan. This HeldJob writes nothing after.
func (hj *HeldJob) Queue(ctx context.Context) error {
	v, err := viewJob(ctx, hj.jobs.storage, hj.rec)
	if err != nil {
		return err
	}
	p := v.progress
	p.State = JobQueued
	if !p.Undoing {
		p.Reason = "" // an undo's stays: it says why the job is undone
	}
	if err := hj.WriteProgress(ctx, p); err != nil {
		return err
	}
	return hj.Release(ctx)
}
