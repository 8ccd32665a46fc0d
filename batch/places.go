package batch

import (
	"context"
	"sync"

	"github.com/caddy-batch/caddy-batch/internal/stop"
)

// places admit a window's items to be sent in the order its workers
// took them, at most max at once: the workers are recordsAhead times
// as many, so that the records of the items waiting here go to storage
// together, and a job of concurrency 1 still sends its items one by
// one in the order of its input.
type places struct {
	mu       sync.Mutex
	cond     *sync.Cond
	max      int
	inFlight int
	// turn maps an item to its place in the order taken; next is the
	// turn admitted next, and passed the turns that will never come
	// (their item stopped before it was to be sent).
	turn   map[int]int
	next   int
	passed map[int]bool
	// entered are the items holding a place.
	entered map[int]bool
	// halted closes when the window starts no new item (a refusal of
	// its credentials), and stop when it is told to stop (a cancel, a
	// hand-over): an item waiting here then is not sent.
	halted, stop <-chan struct{}
}

// newPlaces admits the items of order, in that order, until halted or
// stop closes; the caller closes halted once the window is over.
func newPlaces(max int, order []int, halted, stop <-chan struct{}) *places {
	p := &places{max: max, turn: make(map[int]int, len(order)), passed: map[int]bool{}, entered: map[int]bool{}, halted: halted, stop: stop}
	p.cond = sync.NewCond(&p.mu)
	for t, i := range order {
		p.turn[i] = t
	}
	go func() {
		select {
		case <-halted:
		case <-stop:
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cond.Broadcast()
	}()
	return p
}

// enter waits until item i's turn comes and a place is free, or until
// ctx is done or the window halted or was told to stop (then it reports
// false, and the item is not sent). For a batch (w nil), or an envelope
// job's window (no places: its graph orders its operations), nothing
// waits.
func (w *windowing) enter(ctx context.Context, i int) bool {
	if w == nil || w.places == nil {
		return true
	}
	p := w.places
	defer context.AfterFunc(ctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.cond.Broadcast()
	})()
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.turn[i]
	for {
		for p.passed[p.next] {
			delete(p.passed, p.next)
			p.next++
		}
		switch {
		case ctx.Err() != nil || stop.Asked(p.halted) || stop.Asked(p.stop):
			p.passed[t] = true
			p.cond.Broadcast()
			return false
		case t == p.next && p.inFlight < p.max:
			p.next++
			p.inFlight++
			p.entered[i] = true
			p.cond.Broadcast()
			return true
		}
		p.cond.Wait()
	}
}

// done ends item i's time in the window's places: it gives back the
// place of an item that entered, and gives up the turn of one that
// never did (it stopped first), so that the turns after it come. It
// runs once the window has seen the item's answer, so that a refusal
// halts the window before the next item enters. A no-op for a batch
// (w nil), or an envelope job's window.
func (w *windowing) done(i int) {
	if w == nil || w.places == nil {
		return
	}
	p := w.places
	p.mu.Lock()
	defer p.mu.Unlock()
	switch t := p.turn[i]; {
	case p.entered[i]:
		delete(p.entered, i)
		p.inFlight--
	case t >= p.next:
		p.passed[t] = true
	}
	p.cond.Broadcast()
}
