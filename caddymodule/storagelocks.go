package caddymodule

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// storageLocks are item locks in Caddy's storage (item_locks storage), so
// that every instance sharing the storage excludes the others. Each lock
// is taken in the process's local table first: writers within one
// process then queue fairly in memory, and only the one at the head of
// the queue polls the storage, which is slow (the file system storage
// looks again every second) and not made for contention.
type storageLocks struct {
	local   *batch.LocalLocks
	storage certmagic.Storage
	logger  *zap.Logger
	// poll is the wait between two TryLock attempts.
	poll time.Duration
}

// storageLockPoll is how often a held storage lock is tried again, for a
// storage whose TryLock answers at once (the file system's waits a second
// itself, and Redis's Lock polls every second).
const storageLockPoll = 50 * time.Millisecond

// unlockTimeout bounds the release of a storage lock, which may need the
// network (Redis), after the request that held it is gone.
const unlockTimeout = 10 * time.Second

func newStorageLocks(local *batch.LocalLocks, storage certmagic.Storage, logger *zap.Logger) *storageLocks {
	return &storageLocks{local: local, storage: storage, logger: logger, poll: storageLockPoll}
}

// itemLockName is the storage lock name of an item key. The key is a
// path, which lock names cannot hold (the file system storage lower-cases
// them and drops everything but [\w@.-], so /a/B and /a/b would share a
// lock), hence the hash.
func itemLockName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "batch_item_" + hex.EncodeToString(sum[:])
}

// Lock takes key's lock, here and in the storage, waiting until ctx is
// done.
func (l *storageLocks) Lock(ctx context.Context, key string) (func(), error) {
	unlockLocal, err := l.local.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	unlockStorage, err := lockStorage(ctx, l.storage, itemLockName(key), l.poll, l.logger)
	if err != nil {
		unlockLocal()
		if errors.Is(err, batch.ErrLocked) {
			return nil, fmt.Errorf("%w: %s (in storage: %w)", batch.ErrLocked, key, context.Cause(ctx))
		}
		return nil, fmt.Errorf("locking %s in storage: %w", key, err)
	}
	return sync.OnceFunc(func() {
		unlockStorage()
		unlockLocal()
	}), nil
}

// lockStorage takes the storage lock name, waiting until ctx is done; the
// error then wraps batch.ErrLocked. Any other error is the storage's.
// The unlock it returns releases the lock once, however often it is
// called, and without ctx, which may be over by then.
func lockStorage(ctx context.Context, s certmagic.Storage, name string, poll time.Duration, logger *zap.Logger) (func(), error) {
	var err error
	if tl, ok := s.(certmagic.TryLocker); ok {
		err = tryLockStorage(ctx, tl, name, poll)
	} else {
		err = lockStorageUntil(ctx, s, name)
	}
	if err != nil {
		return nil, err
	}
	return sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
		defer cancel()
		if err := s.Unlock(ctx, name); err != nil {
			logger.Error("releasing a storage lock", zap.String("lock", name), zap.Error(err))
		}
	}), nil
}

// tryLockStorage polls TryLock until it succeeds or ctx is done.
func tryLockStorage(ctx context.Context, tl certmagic.TryLocker, name string, poll time.Duration) error {
	for {
		ok, err := tl.TryLock(ctx, name)
		switch {
		case ok && err == nil:
			return nil
		case ctx.Err() != nil:
			if ok {
				// Taken as ctx ended; nobody will hold it.
				_ = tl.Unlock(context.WithoutCancel(ctx), name)
			}
			return fmt.Errorf("%w (%w)", batch.ErrLocked, context.Cause(ctx))
		case err != nil:
			return err
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", batch.ErrLocked, context.Cause(ctx))
		}
	}
}

// lockStorageUntil calls Lock, which blocks until the lock is had, and
// gives up when ctx is done even if the storage does not honour ctx: a
// lock it takes after that is let go at once.
func lockStorageUntil(ctx context.Context, s certmagic.Storage, name string) error {
	done := make(chan error, 1)
	go func() { done <- s.Lock(ctx, name) }()
	select {
	case err := <-done:
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("%w (%w)", batch.ErrLocked, context.Cause(ctx))
		}
		return err
	case <-ctx.Done():
		go func() {
			if err := <-done; err == nil {
				uctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
				defer cancel()
				_ = s.Unlock(uctx, name)
			}
		}()
		return fmt.Errorf("%w (%w)", batch.ErrLocked, context.Cause(ctx))
	}
}

// Interface guard
var _ batch.Locker = (*storageLocks)(nil)
