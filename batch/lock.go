package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Locker holds exclusive locks on items, each named by a key (the item's
// path, as policy.Match builds it). A saga locks the items it writes, and
// a single-item write through the gateway locks its item, so that writers
// through the gateway never interleave with a saga.
type Locker interface {
	// Lock takes the lock on key, waiting until ctx is done. The error
	// wraps ErrLocked when another holder kept it that long.
	Lock(ctx context.Context, key string) (unlock func(), err error)
}

// ErrLocked is the error of a lock another writer held for too long.
var ErrLocked = errors.New("the item is locked by another write")

// LocalLocks are item locks within one process. The zero value is ready
// to use.
type LocalLocks struct {
	mu   sync.Mutex
	held map[string]*localLock
}

type localLock struct {
	token chan struct{} // holds one token while the lock is free
	refs  int           // holders and waiters; the entry goes at zero
}

// Lock takes key's lock. Waiters are served in the order they came.
func (l *LocalLocks) Lock(ctx context.Context, key string) (func(), error) {
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

func (l *LocalLocks) drop(key string, e *localLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(l.held, key)
	}
}

// heldLocks are the locks a saga holds until its last undo or check.
type heldLocks struct {
	mu      sync.Mutex
	keys    map[string]bool
	unlocks []func()
}

func (h *heldLocks) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[key]
}

func (h *heldLocks) add(key string, unlock func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.keys[key] = true
	h.unlocks = append(h.unlocks, unlock)
}

// release lets every lock go, last taken first.
func (h *heldLocks) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, unlock := range slices.Backward(h.unlocks) {
		unlock()
	}
	h.unlocks = nil
}

// lock is the saga's second step: it takes the lock of every item the
// batch will write, in the order of their keys, so that two batches that
// share items never wait for each other in a cycle. It reports whether
// the batch may go on; if not, it holds no lock and the batch is refused
// with 409.
func (sg *saga) lock(ctx context.Context) bool {
	sg.locks = &heldLocks{keys: map[string]bool{}}
	if sg.rt.Locks == nil {
		return true
	}
	var keys []string
	for i, it := range sg.plan.Items {
		if it.ID != "" && it.tgt != nil && it.tgt.op.Writes() {
			keys = append(keys, sg.itemPath(i, it.ID))
		}
	}
	slices.Sort(keys)
	for _, key := range slices.Compact(keys) {
		unlock, err := sg.rt.Locks.Lock(ctx, key)
		if err != nil {
			sg.locks.release()
			sg.refusal = lockRefusal(key, err)
			return false
		}
		sg.locks.add(key, unlock)
	}
	return true
}

// lockCreated locks an item the batch created, as soon as its id is
// known, so that no writer through the gateway changes it before the
// saga ends. Created items are locked out of key order, so the wait is
// short: a writer that holds a newly created id holds nothing else the
// saga waits for, and if the lock cannot be had the undo's proof still
// guards the item.
func (sg *saga) lockCreated(ctx context.Context, i int, id string) {
	key := sg.itemPath(i, id)
	if sg.rt.Locks == nil || sg.locks.has(key) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, sg.set(i).ItemTimeout)
	defer cancel()
	if unlock, err := sg.rt.Locks.Lock(ctx, key); err == nil {
		sg.locks.add(key, unlock)
	}
}

// lockOne locks one item for the time of one write: a partial batch's
// write, as a single write would. It returns a no-op when there is no
// locker or no id.
func (sg *saga) lockOne(ctx context.Context, i int, id string) (func(), error) {
	if sg.rt.Locks == nil || id == "" {
		return func() {}, nil
	}
	return sg.rt.Locks.Lock(ctx, sg.itemPath(i, id))
}

// refusal is why a batch did not start: nothing was sent.
type refusal struct {
	status     int
	detail     string
	retryAfter string
	cause      error
}

func lockRefusal(key string, err error) *refusal {
	if !errors.Is(err, ErrLocked) {
		// Not another writer: the locks themselves failed (a storage
		// that is down, under item_locks storage).
		return &refusal{
			status:     503,
			detail:     fmt.Sprintf("the lock of %s could not be taken (the item locks are unavailable); nothing was changed, try again", key),
			retryAfter: "1",
			cause:      err,
		}
	}
	return &refusal{
		status:     409,
		detail:     fmt.Sprintf("another write through the gateway holds %s; nothing was changed, try again", key),
		retryAfter: "1",
		cause:      err,
	}
}
