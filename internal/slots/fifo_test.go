package slots

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// waitFor waits until every other goroutine of the test's bubble is
// blocked (on a slot, or holding one), then fails the test unless cond
// holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	synctest.Wait()
	if !cond() {
		t.Fatalf("not so once every goroutine was blocked: %s", what)
	}
}

// The lanes of Acquire, for the tests' tables.
var (
	normal           = Priority{}
	urgent           = Priority{Urgent: true}
	urgentBackground = Priority{Urgent: true, Background: true}
	background       = Priority{Background: true}
)

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// queueUp starts one Acquire per entry of lanes, in that order, each
// only once the one before it waits, so that the arrival order is
// known. Each waiter, once served, appends its index to the returned
// order and releases at once.
func queueUp(t *testing.T, s *FIFO, lanes []Priority) (order func() []int, wait func()) {
	t.Helper()
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	base := s.Waiting()
	for i, p := range lanes {
		wg.Go(func() {
			release, err := s.Acquire(context.Background(), p)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
			release()
		})
		waitFor(t, "waiter to queue", func() bool { return s.Waiting() == base+i+1 })
	}
	return func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}, wg.Wait
}

func TestSlotsBoundUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, goroutines, rounds = 4, 64, 50
		s := NewFIFO(n)
		var now, peak atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for r := range rounds {
					ctx, cancel := context.WithCancel(context.Background())
					if r%7 == g%7 {
						cancel() // some give up before or while they wait
					}
					release, err := s.Acquire(ctx, Priority{Urgent: (g+r)%5 == 0})
					cancel()
					if err != nil {
						if !errors.Is(err, ErrNoSlot) || !errors.Is(err, context.Canceled) {
							t.Errorf("Acquire: %v, want ErrNoSlot wrapping context.Canceled", err)
						}
						continue
					}
					v := now.Add(1)
					for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
					}
					if v > n {
						t.Errorf("%d holders at once, want at most %d", v, n)
					}
					time.Sleep(time.Duration(r%3) * 100 * time.Microsecond)
					now.Add(-1)
					release()
					release() // idempotent: must not free a second slot
				}
			})
		}
		wg.Wait()
		if p := peak.Load(); p != n {
			t.Errorf("peak %d holders, want the bound %d reached", p, n)
		}
		if s.InFlight() != 0 || s.Waiting() != 0 {
			t.Errorf("after everyone left: InFlight %d, Waiting %d, want 0 and 0", s.InFlight(), s.Waiting())
		}
	})
}

func TestSlotsServeInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(1)
		release, err := s.Acquire(context.Background(), Priority{})
		if err != nil {
			t.Fatal(err)
		}
		order, wait := queueUp(t, s, make([]Priority, 8))
		release()
		wait()
		if got := order(); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("served in order %v, want arrival order", got)
		}
	})
}

// TestSlotsUrgentGoFirst: compensations (urgent) pass every batch
// sub-request that waits, however early it came, and keep their own
// arrival order.
func TestSlotsUrgentGoFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(1)
		release, err := s.Acquire(context.Background(), Priority{})
		if err != nil {
			t.Fatal(err)
		}
		order, wait := queueUp(t, s, []Priority{normal, normal, normal, urgent, urgent, normal, urgent})
		release()
		wait()
		if got, want := order(), []int{3, 4, 6, 0, 1, 2, 5}; !slices.Equal(got, want) {
			t.Errorf("served in order %v, want %v (urgent first, each queue in arrival order)", got, want)
		}
	})
}

// TestSlotsUrgentUnderSaturation: with every slot held and a long queue
// of batch sub-requests, an undo gets the very next slot that frees.
func TestSlotsUrgentUnderSaturation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 4
		s := NewFIFO(n)
		var releases []func()
		for range n {
			r, err := s.Acquire(context.Background(), Priority{})
			if err != nil {
				t.Fatal(err)
			}
			releases = append(releases, r)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var normals sync.WaitGroup
		var servedNormal atomic.Int64
		for range 50 {
			normals.Go(func() {
				if r, err := s.Acquire(ctx, Priority{}); err == nil {
					servedNormal.Add(1)
					<-ctx.Done() // keep it: the storm does not let go
					r()
				}
			})
		}
		waitFor(t, "the queue of batches", func() bool { return s.Waiting() == 50 })
		got := make(chan func(), 1)
		go func() {
			r, err := s.Acquire(context.Background(), Priority{Urgent: true})
			if err != nil {
				t.Error(err)
			}
			got <- r
		}()
		waitFor(t, "the undo to queue", func() bool { return s.Waiting() == 51 })
		releases[0]()
		select {
		case r := <-got:
			if v := servedNormal.Load(); v != 0 {
				t.Errorf("%d batch sub-requests were served before the undo", v)
			}
			r()
		case <-time.After(5 * time.Second):
			t.Fatal("the undo did not get the slot that came free")
		}
		// The undo's slot then goes to the head of the queue of batches.
		waitFor(t, "the undo's slot to go to the queue", func() bool { return servedNormal.Load() == 1 })
		if s.InFlight() != n || s.Waiting() != 49 {
			t.Errorf("InFlight %d, Waiting %d, want %d and 49", s.InFlight(), s.Waiting(), n)
		}
		cancel()
		normals.Wait()
		for _, r := range releases[1:] {
			r()
		}
		if s.InFlight() != 0 || s.Waiting() != 0 {
			t.Errorf("InFlight %d, Waiting %d, want 0 and 0", s.InFlight(), s.Waiting())
		}
	})
}

