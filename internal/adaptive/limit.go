// Package adaptive is a limit on requests in flight that follows the
// latency of what it guards, in the manner of TCP Vegas and of Netflix's
// concurrency-limits: while the latency of requests stays near the
// lowest recently seen, the guarded server is not queueing them, and the
// limit grows; when latency rises above it, requests are queueing, and
// the limit falls by what queues; when the server pushes back
// (throttles, or does not answer in time), the limit falls by a quarter.
// It knows nothing of HTTP or Caddy.
package adaptive

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Limit is an adaptive limit between a least and a most. Every request
// that completes is told to Observe; the limit changes once per window
// of samples (twice the limit, at least 16: about two round trips'
// worth), never per sample, so one slow request moves nothing. It is
// safe for concurrent use.
type Limit struct {
	least, most int

	mu    sync.Mutex
	limit float64
	// floors are the median latencies of the last windows: the lowest
	// among them is the latency of a server that is not queueing. A
	// median, not a minimum, so that a server whose latency varies
	// anyway (one fast request in ten) does not look as if it queued.
	floors []time.Duration
	win    window
	// windows counts the windows since the last probe; resume is the
	// limit to return to after the probe in progress, 0 when none is.
	windows int
	resume  float64
}

// window is the samples since the limit last changed.
type window struct {
	latencies  []time.Duration
	busiest    int  // the most requests in flight any sample saw
	overloaded bool // a sample said the server pushed back
}

// recentWindows is how many windows "recently" spans: long enough to
// remember an unloaded latency through a burst, short enough to learn a
// server's new pace within a few seconds.
const recentWindows = 50

// A limit that is always used never sees the server unloaded, and its
// notion of an unloaded latency would creep up with the queue it
// causes. So once every recentWindows windows it drops to its least for
// one window, a probe, as Envoy's adaptive concurrency filter measures
// its minimum round trip, and goes back to where it was.

// decrease is what the limit keeps of itself when the server pushes back.
const decrease = 0.75

// New returns a limit between least and most (1 ≤ least ≤ most), starting
// at least: it earns its way up.
func New(least, most int) *Limit {
	if least < 1 || most < least {
		panic("adaptive: New needs 1 <= least <= most")
	}
	return &Limit{least: least, most: most, limit: float64(least)}
}

// Current returns the limit now.
func (l *Limit) Current() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// Observe takes one completed request: its latency, how many requests
// were in flight when it completed (itself included), and whether the
// server pushed back. It returns the limit, and whether it changed.
func (l *Limit) Observe(latency time.Duration, inFlight int, overloaded bool) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := &l.win
	w.latencies = append(w.latencies, latency)
	w.busiest = max(w.busiest, inFlight)
	w.overloaded = w.overloaded || overloaded
	if len(w.latencies) < max(2*int(l.limit), 16) {
		return int(l.limit), false
	}
	before := int(l.limit)
	l.adjust()
	l.win = window{latencies: w.latencies[:0]}
	return int(l.limit), int(l.limit) != before
}

// adjust moves the limit by what the window just closed says. l.mu is held.
func (l *Limit) adjust() {
	w := l.win
	slices.Sort(w.latencies)
	median := w.latencies[len(w.latencies)/2]
	if l.resume > 0 {
		// The probe's window tells only the unloaded latency; one the
		// server pushed back in tells not even that (its answers may be
		// refusals made in no time), and the limit goes back to a quarter
		// below where it was, as after any push-back.
		resume := l.resume
		l.resume, l.windows = 0, 0
		if w.overloaded {
			l.limit = max(resume*decrease, float64(l.least))
			return
		}
		l.floors = append(l.floors[:0], median)
		l.limit = resume
		return
	}
	if !w.overloaded || len(l.floors) == 0 {
		// A window the server pushed back in says nothing of its
		// unloaded latency (its answers may be refusals made in no
		// time), unless there is no other yet.
		l.floors = append(l.floors, median)
	}
	if len(l.floors) > recentWindows {
		l.floors = l.floors[1:]
	}
	if l.windows++; l.windows >= recentWindows && l.limit > float64(l.least) && !w.overloaded {
		l.resume, l.limit = l.limit, float64(l.least)
		return
	}
	floor := slices.Min(l.floors)
	// Vegas' estimate of the requests queued at the server: what is in
	// flight beyond what the server would hold at its unloaded latency.
	queued := l.limit * (1 - float64(floor)/float64(max(median, 1)))
	alpha := max(1, math.Log10(l.limit))
	next := l.limit
	switch {
	case w.overloaded:
		next = l.limit * decrease
	case queued > 2*alpha:
		// Well past the band: fall at once to what the server serves
		// without queueing, as a gradient limiter does.
		next = l.limit*float64(floor)/float64(median) + alpha
	case queued > 2*alpha-0.5:
		next = l.limit - 1
	case queued < alpha && 2*w.busiest >= int(l.limit):
		// Only a limit that is used can tell it is too low.
		next = l.limit + 1
	}
	l.limit = min(max(next, float64(l.least)), float64(l.most))
}
