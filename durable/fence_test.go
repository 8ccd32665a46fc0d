package durable

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// The faults a cluster sees (docs/durability.md, "A saga never writes
// after it lost its lease"), played on the in-memory storage in a
// synctest bubble: a storage call that hangs past the lapse, renewals
// refused while other calls pass, a blip shorter than the lease, a lease
// key that vanishes, an owner paused across a takeover, and a renewal
// racing a takeover at every interleaving of their storage calls.

// faulty is a storage whose every call first goes through hook, which
// may block (on channels or the bubble's clock) or fail it.
type faulty struct {
	*memStorage
	mu   sync.Mutex
	hook func(ctx context.Context, op, key string) error
}

func newFaulty() *faulty { return &faulty{memStorage: newMemStorage()} }

func (f *faulty) setHook(h func(ctx context.Context, op, key string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = h
}

func (f *faulty) before(ctx context.Context, op, key string) error {
	f.mu.Lock()
	h := f.hook
	f.mu.Unlock()
	if h == nil {
		return nil
	}
	return h(ctx, op, key)
}

func (f *faulty) Store(ctx context.Context, key string, value []byte) error {
	if err := f.before(ctx, "store", key); err != nil {
		return err
	}
	return f.memStorage.Store(ctx, key, value)
}

func (f *faulty) Load(ctx context.Context, key string) ([]byte, error) {
	if err := f.before(ctx, "load", key); err != nil {
		return nil, err
	}
	return f.memStorage.Load(ctx, key)
}

func (f *faulty) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	if err := f.before(ctx, "list", prefix); err != nil {
		return nil, err
	}
	return f.memStorage.List(ctx, prefix, recursive)
}

func (f *faulty) Modified(ctx context.Context, key string) (time.Time, error) {
	if err := f.before(ctx, "modified", key); err != nil {
		return time.Time{}, err
	}
	return f.memStorage.Modified(ctx, key)
}

func (f *faulty) Delete(ctx context.Context, key string) error {
	if err := f.before(ctx, "delete", key); err != nil {
		return err
	}
	return f.memStorage.Delete(ctx, key)
}

// fenceLease is the lease of the fault tests: renewed every 100ms, a
// write held back 50ms short of its end.
const fenceLease = 300 * time.Millisecond

// slowWrites is an upstream whose every write takes d, and which logs
// the writes it received, in order.
type slowWrites struct {
	d    time.Duration
	mu   sync.Mutex
	sent []string
	// during, if set, runs as the nth write (from 1) is being served.
	during func(n int)
}

func (u *slowWrites) Send(ctx context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	if sr.Method != http.MethodGet {
		u.mu.Lock()
		u.sent = append(u.sent, sr.Method+" "+sr.Path)
		n, during := len(u.sent), u.during
		u.mu.Unlock()
		if during != nil {
			during(n)
		}
		time.Sleep(u.d)
	}
	id := sr.Path[strings.LastIndex(sr.Path, "/")+1:]
	return &batch.SubResponse{Status: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":` + id + `,"name":"old"}`)}, nil
}

func (u *slowWrites) writes() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.sent...)
}

// oneAtATime plans an all-or-nothing update of n widgets sent one at a
// time.
func oneAtATime(t *testing.T, n int) *batch.Plan {
	t.Helper()
	return oneAtATimeWith(t, n, policy.Defaults())
}

