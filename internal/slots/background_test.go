package slots

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// hold takes n slots in lane p at once (free ones: the fast path) and
// returns their releases.
func hold(t *testing.T, s *FIFO, p Priority, n int) []func() {
	t.Helper()
	releases := make([]func(), n)
	for i := range releases {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		r, err := s.Acquire(ctx, p)
		cancel()
		if err != nil {
			t.Fatalf("slot %d of %d in lane %+v: %v", i+1, n, p, err)
		}
		releases[i] = r
	}
	return releases
}

// wait starts one Acquire in lane p that keeps its slot, and returns
// the channel its release comes on once it is served.
func wait(t *testing.T, s *FIFO, p Priority) <-chan func() {
	t.Helper()
	got := make(chan func(), 1)
	before := s.Waiting()
	go func() {
		r, err := s.Acquire(context.Background(), p)
		if err != nil {
			t.Error(err)
			return
		}
		got <- r
	}()
	waitFor(t, "the waiter to queue", func() bool { return s.Waiting() == before+1 })
	return got
}

// TestSlotsLaneOrder: a freed slot goes to the urgent lane, then the
// urgent background lane (a job's undos), then the synchronous
// batches, then the jobs; each lane in arrival order.
func TestSlotsLaneOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(1)
		held := hold(t, s, normal, 1)
		order, done := queueUp(t, s, []Priority{background, normal, urgentBackground, urgent, background, normal, urgentBackground, urgent})
		held[0]()
		done()
		if got, want := order(), []int{3, 7, 2, 6, 1, 5, 0, 4}; !slices.Equal(got, want) {
			t.Errorf("served in order %v, want %v (urgent, urgent background, normal, background)", got, want)
		}
	})
}

// TestSlotsBackgroundCap: the jobs hold at most half of the slots, at
// least one, however many of their requests wait; the other half is
// there for the synchronous batches. The cap follows SetCap, up and
// down.
func TestSlotsBackgroundCap(t *testing.T) {
	for _, c := range []struct{ n, cap int }{{1, 1}, {2, 1}, {7, 3}, {32, 16}} {
		t.Run(fmt.Sprint(c.n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := NewFIFO(c.n)
				equal(t, "BackgroundCap", s.BackgroundCap(), c.cap)
				jobs := hold(t, s, background, c.cap)
				var queued []<-chan func()
				for range 2 * c.n {
					queued = append(queued, wait(t, s, background))
				}
				equal(t, "in flight with the jobs capped", s.InFlight(), c.cap)
				// What the cap leaves is the synchronous batches', at once.
				batches := hold(t, s, normal, c.n-c.cap)
				equal(t, "in flight with the batches", s.InFlight(), c.n)

				// Up: the new background slots go to the jobs waiting.
				s.SetCap(2 * c.n)
				equal(t, "BackgroundCap after SetCap up", s.BackgroundCap(), c.n)
				for _, q := range queued[:c.n-c.cap] {
					jobs = append(jobs, <-q)
				}
				queued = queued[c.n-c.cap:]
				waitFor(t, "the jobs to take the raised cap, no more", func() bool {
					return s.InFlight() == c.n+c.n-c.cap && s.Waiting() == len(queued)
				})

				// Down: nothing is taken back, and no job is served until
				// the jobs hold fewer than the new cap.
				s.SetCap(c.n)
				equal(t, "BackgroundCap after SetCap down", s.BackgroundCap(), c.cap)
				for _, r := range jobs[:len(jobs)-c.cap] {
					r()
				}
				jobs = jobs[len(jobs)-c.cap:]
				waitFor(t, "no job served at the lowered cap", func() bool { return s.Waiting() == len(queued) })
				jobs[0]()
				jobs[0] = <-queued[0]
				waitFor(t, "one job served for the one freed", func() bool { return s.Waiting() == len(queued)-1 })

				for _, r := range slices.Concat(jobs, batches) {
					r()
				}
				for _, q := range queued[1:] {
					(<-q)()
				}
				equal(t, "in flight at the end", s.InFlight(), 0)
			})
		})
	}
}

// TestSlotsCappedBackgroundBlocksNoOne: an undo of a job (urgent
// background) held back by the background cap lets the batches behind
// it have the slots that free, and gets the first background slot that
// frees.
func TestSlotsCappedBackgroundBlocksNoOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(4) // background cap 2
		jobs := hold(t, s, background, 2)
		batches := hold(t, s, normal, 2)
		undo := wait(t, s, urgentBackground)
		job := wait(t, s, background)
		batch := wait(t, s, normal)
		batches[0]()
		select {
		case r := <-batch:
			r()
		case <-undo:
			t.Fatal("the undo passed the background cap")
		}
		jobs[0]()
		(<-undo)()
		(<-job)()
		jobs[1]()
		batches[1]()
		equal(t, "in flight at the end", s.InFlight(), 0)
	})
}

// TestSlotsUsed: the slots count as used while the background cap holds
// a job back, so that an adaptive limit fed Used grows under jobs alone.
func TestSlotsUsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewFIFO(4)
		equal(t, "Used, idle", s.Used(), 0)
		jobs := hold(t, s, background, 2)
		equal(t, "Used, the jobs at their cap with nobody waiting", s.Used(), 2)
		queued := wait(t, s, background)
		equal(t, "Used, a job held back by the cap", s.Used(), 4)
		batches := hold(t, s, normal, 1)
		equal(t, "Used, a batch beside the capped jobs", s.Used(), 4)
		jobs[0]()
		jobs[0] = <-queued
		equal(t, "Used, the job waiting served", s.Used(), 3)

		more := hold(t, s, normal, 1)
		waiting := wait(t, s, background)
		equal(t, "Used, every slot held", s.Used(), 4)
		s.SetCap(2)
		equal(t, "Used, above a lowered cap", s.Used(), 4)
		for _, r := range slices.Concat(jobs, batches, more) {
			r()
		}
		(<-waiting)()
		equal(t, "Used at the end", s.Used(), 0)
	})
}

// TestSlotsBackgroundUnderLoad: many goroutines in every lane, the cap
// moving under them: never more slots held than the cap, nor more
// background ones than half of it, and nothing left held or waiting.
func TestSlotsBackgroundUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const goroutines, rounds = 64, 40
		s := NewFIFO(8)
		var all, jobs atomic.Int64
		check := func(what string, v int64, bound int) {
			if v > int64(bound) {
				t.Errorf("%d %s held at once, want at most %d", v, what, bound)
			}
		}
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for r := range rounds {
					p := Priority{Urgent: (g+r)%5 == 0, Background: g%2 == 0}
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+r%4)*time.Millisecond)
					release, err := s.Acquire(ctx, p)
					cancel()
					if err != nil {
						continue
					}
					// The cap only moves between 4 and 8: at most 8 held, 4 by jobs.
					check("slots", all.Add(1), 8)
					if p.Background {
						check("background slots", jobs.Add(1), 4)
					}
					time.Sleep(time.Duration(r%3) * 200 * time.Microsecond)
					if p.Background {
						jobs.Add(-1)
					}
					all.Add(-1)
					release()
				}
			})
		}
		wg.Go(func() {
			for i := range 200 {
				s.SetCap(4 + i%5)
				time.Sleep(100 * time.Microsecond)
			}
			s.SetCap(8)
		})
		wg.Wait()
		equal(t, "in flight at the end", s.InFlight(), 0)
		equal(t, "waiting at the end", s.Waiting(), 0)
	})
}
