package durable

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// storedLease is the lease record stored at key.
func storedLease(t *testing.T, s Storage, key string) Lease {
	t.Helper()
	var l Lease
	if found, err := loadJSON(context.Background(), s, key, &l); !found || err != nil {
		t.Fatalf("lease %s: found %v, %v", key, found, err)
	}
	return l
}

// A job's lease is renewed while it is held, and not claimable; released,
// another instance claims it at once, under the next epoch, and the
// owner that released it writes nothing more: no progress, no results,
// no end.
func TestJobReleasedLeaseIsClaimedAtOnce(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, token := mustStart(t, js, 4)
		id := hj.Record().ID
		lease := jobLeases(id).key(0, Owner())
		time.Sleep(time.Minute + time.Second)
		if l := storedLease(t, s, lease); l.Renewal != 3 || l.Released || !l.Expires.After(now()) {
			t.Errorf("a held job's lease after a minute: %+v, want renewed thrice", l)
		}
		if _, err := js.ClaimReleased(ctx, id); !errors.Is(err, ErrJobHeld) {
			t.Errorf("claiming a held job: %v, want ErrJobHeld", err)
		}

		if err := hj.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if l := storedLease(t, s, lease); !l.Released {
			t.Errorf("a released lease %+v", l)
		}
		before := maps.Clone(s.keys)
		p := JobProgress{State: JobRunning, Started: now()}
		for name, write := range map[string]func() error{
			"progress": func() error { return hj.WriteProgress(ctx, p) },
			"results":  func() error { return hj.AppendResults(ctx, 0, createdRange(0, 1)) },
			"end":      func() error { return hj.End(ctx, JobProgress{State: JobSucceeded, Ended: now()}) },
		} {
			var lost *batch.LeaseLost
			if err := write(); !errors.As(err, &lost) {
				t.Errorf("the %s written after the release: %v, want a lost lease", name, err)
			}
		}
		if len(s.keys) != len(before) {
			t.Errorf("a released owner wrote: %d keys, were %d", len(s.keys), len(before))
		}

		next, err := js.ClaimReleased(ctx, id)
		if err != nil || next.Epoch() != 1 {
			t.Fatalf("claiming a released job: %v", err)
		}
		if _, err := js.ClaimReleased(ctx, id); !errors.Is(err, ErrJobHeld) {
			t.Errorf("claiming a job claimed already: %v, want ErrJobHeld", err)
		}
		if err := next.WriteProgress(ctx, p); err != nil {
			t.Fatal(err)
		}
		if st, _ := js.Status(ctx, id, token); st.State != JobRunning {
			t.Errorf("the new owner's progress is not read: %+v", st)
		}
		time.Sleep(time.Minute)
		// The old owner's key, released, is never renewed again.
		if l := storedLease(t, s, lease); !l.Released {
			t.Errorf("the released lease was written again: %+v", l)
		}
		endJob(t, next)
		if left := s.keysUnder(jobDir(id)); len(left) != 3 {
			t.Errorf("an ended job kept %v: want its record, progress and results, no lease", left)
		}
	})
}

// A release racing a renewal: the release waits for the renewal being
// written, and nothing renews the lease after the release.
func TestJobReleaseRacingARenewal(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		slow := &slowStores{memStorage: newMemStorage()}
		js := NewJobs(slow, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, _ := mustStart(t, js, 1)
		slow.delay.Store(int64(5 * time.Second)) // each store, the renewal's too
		lease := jobLeases(hj.Record().ID).key(0, Owner())
		time.Sleep(time.Minute/3 + time.Second) // a renewal is being stored
		released := make(chan error, 1)
		go func() { released <- hj.Release(ctx) }()
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		if l := storedLease(t, slow.memStorage, lease); !l.Released || l.Renewal != 2 {
			t.Errorf("after a release racing a renewal: %+v, want the renewal's, then the release's", l)
		}
		time.Sleep(time.Hour)
		if l := storedLease(t, slow.memStorage, lease); !l.Released || l.Renewal != 2 {
			t.Errorf("renewed after the release: %+v", l)
		}
	})
}