// oneAtATimeWith is oneAtATime under the settings s.
func oneAtATimeWith(t *testing.T, n int, s policy.Settings) *batch.Plan {
	t.Helper()
	s.Concurrency = 1
	s.BatchTimeout = 5 * time.Second
	p, err := policy.New([]policy.ResourceSpec{{
		Path: "/widgets", CollectionMethods: []string{"GET", "PATCH"}, ItemMethods: []string{"GET", "PUT", "PATCH"},
		Settings: s, Gateway: policy.GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return updatePlan(t, p, n)
}

// checkNeverSucceededAfterLoss asserts what a saga that lost its lease
// may answer: never succeeded, and never an item succeeded.
func checkNeverSucceededAfterLoss(t *testing.T, res *batch.Result) {
	t.Helper()
	if res.Outcome == batch.Succeeded || !res.LeaseLost {
		t.Errorf("outcome %s (lease lost: %v): %s", res.Outcome, res.LeaseLost, res.Detail)
	}
	for _, it := range res.Items {
		if it.Outcome == batch.Succeeded {
			t.Errorf("item %d told succeeded after the lease was lost", it.Index)
		}
	}
}

// A storage that hangs for one and a half leases and then answers, as a
// partition that heals does: the renewal that hung proves nothing, the
// lease lapsed by the owner's own clock, and the write whose journal
// store hung is not sent when the store returns.
func TestStorageHangingPastTheLapse(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newFaulty()
		js := NewJournals(s, NewLeases(fenceLease), zap.NewNop())
		heal := make(chan struct{})
		up := &slowWrites{d: 20 * time.Millisecond, during: func(n int) {
			if n == 2 {
				s.setHook(func(context.Context, string, string) error { <-heal; return nil })
				go func() { time.Sleep(fenceLease * 3 / 2); close(heal) }()
			}
		}}
		res := batch.Run(context.Background(), oneAtATime(t, 8), batch.Runtime{Send: up, Journal: js.New(Origin{})})
		// The records of the four writes after the second went ahead
		// of them (docs/durability.md, "Records stored ahead"), and may
		// have landed before the hang: those are sent, under a lease
		// still proven, and the store that hangs is a later write's.
		// Never the seventh.
		if got := up.writes(); len(got) < 2 || len(got) > 6 {
			t.Errorf("writes sent %v, want the first two, and at most the four after", got)
		}
		checkNeverSucceededAfterLoss(t, res)
	})
}

// Renewals refused while every other call passes: the lease is never
// proven again, lapses by the owner's clock, and the writes stop there.
func TestRenewalsRefused(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newFaulty()
		s.setHook(func(_ context.Context, op, key string) error {
			if op == "store" && strings.HasSuffix(key, "/"+leaseName) {
				return errors.New("READONLY")
			}
			return nil
		})
		js := NewJournals(s, NewLeases(fenceLease), zap.NewNop())
		up := &slowWrites{d: fenceLease / 4}
		start := time.Now()
		res := batch.Run(context.Background(), oneAtATime(t, 8), batch.Runtime{Send: up, Journal: js.New(Origin{})})
		// Proven from the first store on, the lease stands 300ms, and
		// writes go until 50ms short of that: at 0, 75, 150 and 225ms;
		// the fifth, at 300ms, finds it lapsed.
		if got := up.writes(); len(got) != 4 {
			t.Errorf("writes sent %v, want four (%s)", got, time.Since(start))
		}
		checkNeverSucceededAfterLoss(t, res)
	})
}

// A storage blip shorter than the lease loses nothing: a renewal it
// fails leaves the lease unproven, the writes wait, and go on once the
// next renewal proves it; a store of records kept ahead of their writes
// that it fails is made again by the write; one that fails a write's own
// journal store fails that item (503: the gateway's storage), and the
// batch is undone cleanly once the storage is back, its lease never
// lost.
func TestStorageBlipLosesNothing(t *testing.T) {
	perWrite := policy.Defaults()
	perWrite.IdempotentUpstream = true // no record goes ahead of its write
	for _, tc := range []struct {
		name     string
		calls    string // the calls the blip fails: "lease" (renewals) or "" (all)
		settings policy.Settings
		want     batch.Outcome
	}{
		{"renewals", leaseName, policy.Defaults(), batch.Succeeded},
		// Whether the store of the third write's record, gone ahead of
		// it, lands before the blip or not, nothing is lost: the batch
		// goes on, or the write is not sent and the batch is undone.
		{"every call, records ahead", "", policy.Defaults(), ""},
		{"every call, a store per write", "", perWrite, batch.RolledBack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) { storageBlip(t, tc.calls, tc.settings, tc.want) })
		})
	}
}

