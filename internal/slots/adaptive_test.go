package slots_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/adaptive"
	"github.com/caddy-batch/caddy-batch/internal/slots"
)

// growUnderJobs runs jobs alone (background requests, far more than
// the slots) against an upstream that answers every request in 10ms
// whatever the load, telling the limit each answer with what used
// reports, and returns where the limit ended.
func growUnderJobs(t *testing.T, used func(*slots.FIFO) int) int {
	const least, most = 3, 32
	limit := adaptive.New(least, most)
	s := slots.NewFIFO(limit.Current())
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 100 {
				release, err := s.Acquire(context.Background(), slots.Priority{Background: true})
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(10 * time.Millisecond)
				if n, changed := limit.Observe(10*time.Millisecond, used(s), false); changed {
					s.SetCap(n)
				}
				release()
			}
		})
	}
	wg.Wait()
	return limit.Current()
}

// TestAdaptiveLimitGrowsPastTheJobCap: a limit grows only when it is
// used (adaptive.Limit), and jobs alone hold at most half of it. Fed
// InFlight, a limit of 3 lets jobs hold 1 and never learns that the
// upstream has room; fed Used, it grows as it would under batches.
func TestAdaptiveLimitGrowsPastTheJobCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pinned := growUnderJobs(t, (*slots.FIFO).InFlight)
		grown := growUnderJobs(t, (*slots.FIFO).Used)
		if pinned != 3 {
			t.Errorf("fed InFlight, the limit moved to %d; the test no longer shows the pinning it guards against", pinned)
		}
		if grown < 16 {
			t.Errorf("fed Used, the limit reached %d, want at least 16 (the job cap past 8)", grown)
		}
	})
}
