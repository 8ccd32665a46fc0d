package batchapp

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/stop"
)

// Bulk jobs run in the process, not in a request (docs/jobs.md): the
// app runs each job on a goroutine of its own, sends each of its windows
// through the server's routes as a recovery's request goes (so that a
// reload's new routes apply from the next window on), and scans the
// storage for jobs that wait for an owner: queued ones, ones handed over
// at a stop, ones whose owner died. Its Stop hands its jobs over.

// A JobHost is the batch handler that serves a job, as a job's request
// through the routes reaches it.
type JobHost interface {
	// Room takes one of the handler's max_jobs for a job, if one is
	// free; release gives it back.
	Room() (release func(), ok bool)
	// Site is where a window of the job runs: the handler chain after
	// the handler, as the job's request reached it, under the job's
	// resource's settings.
	Site() batch.Site
}

// A JobTrip is what a job's request through the routes carries: the job,
// and the call that the batch handler serving it offers itself to.
type JobTrip struct {
	rec   *durable.JobRecord
	taken atomic.Bool
	call  func(JobHost)
}

// Record is the job the trip is for.
func (t *JobTrip) Record() *durable.JobRecord { return t.rec }

// Offer gives the trip the handler that serves its job, which it uses at
// once, before Offer returns (the chain after the handler is the
// handler's to call only while it serves the request). The first offer
// is taken; a later one, from a batch handler the job's own
// sub-requests reach, is refused (false), and that handler passes the
// request on.
func (t *JobTrip) Offer(host JobHost) bool {
	if !t.taken.CompareAndSwap(false, true) {
		return false
	}
	t.call(host)
	return true
}

type jobTripCtxKeyType struct{}

var jobTripCtxKey jobTripCtxKeyType

// JobTripOf is the job a request made by the app carries, if it is one:
// the batch handler that serves it offers itself instead of serving a
// client.
func JobTripOf(ctx context.Context) (*JobTrip, bool) {
	t, ok := ctx.Value(jobTripCtxKey).(*JobTrip)
	return t, ok
}

// errNoConfig is a job's trip while no running config has the batch app.
var errNoConfig = errors.New("no running config has a batch handler to run the job through; it carries on once one has")

// withHost sends a request for the job rec, with header cred, through
// the routes of the running config, and calls use with the batch handler
// that serves the job, before it returns.
func withHost(rec *durable.JobRecord, cred http.Header, use func(JobHost)) error {
	a := operated.Load()
	if a == nil {
		return errNoConfig
	}
	t := &JobTrip{rec: rec, call: use}
	routed, err := a.throughRoutes(rec.Origin, cred, jobTripCtxKey, t)
	if err != nil {
		return err
	}
	if !t.taken.Load() {
		return notReached(rec.Origin, rec.Path, routed)
	}
	return nil
}

// ThroughRoutes is the route of every window of every job, and of a
// start's first item: a trip of its own through the running config's
// routes, as the start request went. A window is traced under its run's
// span, the first item under its start's (jobtrace.go).
func ThroughRoutes(ctx context.Context, rec *durable.JobRecord, cred http.Header, work func(batch.Site) error) error {
	var err error
	if terr := withHost(rec, cred, func(h JobHost) { err = work(traced(ctx, h.Site())) }); terr != nil {
		return terr
	}
	return err
}

// handOverWait bounds how long a Stop waits for its jobs to hand over:
// each finishes the requests it has in flight first. One that takes
// longer hands over when it is done, on its own.
const handOverWait = 30 * time.Second

