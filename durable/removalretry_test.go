package durable

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
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
		if res.Outcome == batch.Succeeded {
			t.Fatalf("told %s with its journal left in storage past the lease: %s", res.Outcome, res.Detail)
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

// nameOf is widget id's name as u keeps it ("old" until written).
func nameOf(u *namedWidgets, id string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return cmp.Or(u.names[id], "old")
}

// A saga succeeds, and the storage becomes unreachable for this
// instance as its last write leaves. Its journal cannot be removed, and
// a journal left in storage past the lease is taken for a saga cut
// short, and undone: so its client is never told succeeded before the
// removal lands. A blip at the end costs the answer a moment, and the
// batch stands; an outage past the lease loses the lease, the client is
// told 503 with every item unknown, and the instance that takes the
// saga over undoes it, as the client was told it might.
func TestSagaIsNeverToldSucceededBeforeItsEndIsRecorded(t *testing.T) {
	for _, tc := range []struct {
		name      string
		outage    time.Duration
		succeeded bool
	}{
		{"a blip", time.Second, true},
		{"an outage past the lease", 3 * time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				s := &partitioned{memStorage: newMemStorage()}
				a := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
				j := a.New(Origin{})
				up := newNamedWidgets()
				var once sync.Once
				up.before = func(*batch.SubRequest) {
					once.Do(func() {
						s.cut.Store(true)
						time.AfterFunc(tc.outage, func() { s.cut.Store(false) })
					})
				}
				res := batch.Run(context.Background(), updatePlan(t, widgets(t), 1), batch.Runtime{Send: up, Journal: j})
				if tc.succeeded != (res.Outcome == batch.Succeeded) {
					t.Fatalf("told %s (%d): %s", res.Outcome, res.Status, res.Detail)
				}
				if !tc.succeeded && (res.Status != http.StatusServiceUnavailable || res.Items[0].Outcome != batch.Unknown) {
					t.Errorf("told %s (%d), item %s; want 503 and the item unknown", res.Outcome, res.Status, res.Items[0].Outcome)
				}
				time.Sleep(tc.outage)
				b := NewJournals(s.memStorage, NewLeases(time.Minute), zap.NewNop())
				finished := make(chan *batch.Result, 1)
				finish := func(r *Recovered) error {
					res, err := batch.Resume(context.Background(), r.Snapshot, widgets(t).Lookup, nil, batch.Runtime{Send: up, Journal: r.Journal})
					finished <- res
					return err
				}
				scanAfterLease(t, b, finish, func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) })
				time.Sleep(time.Minute)
				var recovered *batch.Result
				select {
				case recovered = <-finished:
				default:
				}
				switch {
				case tc.succeeded && (recovered != nil || nameOf(up, "1") != "new"):
					t.Errorf("told succeeded, then taken over (%v) and the widget is %q", recovered != nil, nameOf(up, "1"))
				case !tc.succeeded && (recovered == nil || nameOf(up, "1") != "old"):
					t.Errorf("the saga whose end was not recorded: taken over %v, the widget %q; want taken over and undone", recovered != nil, nameOf(up, "1"))
				}
			})
		})
	}
}
