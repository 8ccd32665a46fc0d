package batch

import (
	"context"
	"testing"
)

// A raised cap hands its new slots to the waiters at once, urgent ones
// first; a lowered one takes no slot from its holders, and serves no
// waiter until the slots held are below it.
func TestSlotsSetCap(t *testing.T) {
	s := NewFIFOSlots(1)
	held, err := s.Acquire(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan bool, 3)
	var releases = make(chan func(), 3)
	for _, urgent := range []bool{false, true, false} {
		go func() {
			release, err := s.Acquire(context.Background(), urgent)
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
}