// TestSlotsCancelledWaiterLeaksNothing: a waiter that gives up leaves
// the queue, and one whose slot is handed over just as it gives up
// passes the slot on to the next waiter.
func TestSlotsCancelledWaiterLeaksNothing(t *testing.T) {
	t.Run("while waiting", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := NewFIFO(1)
			hold, _ := s.Acquire(context.Background(), Priority{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			_, err := s.Acquire(ctx, Priority{})
			if !errors.Is(err, ErrNoSlot) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire past the deadline: %v, want ErrNoSlot wrapping context.DeadlineExceeded", err)
			}
			if s.Waiting() != 0 {
				t.Errorf("Waiting %d after the waiter gave up, want 0", s.Waiting())
			}
			hold()
			if s.InFlight() != 0 {
				t.Errorf("InFlight %d after the holder released, want 0", s.InFlight())
			}
		})
	})
	t.Run("done before asking", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := NewFIFO(1)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := s.Acquire(ctx, Priority{Urgent: true}); !errors.Is(err, ErrNoSlot) {
				t.Errorf("Acquire with a done context: %v, want ErrNoSlot", err)
			}
			if s.InFlight() != 0 {
				t.Errorf("InFlight %d, want 0: a done context must not take a free slot", s.InFlight())
			}
		})
	})
	t.Run("while being handed the slot", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := NewFIFO(1)
			for i := range 300 {
				hold, _ := s.Acquire(context.Background(), Priority{})
				ctx, cancel := context.WithCancel(context.Background())
				first := make(chan error, 1)
				go func() {
					r, err := s.Acquire(ctx, Priority{Urgent: i%2 == 0})
					if err == nil {
						r()
					}
					first <- err
				}()
				waitFor(t, "the first waiter", func() bool { return s.Waiting() == 1 })
				second := make(chan func(), 1)
				go func() {
					r, err := s.Acquire(context.Background(), Priority{})
					if err != nil {
						t.Error(err)
					}
					second <- r
				}()
				waitFor(t, "the second waiter", func() bool { return s.Waiting() == 2 })
				// Cancel and release together: the slot may reach the first
				// waiter before it sees its context end.
				cancel()
				hold()
				if err := <-first; !errors.Is(err, ErrNoSlot) {
					t.Fatalf("round %d: the cancelled waiter got %v, want ErrNoSlot", i, err)
				}
				select {
				case r := <-second:
					r()
				case <-time.After(5 * time.Second):
					t.Fatalf("round %d: the slot was lost with the cancelled waiter", i)
				}
				if s.InFlight() != 0 || s.Waiting() != 0 {
					t.Fatalf("round %d: InFlight %d, Waiting %d, want 0 and 0", i, s.InFlight(), s.Waiting())
				}
			}
		})
	})
}

// TestSlotsReleaseIsIdempotent: a second call of a release frees
// nothing, so a deferred release after an explicit one is harmless.
func TestSlotsReleaseIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(2)
		a, _ := s.Acquire(context.Background(), Priority{})
		b, _ := s.Acquire(context.Background(), Priority{})
		a()
		a()
		if s.InFlight() != 1 {
			t.Fatalf("InFlight %d after releasing one slot twice, want 1", s.InFlight())
		}
		c, err := s.Acquire(context.Background(), Priority{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := s.Acquire(ctx, Priority{}); err == nil {
			t.Fatal("a third holder of two slots")
		}
		b()
		c()
		if s.InFlight() != 0 {
			t.Errorf("InFlight %d, want 0", s.InFlight())
		}
	})
}

func TestSlotsNeedOne(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewFIFO(0) did not panic")
		}
	}()
	NewFIFO(0)
}

// A raised cap hands its new slots to the waiters at once, urgent ones
// first; a lowered one takes no slot from its holders, and serves no
// waiter until the slots held are below it.
func TestSlotsSetCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(1)
		held, err := s.Acquire(context.Background(), Priority{})
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan bool, 3)
		var releases = make(chan func(), 3)
		for _, urgent := range []bool{false, true, false} {
			go func() {
				release, err := s.Acquire(context.Background(), Priority{Urgent: urgent})
				if err != nil {
					t.Error(err)
					return
				}
				granted <- urgent
				releases <- release
			}()
		}
		waitFor(t, "three waiters", func() bool { return s.Waiting() == 3 })
		s.SetCap(3)
		// Two slots for three waiters: the undo's is one of them.
		if a, b := <-granted, <-granted; !a && !b {
			t.Error("a raised cap served two batches' waiters and left the undo's waiting")
		}
		equal(t, "waiting after the cap rose to 3", s.Waiting(), 1)
		equal(t, "in flight", s.InFlight(), 3)

		s.SetCap(1)
		held()
		(<-releases)()
		equal(t, "in flight after two of three were freed under a cap of 1", s.InFlight(), 1)
		equal(t, "still waiting", s.Waiting(), 1)
		(<-releases)()
		<-granted
		equal(t, "in flight once the last was freed", s.InFlight(), 1)
		equal(t, "cap", s.Cap(), 1)
	})
}
