package adaptive

import (
	"slices"
	"testing"
	"time"
)

// server is a scripted legacy API: workers serve at once, each request
// takes service; what is in flight beyond the workers queues, so that a
// request's latency grows with the queue: service × inFlight / workers.
type server struct {
	workers int
	service time.Duration
	// throttling makes every answer a push-back.
	throttling bool
}

// latency is what a request sees with inFlight requests at the server.
func (s server) latency(inFlight int) time.Duration {
	return time.Duration(float64(s.service) * max(1, float64(inFlight)/float64(s.workers)))
}

// drive runs rounds of load through l, every round as many requests in
// flight as the limit allows, and returns the limits it went through.
func drive(l *Limit, s server, rounds int) []int {
	var seen []int
	for range rounds {
		n := l.Current()
		for range n {
			l.Observe(s.latency(n), n, s.throttling)
		}
		seen = append(seen, l.Current())
	}
	return seen
}

func last(s []int) int { return s[len(s)-1] }

// The limit rises from its least to about what the server serves without
// queueing, falls when the server slows, rises again when it recovers,
// and shrinks when it throttles.
func TestLimitFollowsAScriptedServer(t *testing.T) {
	t.Parallel()
	l := New(4, 32)
	fast := server{workers: 8, service: 10 * time.Millisecond}

	settled := drive(l, fast, 2000)
	if got := last(settled); got < 8 || got > 10 {
		t.Fatalf("in front of 8 workers the limit settled at %d, want 8 to 10 (what they serve without queueing, and a little)", got)
	}
	// It stays there: its unloaded latency does not creep up with the
	// queue it keeps, and its probes are short.
	low := 0
	for _, n := range settled[1000:] {
		if n > 10 {
			t.Fatalf("after 1000 rounds the limit crept up to %d", n)
		}
		if n < 8 {
			low++
		}
	}
	if low > 1000/recentWindows*2 {
		t.Errorf("%d of 1000 rounds below 8: probing costs too much", low)
	}

	slow := server{workers: 8, service: 40 * time.Millisecond}
	slowed := drive(l, slow, 5)
	if lowest := minOf(slowed); lowest >= last(settled) {
		t.Errorf("under a server four times slower the limit went %v, never below %d", slowed, last(settled))
	}

	fast2 := drive(l, fast, 200)
	if got := last(fast2); got < 8 || got > 10 {
		t.Errorf("once the server recovered the limit went to %d, want back to 8 to 10 (%v)", got, fast2[:20])
	}

	before := l.Current()
	throttled := drive(l, server{workers: 8, service: 10 * time.Millisecond, throttling: true}, 1)
	if got := last(throttled); got >= before {
		t.Errorf("a throttling server left the limit at %d (was %d)", got, before)
	}
	for range 10 {
		drive(l, server{workers: 8, service: 10 * time.Millisecond, throttling: true}, 1)
	}
	if got := l.Current(); got != 4 {
		t.Errorf("a server that keeps throttling left the limit at %d, want its least, 4", got)
	}
}

// The limit never passes its bounds, and a limit nobody uses does not
// grow: only a used limit can tell it is too low.
func TestLimitBoundsAndIdleness(t *testing.T) {
	t.Parallel()
	l := New(2, 6)
	drive(l, server{workers: 100, service: time.Millisecond}, 100)
	if got := l.Current(); got != 6 {
		t.Errorf("in front of a server that never queues the limit is %d, want its most, 6", got)
	}
	idle := New(4, 32)
	for range 1000 {
		idle.Observe(time.Millisecond, 1, false) // one request at a time
	}
	if got := idle.Current(); got != 4 {
		t.Errorf("a limit of 4 used one request at a time grew to %d", got)
	}
}

func minOf(s []int) int {
	m := s[0]
	for _, v := range s {
		m = min(m, v)
	}
	return m
}

// A server whose latency varies by itself (one request in five twice as
// slow) is not taken for one that queues: the limit still rises to what
// its workers serve.
func TestLimitToleratesJitter(t *testing.T) {
	t.Parallel()
	l := New(4, 32)
	s := server{workers: 8, service: 10 * time.Millisecond}
	for i := range 3000 {
		n := l.Current()
		latency := s.latency(n)
		if i%5 == 0 {
			latency *= 2
		}
		l.Observe(latency, n, false)
	}
	if got := l.Current(); got < 7 || got > 10 {
		t.Errorf("in front of 8 jittery workers the limit is %d, want 7 to 10", got)
	}
}

// A window the server pushed back in (fast 429s, say) does not become
// the unloaded latency the limit measures queueing against: once the
// push-back is over, the limit climbs back as the server's pace allows,
// not held at its least for the windows that remember such a floor.
func TestPushBackIsNoFloor(t *testing.T) {
	t.Parallel()
	l := New(4, 32)
	fast := server{workers: 8, service: 10 * time.Millisecond}
	drive(l, fast, 2000)
	for range 100 {
		l.Observe(50*time.Microsecond, l.Current(), true)
	}
	after := drive(l, fast, 60)
	if got := last(after); got < 8 {
		t.Errorf("60 rounds after a burst of fast push-backs the limit is %d, want it back at 8 or more", got)
	}
}

// A probe window (the limit at its least for one window, to measure the
// unloaded latency) in which the server pushes back: the limit does not
// go back to where it was as if nothing happened, but a quarter below,
// and the refusals' latency does not become the floor.
func TestPushBackDuringAProbe(t *testing.T) {
	t.Parallel()
	l := New(4, 32)
	s := server{workers: 16, service: 10 * time.Millisecond}
	for l.resume == 0 {
		n := l.Current()
		l.Observe(s.latency(n), n, false)
	}
	was, floors := l.resume, len(l.floors)
	for range max(2*l.Current(), 16) {
		l.Observe(50*time.Microsecond, l.Current(), true)
	}
	if l.resume != 0 {
		t.Fatal("the probe did not end with its window")
	}
	if got, want := float64(l.Current()), was*decrease; got > want {
		t.Errorf("after a probe the server pushed back in, the limit is %v, want at most %v (it was %v)", got, want, was)
	}
	if slices.Min(l.floors) < s.service || len(l.floors) != floors {
		t.Errorf("the probe's refusals became a floor: %v", l.floors)
	}
}