func storageBlip(t *testing.T, calls string, settings policy.Settings, want batch.Outcome) {
	s := newFaulty()
	js := NewJournals(s, NewLeases(fenceLease), zap.NewNop())
	up := &slowWrites{d: fenceLease / 4, during: func(n int) {
		if n == 2 {
			s.setHook(func(_ context.Context, _, key string) error {
				if strings.HasSuffix(key, calls) {
					return errors.New("connection refused")
				}
				return nil
			})
			go func() { time.Sleep(fenceLease / 3); s.setHook(nil) }()
		}
	}}
	res := batch.Run(context.Background(), oneAtATimeWith(t, 6, settings), batch.Runtime{Send: up, Journal: js.New(Origin{})})
	if want == "" {
		want = batch.RolledBack
		if res.Outcome == batch.Succeeded {
			want = batch.Succeeded
		}
	}
	if res.Outcome != want || res.LeaseLost {
		t.Errorf("outcome %s (lease lost: %v), want %s: %s", res.Outcome, res.LeaseLost, want, res.Detail)
	}
	if want == batch.Succeeded && len(up.writes()) != 6 {
		t.Errorf("%d writes, want 6", len(up.writes()))
	}
	if want == batch.RolledBack && res.Status != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503: the gateway's storage failed, not the legacy API", res.Status)
	}
	time.Sleep(fenceLease)
	if keys, _ := s.count(); keys != 0 {
		t.Errorf("%d keys left: %v", keys, s.keys)
	}
}

// A lease key that vanishes (the storage forgot it, an operator deleted
// it) is a lost lease at the next renewal: nothing more is written.
func TestLeaseKeyVanishes(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newFaulty()
		js := NewJournals(s, NewLeases(fenceLease), zap.NewNop())
		var saga string
		up := &slowWrites{d: fenceLease / 4, during: func(n int) {
			if n == 4 { // a renewal wrote the lease key by now
				if err := s.memStorage.Delete(context.Background(), leaseKey(saga)); err != nil {
					t.Error(err)
				}
			}
		}}
		j := js.New(Origin{})
		saga = j.Saga()
		res := batch.Run(context.Background(), oneAtATime(t, 10), batch.Runtime{Send: up, Journal: j})
		if n := len(up.writes()); n > 6 {
			t.Errorf("%d writes sent, want the lease found gone within a renewal of the 4th", n)
		}
		checkNeverSucceededAfterLoss(t, res)
	})
}

// An owner paused (its goroutines stopped, its clock running) across a
// takeover: another instance sees its lease unchanged for a lease and
// takes the saga over; the owner, awake, sends nothing more, and its
// client is told neither succeeded nor a rollback it did not see.
func TestOwnerPausedAcrossATakeover(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newFaulty()
		a := NewJournals(s, NewLeases(fenceLease), zap.NewNop())
		wake := make(chan struct{})
		sB := &faulty{memStorage: s.memStorage} // the other instance's calls are not paused
		up := &slowWrites{d: 10 * time.Millisecond, during: func(n int) {
			if n == 2 {
				// The whole process stops: its renewals too.
				s.setHook(func(context.Context, string, string) error { <-wake; return nil })
				<-wake
			}
		}}
		done := make(chan *batch.Result)
		j := a.New(Origin{})
		go func() {
			done <- batch.Run(context.Background(), oneAtATime(t, 4), batch.Runtime{Send: up, Journal: j})
		}()
		time.Sleep(50 * time.Millisecond)
		owned.forget(j.Saga()) // the other instance is another process, which does not know it
		b := NewJournals(sB, NewLeases(fenceLease), zap.NewNop())
		finished := make(chan *batch.Result, 1)
		finish := func(r *Recovered) error {
			res, err := batch.Resume(context.Background(), r.Snapshot, widgets(t).Lookup, nil, batch.Runtime{Send: &slowWrites{}, Journal: r.Journal})
			finished <- res
			return err
		}
		if err := b.Scan(context.Background(), finish, func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(fenceLease)
		if err := b.Scan(context.Background(), finish, func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }); err != nil {
			t.Fatal(err)
		}
		recovered := <-finished
		close(wake)
		res := <-done
		// Item 0's answer may not be stored: item 1's record went ahead
		// of it (docs/durability.md, "Records stored ahead"), so its
		// write waited for no store. The takeover then reads item 0 back,
		// and this upstream reads every item as it was: nothing to undo.
		if recovered.Outcome != batch.RolledBack && recovered.Outcome != batch.Failed {
			t.Errorf("the takeover ended %s: %s", recovered.Outcome, recovered.Detail)
		}
		if got := up.writes(); len(got) != 2 {
			t.Errorf("the paused owner sent %v, want nothing after it woke", got)
		}
		// Woken after the new owner ended the saga and removed its journal,
		// the owner cannot tell that end from a storage that forgot the
		// journal: it answers 503, the items unknown, never what it did
		// not see.
		checkNeverSucceededAfterLoss(t, res)
		if res.Status != http.StatusServiceUnavailable || res.Outcome != batch.Failed && res.Outcome != batch.RolledBack {
			t.Errorf("the paused owner's client was told %s (%d), want 503: %s", res.Outcome, res.Status, res.Detail)
		}
	})
}

