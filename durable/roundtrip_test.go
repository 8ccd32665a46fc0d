package durable

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/slots"
)

// createPlan plans an all-or-nothing create of n widgets.
func createPlan(t *testing.T, n int) *batch.Plan {
	t.Helper()
	var elems []string
	for i := range n {
		elems = append(elems, fmt.Sprintf(`{"name":"c%d"}`, i))
	}
	r := httptest.NewRequest("POST", "/widgets", strings.NewReader("["+strings.Join(elems, ",")+"]"))
	r.Header.Set("Content-Type", "application/json")
	m, _ := widgets(t).Lookup("/widgets")
	_, _, plan, prob := batch.Admit(r, m)
	if prob != nil {
		t.Fatal(prob.Detail)
	}
	return plan
}

// TestRoundTripsPerBatch runs all-or-nothing batches with the journal
// and storage item locks over a storage whose every call takes 10ms of
// a bubble's time, against an upstream that answers at once, and counts
// the storage calls the batch made one after another (its time, in
// round trips) and by purpose: the locks go in a few rounds, not one per
// item; the journal stores overlap, so a wave of writes waits for about
// one store; the removal deletes only what was written, and the answer
// waits for its first call only (the end marker, or the one call of a
// storage that deletes several keys at once).
func TestRoundTripsPerBatch(t *testing.T) {
	t.Run("generic", func(t *testing.T) { roundTripsPerBatch(t, false) })
	t.Run("atomic removal", func(t *testing.T) { roundTripsPerBatch(t, true) })
}

func roundTripsPerBatch(t *testing.T, atomic bool) {
	const rt = 10 * time.Millisecond
	for _, tc := range []struct {
		name      string
		plan      func(t *testing.T) *batch.Plan
		items     int
		maxRounds int
		stores    int
		// slots, when set, bound the writes in flight (max_in_flight)
		// below the batch's concurrency: a write is recorded before it
		// waits for one, so the stores are the same.
		slots int
	}{
		// Locks: 1 round per 128 items; stores: a create's, one per wave
		// of 8, the intent with the first (its writers record together,
		// and the intent's store waits for them); an update's, at most: the intent and
		// the first four waves' records, while the preflight reads (here,
		// where the upstream answers at once, those stores overlap
		// nothing: two rounds where a create has one), then the records
		// of the waves four ahead, stored while a wave is in flight; the
		// end: the removal's first call (its end marker, where it goes
		// key by key, and the rest after the answer; on a storage that
		// removes at once, the one call, with no listing), while the
		// locks are let go (a round per 128 items, or two when created
		// items' locks go too). A create's lock is taken in the
		// background, as its worker goes on.
		{"PATCH 100", func(t *testing.T) *batch.Plan { return updatePlan(t, widgets(t), 100) }, 100, 1 + 4 + 2, 4, 0},
		{"PATCH 20", func(t *testing.T) *batch.Plan { return updatePlan(t, widgets(t), 20) }, 20, 1 + 4 + 2, 4, 0},
		{"CREATE 100", func(t *testing.T) *batch.Plan { return createPlan(t, 100) }, 100, 13 + 2, (100 + 7) / 8, 0},
		{"CREATE 20", func(t *testing.T) *batch.Plan { return createPlan(t, 20) }, 20, 3 + 2, (20 + 7) / 8, 0},
		{"CREATE 100, 4 slots", func(t *testing.T) *batch.Plan { return createPlan(t, 100) }, 100, 13 + 2, (100 + 7) / 8, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				s := newCountingStorage(rt)
				js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
				if atomic {
					// The removal is one call, with no listing, beside the locks' release.
					js = NewJournals(atomicCounting{s}, NewLeases(time.Minute), zap.NewNop())
				}
				locks := NewItemLocks(&itemlock.Local{}, s, nil)
				plan := tc.plan(t)
				start := time.Now()
				run := batch.Runtime{Send: &upstream{}, Journal: js.New(Origin{}), Locks: locks}
				if tc.slots > 0 {
					run.Slots = slots.NewFIFO(tc.slots)
				}
				res := batch.Run(context.Background(), plan, run)
				rounds := int(time.Since(start) / rt)
				if res.Outcome != batch.Succeeded {
					t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
				}
				removed(t, run.Journal.(*Journal).Saga())
				calls := s.snapshot()
				t.Logf("%d round trips one after another; calls %v", rounds, calls)
				if rounds > tc.maxRounds {
					t.Errorf("%d storage round trips one after another, want at most %d", rounds, tc.maxRounds)
				}
				// A created item's lock is taken once it is known.
				if calls["lock item lock"] != tc.items || calls["unlock item lock"] != tc.items {
					t.Errorf("%d locks and %d unlocks of items, want %d each", calls["lock item lock"], calls["unlock item lock"], tc.items)
				}
				if stores := calls["store journal"]; stores > tc.stores {
					t.Errorf("%d journal stores for %d writes sent 8 at a time, want at most %d", stores, tc.items, tc.stores)
				}
				if len(s.absent) > 0 {
					t.Errorf("deleted %v, which were never written", s.absent)
				}
				if keys, _ := s.memStorage.count(); keys != 0 {
					t.Errorf("%d keys left", keys)
				}
			})
		})
	}
}
