package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// A job runs under a lease in its folder, with the rules that fence a
// saga (fence.go; docs/durability.md, "A saga never writes after it lost
// its lease"): epoch 0 is written by the start, each later owner claims
// the next epoch under a key of its own, renewals are conditional, and
// what the owner writes names its epoch. A job's owner may also give its
// lease up (a graceful stop, a job put in the queue): the record then
// says released, and another instance claims it at once, without waiting
// for it to lapse.

// jobLeases is the lease folder of a job: its lease keys sit beside its
// record, which a first renewal of epoch 0 must find.
func jobLeases(id string) leaseFolder {
	return leaseFolder{dir: jobDir(id), guard: jobKey(id, jobName), what: "job"}
}

// ErrJobHeld refuses the claim of a job whose lease is not released: its
// owner runs it or is starting it (the next scan looks again), or the
// job ended.
var ErrJobHeld = errors.New("the job's lease is not released: its owner holds it, or the job ended")

// releasedRecord is the bytes of a released lease of epoch: standing
// until now, for nobody.
func releasedRecord(epoch, n int) []byte {
	b, _ := json.Marshal(Lease{Owner: Owner(), Epoch: epoch, Expires: now(), Renewal: n, Released: true})
	return b
}

// released reports whether the view's lease record says its owner gave
// it up.
func (v leaseView) released() bool {
	var l Lease
	return v.raw != nil && json.Unmarshal(v.raw, &l) == nil && l.Released
}

// fencedLease is a lease this process holds in a lease folder, renewed
// every third of it by the process's Leases.
type fencedLease struct {
	storage Storage
	folder  leaseFolder
	epoch   int
	logger  *zap.Logger
	*holder

	mu sync.Mutex
	// stored is what this process last stored at its lease key, and
	// maybe what a renewal after it wrote that answered an error, which
	// may have landed (nil: none in doubt).
	stored   []byte
	maybe    []byte
	renewals int
	// listed is what the folder held at the last renewal.
	listed []string
	stop   func()
}

// holdLease starts renewing the lease of epoch this process stored as
// stored, in a call that began at start; listed is the folder as the
// claim found it, which stands for a renewal's list until the first one:
// a cancel marked while the job was queued must stop it before it sends
// anything, not a third of a lease later.
func holdLease(s Storage, leases *Leases, logger *zap.Logger, f leaseFolder, epoch int, stored []byte, start time.Time, listed []string) *fencedLease {
	l := &fencedLease{storage: s, folder: f, epoch: epoch, logger: logger, holder: newHolder(leases.Length), stored: stored, listed: listed}
	l.what = f.what
	l.prove(start)
	l.stop = leases.Hold(l.renew, 0)
	return l
}

// renew proves the lease again: a renewal that finds it lost stops for
// good; one whose storage calls fail leaves it unproven until the next.
func (l *fencedLease) renew() {
	if l.lostErr() != nil {
		return
	}
	start := now()
	l.mu.Lock()
	prev, maybe := l.stored, l.maybe
	l.renewals++
	next := leaseRecord(l.epoch, start.Add(l.length), l.renewals)
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.length/3)
	defer cancel()
	names, err := renewFolderLeaseOver(ctx, l.storage, l.folder, l.epoch, prev, maybe, next)
	var lost *lostLease
	switch {
	case errors.As(err, &lost):
		why := lost.why
		if !lost.takenOver && l.guardGone(ctx) {
			// Its record went with it: the storage forgot the job, or an
			// operator deleted it. Nobody carries it on.
			why = l.folder.guardGone().why
		}
		l.lost(why)
	case err != nil:
		l.mu.Lock()
		l.maybe = next
		l.mu.Unlock()
		l.logger.Warn("renewing a job's lease in storage; it writes nothing until a renewal proves it", zap.String("dir", l.folder.dir), zap.Error(err))
	default:
		l.mu.Lock()
		l.stored, l.listed, l.maybe = next, names, nil
		l.mu.Unlock()
		if !l.prove(start) {
			l.logger.Warn("a renewal of a job's lease did not prove it (too slow, or it lapsed meanwhile)", zap.String("dir", l.folder.dir), zap.Duration("took", now().Sub(start)))
		}
	}
}

// guardGone reports whether the folder's guard (the job's record) is
// surely gone: a read that fails says nothing.
func (l *fencedLease) guardGone(ctx context.Context) bool {
	missing, _ := gone(ctx, l.storage, l.folder.guard)
	return missing
}

// lost makes the lease lost for good to this process, for why, and
// says so.
func (l *fencedLease) lost(why string) {
	l.lose(why)
	l.logger.Error("a job's lease is lost: this process writes nothing more for it", zap.String("dir", l.folder.dir), zap.Int("epoch", l.epoch), zap.String("why", why))
}