// A renewal and a takeover that race: at every interleaving of their
// storage calls (the renewal's read, write and listing; the claim's
// write, listing and read), at most one of them holds the saga
// afterwards.
func TestRenewalRacingATakeover(t *testing.T) {
	for _, order := range interleavings(3, 3) {
		t.Run(order, func(t *testing.T) {
			inBubble(t, func(t *testing.T) { raceRenewalAndClaim(t, order) })
		})
	}
}

// interleavings are every order of a calls of "a" and b of "b".
func interleavings(a, b int) []string {
	if a == 0 || b == 0 {
		return []string{strings.Repeat("a", a) + strings.Repeat("b", b)}
	}
	var out []string
	for _, rest := range interleavings(a-1, b) {
		out = append(out, "a"+rest)
	}
	for _, rest := range interleavings(a, b-1) {
		out = append(out, "b"+rest)
	}
	return out
}

// raceRenewalAndClaim runs one renewal of the owner's lease (instance a)
// and one claim of the saga (instance b, which saw the owner's lease
// record), their first three storage calls in order.
func raceRenewalAndClaim(t *testing.T, order string) {
	s := newFaulty()
	owner := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := firstWriteRecorded(t, owner)
	j.renew() // the lease key, as the owner last wrote it
	defer j.stopRenewal()
	owned.forget(j.Saga()) // so that the claim is not refused as this process's own
	other := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	seen, err := other.readLease(context.Background(), j.Saga())
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
		first3 := calls[who] <= 3
		mu.Unlock()
		if who != "" && first3 {
			turns[who] <- struct{}{} // ready to call
			<-turns[who]             // and called
		}
		return nil
	})
	renewed, claimed := make(chan error, 1), make(chan error, 1)
	go func() {
		ctx := context.WithValue(context.Background(), raceParty{}, "a")
		j.mu.Lock()
		prev := j.leaseBytes
		j.mu.Unlock()
		renewed <- owner.renewLease(ctx, j.Saga(), 0, prev, nil, leaseRecord(0, time.Now().Add(time.Minute), 99))
	}()
	go func() {
		ctx := context.WithValue(context.Background(), raceParty{}, "b")
		r, _, err := other.claim(ctx, j.Saga(), seen)
		if r != nil {
			r.Journal.stopRenewal()
		}
		claimed <- err
	}()
	for _, who := range order {
		<-turns[string(who)]
		turns[string(who)] <- struct{}{}
		synctest.Wait() // the call is made, and its party waits for its next turn or is done
	}
	aErr, bErr := <-renewed, <-claimed
	if aErr == nil && bErr == nil {
		t.Errorf("order %s: the renewal proved the lease and the takeover claimed the saga", order)
	}
	if aErr != nil && bErr != nil && !errors.Is(bErr, errSteppedBack) {
		t.Logf("order %s: both gave way (renewal: %v; claim: %v)", order, aErr, bErr)
	}
}

type raceParty struct{}

