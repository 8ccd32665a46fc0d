// Package itemlock is the item locks (docs/all-or-nothing.md, its Locks paragraph):
// what a lock of an item is, the one error of a lock another writer
// held, and the table of local locks of a process. Storage item locks,
// which take a local lock first, are durable's (durable.ItemLocks).
package itemlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Locker holds exclusive locks on items, each named by a key (the item's
// path, as the gateway's policy builds it). A saga locks the items it writes, and
// a single-item write through the gateway locks its item, so that writers
// through the gateway never interleave with a saga.
type Locker interface {
	// Lock takes the lock on key, waiting until ctx is done. The error
	// wraps ErrLocked when another holder kept it that long.
	Lock(ctx context.Context, key string) (unlock func(), err error)
}

// ErrLocked is the error of a lock another writer held for too long.
var ErrLocked = errors.New("the item is locked by another write")

// Local are item locks within one process. The zero value is ready to
// use; an entry goes as soon as nobody holds or waits for its lock, so a
// table may live as long as the process.
type Local struct {
	mu   sync.Mutex
	held map[string]*localLock
}

type localLock struct {
	token chan struct{} // holds one token while the lock is free
	refs  int           // holders and waiters; the entry goes at zero
}

// Lock takes key's lock. Waiters are served in the order they came.
func (l *Local) Lock(ctx context.Context, key string) (func(), error) {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*localLock{}
	}
	e := l.held[key]
	if e == nil {
		e = &localLock{token: make(chan struct{}, 1)}
		e.token <- struct{}{}
		l.held[key] = e
	}
	e.refs++
	l.mu.Unlock()

	select {
	case <-e.token:
		return sync.OnceFunc(func() {
			e.token <- struct{}{}
			l.drop(key, e)
		}), nil
	case <-ctx.Done():
		l.drop(key, e)
		return nil, fmt.Errorf("%w: %s (%w)", ErrLocked, key, context.Cause(ctx))
	}
}

func (l *Local) drop(key string, e *localLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(l.held, key)
	}
}
