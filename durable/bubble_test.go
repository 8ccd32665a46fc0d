package durable

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// inBubble runs f in a synctest bubble: time in it is fake and moves on
// only when every goroutine of the bubble waits, so a lease of 30ms
// lapses at once, and exactly when it should, however loaded the
// machine. durable's clock needs no SetClock there (time.Now is the
// bubble's). What the process keeps of its sagas (owned) and of the
// journals whose removal is retried (removals) is made anew in the
// bubble, since a goroutine of the bubble may wait only on what the
// bubble made, and put back after it: a test that calls inBubble does
// not run in parallel with the others.
func inBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	prevOwned, prevRemovals := owned, removals
	defer func() { owned, removals = prevOwned, prevRemovals }()
	bubble(t, func(t *testing.T) {
		owned, removals = newOwnedSagas(), newPendingRemovals()
		f(t)
	})
}

// bubble runs f in a synctest bubble, and then lets an hour of the
// bubble's time pass, so that each lease loop f started finds nothing
// held, and ends, before synctest.Test looks for goroutines left behind
// (a holding f never released keeps its loop, and fails the test).
func bubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		f(t)
		time.Sleep(time.Hour)
	})
}

// chanMutex is a mutex whose waiters a bubble sees waiting (one waiting
// on a sync.Mutex counts as busy, and the bubble's clock stops): for a
// test's upstream whose checks sleep, or block for good, while they
// hold it. The zero value is ready to use.
type chanMutex struct {
	once sync.Once
	ch   chan struct{}
}

func (m *chanMutex) Lock() {
	m.once.Do(func() { m.ch = make(chan struct{}, 1) })
	m.ch <- struct{}{}
}

func (m *chanMutex) Unlock() { <-m.ch }

// scanAfterLease scans, lets a lease of js pass on the bubble's clock,
// and scans again: a takeover needs the lease record seen unchanged for
// a whole lease on this process's own clock, whatever the record says
// of its expiry (docs/durability.md, "A saga never writes after it lost
// its lease").
func scanAfterLease(t *testing.T, js *Journals, finish func(*Recovered) error, failed func(saga, doing string, err error)) {
	t.Helper()
	if err := js.Scan(context.Background(), finish, failed); err != nil {
		t.Fatal(err)
	}
	time.Sleep(js.leases.Length)
	if err := js.Scan(context.Background(), finish, failed); err != nil {
		t.Fatal(err)
	}
}

// removed waits, a few seconds at most, until what is left of saga's
// journal once its client was answered is removed (removals.finish).
func removed(t *testing.T, saga string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); owned.has(saga); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the journal of saga %s is still being removed", saga)
		}
	}
}