// A renewal costs three storage calls (docs/durability.md, "Each fault, and what an operator sees": Cost): its
// own key read back (segment 0's age, the first time), written, and the
// folder listed; a blind renewal was one write.
func TestRenewalCost(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newCounting(newMemStorage())
		j := firstWriteRecorded(t, NewJournals(s, NewLeases(time.Minute), zap.NewNop()))
		defer j.Abandon()
		for _, want := range []map[string]int{
			{"modified": 1, "store": 1, "list": 1},
			{"load": 1, "store": 1, "list": 1},
		} {
			s.take()
			j.renew()
			if got := s.take(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("a renewal made %v, want %v", got, want)
			}
		}
	})
}

// items is a legacy API of widgets that keeps what it is sent: a PATCH
// merges the name, a PUT replaces the widget, a GET reads it; each write
// takes d.
type items struct {
	d    time.Duration
	mu   sync.Mutex
	body map[string]string
}

func (u *items) Send(_ context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	if sr.Method != http.MethodGet {
		time.Sleep(u.d)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	switch sr.Method {
	case http.MethodPatch:
		id := sr.Path[strings.LastIndex(sr.Path, "/")+1:]
		u.body[sr.Path] = `{"id":` + id + `,"name":"new"}`
	case http.MethodPut:
		u.body[sr.Path] = string(sr.Body)
	}
	return &batch.SubResponse{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(u.body[sr.Path])}, nil
}

// A saga that lost its lease undoes its own write while the instance
// that took it over finishes the same saga: under one item lock table
// they take turns, the widget ends as it was, and neither tells of an
// item left behind (the second finds it put back already).
func TestLostOwnerAndNewOwnerUndoOneItem(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newFaulty()
		s.setHook(func(_ context.Context, op, key string) error {
			if op == "store" && strings.HasSuffix(key, "/"+leaseName) {
				return errors.New("READONLY") // A's renewals fail: its lease lapses
			}
			return nil
		})
		api := &items{d: fenceLease * 6 / 5, body: map[string]string{"/widgets/1": `{"id":1,"name":"old"}`}}
		locks := new(itemlock.Local)
		a := NewJournals(s, NewLeases(fenceLease), zap.NewNop())
		j := a.New(Origin{})
		done := make(chan *batch.Result)
		go func() {
			done <- batch.Run(context.Background(), oneAtATime(t, 1), batch.Runtime{Send: api, Journal: j, Locks: locks})
		}()
		time.Sleep(time.Millisecond)
		owned.forget(j.Saga()) // the other instance is another process
		b := NewJournals(&faulty{memStorage: s.memStorage}, NewLeases(fenceLease), zap.NewNop())
		finished := make(chan *batch.Result, 1)
		finish := func(r *Recovered) error {
			res, err := batch.Resume(context.Background(), r.Snapshot, widgets(t).Lookup, nil, batch.Runtime{Send: api, Journal: r.Journal, Locks: locks})
			finished <- res
			return err
		}
		scanAfterLease(t, b, finish, func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) })
		lost, recovered := <-done, <-finished
		if got := api.body["/widgets/1"]; got != `{"id":1,"name":"old"}` {
			t.Errorf("widget 1 is %s, want it as it was", got)
		}
		for who, res := range map[string]*batch.Result{"the lost owner": lost, "the new owner": recovered} {
			if res.Outcome == batch.RollbackFailed || res.Outcome == batch.Succeeded {
				t.Errorf("%s ended %s: %s", who, res.Outcome, res.Detail)
			}
		}
		checkNeverSucceededAfterLoss(t, lost)
	})
}

// firstWriteRecorded is a saga's journal in js that recorded its first
// write about to be sent: its intent is stored, and its lease proven.
func firstWriteRecorded(t *testing.T, js *Journals) *Journal {
	t.Helper()
	j := js.New(Origin{})
	if err := j.Begin(context.Background(), updatePlan(t, widgets(t), 1)); err != nil {
		t.Fatal(err)
	}
	if err := j.Record(context.Background(), batch.Transition{Index: 0, Phase: batch.PhaseSending}); err != nil {
		t.Fatal(err)
	}
	return j
}
