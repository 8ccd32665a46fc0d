package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A saga leaves no key behind on a storage whose Delete of a folder is
// not recursive (Redis's), whatever it did: several segments (items
// written one at a time), a lease renewed while it ran, items rolled
// back.
func TestJournalLeavesNoKey(t *testing.T) {
	for _, flat := range []bool{false, true} {
		t.Run(fmt.Sprintf("flat=%v", flat), func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				s := newMemStorage()
				s.flat = flat
				leases := NewLeases(30 * time.Millisecond)
				js := NewJournals(s, leases, zap.NewNop())
				j := js.New(Origin{Server: "srv0"})
				renewed := false
				up := &upstream{fail: "/widgets/3", check: func(*batch.SubRequest) {
					if !renewed {
						renewed = true
						time.Sleep(40 * time.Millisecond) // past a renewal (every 10ms)
						if _, err := s.Load(context.Background(), leaseKey(j.Saga())); err != nil {
							t.Errorf("no lease renewed while the saga ran: %v", err)
						}
					}
				}}
				p := widgets(t)
				plan := updatePlan(t, p, 3)
				res := batch.Run(context.Background(), plan, batch.Runtime{Send: up, Journal: j})
				if res.Outcome != batch.RolledBack {
					t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
				}
				removed(t, j.Saga())
				if keys, stores := s.count(); keys != 0 || stores < 3 {
					t.Errorf("%d keys left after %d stores: %v", keys, stores, s.keys)
				}
			})
		})
	}
}

// A removal that fails is logged and retried by the process, under the
// saga's lease (a scan meanwhile does not take the saga over), until the
// journal is gone.
func TestJournalRemovalRetried(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newMemStorage()
		s.flat = true
		core, logs := observer.New(zapcore.InfoLevel)
		js := NewJournals(s, NewLeases(30*time.Millisecond), zap.New(core))
		j := js.New(Origin{})
		pending := Pending()
		up := &upstream{check: func(*batch.SubRequest) { s.failDeletes(errors.New("the storage is down")) }}
		res := batch.Run(context.Background(), updatePlan(t, widgets(t), 1), batch.Runtime{Send: up, Journal: j})
		if res.Outcome != batch.Succeeded {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
		}
		synctest.Wait() // what is left after the end marker goes after the answer
		if logs.FilterMessageSnippet("could not be removed").Len() == 0 {
			t.Error("the failed removal was not logged")
		}
		time.Sleep(50 * time.Millisecond) // past the lease's length
		other := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		finish := func(*Recovered) error { t.Error("a saga being removed was taken over"); return nil }
		if err := other.Scan(context.Background(), finish, func(saga, doing string, err error) {}); err != nil {
			t.Fatal(err)
		}
		if Pending() != pending+1 {
			t.Error("a saga whose removal is pending is not counted")
		}
		// Another instance, which does not know the saga is this
		// process's, finds its lease renewed.
		if l, err := other.leaseOf(context.Background(), j.Saga()); err != nil || !time.Now().Before(l.Expires) {
			t.Errorf("the lease of a saga whose removal is pending: %+v, %v; want it renewed", l, err)
		}
		s.failDeletes(nil)
		time.Sleep(16 * time.Millisecond) // past the next try, half the lease later
		if keys, _ := s.count(); keys != 0 {
			t.Fatalf("%d keys left: %v", keys, s.keys)
		}
		if owned.has(j.Saga()) {
			t.Error("the removed saga is still owned")
		}
		if logs.FilterMessageSnippet("after it failed").Len() != 1 {
			t.Errorf("the removal that succeeded at last was not logged: %v", logs.All())
		}
	})
}

