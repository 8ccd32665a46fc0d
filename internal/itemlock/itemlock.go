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

// GroupLocker is a Locker that can take the locks of several keys
// together, in fewer round trips to where they live than one per key
// (storage locks: docs/durability.md, "Round trips per batch").
type GroupLocker interface {
	Locker
	// LockAll takes the lock of every key (sorted, no key twice),
	// waiting until ctx is done, in an order that cannot deadlock with
	// another LockAll or Lock: all or none, and otherwise one at a time
	// in the keys' order. It returns each key's unlock, in keys' order;
	// on an error it holds none, and failed is the index of the key
	// whose lock could not be had.
	LockAll(ctx context.Context, keys []string) (unlocks []func(), failed int, err error)
}

// LockAll takes the locks of keys (sorted, no key twice) from l: in one
// go where l is a GroupLocker, else one at a time in the keys' order, so
// that two callers that share keys never wait for each other in a
// cycle. It returns what GroupLocker.LockAll does.
func LockAll(ctx context.Context, l Locker, keys []string) ([]func(), int, error) {
	if gl, ok := l.(GroupLocker); ok {
		return gl.LockAll(ctx, keys)
	}
	unlocks := make([]func(), 0, len(keys))
	for i, key := range keys {
		unlock, err := l.Lock(ctx, key)
		if err != nil {
			Release(unlocks)
			return nil, i, err
		}
		unlocks = append(unlocks, unlock)
	}
	return unlocks, -1, nil
}

// Release calls every unlock at once, and returns once all are done: a
// storage lock's unlock is a round trip, and the unlocks of locks taken
// together wait for each other to share one (durable.ItemLocks), so none
// may wait for another to start.
func Release(unlocks []func()) {
	if len(unlocks) <= 1 {
		for _, u := range unlocks {
			u()
		}
		return
	}
	var wg sync.WaitGroup
	for _, u := range unlocks {
		wg.Go(u)
	}
	wg.Wait()
}

// LossReporter is a Locker whose locks may be lost while held (storage
// locks are leases): Lost returns why one of the locks of keys (asked
// for only when one may be lost: it runs before every write), taken
// from it and held, is lost, or nil.
type LossReporter interface {
	Lost(keys func() []string) error
}

// Held keeps the locks taken through it until Release: an all-or-nothing
// bulk job's, whose items stay locked from the window that wrote them to
// the job's end (docs/jobs.md, "All-or-nothing jobs"), while each window
// is a run of its own that lets its locks go when it ends. The zero
// value holds nothing.
type Held struct {
	mu      sync.Mutex
	unlocks map[string]func()
	// keys are those of unlocks, in the order taken: appended to only,
	// so that Lost reads them without a copy.
	keys []string
}

// Through is a Locker that takes a lock from l, unless h holds it
// already, and keeps it in h: its unlocks do nothing. l may change from
// one call to the next (a reload's), the locks kept stay held.
func (h *Held) Through(l Locker) Locker {
	if l == nil {
		return nil
	}
	return heldThrough{h: h, l: l}
}

type heldThrough struct {
	h *Held
	l Locker
}

func (t heldThrough) Lock(ctx context.Context, key string) (func(), error) {
	h := t.h
	h.mu.Lock()
	_, ok := h.unlocks[key]
	h.mu.Unlock()
	if ok {
		return func() {}, nil
	}
	unlock, err := t.l.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	h.keep([]string{key}, []func(){unlock})
	return func() {}, nil
}

// keep keeps the locks of keys, just taken (unlocks, in the same order),
// until Release, letting go at once of one h holds already: taken twice
// at once, one is enough.
func (h *Held) keep(keys []string, unlocks []func()) {
	var twice []func()
	h.mu.Lock()
	if h.unlocks == nil {
		h.unlocks = map[string]func(){}
	}
	for j, key := range keys {
		if _, ok := h.unlocks[key]; ok {
			twice = append(twice, unlocks[j])
		} else {
			h.unlocks[key] = unlocks[j]
			h.keys = append(h.keys, key)
		}
	}
	h.mu.Unlock()
	Release(twice)
}

// Lost says why the lock of one of the keys h holds is lost, where the
// Locker it goes through can tell (LossReporter), whichever keys it is
// asked of: a job's lease stands on every lock it holds, taken by any
// of its windows.
func (t heldThrough) Lost(func() []string) error {
	lr, ok := t.l.(LossReporter)
	if !ok {
		return nil
	}
	return lr.Lost(func() []string {
		t.h.mu.Lock()
		defer t.h.mu.Unlock()
		return t.h.keys
	})
}

// LockAll takes, as LockAll does from the Locker it goes through, the
// locks of keys that h does not hold yet: in one go where that Locker
// can (a window of an all-or-nothing job on storage locks would
// otherwise wait for a round trip per item), and keeps them in h. On an
// error it takes none (those h held stay held), and failed indexes
// keys.
func (t heldThrough) LockAll(ctx context.Context, keys []string) ([]func(), int, error) {
	h := t.h
	var missing []int
	h.mu.Lock()
	for i, key := range keys {
		if _, ok := h.unlocks[key]; !ok {
			missing = append(missing, i)
		}
	}
	h.mu.Unlock()
	take := make([]string, len(missing))
	for j, i := range missing {
		take[j] = keys[i]
	}
	unlocks, failed, err := LockAll(ctx, t.l, take)
	if err != nil {
		return nil, missing[max(failed, 0)], err
	}
	h.keep(take, unlocks)
	kept := make([]func(), len(keys))
	for i := range kept {
		kept[i] = func() {}
	}
	return kept, -1, nil
}

// Release lets every lock h holds go.
func (h *Held) Release() {
	h.mu.Lock()
	unlocks := make([]func(), 0, len(h.unlocks))
	for _, u := range h.unlocks {
		unlocks = append(unlocks, u)
	}
	h.unlocks, h.keys = nil, nil
	h.mu.Unlock()
	Release(unlocks)
}