// end stops the renewals, and makes the lease lost for good to this
// process: nothing is written under it after.
func (l *fencedLease) end(why string) {
	l.stop() // waits for a renewal being written
	l.lose(why)
}

// release gives the lease up for another instance to claim at once:
// first lost to this process for good, then its record written released,
// on a renewal's conditions, so that a lease another instance took
// meanwhile is never written over.
func (l *fencedLease) release(ctx context.Context) error {
	l.end("this process released the lease")
	l.mu.Lock()
	prev, maybe := l.stored, l.maybe
	l.renewals++
	next := releasedRecord(l.epoch, l.renewals)
	l.mu.Unlock()
	if _, err := renewFolderLeaseOver(ctx, l.storage, l.folder, l.epoch, prev, maybe, next); err != nil {
		return fmt.Errorf("releasing the lease of %s: %w", l.folder.dir, err)
	}
	return nil
}

// CancelAsked reports whether the job's last renewal listed a cancel
// mark: a cancel is seen within a third of the lease, at no extra
// storage call.
func (hj *HeldJob) CancelAsked() bool {
	hj.lease.mu.Lock()
	defer hj.lease.mu.Unlock()
	return slices.Contains(hj.lease.listed, cancelName)
}

// Release gives the job up, for another instance (or this one) to claim
// at once: the job put in the queue, or this process stopping. This
// HeldJob writes nothing after.
func (hj *HeldJob) Release(ctx context.Context) error { return hj.lease.release(ctx) }

// fence returns once the job's lease is proven with a sixth of it to
// spare, or the *batch.LeaseLost once it is lost (an item lock it holds
// in storage lost loses it too): every owner's write waits for it.
func (hj *HeldJob) fence(ctx context.Context) error {
	if lost := hj.locksLost.Load(); lost != nil {
		if err := (*lost)(); err != nil {
			hj.lease.lost("an item lock in storage was lost: " + err.Error())
		}
	}
	return hj.lease.fence(ctx)
}

// ClaimReleased takes the job id whose lease was released, under the
// next epoch: ErrJobHeld when its lease is not released, or another
// instance claims it first.
func (js *Jobs) ClaimReleased(ctx context.Context, id string) (*HeldJob, error) {
	if !validJobID(id) {
		return nil, ErrUnknownJob
	}
	rec, err := readJob(ctx, js.storage, id)
	if err != nil {
		return nil, err
	}
	return js.claim(ctx, rec, nil)
}

// claim takes the job rec under the next epoch, under the job's storage
// lock (of instances that find it at once, one goes first; the claim
// itself proves, claimFolderKey): a job whose lease was released, or
// whose lease record is still the one a scan watched stand unchanged
// for a whole lease (lapsed; nil when no scan watched it). A job with
// no lease key at all (the storage forgot it, or an operator deleted
// it: its owner finds it gone at its next renewal, and stops) is
// claimed once a scan watched it so for a lease, as a lapsed one is.
// ErrJobHeld when it is neither, or another instance claims it first.
func (js *Jobs) claim(ctx context.Context, rec *JobRecord, lapsed *leaseView) (*HeldJob, error) {
	name := jobLock(rec.ID)
	unlock, err := Lock(ctx, js.storage, name, 0, js.unlockFailed(name))
	if errors.Is(err, itemlock.ErrLocked) {
		return nil, ErrJobHeld
	}
	if err != nil {
		return nil, fmt.Errorf("locking job %s to claim it: %w", rec.ID, err)
	}
	defer unlock()
	return js.claimLocked(ctx, rec, lapsed)
}

// claimLocked is claim under the job's storage lock.
func (js *Jobs) claimLocked(ctx context.Context, rec *JobRecord, lapsed *leaseView) (*HeldJob, error) {
	f := jobLeases(rec.ID)
	seen, err := readFolderLease(ctx, js.storage, f)
	if err != nil {
		return nil, fmt.Errorf("reading the lease of job %s: %w", rec.ID, err)
	}
	if !seen.released() && (lapsed == nil || seen.record() != lapsed.record()) {
		return nil, ErrJobHeld
	}
	epoch := seen.epoch + 1
	key := f.key(epoch, Owner())
	start := now()
	record := leaseRecord(epoch, start.Add(js.leases.Length), 0)
	doing, err := claimFolderKey(ctx, js.storage, f, seen, epoch, key, record)
	switch {
	case errors.Is(err, errSteppedBack):
		return nil, ErrJobHeld
	case err != nil:
		return nil, fmt.Errorf("%s: %w", doing, err)
	}
	return &HeldJob{jobs: js, rec: rec, epoch: epoch, lease: holdLease(js.storage, js.leases, js.logger, f, epoch, record, start, seen.names)}, nil
}
