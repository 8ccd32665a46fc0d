package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// lock is the saga's second step: it takes the lock of every item the
// batch will write, in the order of their keys, so that two batches that
// share items never wait for each other in a cycle, at most until
// batchCtx is done. It reports whether the batch may go on; if not, it
// holds no lock and the batch is refused as RefuseLock says.
func (run *batchRun) lock(clientCtx, batchCtx context.Context) bool {
	run.locks = newHeldLocks()
	if run.rt.Locks == nil {
		return true
	}
	var keys []string
	first := map[string]int{} // the item each key is first written by
	for i := range run.items {
		if key := writeKey(run.state[i].tgt, run.items[i].ID); key != "" {
			keys = append(keys, key)
			if _, seen := first[key]; !seen {
				first[key] = i
			}
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	// One wait for all of them, as the batch span's lock_wait counts it.
	start := run.trace.now()
	unlocks, failed, err := itemlock.LockAll(batchCtx, run.rt.Locks, keys)
	run.trace.lockWaited(start, err)
	if err != nil {
		key := keys[max(failed, 0)]
		ref := RefuseLock(key, err, LockWait{Client: clientCtx, Batch: batchCtx, BatchTimeout: run.batchSettings.BatchTimeout, Item: run.items[first[key]].describe()})
		run.refusal = &refusal{status: ref.Status, detail: ref.Detail, retryAfter: ref.RetryAfter, cause: err}
		return false
	}
	for i, key := range keys {
		run.locks.add(key, unlocks[i])
	}
	lr, reports := run.rt.Locks.(itemlock.LossReporter)
	if lw, watches := run.rt.Journal.(LockWatcher); reports && watches {
		lw.WatchLocks(func() error { return lr.Lost(run.locks.held) })
	}
	return true
}

// lockCreated locks an item the batch created, as soon as its id is
// known, so that no writer through the gateway changes it before the
// saga ends. Created items are locked out of key order, so the wait is
// short: a writer that holds a newly created id holds nothing else the
// saga waits for, and if the lock cannot be had the undo's proof still
// guards the item. The lock is taken in the background: the worker goes
// on with its next write rather than wait a storage round trip
// (docs/durability.md, "Round trips per batch"); the saga's undos and
// its release wait for it.
func (run *batchRun) lockCreated(ctx context.Context, i int, id string) {
	key := run.state[i].tgt.paths.Key(id)
	if run.rt.Locks == nil || run.locks.has(key) {
		return
	}
	timeout := run.state[i].tgt.settings.ItemTimeout
	run.locks.later(func() {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if unlock, err := run.rt.Locks.Lock(ctx, key); err == nil {
			run.locks.add(key, unlock)
		}
	})
}

// lockLate locks an item whose id an envelope learned only as it ran, out
// of the order of keys: the wait is bounded by item_timeout, and an item
// it cannot lock fails the operation as RefuseLock says, nothing sent.
func (run *batchRun) lockLate(clientCtx, batchCtx context.Context, i int) bool {
	key := run.state[i].tgt.paths.Key(run.items[i].ID)
	if run.rt.Locks == nil || run.locks.holds(key) {
		return true
	}
	unlock, ok := run.lockOne(clientCtx, batchCtx, i, run.items[i].ID)
	if ok {
		run.locks.add(key, unlock)
	}
	return ok
}

// lockOne locks one item for the time of one write: a partial batch's
// write, as a single write would, waiting at most item_timeout. It
// reports whether the write may go on; if not, the item is settled as
// refused. With no locker or no id it takes no lock.
func (run *batchRun) lockOne(clientCtx, batchCtx context.Context, i int, id string) (func(), bool) {
	if run.rt.Locks == nil || id == "" {
		return func() {}, true
	}
	key, timeout := run.state[i].tgt.paths.Key(id), run.state[i].tgt.settings.ItemTimeout
	lockCtx, cancel := context.WithTimeout(batchCtx, timeout)
	defer cancel()
	start := run.trace.now()
	unlock, err := run.rt.Locks.Lock(lockCtx, key)
	run.trace.lockWaited(start, err)
	if err != nil {
		run.refuseItem(context.WithoutCancel(clientCtx), i, RefuseLock(key, err, LockWait{Client: clientCtx, Batch: batchCtx, BatchTimeout: run.batchSettings.BatchTimeout, ItemTimeout: timeout}), err)
		return nil, false
	}
	return unlock, true
}

// refuseItem settles item i as refused its lock, with nothing sent; its
// Retry-After becomes the batch answer's.
func (run *batchRun) refuseItem(ctx context.Context, i int, ref LockRefusal, cause error) {
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.clearResponse()
		it.Status, it.Error, it.cause = ref.Status, ref.Detail, cause
		if ref.RetryAfter != "" {
			it.Headers = map[string]string{"Retry-After": ref.RetryAfter}
		}
		it.Outcome, st.failure = Failed, true
	})
}

// heldLocks are the locks a saga holds until its last undo or check.
type heldLocks struct {
	mu    sync.Mutex
	keys  map[string]func()
	order []string // in the order they were taken
	// taking counts the locks of created items still being taken; done
	// is signalled as each is.
	taking int
	done   *sync.Cond
}

