// Package batchapp is the Caddy glue of what outlives a request: the
// "batch" app, which runs durable's recovery scan and Idempotency-Key
// sweep for a config and finishes a taken-over saga through the
// server's routes, the certmagic adapter of durable's storage, and the
// operator's surface over the app's journals (the admin.api.batch
// module and the caddy batch subcommands; docs/operations.md, "Sagas
// left behind"). The
// batch handler joins the app as it is provisioned (Register) and
// offers a Finisher for each saga the app sends it (RecoveryOf).
package batchapp

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/traceprop"
)

func init() {
	caddy.RegisterModule(App{})
	httpcaddyfile.RegisterGlobalOption("batch", parseGlobalOption)
	// A process that exits lets the sagas it runs finish first, once its
	// servers stopped taking requests: one cut short would wait a lease
	// for another instance to undo it, when it can be finished now.
	caddy.OnExit(func(ctx context.Context) { _ = durable.Wait(ctx) })
}

// App finishes the all-or-nothing batches that a Caddy process did not:
// at start, and then every recovery_interval, it looks in Caddy's
// storage for saga journals whose owner's lease lapsed (the process
// died, or left the cluster), takes each over under a storage lock, and
// undoes what the batch did, with the same proofs, sending through the
// handler chain of the server the batch came in on. Every batch handler
// loads it; it needs no configuration of its own.
type App struct {
	// How long this process holds what it holds in storage without
	// renewing it: the journals of the sagas it runs and its
	// Idempotency-Key claims, renewed every third of this while they run
	// (docs/durability.md, "Leases"). A saga whose owner died is taken
	// over by another process this long after the last renewal, and a
	// key whose gateway died is told abandoned, so clocks of instances
	// that share a storage must agree to well within it. Default: 30s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// How often this process looks for journals whose owner's lease
	// lapsed. Default: 10s.
	RecoveryInterval caddy.Duration `json:"recovery_interval,omitempty"`

	// How often this process tries to sweep expired Idempotency-Key
	// records, and bulk jobs past their job_ttl where a handler runs
	// jobs (one instance of a cluster sweeps at a time, under a
	// storage lock): a record is gone at most this plus a 64th of
	// idempotency_ttl (5 minutes at most) after it expired
	// (docs/durability.md, "Expiry and the sweep"). At most 1h.
	// Default: 5m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	ctx        caddy.Context
	logger     *zap.Logger
	leases     *durable.Leases
	journals   *durable.Journals
	sweeper    *durable.Sweeper
	jobSweeper *durable.Sweeper
	// jobStore is where the jobs' scan looks; jobsRunning are the jobs
	// this config runs (RunJob), which its Stop hands over; jobsNudge
	// has the scan look at once.
	jobStore      *durable.Jobs
	jobsRunning   *sync.WaitGroup
	jobsNudge     chan struct{}
	state         *appState
	stop, stopped chan struct{}
	// prop are the propagators of Caddy's tracing, whose headers a
	// recovery's request does not carry (finishThrough).
	prop *traceprop.Propagation
	// events is the config's events app, which the module's events go
	// through (events.go).
	events *caddyevents.App
	// jobs are the bulk jobs of the storage, as the operator sees them
	// (adminjobs.go).
	jobs *durable.Jobs
}

type appState struct {
	mu       sync.Mutex
	handlers int
	// jobs says a handler of the config runs bulk jobs, whose expired
	// ones the app sweeps.
	jobs bool
	// failed names the sagas this process could not finish, with why,
	// in this scan and the one before, so that each is logged once and
	// not every interval, and a saga that no longer fails is forgotten.
	failed, failedBefore map[string]string
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "batch",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision only prepares: caddy validate provisions too, and must start
// nothing and write nothing.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx, a.logger = ctx, ctx.Logger()
	if a.Lease == 0 {
		a.Lease = caddy.Duration(30 * time.Second)
	}
	if a.RecoveryInterval == 0 {
		a.RecoveryInterval = caddy.Duration(10 * time.Second)
	}
	if a.SweepInterval == 0 {
		a.SweepInterval = caddy.Duration(5 * time.Minute)
	}
	// The process's leases: what a saga holds outlives this config.
	a.leases = durable.ProcessLeases(time.Duration(a.Lease))
	storage := DurableStorage(ctx.Storage())
	path, why := StoragePath(ctx.Storage())
	a.logger.Info("storage fast path", zap.String("path", path), zap.String("why_not", why))
	a.journals = durable.NewJournals(storage, a.leases, a.logger)
	a.sweeper = durable.NewSweeper(storage, a.logger)
	a.jobSweeper = durable.NewJobSweeper(storage, a.logger)
	a.jobs = durable.NewJobs(storage, a.leases, a.logger).WithHooks(JobHooks())
	a.jobsNudge = make(chan struct{}, 1)
	a.jobsRunning = new(sync.WaitGroup)
	a.state = &appState{failed: map[string]string{}}
	a.prop = traceprop.New()
	ev, err := ctx.App("events")
	if err != nil {
		return fmt.Errorf("batch: loading the events app: %w", err)
	}
	a.events = ev.(*caddyevents.App)
	return nil
}

