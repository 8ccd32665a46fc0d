package durable

import (
	"sync/atomic"
	"testing"
	"time"
)

// One loop renews every holding each third of the lease; a release
// waits for a renewal being written and none comes after it; max bounds
// a holding that is never released; and the loop ends with nothing held.
// In a bubble, so the renewals are counted exactly: one every 10ms.
func TestLeases(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		l := NewLeases(30 * time.Millisecond)
		start := time.Now()
		var a, b, bounded atomic.Int32
		releaseA := l.Hold(func() { a.Add(1) }, 0)
		releaseB := l.Hold(func() { time.Sleep(5 * time.Millisecond); b.Add(1) }, 0)
		l.Hold(func() { bounded.Add(1) }, 25*time.Millisecond)
		time.Sleep(103 * time.Millisecond) // b's renewal at 100ms is being written
		releaseB()
		atRelease, released := b.Load(), time.Since(start)
		time.Sleep(50 * time.Millisecond)
		if a.Load() != 15 || atRelease != 10 {
			t.Errorf("renewed %d and %d times in 150ms and 103ms, want one every 10ms (15 and 10)", a.Load(), atRelease)
		}
		if released != 105*time.Millisecond {
			t.Errorf("the release returned at %s, want at 105ms, once the renewal being written was", released)
		}
		if b.Load() != atRelease {
			t.Errorf("renewed %d times after its release", b.Load()-atRelease)
		}
		if n := bounded.Load(); n != 2 {
			t.Errorf("renewed %d times in its 25ms, want 2", n)
		}
		releaseA()
		releaseA()
		time.Sleep(30 * time.Millisecond)
		l.mu.Lock()
		running := l.running
		l.mu.Unlock()
		if running {
			t.Error("the loop runs with nothing held")
		}
	})
}
