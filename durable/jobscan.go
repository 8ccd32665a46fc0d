package durable

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// A job carries on wherever there is room for it (docs/durability.md,
// "Bulk jobs in storage"): every instance scans the active jobs, and
// claims, under the next lease epoch, each whose lease was released (a
// queued job, a hand-over at a stop) or stood unchanged for a whole
// lease on this process's clocks (its owner died, or lost the storage),
// as a saga is taken over (recovery.go), when it has room for it.

// JobRoom is what a scan asks before it claims the job rec: room to run
// it on this instance (one of max_jobs). ok false leaves the job for the
// next scan, or another instance; otherwise exactly one of run (with the
// job claimed) or release (the claim failed) is called.
type JobRoom func(rec *JobRecord) (run func(*HeldJob), release func(), ok bool)

// jobsRunning counts the jobs this process runs (HeldJob.Run), which an
// exit waits for (Wait): each hands over at a stop. A count, not a
// WaitGroup, for jobs run in several synctest bubbles of one test binary.
var jobsRunning atomic.Int64

// jobsStopped returns once no job runs in this process: polled, as only
// an exit waits.
func jobsStopped() {
	for jobsRunning.Load() > 0 {
		time.Sleep(50 * time.Millisecond)
	}
}

// Scan claims each active job of the storage that waits for an owner
// and for which room has room, and hands it to room's run. A paused job
// waits for its client's resume, not for room, until its job_timeout
// passed: the scan then ends it as the deadline ends a job. A job that cannot be
// read or claimed is told to failed, with what was being done, and
// looked at again by the next scan. The error is the listing's: then
// nothing was scanned.
func (js *Jobs) Scan(ctx context.Context, room JobRoom, failed func(id, doing string, err error)) error {
	names, err := listNames(ctx, js.storage, jobActivePrefix)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(names))
	for _, name := range names {
		ids = append(ids, name[strings.LastIndexByte(name, '.')+1:]) // <created>.<id>
	}
	js.watch.forgetAllBut(ids)
	for k, id := range ids {
		if ctx.Err() != nil {
			return nil
		}
		if doing, err := js.scanJob(ctx, names[k], id, room); err != nil {
			failed(id, doing, err)
		}
	}
	return nil
}

// scanJob claims the job id, listed active as name, for room if it
// waits for an owner: an error comes with what was being done.
func (js *Jobs) scanJob(ctx context.Context, name, id string, room JobRoom) (string, error) {
	if !validJobID(id) {
		return "", nil // another build's entry
	}
	lease, err := readFolderLease(ctx, js.storage, jobLeases(id))
	if err != nil {
		return "reading the job's lease", err
	}
	if !lease.released() && !js.watch.unchangedFor(id, lease.record(), js.leases.Length) {
		return "", nil
	}
	rec, err := readJob(ctx, js.storage, id)
	if errors.Is(err, fs.ErrNotExist) {
		// Listed active with no record, and no owner for a whole lease:
		// the storage forgot the job (a record goes in before its
		// entries, and out after them). Nobody can carry it on, and its
		// entries would only be read again at every scan.
		js.watch.forget(id)
		return "clearing the entries of a job whose record is gone", js.dropForgotten(ctx, name)
	}
	if err != nil {
		return "reading the job", err
	}
	v, err := viewJob(ctx, js.storage, rec)
	switch {
	case err != nil:
		return "reading the job's progress", err
	case v.ended():
		return "", nil // its owner is clearing it after its end
	case v.progress.State == JobPaused && rec.atomic() && (v.cancelled || !now().Before(rec.Deadline)):
		// Undone, which takes its routes: it is claimed and run, and
		// its run undoes it.
	case v.progress.State == JobPaused && now().Before(rec.Deadline):
		return "", nil
	case v.progress.State == JobPaused:
		// Nothing is sent: the job ends as its deadline ends it.
		if _, err := js.EndPausedPastDeadline(ctx, id); err != nil {
			return "ending the job paused past its job_timeout", err
		}
		return "", nil
	}
	run, release, ok := room(rec)
	if !ok {
		return "", nil
	}
	held, err := js.claim(ctx, rec, &lease)
	if err != nil {
		release()
		if errors.Is(err, ErrJobHeld) {
			return "", nil // its owner renewed, or another instance was first
		}
		return "claiming the job", err
	}
	js.watch.forget(id)
	run(held)
	return "", nil
}

// dropForgotten deletes the active and index entries, listed as name
// (<created>.<id>), of a job not ended whose record the storage lost,
// and logs it: its quota entry goes at its client's next count
// (CheckQuota), its expiry entry at the sweep.
func (js *Jobs) dropForgotten(ctx context.Context, name string) error {
	js.logger.Error("a bulk job listed active has no record in storage (the storage lost it, or an operator deleted it): its entries are removed, and nobody carries it on",
		zap.String("job", name[strings.LastIndexByte(name, '.')+1:]))
	return errors.Join(
		deleteKey(ctx, js.storage, path.Join(jobActivePrefix, name)),
		deleteKey(ctx, js.storage, path.Join(jobIndexPrefix, name+"."+jobIndexActive)),
	)
}