// Validate refuses durations that cannot work: a lease shorter than a
// second would lapse between two renewals of a busy storage.
func (a *App) Validate() error {
	if a.Lease < caddy.Duration(time.Second) {
		return fmt.Errorf("batch: lease %s is too short: give a second or more, e.g. 30s", time.Duration(a.Lease))
	}
	if a.RecoveryInterval < caddy.Duration(10*time.Millisecond) {
		return fmt.Errorf("batch: recovery_interval %s is too short: give e.g. 10s", time.Duration(a.RecoveryInterval))
	}
	if a.SweepInterval < caddy.Duration(10*time.Millisecond) || a.SweepInterval > caddy.Duration(time.Hour) {
		return fmt.Errorf("batch: sweep_interval %s is out of range: give at most 1h, e.g. 5m", time.Duration(a.SweepInterval))
	}
	return nil
}

// Register is how a batch handler joins the app, in its Provision: it
// gets the config's journals, and the lease its Idempotency-Key claims
// are held under.
func (a *App) Register() (*durable.Journals, *durable.Leases) {
	a.state.mu.Lock()
	defer a.state.mu.Unlock()
	a.state.handlers++
	return a.journals, a.leases
}

// SweepJobs is how a batch handler that runs bulk jobs says so, in its
// Provision: the app then sweeps the jobs past their job_ttl too.
func (a *App) SweepJobs() {
	a.state.mu.Lock()
	defer a.state.mu.Unlock()
	a.state.jobs = true
}

// Start starts looking for journals to finish, and sweeping expired
// Idempotency-Key records, each on its own schedule, so that a long
// sweep never delays a takeover. With no batch handler in the config
// there is no chain to finish journals through, so it does neither.
func (a *App) Start() error {
	a.stop, a.stopped = make(chan struct{}), make(chan struct{})
	a.state.mu.Lock()
	handlers, jobs := a.state.handlers, a.state.jobs
	a.state.mu.Unlock()
	if handlers == 0 {
		close(a.stopped)
		return nil
	}
	operated.Store(a)
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { a.every(ctx, time.Duration(a.RecoveryInterval), a.scan, nil) })
	loops.Go(func() { a.every(ctx, time.Duration(a.SweepInterval), a.sweepIdempotency, nil) })
	if jobs {
		loops.Go(func() { a.every(ctx, time.Duration(a.RecoveryInterval), a.scanJobs, a.jobsNudge) })
		loops.Go(func() { a.every(ctx, time.Duration(a.SweepInterval), a.sweepJobs, nil) })
		loops.Go(func() { a.every(ctx, time.Duration(a.RecoveryInterval), a.countJobs, nil) })
	}
	go func() {
		<-a.stop
		cancel()
		loops.Wait()
		close(a.stopped)
	}()
	return nil
}

// Stop stops the scan and the sweep, and returns once both stopped.
// Sagas this process is finishing go on to their end, as batches in
// flight do: they, their leases and their journals' removal belong to
// the process (durable.Wait).
func (a *App) Stop() error {
	if a.stop == nil {
		return nil
	}
	// Closed first: a job between two windows then hands over rather
	// than finding no config to run its next window through.
	close(a.stop)
	operated.CompareAndSwap(a, nil)
	<-a.stopped
	a.handOver()
	return nil
}

// handOver waits for the jobs this config runs to hand over (RunJob),
// for at most handOverWait: the next config's scan, or another
// instance's, carries them on.
func (a *App) handOver() {
	a.state.mu.Lock() // a RunJob that did not see the stop has counted its job
	a.state.mu.Unlock()
	done := make(chan struct{})
	go func() {
		a.jobsRunning.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(handOverWait):
		a.logger.Warn("bulk jobs still finishing their requests in flight after the config stopped: each hands over once they are done")
	}
}

// every does work at once and then every interval, and at once when
// nudged, until ctx is done.
func (a *App) every(ctx context.Context, interval time.Duration, work func(context.Context), nudge <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		work(ctx)
		select {
		case <-ctx.Done():
		case <-tick.C:
		case <-nudge:
		}
	}
}

// parseGlobalOption reads the global option that configures the app:
//
//	{
//	    batch {
//	        lease             <duration>
//	        recovery_interval <duration>
//	    }
//	}
func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	var a App
	d.Next() // the option's name
	if d.NextArg() {
		return nil, d.Errf("the batch global option takes a block, not %q", d.Val())
	}
	for d.NextBlock(0) {
		name := d.Val()
		var dst *caddy.Duration
		switch name {
		case "lease":
			dst = &a.Lease
		case "recovery_interval":
			dst = &a.RecoveryInterval
		case "sweep_interval":
			dst = &a.SweepInterval
		default:
			return nil, d.Errf("unknown batch global option %q (it takes lease, recovery_interval, sweep_interval)", name)
		}
		if !d.NextArg() {
			return nil, d.Errf("%s takes a duration, e.g. %s 10s", name, name)
		}
		v, err := caddy.ParseDuration(d.Val())
		if err != nil || v <= 0 {
			return nil, d.Errf("%s takes a positive duration such as 10s, not %q", name, d.Val())
		}
		*dst = caddy.Duration(v)
		if d.NextArg() {
			return nil, d.Errf("%s takes one duration", name)
		}
	}
	return httpcaddyfile.App{Name: "batch", Value: caddyconfig.JSON(a, nil)}, nil
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
	_ caddy.Validator   = (*App)(nil)
)
