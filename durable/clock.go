package durable

import (
	"sync/atomic"
	"time"
)

// clock is the one clock of everything durable decides by time (leases,
// expiries, sweeps), so that a test can move it instead of waiting.
// Timers and tickers run on time's own clock: they pace work, they
// decide nothing.
var clock atomic.Pointer[func() time.Time]

// now is the clock's time.
func now() time.Time {
	if f := clock.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// Now is the time by durable's clock, for a caller that asks durable
// to decide by a time (a sweep).
func Now() time.Time { return now() }

// SetClock makes f the clock until restore is called. It is for the
// tests that cannot run in a synctest bubble, whose fake time.Now is
// already this clock's: those with a storage over the network (Redis),
// which the bubble does not cover. They share the one clock of the
// process: a test that sets it must not run in parallel with others
// that depend on it.
func SetClock(f func() time.Time) (restore func()) {
	old := clock.Swap(&f)
	return func() { clock.Store(old) }
}
