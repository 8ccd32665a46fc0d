package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// A batch's item locks taken together (docs/durability.md, "Round trips
// per batch"): every storage lock at once, all or none, so that the
// batch waits for one round trip to the storage rather than one per
// item; only when another writer holds one of them, one at a time in the
// keys' order, as a single Lock would.

// lockWidth bounds the storage lock calls one LockAll has in flight.
const lockWidth = 128

// allOrNoneWait bounds each lock of the all-or-none try on a storage
// that cannot try a lock without waiting for it (the Redis module's
// Lock, which looks again only every second): a lock not had by then
// counts as held, and the batch goes on one lock at a time.
const allOrNoneWait = 100 * time.Millisecond

// LockAll takes the locks of keys (sorted, no key twice), here and in
// the storage (itemlock.GroupLocker). The local locks come first, in
// order, so that the process never holds storage locks while it waits
// in its own queue; then every storage lock at once, all or none; and
// if another writer held one, one at a time in order from the first,
// waiting until ctx is done. Holding only a prefix of its ordered keys
// while it waits, a batch never deadlocks with another.
func (l *ItemLocks) LockAll(ctx context.Context, keys []string) ([]func(), int, error) {
	locals, failed, err := itemlock.LockAll(ctx, l.local, keys)
	if err != nil {
		return nil, failed, err
	}
	storage, failed, err := l.allOrNone(ctx, keys)
	if err == nil && storage == nil {
		storage, failed, err = l.inOrder(ctx, keys)
	}
	if err != nil {
		itemlock.Release(locals)
		return nil, failed, err
	}
	unlocks := make([]func(), len(keys))
	for i := range keys {
		unlocks[i] = sync.OnceFunc(func() {
			storage[i]()
			l.names.Delete(keys[i])
			locals[i]()
		})
	}
	return unlocks, -1, nil
}

// allOrNone tries every key's storage lock at once. It returns their
// unlocks when it had them all, none and no error when another writer
// held one (what it took is let go), and the first key's error when the
// storage failed.
func (l *ItemLocks) allOrNone(ctx context.Context, keys []string) ([]func(), int, error) {
	if gl, ok := l.storage.(GroupTryLocker); ok {
		return l.allOrNoneAtOnce(ctx, gl, keys)
	}
	unlocks := make([]func(), len(keys))
	errs := make([]error, len(keys))
	var g errgroup.Group
	g.SetLimit(lockWidth)
	for i, key := range keys {
		g.Go(func() error {
			unlocks[i], errs[i] = l.tryStorage(ctx, key)
			return nil
		})
	}
	_ = g.Wait()
	held := false
	for i, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, itemlock.ErrLocked):
			held = true
		default:
			releaseTaken(unlocks)
			return nil, i, lockError(ctx, keys[i], err)
		}
	}
	if held {
		releaseTaken(unlocks)
		return nil, -1, nil
	}
	return unlocks, -1, nil
}

// allOrNoneAtOnce is allOrNone on a storage that tries them all in one
// call.
func (l *ItemLocks) allOrNoneAtOnce(ctx context.Context, gl GroupTryLocker, keys []string) ([]func(), int, error) {
	names := make([]string, len(keys))
	for i, key := range keys {
		names[i] = ItemLockName(key)
	}
	got, err := gl.TryLockAll(ctx, names)
	if err != nil {
		return nil, 0, lockError(ctx, keys[0], err)
	}
	g := &lockGroup{storage: gl, failedFor: l.failedFor, round: &unlockRound{done: make(chan struct{})}}
	unlocks := make([]func(), len(keys))
	held := false
	for i, name := range names {
		if got[i] {
			g.left++
			unlocks[i] = sync.OnceFunc(func() { g.unlock(name) })
		} else {
			held = true
		}
	}
	if held {
		releaseTaken(unlocks)
		return nil, -1, nil
	}
	return unlocks, -1, nil
}

// groupUnlockWait is how long the unlock of a lock taken with others
// waits for theirs, to share a call, when not all of them come (one
// dropped early): those let go together (itemlock.Release) all come
// at once, and the last sends the call.
const groupUnlockWait = 2 * time.Millisecond

