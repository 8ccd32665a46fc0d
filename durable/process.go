package durable

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
)

// What belongs to the process rather than to one config (docs/durability.md,
// "Leases"): a saga outlives the config reload that replaced the config
// it started under, and the renewal of its lease, and the removal of its
// journal, must outlive it too, or a recovery would take over, and undo,
// a saga still running or already done. So the leases are one per
// length for the process (ProcessLeases), handed from one config's app
// to the next, and the journals whose removal failed are retried by the
// process (removals) until they go; both end at process exit, after the
// sagas (Wait).

var processLeases = struct {
	mu     sync.Mutex
	leases map[time.Duration]*Leases
}{leases: map[time.Duration]*Leases{}}

// ProcessLeases is the process's leases of length: every config with
// that lease shares them, so a reload hands what is held to the next
// config. Each renews only while something is held, so the few lengths
// a process was ever configured with cost nothing idle.
func ProcessLeases(length time.Duration) *Leases {
	processLeases.mu.Lock()
	defer processLeases.mu.Unlock()
	l := processLeases.leases[length]
	if l == nil {
		l = NewLeases(length)
		processLeases.leases[length] = l
	}
	return l
}

// removals are the journals whose removal failed, each retried every
// half of its lease, under the lease, until it goes; at exit (Wait)
// each is tried at once, and then every second, for as long as the exit
// allows.
var removals = newPendingRemovals()

type pendingRemovals struct {
	running   sync.WaitGroup
	hurryOnce sync.Once
	hurry     chan struct{}
}

func newPendingRemovals() *pendingRemovals {
	return &pendingRemovals{hurry: make(chan struct{})}
}

// exitRemovalGrace bounds how long an exit waits for the journals whose
// removal failed, once the sagas ended.
const exitRemovalGrace = 3 * StorageTimeout

// retry tries end (what is left of ending j: keeping its saga, removing
// its journal) again until it succeeds.
func (p *pendingRemovals) retry(j *Journal, end func(context.Context) error) {
	sagas := owned // the set the saga is in, read before the goroutine: tests change it
	p.running.Go(func() {
		j.endLater(p.hurry, end, j.js.leases.Length/2, nil)
		sagas.forget(j.saga)
	})
}

// finish runs end (what is left of a removal whose end is recorded)
// at once, in the background, then as retry does until it succeeds.
func (p *pendingRemovals) finish(j *Journal, end func(context.Context) error) {
	sagas := owned
	p.running.Go(func() {
		defer sagas.forget(j.saga)
		err := end(context.Background())
		if err == nil {
			return
		}
		j.js.logger.Warn("what is left of an ended saga's journal could not be removed from storage; retrying while this process runs (a recovery scan clears it too)",
			zap.String("saga", j.saga), zap.Error(err))
		j.endLater(p.hurry, end, j.js.leases.Length/2, nil)
	})
}

// endLater tries end again until it succeeds or the lease is lost,
// holding the lease meanwhile and letting it go for each try, so that
// no renewal writes the lease again once the journal is removed. It
// waits first before the first try, twice as long before each next,
// up to half the lease: once the waits reach a third of it, the loop
// renews at most a third of the length after the hold, so every wait
// holds a renewal (a third would be a race with the loop's tick); the
// fence before each try waits for one where they do not. With enough
// set, it stops once a try that failed leaves enough done, and returns
// false: the rest is the caller's to hand on. Once it finished (true),
// the caller lets the saga go (owned).
func (j *Journal) endLater(hurry <-chan struct{}, end func(context.Context) error, first time.Duration, enough func() bool) (finished bool) {
	for try, next := 2, first; ; try, next = try+1, min(2*next, j.js.leases.Length/2) {
		wait := next
		select {
		case <-hurry:
			wait = min(wait, time.Second)
		default:
		}
		j.mu.Lock()
		j.startRenewal()
		j.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-hurry:
		}
		// The lease proven (a sixth of it to spare) before anything is
		// removed or kept: a lease lost meanwhile (the storage unreachable
		// past it, the saga taken over) leaves the journal to its new
		// owner, whose keys a removal would delete.
		fenced, cancel := context.WithTimeout(context.Background(), j.js.leases.Length/3)
		ferr := j.lease.fence(fenced)
		cancel()
		j.stopRenewal()
		if j.lostErr() != nil {
			j.js.logger.Warn("the saga's journal is left to the instance that took it over: this one's lease was lost before it could remove it", zap.String("saga", j.saga))
			return true
		}
		if ferr != nil {
			j.js.logger.Warn("the saga's lease could not be proven to remove its journal; retrying", zap.String("saga", j.saga), zap.Int("tries", try), zap.Error(ferr))
			continue
		}
		err := end(context.Background())
		if _, lost := errors.AsType[*lostLease](err); lost {
			return true // the journal is the new owner's: nothing to retry
		}
		if err == nil {
			j.js.logger.Info("removed the saga's journal from storage after it failed", zap.String("saga", j.saga), zap.Int("tries", try))
			return true
		}
		if enough != nil && enough() {
			return false
		}
		j.js.logger.Warn("the saga's journal could not be removed from storage; retrying", zap.String("saga", j.saga), zap.Int("tries", try), zap.Error(err))
	}
}

// Wait returns once the sagas this process runs or is finishing ended,
// the jobs it runs stopped (handed over, once their stop closed), and
// the sagas' journals are removed, or once ctx is done (its error then):
// a process that exits lets its sagas end first, as one cut short would
// wait a lease for another instance to undo it when it can be finished
// now. The journals whose removal keeps failing are given
// exitRemovalGrace after the sagas ended; one left then is taken over by
// a recovery once its lease lapses.
func Wait(ctx context.Context) error {
	if err := waitFor(ctx, owned.running.Wait); err != nil {
		return err
	}
	if err := waitFor(ctx, jobsStopped); err != nil {
		return err
	}
	removals.hurryOnce.Do(func() { close(removals.hurry) })
	ctx, cancel := context.WithTimeout(ctx, exitRemovalGrace)
	defer cancel()
	return waitFor(ctx, removals.running.Wait)
}

// waitFor calls wait, and returns when it does or when ctx is done.
func waitFor(ctx context.Context, wait func()) error {
	done := make(chan struct{})
	go func() {
		wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
