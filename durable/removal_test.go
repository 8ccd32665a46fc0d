package durable

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// removerMem is a memStorage that deletes several keys at once under a
// lease's guard (AtomicRemover), checked as the Redis fast path's
// script checks it; before runs first, as another instance's write
// that lands just before the removal.
type removerMem struct {
	*memStorage
	before func(ctx context.Context)

	mu       sync.Mutex
	removals int
}

func (g *removerMem) DeleteAllIf(ctx context.Context, guard LeaseGuard, keys []string) error {
	g.mu.Lock()
	g.removals++
	g.mu.Unlock()
	if g.before != nil {
		g.before(ctx)
	}
	if err := checkLeaseGuard(ctx, g.memStorage, guard); err != nil {
		return err
	}
	for _, k := range keys {
		if err := g.memStorage.Delete(ctx, k); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// TestAtomicRemovalUnderTheLease: a saga whose lease another instance
// took between its fence and its removal (a takeover's key of a higher
// epoch, or the lease key written by another, lands just before the
// removal's one call) deletes nothing of the journal, and its lease is
// lost, taken over, for good: the removal is not retried, and its client
// is not told the saga succeeded (that instance undoes it). Without
// anything landing, the journal goes whole.
func TestAtomicRemovalUnderTheLease(t *testing.T) {
	other := []byte(`{"owner":"another instance","epoch":1}`)
	for _, tc := range []struct {
		name string
		land func(saga string) string // the key another instance stores
	}{
		{"nothing lands", nil},
		{"a higher epoch", func(saga string) string { return leaseKeyOf(saga, 1, "another instance") }},
		{"the lease written by another", func(saga string) string { return leaseKey(saga) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) { removalUnderTheLease(t, tc.land, other) })
		})
	}
}

func removalUnderTheLease(t *testing.T, land func(string) string, other []byte) {
	s := &removerMem{memStorage: newMemStorage()}
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{})
	landed := ""
	if land != nil {
		landed = land(j.Saga())
		s.before = func(ctx context.Context) {
			if err := s.memStorage.Store(ctx, landed, other); err != nil {
				t.Error(err)
			}
		}
	}
	res := batch.Run(context.Background(), updatePlan(t, widgets(t), 3), batch.Runtime{Send: &upstream{}, Journal: j})
	switch {
	case land == nil && res.Outcome != batch.Succeeded:
		t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
	case land != nil && (res.Outcome == batch.Succeeded || !res.LeaseLost):
		// The saga is the other instance's to end (it undoes a saga
		// cut short): its client is not told it succeeded.
		t.Fatalf("outcome %s, lease lost %v, with the lease another instance's at the removal: %s", res.Outcome, res.LeaseLost, res.Detail)
	}
	time.Sleep(2 * time.Minute) // a retry, if any, would run by now
	left := s.memStorage.keysUnder(journalDir(j.Saga()))
	s.mu.Lock()
	removals := s.removals
	s.mu.Unlock()
	if removals != 1 {
		t.Errorf("%d removals, want 1 (none retried)", removals)
	}
	if land == nil {
		if len(left) != 0 || j.takenOver.Load() {
			t.Errorf("left %v, taken over %v; want the journal gone", left, j.takenOver.Load())
		}
		return
	}
	if !slices.Contains(left, segmentKey(j.Saga(), 0)) || !slices.Contains(left, landed) {
		t.Errorf("left %v, want the whole journal and %s", left, landed)
	}
	if j.lostErr() == nil || !j.takenOver.Load() {
		t.Errorf("lease lost %v, taken over %v; want lost to another instance", j.lostErr(), j.takenOver.Load())
	}
}

// A saga that left nothing behind is answered once its end marker is
// stored, and the rest of its journal goes after: its client does not
// wait for the deletes. While they go, the journal is no saga to anyone
// who looks (a listing, the metrics, a view), and an operator's retry
// or resolve is refused as for a saga running, never writing the
// journal again among keys being deleted. A kept saga's journal is gone
// before its answer, as the keyed retry it may get needs.
func TestAnsweredOnceTheEndIsRecorded(t *testing.T) {
	s := newFaulty()
	held := make(chan struct{})
	s.setHook(func(_ context.Context, op, key string) error {
		if op == "delete" && strings.HasPrefix(key, journalPrefix) {
			<-held
		}
		return nil
	})
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{Server: "srv0"})
	ended := make(chan *batch.Result, 1)
	go func() {
		ended <- batch.Run(context.Background(), updatePlan(t, widgets(t), 2), batch.Runtime{Send: &upstream{}, Journal: j})
	}()
	var res *batch.Result
	select {
	case res = <-ended:
	case <-time.After(5 * time.Second):
		close(held)
		t.Fatal("the saga's answer waited for its journal's deletes")
	}
	if res.Outcome != batch.Succeeded {
		t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
	}
	ctx := context.Background()
	if keys, _ := s.count(); keys == 0 {
		t.Fatal("nothing left to remove after the answer: the test shows nothing")
	}
	// Neither with what a journal holds, nor with a stuck mark, as an
	// operator's retry of a stuck journal leaves while it is removed.
	for _, stuckToo := range []bool{false, true} {
		if stuckToo {
			if err := s.Store(ctx, stuckKey(j.Saga()), []byte(`{"reason":"no batch handler serves it"}`)); err != nil {
				t.Fatal(err)
			}
		}
		if list, err := js.ListSagas(ctx, SagaQuery{}); err != nil || len(list) != 0 {
			t.Errorf("listed %+v, %v while an ended saga's journal is removed; want none", list, err)
		}
		if counts, err := js.CountSagas(ctx); err != nil || counts[StateRunning]+counts[StateOrphaned]+counts[StateStuck] != 0 {
			t.Errorf("counted %v, %v; want no saga", counts, err)
		}
		if _, err := js.Saga(ctx, j.Saga()); !errors.Is(err, ErrUnknownSaga) {
			t.Errorf("viewed: %v, want ErrUnknownSaga", err)
		}
	}
	if _, err := js.Revive(ctx, j.Saga(), nil); !errors.Is(err, ErrSagaRunning) {
		t.Errorf("retried: %v, want ErrSagaRunning", err)
	}
	if _, err := js.Resolve(ctx, j.Saga()); !errors.Is(err, ErrSagaRunning) {
		t.Errorf("resolved: %v, want ErrSagaRunning", err)
	}
	close(held)
	removed(t, j.Saga())
	// The stuck mark came after the removal listed the folder: a scan
	// clears it; the rest is gone.
	if left := s.keysUnder(journalPrefix); !slices.Equal(left, []string{stuckKey(j.Saga())}) {
		t.Errorf("left %v once the removal ended, want the stuck mark stored after it began only", left)
	}

	kept := newFaulty()
	ks := NewJournals(kept, NewLeases(time.Minute), zap.NewNop())
	saga := leaveBehind(t, ks, newRailsAPI("1", "2"))
	for _, k := range kept.keysUnder(journalPrefix) {
		t.Errorf("%s of saga %s, kept, left after its answer", k, saga)
	}
}
