package durable

import (
	"sync/atomic"
	"testing"
	"time"
)

// One loop renews every holding each third of the lease; a release
// waits for a renewal being written and none comes after it; max bounds
// a holding that is never released; and the loop ends with nothing held.
func TestLeases(t *testing.T) {
	l := NewLeases(30 * time.Millisecond)
	var a, b, bounded atomic.Int32
	releaseA := l.Hold(func() { a.Add(1) }, 0)
	releaseB := l.Hold(func() { time.Sleep(5 * time.Millisecond); b.Add(1) }, 0)
	l.Hold(func() { bounded.Add(1) }, 25*time.Millisecond)
	time.Sleep(110 * time.Millisecond)
	releaseB()
	atRelease := b.Load()
	time.Sleep(50 * time.Millisecond)
	if a.Load() < 5 || atRelease < 5 {
		t.Errorf("renewed %d and %d times in 160ms, want one every 10ms", a.Load(), atRelease)
	}
	if b.Load() != atRelease {
		t.Errorf("renewed %d times after its release", b.Load()-atRelease)
	}
	if n := bounded.Load(); n > 3 {
		t.Errorf("renewed %d times in its 25ms", n)
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
}