// RunJob runs the job held on a goroutine of the process until it ends,
// or this config stops (it then hands the job over: its progress stored,
// its lease released for the next scan of any instance), and then calls
// release. A job that stops short (its lease lost, the storage failing)
// is left as durable leaves it: released, or, with its lease lost, to
// whoever holds it now.
func (a *App) RunJob(held *durable.HeldJob, release func()) {
	a.state.mu.Lock()
	stopping := stop.Asked(a.stop)
	if !stopping {
		a.jobsRunning.Add(1) // before handOver's Wait, or not at all
	}
	a.state.mu.Unlock()
	if stopping {
		defer release()
		if err := held.Release(context.Background()); err != nil {
			a.logger.Warn("releasing a bulk job as its config stops; it is taken over once its lease lapses", zap.String("job", held.Record().ID), zap.Error(err))
		}
		return
	}
	go func() {
		defer a.jobsRunning.Done()
		defer NudgeJobs()
		defer release()
		rec := held.Record()
		a.logger.Info("bulk job running", zap.String("job", rec.ID), zap.String("op", rec.Op),
			zap.String("resource", rec.Resource), zap.Int("items", rec.Items), zap.Int("epoch", held.Epoch()))
		ctx, tr := withJobTrace(context.Background(), held)
		err := held.Run(ctx, ThroughRoutes, a.stop)
		tr.end(err)
		var lost *batch.LeaseLost
		switch {
		case errors.As(err, &lost):
			// Not this instance's any more: another carries it on, or, its
			// record gone from storage, nobody does (the reason says).
			a.logger.Warn("bulk job stopped: its lease is lost, and this instance sends nothing more for it",
				zap.String("job", rec.ID), zap.String("why", lost.Why))
		case err != nil && handedOver(err, a.stop):
			a.logger.Info("bulk job handed over: the next scan of an instance with room carries it on", zap.String("job", rec.ID))
		case err != nil:
			a.logger.Warn("bulk job stopped before its end: the next scan of an instance with room carries it on",
				zap.String("job", rec.ID), zap.Error(err))
		case held.FinalStatus() != nil:
			a.logger.Info("bulk job ended", jobEndFields(held.FinalStatus())...)
		default:
			a.logger.Info("bulk job handed over: the next scan of an instance with room carries it on", zap.String("job", rec.ID))
		}
	}()
}

// handedOver says whether a run that stopped with err was handed over:
// its config stopped between two windows, after the run saw it had not
// and before the next window found the config's routes (Run released
// its lease, as a hand-over does, and sent nothing of that window).
func handedOver(err error, stopped <-chan struct{}) bool {
	return errors.Is(err, errNoConfig) && stop.Asked(stopped)
}

// NudgeJobs has the running config's jobs' scan look at once: a job
// ended or was handed over (by a config that stopped, for the next),
// and room freed; or a cancel left a job that only a run can end (an
// all-or-nothing one paused, which is undone).
func NudgeJobs() {
	a := operated.Load()
	if a == nil {
		return
	}
	select {
	case a.jobsNudge <- struct{}{}:
	default:
	}
}

// scanJobs claims the jobs that wait for an owner, where a handler of
// this config has room (durable's Scan).
func (a *App) scanJobs(ctx context.Context) {
	err := a.jobs.Scan(ctx, a.jobRoom, func(id, doing string, err error) {
		if a.firstFailure("job "+id, doing+": "+err.Error()) {
			a.logger.Error("a bulk job waiting for an owner could not be taken; it stays in storage and is tried again",
				zap.String("job", id), zap.String("while", doing), zap.Error(err))
		}
	})
	if err != nil && ctx.Err() == nil {
		a.logger.Warn("listing bulk jobs in storage", zap.Error(err))
	}
}

// jobRoom is the scan's JobRoom: a max_jobs slot of the handler that
// serves rec, found through the routes as the job's windows will be.
func (a *App) jobRoom(rec *durable.JobRecord) (run func(*durable.HeldJob), release func(), ok bool) {
	if stop.Asked(a.stop) {
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), durable.StorageTimeout)
	defer cancel()
	cred, err := a.jobs.Credentials(ctx, rec)
	if err != nil {
		a.logger.Warn("reading a bulk job's credentials to find its handler", zap.String("job", rec.ID), zap.Error(err))
		return nil, nil, false
	}
	err = withHost(rec, cred, func(h JobHost) { release, ok = h.Room() })
	if err != nil {
		if a.firstFailure("job "+rec.ID, err.Error()) {
			a.logger.Warn("a bulk job waiting for an owner has no handler in this config to run it", zap.String("job", rec.ID), zap.Error(err))
		}
		return nil, nil, false
	}
	if !ok {
		return nil, nil, false
	}
	return func(held *durable.HeldJob) { a.RunJob(held, release) }, release, true
}

// jobEndFields are the fields of a job's end line: how it ended (st, its
// final status), and its counts; never a body or its token (a status
// holds neither).
func jobEndFields(st *durable.JobStatus) []zap.Field {
	fields := []zap.Field{zap.String("job", st.ID), zap.String("state", st.State), zap.String("outcome", st.Outcome),
		zap.String("op", st.Op), zap.String("resource", st.Resource), zap.Int("items", st.Items), zap.Int("done", st.Done),
		zap.Int("succeeded", st.Succeeded), zap.Int("failed", st.Failed), zap.Int("takeovers", st.Takeovers)}
	if st.Reason != "" {
		fields = append(fields, zap.String("reason", st.Reason))
	}
	return fields
}