// The scan clears what is left of journals whose removal was cut short,
// once nothing was written to them for a lease: keys it lists, and the
// keys an older build left unlisted on Redis (it deleted the folder,
// whose module then kept the lease and the later segments); it leaves a
// journal being written.
func TestScanClearsLeftovers(t *testing.T) {
	s := newMemStorage()
	s.flat = true
	ctx := context.Background()
	store := func(key string) {
		if err := s.Store(ctx, key, []byte(`{"owner":"dead","expires":"2000-01-01T00:00:00Z"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Cut short by this build: the end marker stored, segment 0 gone,
	// the rest listed.
	store(endKey("listed"))
	store(segmentKey("listed", 1))
	store(leaseKey("listed"))
	// The storage lost the beginning of a saga that never ended (no end
	// marker): kept, and marked stuck.
	store(segmentKey("lost", 1))
	store(leaseKey("lost"))
	// Left by an older build on Redis: the folder unlisted.
	store(segmentKey("unlisted", 1))
	store(segmentKey("unlisted", 2))
	store(leaseKey("unlisted"))
	s.unlisted[journalDir("unlisted")] = true
	s.age(journalPrefix, time.Minute)
	// Being written right now.
	store(segmentKey("fresh", 1))

	core, logs := observer.New(zapcore.ErrorLevel)
	js := NewJournals(s, NewLeases(30*time.Second), zap.New(core))
	failed := func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
	finish := func(*Recovered) error { t.Error("a leftover was taken over"); return nil }
	if err := js.Scan(ctx, finish, failed); err != nil {
		t.Fatal(err)
	}
	want := []string{segmentKey("fresh", 1), leaseKey("lost"), segmentKey("lost", 1), stuckKey("lost")}
	if left := s.keysUnder(journalPrefix); fmt.Sprint(left) != fmt.Sprint(want) {
		t.Errorf("left %v, want %v", left, want)
	}
	if errs := logs.FilterMessageSnippet("lost its beginning").FilterField(zap.String("saga", "lost")); errs.Len() != 1 {
		t.Errorf("the journal that lost its beginning was told %d times at ERROR, want once: %v", errs.Len(), logs.All())
	}
	list, err := js.ListSagas(ctx, SagaQuery{})
	if err != nil || len(list) != 1 || list[0].ID != "lost" || list[0].State != StateStuck || !strings.Contains(list[0].Reason, "segment 0") {
		t.Errorf("listed %+v, %v; want the lost saga, stuck, with why", list, err)
	}
	if err := js.Scan(ctx, finish, failed); err != nil || logs.FilterMessageSnippet("lost its beginning").Len() != 1 {
		t.Errorf("the next scan told it again (%v)", err)
	}
}

// An idle instance's scan and sweep make the same requests of the
// storage with 20,000 Idempotency-Key records kept as with none, and a
// saga whose owner died is taken over by the first scan once its lease
// stood unchanged for one of this instance's, whatever is kept.
func TestIdleCostDoesNotGrowWithWhatIsKept(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		idle := func(records int) (map[string]int, bool) {
			mem := newMemStorage()
			s := newCounting(mem)
			for i := range records {
				fileRecord(t, s, fmt.Sprintf("kept%05d", i), Record{Version: 1, State: StateDone, Expires: time.Now().Add(24 * time.Hour)}, 24*time.Hour)
			}
			dead := NewJournals(s, NewLeases(20*time.Millisecond), zap.NewNop())
			j := dead.New(Origin{Server: "srv0"})
			died, gone := make(chan struct{}), make(chan struct{})
			defer close(gone) // the dead saga's goroutine ends with the test
			up := &upstream{check: func(*batch.SubRequest) {
				select {
				case <-died:
				default:
					j.Abandon() // dead before anyone hears of it: a scan must not find it owned
					close(died)
				}
				<-gone // the gateway died mid-write
			}}
			// A create: its journal is one segment, whatever the timing (an
			// update's intent may be stored alone, while its preflight
			// reads).
			go batch.Run(context.Background(), createPlan(t, 1), batch.Runtime{Send: up, Journal: j})
			<-died
			sw := NewSweeper(s, zap.NewNop())
			if _, err := sw.Sweep(context.Background(), time.Now()); err != nil { // the first, which indexes
				t.Fatal(err)
			}
			js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
			failed := func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
			taken := make(chan struct{}, 1)
			finish := func(r *Recovered) error {
				taken <- struct{}{}
				r.abandon()
				return nil
			}
			if err := js.Scan(context.Background(), finish, failed); err != nil { // sees the dead owner's lease
				t.Fatal(err)
			}
			time.Sleep(time.Minute) // the lease stood unchanged for one of this instance's
			s.take()
			if err := js.Scan(context.Background(), finish, failed); err != nil {
				t.Fatal(err)
			}
			if _, err := sw.Sweep(context.Background(), time.Now()); err != nil {
				t.Fatal(err)
			}
			counts := s.take()
			select {
			case <-taken:
				return counts, true
			case <-time.After(5 * time.Second):
				return counts, false
			}
		}
		none, tookNone := idle(0)
		many, tookMany := idle(20000)
		if fmt.Sprint(none) != fmt.Sprint(many) {
			t.Errorf("an idle scan and sweep made %v with 20,000 records kept, %v with none", many, none)
		}
		if !tookNone || !tookMany {
			t.Errorf("the dead saga was not taken over by the first scan a lease after it was seen: with none %v, with 20,000 %v", tookNone, tookMany)
		}
		t.Logf("an idle scan (with a dead saga to take over) and sweep: %v", many)
	})
}

// Wait returns when its context ends, a saga still running; the leases
// of a length are the process's, one for every config.
func TestProcessLifecycle(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		if ProcessLeases(7*time.Second) != ProcessLeases(7*time.Second) {
			t.Error("two configs with one lease length got two leases")
		}
		j := NewJournals(newMemStorage(), NewLeases(time.Minute), zap.NewNop()).New(Origin{})
		if err := j.Begin(context.Background(), updatePlan(t, widgets(t), 1)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if err := Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait with a saga running: %v, want its context's end", err)
		}
		j.End(context.Background(), nil)
	})
}