// slowStores is a storage whose every Store takes delay.
type slowStores struct {
	*memStorage
	delay atomic.Int64
}

func (s *slowStores) Store(ctx context.Context, key string, value []byte) error {
	time.Sleep(time.Duration(s.delay.Load()))
	return s.memStorage.Store(ctx, key, value)
}

// An owner whose lease another instance took (the storage says a higher
// epoch) learns it at its next renewal, and writes nothing more; nor
// does a release write over the new owner's lease.
func TestJobLeaseTakenOverFencesTheOldOwner(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, _ := mustStart(t, js, 1)
		id := hj.Record().ID
		other, _ := json.Marshal(Lease{Owner: "another instance", Epoch: 1, Expires: now().Add(time.Minute)})
		takeover := jobLeases(id).key(1, "another instance")
		if err := s.Store(ctx, takeover, other); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute/3 + time.Second)
		var lost *batch.LeaseLost
		if err := hj.WriteProgress(ctx, JobProgress{State: JobRunning}); !errors.As(err, &lost) {
			t.Errorf("an owner taken over wrote its progress: %v", err)
		}
		if _, err := s.Load(ctx, progressKey(id, 0)); err != nil {
			t.Fatal(err)
		}
		_ = hj.Release(ctx) // outranked: its own key only
		if b, _ := s.Load(ctx, takeover); string(b) != string(other) {
			t.Errorf("the new owner's lease was written over: %s", b)
		}
	})
}

// A renewal of a job's lease and a scan's claim of the job that race: at
// every interleaving of their storage calls (the renewal's read, write
// and listing; the claim's listing and read of the lease, then its
// write, listing and read again), at most one of them holds the job
// afterwards.
func TestJobRenewalRacingATakeover(t *testing.T) {
	t.Parallel()
	for _, order := range interleavings(3, 5) {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			bubble(t, func(t *testing.T) { raceJobRenewalAndClaim(t, order) })
		})
	}
}

func raceJobRenewalAndClaim(t *testing.T, order string) {
	defer endHeld(t)
	s := newFaulty()
	owner := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
	hj, _ := mustStart(t, owner, 1)
	hj.lease.renew() // the lease key, as the owner last wrote it
	other := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
	f := jobLeases(hj.Record().ID)
	seen, err := readFolderLease(context.Background(), s, f)
	if err != nil {
		t.Fatal(err)
	}
	turns := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	calls := map[string]int{}
	var mu sync.Mutex
	s.setHook(func(ctx context.Context, _, _ string) error {
		who, _ := ctx.Value(raceParty{}).(string)
		mu.Lock()
		calls[who]++
		n := calls[who]
		mu.Unlock()
		if who == "a" && n <= 3 || who == "b" && n <= 5 {
			turns[who] <- struct{}{} // ready to call
			<-turns[who]             // and called
		}
		return nil
	})
	renewed, claimed := make(chan error, 1), make(chan error, 1)
	// A party may be done before its last turn: a claim that found the
	// lease renewed reads no further.
	done := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	go func() {
		defer close(done["a"])
		ctx := context.WithValue(context.Background(), raceParty{}, "a")
		hj.lease.mu.Lock()
		prev := hj.lease.stored
		hj.lease.mu.Unlock()
		_, err := renewFolderLease(ctx, s, f, 0, prev, leaseRecord(0, now().Add(time.Minute), 99))
		renewed <- err
	}()
	go func() {
		defer close(done["b"])
		ctx := context.WithValue(context.Background(), raceParty{}, "b")
		next, err := other.claim(ctx, hj.Record(), &seen)
		if next != nil {
			next.lease.end("the test ended")
		}
		claimed <- err
	}()
	for _, who := range order {
		select {
		case <-turns[string(who)]:
			turns[string(who)] <- struct{}{}
			synctest.Wait() // the call is made, and its party waits for its next turn or is done
		case <-done[string(who)]:
		}
	}
	aErr, bErr := <-renewed, <-claimed
	if aErr == nil && bErr == nil {
		t.Errorf("order %s: the renewal proved the lease and the takeover claimed the job", order)
	}
}
