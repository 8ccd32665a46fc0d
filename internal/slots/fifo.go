// Package slots bounds the sub-requests a process has in flight
// (max_in_flight): a counting semaphore whose waiters keep their turn,
// with a lane for the urgent ones (compensations) ahead of the others,
// and background lanes (bulk jobs) that together hold at most half of
// the slots.
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

// Priority is the lane a sub-request waits in. Urgent is an undo's or a
// recovery's request; Background is a bulk job's, which takes slots
// below every synchronous batch and, all jobs together, at most
// BackgroundCap of them, so that an interactive batch always finds
// slots free or freeing. A job's undo is both.
type Priority struct{ Urgent, Background bool }

// FIFO is the slots of one process: a counting semaphore whose
// waiters are served strictly in turn within four lanes, served in the
// order urgent, urgent background, normal, background. A slot that is
// freed while someone waits goes straight to the first waiter of the
// first lane that may take it, so a newcomer never takes it ahead of
// the queue: under a storm of batches every batch keeps its place, and
// an undo waits for one sub-request to finish, not for the batches
// queued before it.
//
// The background lanes are served only while fewer than BackgroundCap
// background slots are held; a background waiter held back by that cap
// blocks no waiter of another lane behind it.
//
// The zero value has no slots; use NewFIFO.
type FIFO struct {
	n int

	mu sync.Mutex
	// inFlight counts the slots held, including ones handed to a
	// waiter that has not woken yet; background counts those of them
	// held by background waiters.
	inFlight, background int
	// lanes are the waiters (*slotWaiter), each lane in arrival
	// order, in the order they are served.
	lanes [4]list.List
}

// The lanes, in the order they are served.
const (
	urgentLane = iota
	urgentBackgroundLane
	normalLane
	backgroundLane
)

func (p Priority) lane() int {
	switch {
	case p.Urgent && p.Background:
		return urgentBackgroundLane
	case p.Urgent:
		return urgentLane
	case p.Background:
		return backgroundLane
	}
	return normalLane
}

// slotWaiter is one Acquire waiting for a slot. granted is set, under
// FIFO.mu, when a releaser hands it a slot, and ready is closed
// right after.
type slotWaiter struct {
	ready      chan struct{}
	granted    bool
	background bool
	queue      *list.List
	elem       *list.Element
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

// BackgroundCap returns how many slots the background lanes may hold
// together: half of them, rounded down, and at least one, so that a job
// moves on with one slot. It follows SetCap.
func (s *FIFO) BackgroundCap() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backgroundCap()
}

// backgroundCap is BackgroundCap; s.mu is held.
func (s *FIFO) backgroundCap() int {
	return max(1, s.n/2)
}

// SetCap changes the number of slots (an adaptive limit's), and the
// background cap with it: more hands the new slots to the waiters, in
// turn; fewer takes none back from their holders, and serves no waiter
// until enough are freed. It panics when n < 1, as NewFIFO does.
func (s *FIFO) SetCap(n int) {
	if n < 1 {
		panic(fmt.Sprintf("slots: SetCap(%d): the number of slots must be at least 1", n))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n = n
	s.serve()
}

// InFlight returns how many slots are held now.
func (s *FIFO) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight
}

// Used returns how many slots count as used, for an adaptive limit:
// those held, or every slot while the background cap holds a background
// waiter back. A limit only grows when it is used; a job alone holds at
// most half of it, and would otherwise pin it where it stands, however
// fast the upstream answers.
func (s *FIFO) Used() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.backgroundHeldBack() {
		return max(s.n, s.inFlight)
	}
	return s.inFlight
}

// backgroundHeldBack says whether a background waiter waits on the
// background cap (not only on a free slot). s.mu is held.
func (s *FIFO) backgroundHeldBack() bool {
	waiting := s.lanes[urgentBackgroundLane].Len() + s.lanes[backgroundLane].Len()
	return waiting > 0 && s.background >= s.backgroundCap()
}

// Waiting returns how many Acquire calls are waiting for a slot now.
func (s *FIFO) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := range s.lanes {
		n += s.lanes[i].Len()
	}
	return n
}

// Acquire waits for a slot in p's lane until ctx is done, and returns
// the function that frees it; urgent waiters go before every waiter
// that is not, so that undos are never starved by new batches, and
// background ones after the synchronous ones of the same urgency. The
// release may be called more than once; only the first call frees the
// slot. A ctx that is done, on entry or while waiting, gets an error
// wrapping ErrNoSlot and ctx's cause, and no slot: one handed over just
// as ctx ended goes on to the next waiter, so that nothing starts after
// the batch's deadline and no slot is lost.
func (s *FIFO) Acquire(ctx context.Context, p Priority) (func(), error) {
	if ctx.Err() != nil {
		return nil, noSlot(ctx)
	}
	s.mu.Lock()
	// A slot is only ever free while no waiter may take it (serve hands
	// a freed slot to the first that may), so taking a free one passes
	// no one that could have had it.
	if s.inFlight < s.n && s.mayTake(p.Background) {
		s.take(p.Background)
		s.mu.Unlock()
		return s.releaser(p.Background), nil
	}
	w := &slotWaiter{ready: make(chan struct{}), background: p.Background, queue: &s.lanes[p.lane()]}
	w.elem = w.queue.PushBack(w)
	s.mu.Unlock()

	select {
	case <-w.ready:
	case <-ctx.Done():
	}
	if ctx.Err() == nil {
		return s.releaser(p.Background), nil
	}
	s.mu.Lock()
	if w.granted {
		s.free(w.background)
	} else {
		w.queue.Remove(w.elem)
	}
	s.mu.Unlock()
	return nil, noSlot(ctx)
}

func noSlot(ctx context.Context) error {
	return fmt.Errorf("%w: %w", ErrNoSlot, context.Cause(ctx))
}

// mayTake says whether a free slot may go to a waiter of this class:
// any synchronous one, a background one only below the background cap.
// s.mu is held.
func (s *FIFO) mayTake(background bool) bool {
	return !background || s.background < s.backgroundCap()
}

// take counts one more slot held. s.mu is held.
func (s *FIFO) take(background bool) {
	s.inFlight++
	if background {
		s.background++
	}
}

// releaser returns the idempotent release of one held slot.
func (s *FIFO) releaser(background bool) func() {
	var done atomic.Bool
	return func() {
		if !done.CompareAndSwap(false, true) {
			return
		}
		s.mu.Lock()
		s.free(background)
		s.mu.Unlock()
	}
}

// free lets go of one held slot, and serves the waiters it lets on: a
// slot beyond a cap that was lowered goes to no one, and a freed
// background slot may let a background waiter on while others wait for
// a slot. s.mu is held.
func (s *FIFO) free(background bool) {
	s.inFlight--
	if background {
		s.background--
	}
	s.serve()
}

// serve hands the free slots to the waiters, each to the first waiter
// of the first lane that may take it. s.mu is held.
func (s *FIFO) serve() {
	for s.inFlight < s.n {
		w := s.next()
		if w == nil {
			return
		}
		w.queue.Remove(w.elem)
		s.take(w.background)
		w.granted = true
		close(w.ready)
	}
}

// next is the waiter the next free slot goes to, nil when none may
// take it. A background lane held back by the cap is passed over, so
// that the lanes behind it are served. s.mu is held.
func (s *FIFO) next() *slotWaiter {
	for i := range s.lanes {
		e := s.lanes[i].Front()
		if e == nil {
			continue
		}
		if w := e.Value.(*slotWaiter); s.mayTake(w.background) {
			return w
		}
	}
	return nil
}
