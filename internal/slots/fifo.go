// Package slots bounds the sub-requests a process has in flight
// (max_in_flight): a counting semaphore whose waiters keep their turn,
// with a lane for the urgent ones (compensations) ahead of the others.
package slots

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrNoSlot is the error of a sub-request that waited for a slot of
// max_in_flight until its context was done.
var ErrNoSlot = errors.New("no slot of max_in_flight came free")

// FIFO is the slots of one process: a counting semaphore whose
// waiters are served strictly in turn, urgent ones (compensations)
// first. A slot that is freed while someone waits goes straight to the
// first waiter, so a newcomer never takes it ahead of the queue: under
// a storm of batches every batch keeps its place, and an undo waits for
// one sub-request to finish, not for the batches queued before it.
//
// The zero value has no slots; use NewFIFO.
type FIFO struct {
	n int

	mu       sync.Mutex
	inFlight int       // slots held, including ones handed to a waiter that has not woken yet
	urgent   list.List // of *slotWaiter, in arrival order
	normal   list.List // of *slotWaiter, in arrival order
}

// slotWaiter is one Acquire waiting for a slot. granted is set, under
// FIFO.mu, when a releaser hands it a slot, and ready is closed
// right after.
type slotWaiter struct {
	ready   chan struct{}
	granted bool
	queue   *list.List
	elem    *list.Element
}

// NewFIFO returns n slots. It panics when n < 1: configuration
// refuses a max_in_flight below one, so such a value is a bug.
func NewFIFO(n int) *FIFO {
	if n < 1 {
		panic(fmt.Sprintf("slots: NewFIFO(%d): the number of slots must be at least 1", n))
	}
	return &FIFO{n: n}
}

// Cap returns the number of slots.
func (s *FIFO) Cap() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// SetCap changes the number of slots (an adaptive limit's): more hands
// the new slots to the waiters, in turn; fewer takes none back from
// their holders, and serves no waiter until enough are freed. It panics
// when n < 1, as NewFIFO does.
func (s *FIFO) SetCap(n int) {
	if n < 1 {
		panic(fmt.Sprintf("slots: SetCap(%d): the number of slots must be at least 1", n))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n = n
	for s.inFlight < s.n && s.urgent.Len()+s.normal.Len() > 0 {
		s.inFlight++
		s.handOver()
	}
}

// InFlight returns how many slots are held now.
func (s *FIFO) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight
}

// Waiting returns how many Acquire calls are waiting for a slot now.
func (s *FIFO) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.urgent.Len() + s.normal.Len()
}

// Acquire waits for a slot until ctx is done, and returns the function
// that frees it; urgent waiters go before every waiter that is not, so
// that undos are never starved by new batches. The release may be
// called more than once; only the first call frees the slot. A ctx that is done, on entry or while waiting, gets an
// error wrapping ErrNoSlot and ctx's cause, and no slot: one handed
// over just as ctx ended goes on to the next waiter, so that nothing
// starts after the batch's deadline and no slot is lost.
func (s *FIFO) Acquire(ctx context.Context, urgent bool) (func(), error) {
	if ctx.Err() != nil {
		return nil, noSlot(ctx)
	}
	s.mu.Lock()
	// A slot is only ever free while nobody waits (free hands a freed
	// slot to the first waiter), so taking a free one passes no one.
	if s.inFlight < s.n {
		s.inFlight++
		s.mu.Unlock()
		return s.releaser(), nil
	}
	w := &slotWaiter{ready: make(chan struct{}), queue: &s.normal}
	if urgent {
		w.queue = &s.urgent
	}
	w.elem = w.queue.PushBack(w)
	s.mu.Unlock()

	select {
	case <-w.ready:
	case <-ctx.Done():
	}
	if ctx.Err() == nil {
		return s.releaser(), nil
	}
	s.mu.Lock()
	if w.granted {
		s.free()
	} else {
		w.queue.Remove(w.elem)
	}
	s.mu.Unlock()
	return nil, noSlot(ctx)
}

func noSlot(ctx context.Context) error {
	return fmt.Errorf("%w: %w", ErrNoSlot, context.Cause(ctx))
}

// releaser returns the idempotent release of one held slot.
func (s *FIFO) releaser() func() {
	var done atomic.Bool
	return func() {
		if !done.CompareAndSwap(false, true) {
			return
		}
		s.mu.Lock()
		s.free()
		s.mu.Unlock()
	}
}

// free lets go of one held slot, handing it to the first urgent waiter,
// else the first waiter, else making it free; a slot beyond a cap that
// was lowered is not handed on. s.mu is held.
func (s *FIFO) free() {
	if s.inFlight <= s.n && s.handOver() {
		return // the slot changes hands; inFlight stays as it is
	}
	s.inFlight--
}

// handOver gives a held slot to the first urgent waiter, else the first
// waiter, and reports whether there was one. s.mu is held.
func (s *FIFO) handOver() bool {
	q := &s.urgent
	if q.Len() == 0 {
		q = &s.normal
	}
	e := q.Front()
	if e == nil {
		return false
	}
	w := q.Remove(e).(*slotWaiter)
	w.granted = true
	close(w.ready)
	return true
}