func newHeldLocks() *heldLocks {
	h := &heldLocks{keys: map[string]func(){}}
	h.done = sync.NewCond(&h.mu)
	return h
}

func (h *heldLocks) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[key] != nil
}

// holds is has, once the locks of created items being taken are had: an
// item the batch created may be the one a later operation writes.
func (h *heldLocks) holds(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.settle()
	return h.keys[key] != nil
}

// held are the keys whose locks are held.
func (h *heldLocks) held() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := make([]string, 0, len(h.keys))
	for k := range h.keys {
		keys = append(keys, k)
	}
	return keys
}

func (h *heldLocks) add(key string, unlock func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.keys[key] = unlock
	h.order = append(h.order, key)
}

// later takes a lock in the background (take adds it once had).
func (h *heldLocks) later(take func()) {
	h.mu.Lock()
	h.taking++
	h.mu.Unlock()
	go func() {
		take()
		h.mu.Lock()
		defer h.mu.Unlock()
		h.taking--
		h.done.Broadcast()
	}()
}

// settle waits for the locks being taken; h.mu is held.
func (h *heldLocks) settle() {
	for h.taking > 0 {
		h.done.Wait()
	}
}

// drop lets key's lock go, if it is held, for it to be taken afresh;
// a lock still being taken is waited for first, so that it is not
// taken behind the caller's back.
func (h *heldLocks) drop(key string) {
	h.mu.Lock()
	h.settle()
	unlock := h.keys[key]
	delete(h.keys, key)
	h.mu.Unlock()
	if unlock != nil {
		unlock()
	}
}

// release lets every lock go, together: a storage lock's release is a
// round trip, and the order of releases cannot make anyone deadlock.
func (h *heldLocks) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.settle()
	unlocks := make([]func(), 0, len(h.keys))
	for _, key := range h.order {
		if unlock := h.keys[key]; unlock != nil {
			unlocks = append(unlocks, unlock)
			delete(h.keys, key)
		}
	}
	h.order = nil
	h.mu.Unlock()
	itemlock.Release(unlocks) // a round trip: the lock lists stay readable meanwhile
}

// refusal is why a batch did not start: nothing was sent.
type refusal struct {
	status     int
	detail     string
	retryAfter string
	cause      error
}

// LockWait is what a wait for an item's lock ran under: the client's
// request, and the deadlines that bounded it.
type LockWait struct {
	// Client is the client's request, done when the client went away.
	Client context.Context
	// Batch is the batch's deadline (batch_timeout, BatchTimeout long);
	// nil for a single write.
	Batch        context.Context
	BatchTimeout time.Duration
	// ItemTimeout is item_timeout, when it bounded the wait too.
	ItemTimeout time.Duration
	// Item names the batch's item the lock is for (its index and id),
	// when the refusal is the whole batch's answer: the client must learn
	// which item to look at, where a path is the upstream's spelling. A
	// single write's path is the client's own, and an item's refusal
	// stands in that item's result, so both leave it empty.
	Item string
}

// LockRefusal is the answer to a write whose item's lock could not be
// had: nothing was sent for it.
type LockRefusal struct {
	// Status is 409 when another write held the item, 503 when the locks
	// themselves failed, and 499 (Caddy's code for a client that closed
	// the request) when the client went away first.
	Status int
	// Type is the problem type a single write is answered with
	// (README, "Problem types"); empty for 499, which is answered to
	// no one.
	Type string
	// Detail says which item, and what kept its lock from the write.
	Detail string
	// RetryAfter is the Retry-After to answer with; empty for 499.
	RetryAfter string
}

// RefuseLock decides, from the lock's error and what the wait ran under,
// how a write refused its item's lock is answered: a single write, a
// saga that could not lock its items, an envelope's operation locked
// late, and a partial batch's write all are, the same way.
func RefuseLock(key string, err error, w LockWait) LockRefusal {
	ref := refuseLock(key, err, w)
	if w.Item != "" {
		ref.Detail = w.Item + ": " + ref.Detail
	}
	return ref
}

func refuseLock(key string, err error, w LockWait) LockRefusal {
	switch {
	case w.Client.Err() != nil:
		return LockRefusal{Status: 499, Detail: fmt.Sprintf(
			"the client went away while the write waited for the lock of %s; nothing was sent", key)}
	case !errors.Is(err, itemlock.ErrLocked):
		// Not another writer: the locks themselves failed (a storage
		// that is down, under item_locks storage).
		return LockRefusal{Status: http.StatusServiceUnavailable, Type: "item-lock-unavailable", RetryAfter: "1", Detail: fmt.Sprintf(
			"the lock of %s could not be taken (the item locks are unavailable); nothing was sent, try again", key)}
	}
	held := "holds " + key
	switch {
	case w.Batch != nil && w.Batch.Err() != nil:
		held = fmt.Sprintf("held %s until batch_timeout (%s) ran out", key, w.BatchTimeout)
	case w.ItemTimeout > 0:
		held = fmt.Sprintf("held %s for item_timeout (%s)", key, w.ItemTimeout)
	}
	return LockRefusal{Status: http.StatusConflict, Type: "item-locked", RetryAfter: "1",
		Detail: "another write through the gateway " + held + "; nothing was sent, try again"}
}
