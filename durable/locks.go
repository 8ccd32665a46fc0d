package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// UnlockTimeout bounds the release of a storage lock, which may need the
// network (Redis), after the request that held it is gone.
const UnlockTimeout = 10 * time.Second

// LockPoll is how often a held storage lock is tried again, for a storage
// whose TryLock answers at once (the file system's waits a second itself,
// and Redis's Lock polls every second).
const LockPoll = 50 * time.Millisecond

// Lock takes the storage lock name, the one way every part of the gateway
// takes one. With poll above zero it waits until ctx is done, trying
// again every poll (or blocking in Lock, for a storage that cannot try);
// with poll zero it does not wait for a holder: one try, or a Lock cut
// short by ctx. When the lock is held elsewhere the error wraps
// itemlock.ErrLocked; any other error is the storage's. The unlock it
// returns releases the lock once, however often it is called, and
// without ctx, which may be over by then; a failed release goes to
// unlockFailed.
func Lock(ctx context.Context, s Locker, name string, poll time.Duration, unlockFailed func(error)) (func(), error) {
	var err error
	if tl, ok := s.(TryLocker); ok {
		err = tryLock(ctx, s, tl, name, poll)
	} else {
		err = lockUntil(ctx, s, name)
	}
	if err != nil {
		return nil, err
	}
	return unlocker(s, name, unlockFailed), nil
}

// unlocker releases the storage lock name once, however often it is
// called, without the context it was taken under.
func unlocker(s Locker, name string, unlockFailed func(error)) func() {
	return sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), UnlockTimeout)
		defer cancel()
		if err := s.Unlock(ctx, name); err != nil && unlockFailed != nil {
			unlockFailed(err)
		}
	})
}

// tryLock calls TryLock until it succeeds, ctx is done, or, with poll
// zero, once.
func tryLock(ctx context.Context, s Locker, tl TryLocker, name string, poll time.Duration) error {
	for {
		ok, err := tl.TryLock(ctx, name)
		switch {
		case ok && err == nil:
			return nil
		case ctx.Err() != nil:
			if ok {
				// Taken as ctx ended; nobody will hold it.
				_ = s.Unlock(context.WithoutCancel(ctx), name)
			}
			return fmt.Errorf("%w (%w)", itemlock.ErrLocked, context.Cause(ctx))
		case err != nil:
			return err
		case poll <= 0:
			return fmt.Errorf("%w (held elsewhere)", itemlock.ErrLocked)
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", itemlock.ErrLocked, context.Cause(ctx))
		}
	}
}

// lockUntil calls Lock, which blocks until the lock is had, and gives up
// when ctx is done even if the storage does not honour ctx: a lock it
// takes after that is let go at once.
func lockUntil(ctx context.Context, s Locker, name string) error {
	done := make(chan error, 1)
	go func() { done <- s.Lock(ctx, name) }()
	select {
	case err := <-done:
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("%w (%w)", itemlock.ErrLocked, context.Cause(ctx))
		}
		return err
	case <-ctx.Done():
		go func() {
			if err := <-done; err == nil {
				uctx, cancel := context.WithTimeout(context.Background(), UnlockTimeout)
				defer cancel()
				_ = s.Unlock(uctx, name)
			}
		}()
		return fmt.Errorf("%w (%w)", itemlock.ErrLocked, context.Cause(ctx))
	}
}

// ItemLocks are item locks in a storage (item_locks storage), so that
// every instance sharing it excludes the others. Each lock is taken in
// the process's local table first: writers within one process then queue
// fairly in memory, and only the one at the head of the queue polls the
// storage, which is slow (the file system storage looks again every
// second) and not made for contention.
type ItemLocks struct {
	local   *itemlock.Local
	storage Locker
	// unlockFailed hears of a storage lock that could not be released.
	unlockFailed func(name string, err error)
	// names are the storage lock names of the keys whose loss was asked
	// for (nameOf), until their locks are let go.
	names sync.Map
}

// NewItemLocks locks items in local and in storage.
func NewItemLocks(local *itemlock.Local, storage Locker, unlockFailed func(name string, err error)) *ItemLocks {
	return &ItemLocks{local: local, storage: storage, unlockFailed: unlockFailed}
}

// ItemLockName is the storage lock name of an item key. The key is a
// path, which lock names cannot hold (the file system storage lower-cases
// them and drops everything but [\w@.-], so /a/B and /a/b would share a
// lock), hence the hash.
func ItemLockName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "batch_item_" + hex.EncodeToString(sum[:])
}

// Lock takes key's lock, here and in the storage, waiting until ctx is
// done.
func (l *ItemLocks) Lock(ctx context.Context, key string) (func(), error) {
	unlockLocal, err := l.local.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	unlockStorage, err := l.lockStorage(ctx, key)
	if err != nil {
		unlockLocal()
		return nil, err
	}
	return sync.OnceFunc(func() {
		unlockStorage()
		l.names.Delete(key)
		unlockLocal()
	}), nil
}

// lockStorage takes key's storage lock, waiting until ctx is done.
func (l *ItemLocks) lockStorage(ctx context.Context, key string) (func(), error) {
	unlock, err := Lock(ctx, l.storage, ItemLockName(key), LockPoll, l.failedFor(ItemLockName(key)))
	if err != nil {
		return nil, lockError(ctx, key, err)
	}
	return unlock, nil
}

// lockError says why key's storage lock could not be had.
func lockError(ctx context.Context, key string, err error) error {
	if errors.Is(err, itemlock.ErrLocked) {
		return fmt.Errorf("%w: %s (in storage: %w)", itemlock.ErrLocked, key, context.Cause(ctx))
	}
	return fmt.Errorf("locking %s in storage: %w", key, err)
}

func (l *ItemLocks) failedFor(name string) func(error) {
	return func(err error) {
		if l.unlockFailed != nil {
			l.unlockFailed(name, err)
		}
	}
}

// Interface guards
var (
	_ itemlock.GroupLocker  = (*ItemLocks)(nil)
	_ itemlock.LossReporter = (*ItemLocks)(nil)
)