// lockGroup is the storage locks one TryLockAll took: let go in one call
// when all of them are (a batch's release, which lets every lock go at
// once), without waiting for a window to close; a lock let go alone
// (one dropped early) waits groupUnlockWait for others to join it.
type lockGroup struct {
	storage   GroupTryLocker
	failedFor func(name string) func(error)

	mu    sync.Mutex
	left  int // the locks not yet asked to be let go
	round *unlockRound
}

// unlockRound is the unlocks that go in one call.
type unlockRound struct {
	names []string
	timer bool
	done  chan struct{}
	err   error
}

// unlock lets go of name's lock, in the call of the round it joins, and
// returns once that call is done.
func (g *lockGroup) unlock(name string) {
	g.mu.Lock()
	r := g.round
	r.names = append(r.names, name)
	g.left--
	last := g.left == 0
	if !last && !r.timer {
		r.timer = true
		time.AfterFunc(groupUnlockWait, func() { g.send(r) })
	}
	g.mu.Unlock()
	if last {
		g.send(r)
	}
	<-r.done
	if r.err != nil {
		g.failedFor(name)(r.err)
	}
}

// send makes r's call, unless another did.
func (g *lockGroup) send(r *unlockRound) {
	g.mu.Lock()
	if g.round != r {
		g.mu.Unlock()
		return
	}
	g.round = &unlockRound{done: make(chan struct{})}
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), UnlockTimeout)
	defer cancel()
	r.err = g.storage.UnlockAll(ctx, r.names)
	close(r.done)
}

// tryStorage takes key's storage lock if it is free: at once where the
// storage can try, else waiting at most allOrNoneWait. The error wraps
// itemlock.ErrLocked when the lock was not had.
func (l *ItemLocks) tryStorage(ctx context.Context, key string) (func(), error) {
	name := ItemLockName(key)
	if tl, ok := l.storage.(TryLocker); ok {
		if err := tryLock(ctx, l.storage, tl, name, 0); err != nil {
			return nil, err
		}
		return unlocker(l.storage, name, l.failedFor(name)), nil
	}
	short, cancel := context.WithTimeout(ctx, allOrNoneWait)
	defer cancel()
	if err := lockUntil(short, l.storage, name); err != nil {
		return nil, err
	}
	return unlocker(l.storage, name, l.failedFor(name)), nil
}

// inOrder takes the storage locks one at a time in the keys' order, each
// waiting until ctx is done; on an error it lets go of what it took.
func (l *ItemLocks) inOrder(ctx context.Context, keys []string) ([]func(), int, error) {
	unlocks := make([]func(), 0, len(keys))
	for i, key := range keys {
		unlock, err := l.lockStorage(ctx, key)
		if err != nil {
			itemlock.Release(unlocks)
			return nil, i, err
		}
		unlocks = append(unlocks, unlock)
	}
	return unlocks, -1, nil
}

// releaseTaken lets go of the locks an all-or-none try took.
func releaseTaken(unlocks []func()) {
	var taken []func()
	for _, u := range unlocks {
		if u != nil {
			taken = append(taken, u)
		}
	}
	itemlock.Release(taken)
}

// LockLoser is a storage that knows when a lock it took and holds is
// lost (the Redis fast path, which refreshes its own locks): LockLost
// says why, or nil while it stands.
type LockLoser interface {
	LockLost(name string) error
	// NoneLost reports, in one look, that no lock the storage holds is
	// lost: a saga asks before each of its writes, for each of its
	// locks.
	NoneLost() bool
}

// Lost says why the storage lock of one of keys is lost, where the
// storage knows (LockLoser); nil otherwise. A saga whose item lock is
// lost has lost its lease (Journal.WatchLocks).
func (l *ItemLocks) Lost(keys func() []string) error {
	ll, ok := l.storage.(LockLoser)
	if !ok || ll.NoneLost() {
		return nil
	}
	for _, key := range keys() {
		if err := ll.LockLost(l.nameOf(key)); err != nil {
			return fmt.Errorf("the lock of %s: %w", key, err)
		}
	}
	return nil
}

// nameOf is ItemLockName(key), remembered while the lock may be held:
// Lost runs before every write a saga sends, for each of its items.
func (l *ItemLocks) nameOf(key string) string {
	if name, ok := l.names.Load(key); ok {
		return name.(string)
	}
	name := ItemLockName(key)
	l.names.Store(key, name)
	return name
}
