package durable

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// partitioned is a memStorage this instance cannot reach while cut is
// set (every Store, Load and Delete fails), as a network partition
// between one instance and the storage does; others still reach it.
type partitioned struct {
	*memStorage
	cut atomic.Bool
}

var errCut = errors.New("dial tcp: i/o timeout (partitioned)")

func (s *partitioned) Store(ctx context.Context, k string, v []byte) error {
	if s.cut.Load() {
		return errCut
	}
	return s.memStorage.Store(ctx, k, v)
}

func (s *partitioned) Load(ctx context.Context, k string) ([]byte, error) {
	if s.cut.Load() {
		return nil, errCut
	}
	return s.memStorage.Load(ctx, k)
}

func (s *partitioned) Delete(ctx context.Context, k string) error {
	if s.cut.Load() {
		return errCut
	}
	return s.memStorage.Delete(ctx, k)
}

// A saga ends, and the storage becomes unreachable for this instance
// alone just as its journal is removed, so the removal is tried again
// later (endLater). Its lease lapses by this process's own clock (lost
// for good), another instance takes the saga over (a lease key of epoch
// 1, a segment of its own), and the partition heals: the removal tried
// again deletes nothing of the new owner's. It deleted the whole folder.
func TestRemovalTriedAgainAfterTheLeaseIsLost(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := &partitioned{memStorage: newMemStorage()}
		s.flat = true // the Redis module's Delete: one key
		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		j := js.New(Origin{})
		up := &upstream{check: func(*batch.SubRequest) { s.cut.Store(true) }}
		res := batch.Run(context.Background(), updatePlan(t, widgets(t), 1), batch.Runtime{Send: up, Journal: j})
		if res.Outcome != batch.Succeeded {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
		}
		time.Sleep(90 * time.Second) // the lease lapsed by this process's clock
		if j.lostErr() == nil {
			t.Fatal("the lease should have lapsed")
		}
		// Another instance takes the saga over.
		theirs := []string{leaseKeyOf(j.Saga(), 1, "another instance"), segmentKeyAt(j.Saga(), segmentName{1, 1})}
		for _, k := range theirs {
			if err := s.memStorage.Store(context.Background(), k, []byte(`{"owner":"another instance","epoch":1}`)); err != nil {
				t.Fatal(err)
			}
		}
		s.cut.Store(false)
		time.Sleep(2 * time.Minute) // the next retries run
		left := s.memStorage.keysUnder(journalDir(j.Saga()))
		for _, k := range theirs {
			if !slices.Contains(left, k) {
				t.Errorf("the new owner's %s was deleted by an instance whose lease was lost (left: %v)", k, left)
			}
		}
	})
}
