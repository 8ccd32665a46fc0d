package durable

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// leased is what keeps records in a storage under the process's leases
// (Journals, Keys): the storage, the leases, and the logger that hears
// of what fails after the request that caused it is gone.
type leased struct {
	storage Storage
	leases  *Leases
	logger  *zap.Logger
}

// Leases is the one lease of the process (docs/durability.md, "Leases"):
// one length, and one loop that renews, every third of it, everything
// the process holds in storage under a lease — the journals of the sagas
// it runs or took over, and its Idempotency-Key claims. Each holding is
// its own record in storage (a saga's lease key, a claim's record), so
// that an instance looking at one saga or key reads one key; the loop is
// shared, and runs only while something is held.
type Leases struct {
	// Length is how long a holding stands without being renewed.
	Length time.Duration

	mu      sync.Mutex
	held    map[*holding]struct{}
	running bool
}

// NewLeases is the process's leases of length.
func NewLeases(length time.Duration) *Leases {
	return &Leases{Length: length, held: map[*holding]struct{}{}}
}

type holding struct {
	renew func()
	// until is when renewals end (zero: never), for a holder that may
	// never let go.
	until time.Time
	// turn holds a token while no renewal runs: renew and release each
	// take it, so that release waits for a renewal being written. A
	// channel, not a mutex, so that the wait is one a fake clock sees
	// (testing/synctest counts a goroutine waiting on a mutex as busy).
	turn     chan struct{}
	released bool
}

func (h *holding) take() { <-h.turn }
func (h *holding) give() { h.turn <- struct{}{} }

// Hold renews a holding every third of the length, by calling renew
// (which writes it to storage), until the returned release is called or,
// with max above zero, for at most max. Release waits until no renewal
// is being written, and none is written after it.
func (l *Leases) Hold(renew func(), max time.Duration) (release func()) {
	h := &holding{renew: renew, turn: make(chan struct{}, 1)}
	h.give()
	if max > 0 {
		h.until = now().Add(max)
	}
	l.mu.Lock()
	l.held[h] = struct{}{}
	if !l.running {
		l.running = true
		go l.loop()
	}
	l.mu.Unlock()
	return sync.OnceFunc(func() {
		l.mu.Lock()
		delete(l.held, h)
		l.mu.Unlock()
		h.take()
		h.released = true
		h.give()
	})
}

// loop renews every holding each tick, side by side so that a slow write
// of one delays no other, and ends when nothing is held.
func (l *Leases) loop() {
	tick := time.NewTicker(l.Length / 3)
	defer tick.Stop()
	for range tick.C {
		l.mu.Lock()
		if len(l.held) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		at := now()
		var due []*holding
		for h := range l.held {
			if !h.until.IsZero() && at.After(h.until) {
				delete(l.held, h)
				continue
			}
			due = append(due, h)
		}
		l.mu.Unlock()
		var wg sync.WaitGroup
		for _, h := range due {
			wg.Go(func() {
				h.take()
				defer h.give()
				if !h.released {
					h.renew()
				}
			})
		}
		wg.Wait()
	}
}
