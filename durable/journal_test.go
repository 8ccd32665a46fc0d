package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

// widgets is the policy of one /widgets resource.
func widgets(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.New([]policy.ResourceSpec{{
		Path:              "/widgets",
		CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"},
		ItemMethods:       []string{"GET", "PUT", "PATCH", "DELETE"},
		Settings:          policy.Defaults(),
		Gateway:           policy.GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// updatePlan plans an all-or-nothing update of n widgets.
func updatePlan(t *testing.T, p *policy.Policy, n int) *batch.Plan {
	t.Helper()
	var elems []string
	for i := 1; i <= n; i++ {
		elems = append(elems, fmt.Sprintf(`{"id":%d,"name":"new"}`, i))
	}
	r := httptest.NewRequest("PATCH", "/widgets", strings.NewReader("["+strings.Join(elems, ",")+"]"))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer journal-test")
	m, _ := p.Lookup("/widgets")
	_, isBatch, plan, prob := batch.Admit(r, m)
	if !isBatch || prob != nil {
		t.Fatalf("not a batch: %v", prob)
	}
	return plan
}

// upstream answers every request with an item; before each write it
// calls check, one check at a time.
type upstream struct {
	mu    chanMutex
	check func(*batch.SubRequest)
	fail  string // a path whose write fails
	// created counts the creates, each given the next id.
	created int
}

func (u *upstream) Send(_ context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	if sr.Method != http.MethodGet && u.check != nil {
		u.mu.Lock()
		u.check(sr)
		u.mu.Unlock()
	}
	id := sr.Path[strings.LastIndex(sr.Path, "/")+1:]
	if sr.Method == http.MethodPost {
		u.mu.Lock()
		u.created++
		id = fmt.Sprint(1000 + u.created)
		u.mu.Unlock()
	}
	if sr.Method != http.MethodGet && sr.Path == u.fail {
		return &batch.SubResponse{Status: 500, Header: http.Header{}}, nil
	}
	return &batch.SubResponse{Status: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":` + id + `,"name":"old"}`)}, nil
}

// TestJournalWriteAhead runs an all-or-nothing update whose last item
// fails, so that every other item is written and then undone, and checks
// at the moment each write and each undo reaches the upstream that the
// journal in storage already says it is being sent, with the client's
// Authorization for the undo; that the journal costs one storage write
// per request that changes the upstream, and the intent's, no more; and
// that nothing is left in storage at the end.
func TestJournalWriteAhead(t *testing.T) {
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{Server: "srv0", Method: "PATCH", URI: "/widgets", Host: "example.com"})
	changes, checked := 0, 0
	up := &upstream{fail: "/widgets/3", check: func(sr *batch.SubRequest) {
		changes++
		st, err := js.load(context.Background(), j.Saga())
		if err != nil {
			t.Errorf("%s %s sent with no journal: %v", sr.Method, sr.Path, err)
			return
		}
		if st.intent.Origin.Host != "example.com" {
			t.Errorf("origin %+v", st.intent.Origin)
		}
		for _, it := range st.snap.Items {
			if it.Phase == batch.PhaseSending && it.Sent != nil && it.Sent.Path == sr.Path && it.Sent.Method == sr.Method ||
				it.Phase == batch.PhaseUndoing && it.Undo != nil && it.Undo.Path == sr.Path && it.Undo.Method == sr.Method {
				if got := it.Sent.Header.Get("Authorization"); got != "Bearer journal-test" {
					t.Errorf("the journal keeps Authorization %q, want the client's, for the undo", got)
				}
				checked++
				return
			}
		}
		t.Errorf("%s %s sent before the journal recorded it", sr.Method, sr.Path)
	}}
	res := batch.Run(context.Background(), updatePlan(t, widgets(t), 3), batch.Runtime{Send: up, Journal: j})
	if res.Outcome != batch.RolledBack {
		t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
	}
	// 3 PATCHes (the third failed) and 2 PUTs putting the pre-images back.
	if changes != 5 || checked != changes {
		t.Errorf("%d of %d writes and undos recorded before they were sent, want 5 of 5", checked, changes)
	}
	// Two stores more: the intent, which may be stored alone while the
	// preflight reads (docs/durability.md, "Records stored ahead"), and
	// the end marker the journal's removal begins with.
	removed(t, j.Saga())
	keys, stores := s.count()
	if stores > changes+2 || keys != 0 {
		t.Errorf("%d stores for %d writes, the intent and the end marker, %d keys left", stores, changes, keys)
	}
}

// TestJournalStoresNoRead: a preflight's reads are not stored, only
// the writes' records (each with the pre-image its read found): a
// 40-item update, one write at a time, so that most reads come after
// the first writes' records went ahead, finds no read in the journal
// whenever one of its writes reaches the upstream.
func TestJournalStoresNoRead(t *testing.T) {
	pol, err := policy.New([]policy.ResourceSpec{{
		Path: "/widgets", CollectionMethods: []string{"PATCH"}, ItemMethods: []string{"GET", "PUT", "PATCH"},
		Settings: policy.Defaults(), Gateway: policy.GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := pol.Lookup("/widgets")
	m.Resource.Settings.Concurrency = 1
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{})
	checked := 0
	up := &upstream{check: func(sr *batch.SubRequest) {
		st, err := js.load(context.Background(), j.Saga())
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for i, it := range st.snap.Items {
			if it.Phase == batch.PhaseRead {
				t.Errorf("as %s was sent, item %d's read was in the journal", sr.Path, i)
			}
		}
	}}
	plan := updatePlan(t, pol, 40)
	if res := batch.Run(context.Background(), plan, batch.Runtime{Send: up, Journal: j}); res.Outcome != batch.Succeeded || checked != 40 {
		t.Fatalf("outcome %s, %d writes: %s", res.Outcome, checked, res.Detail)
	}
}

// TestJournalRefusesWhatItCannotRecord checks that a write whose record
// cannot be stored is not sent: the batch fails with nothing changed,
// 503 (the gateway's storage, not the legacy API), and no ERROR line
// says that a journal never stored could not be removed.
func TestJournalRefusesWhatItCannotRecord(t *testing.T) {
	s := newMemStorage()
	s.failStores(errors.New("the disk is full"))
	core, logs := observer.New(zapcore.ErrorLevel)
	j := NewJournals(s, NewLeases(time.Minute), zap.New(core)).New(Origin{})
	up := &upstream{check: func(sr *batch.SubRequest) { t.Errorf("%s %s sent with no journal", sr.Method, sr.Path) }}
	res := batch.Run(context.Background(), updatePlan(t, widgets(t), 2), batch.Runtime{Send: up, Journal: j})
	if res.Outcome != batch.Failed || res.Items[0].Status != http.StatusServiceUnavailable {
		t.Errorf("outcome %s, item 0 %d; want failed, 503: %s", res.Outcome, res.Items[0].Status, res.Detail)
	}
	if owned.has(j.Saga()) {
		t.Error("the saga is still counted as running")
	}
	if res.Status != http.StatusServiceUnavailable || res.RetryAfter == "" {
		t.Errorf("status %d, Retry-After %q; want 503 with Retry-After", res.Status, res.RetryAfter)
	}
	if logs.Len() != 0 {
		t.Errorf("logged at ERROR: %v", logs.All())
	}
}

// slowStorage is a storage whose every store takes a while, as a synced
// file does.
type slowStorage struct {
	*memStorage
	delay time.Duration
}

func (s slowStorage) Store(ctx context.Context, key string, value []byte) error {
	time.Sleep(s.delay)
	return s.memStorage.Store(ctx, key, value)
}

// TestJournalGroupCommit: writes that start together share one store of
// their records, and none is sent before its own record is stored; the
// saga counts as pending while it runs, and no more once it ended. In a
// bubble, so the storage's 20ms per store cost no time.
func TestJournalGroupCommit(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		mem := newMemStorage()
		js := NewJournals(slowStorage{mem, 20 * time.Millisecond}, NewLeases(time.Minute), zap.NewNop())
		j := js.New(Origin{})
		pending := Pending()
		p := widgets(t) // concurrency 8, the default
		var elems []string
		for i := range 16 {
			elems = append(elems, fmt.Sprintf(`{"name":"g%d"}`, i))
		}
		r := httptest.NewRequest("POST", "/widgets", strings.NewReader("["+strings.Join(elems, ",")+"]"))
		r.Header.Set("Content-Type", "application/json")
		m, _ := p.Lookup("/widgets")
		_, _, plan, prob := batch.Admit(r, m)
		if prob != nil {
			t.Fatal(prob.Detail)
		}
		var recorded, writes int
		up := &upstream{check: func(sr *batch.SubRequest) {
			writes++
			if Pending() <= pending {
				t.Error("the saga in flight is not counted as pending")
			}
			st, err := js.load(context.Background(), j.Saga())
			if err != nil {
				t.Errorf("a create sent with no journal: %v", err)
				return
			}
			for _, it := range st.snap.Items {
				if it.Phase >= batch.PhaseSending && it.Sent != nil && it.Sent.Header.Get("Idempotency-Key") == sr.Header.Get("Idempotency-Key") {
					recorded++
					return
				}
			}
			t.Errorf("a create reached the upstream before the journal recorded it")
		}}
		if res := batch.Run(context.Background(), plan, batch.Runtime{Send: up, Journal: j}); res.Outcome != batch.Succeeded {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
		}
		removed(t, j.Saga())
		if n := Pending(); n != pending {
			t.Errorf("%d sagas pending after the saga ended, want %d", n, pending)
		}
		if writes != 16 || recorded != writes {
			t.Errorf("%d of %d creates were recorded before they were sent, want 16 of 16", recorded, writes)
		}
		if _, stores := mem.count(); stores >= writes {
			t.Errorf("%d stores for %d creates sent 8 at a time: their records were not stored together", stores, writes)
		}
	})
}

// dieMidWrite runs an update of n widgets whose gateway dies (its
// journal abandoned, its lease left to lapse in 30 ms) as its first write
// is sent; the saga's goroutine stays blocked until gone is closed.
func dieMidWrite(t *testing.T, s Storage, p *policy.Policy, n int) (j *Journal, gone chan struct{}) {
	dead := NewJournals(s, NewLeases(30*time.Millisecond), zap.NewNop())
	j = dead.New(Origin{Server: "srv0", Method: "PATCH", URI: "/v1/widgets", Host: "example.com"})
	died, gone := make(chan struct{}), make(chan struct{})
	up := &upstream{check: func(*batch.SubRequest) {
		select {
		case <-died:
		default:
			j.Abandon() // dead before anyone hears of it: a scan must not find it owned
			close(died)
			<-gone // the gateway died mid-write
		}
	}}
	go batch.Run(context.Background(), updatePlan(t, p, n), batch.Runtime{Send: up, Journal: j})
	<-died
	return j, gone
}

// resumeEach is what a scan hands the sagas it takes over to: each is
// resumed against an upstream that answers, and sent on finished; failed
// fails the test.
func resumeEach(t *testing.T, p *policy.Policy) (finish func(*Recovered) error, finished chan *Recovered, failed func(saga, doing string, err error)) {
	finished = make(chan *Recovered, 2)
	finish = func(r *Recovered) error {
		_, err := batch.Resume(context.Background(), r.Snapshot, p.Lookup, nil, batch.Runtime{Send: &upstream{}, Journal: r.Journal})
		finished <- r
		return err
	}
	failed = func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
	return finish, finished, failed
}

// A saga whose gateway died (its lease lapsed) is taken over by a scan,
// once, with its origin and snapshot, under this process's lease, and
// its journal is gone once it is finished; what is left of a removed
// journal is swept once it is a lease old.
func TestScanTakesOverADeadSaga(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newMemStorage()
		p := widgets(t)
		j, gone := dieMidWrite(t, s, p, 2)
		defer close(gone)
		for _, k := range []string{"batch/v1/journal/leftover/seg.00000001", endKey("leftover")} {
			if err := s.Store(context.Background(), k, []byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
		s.age("batch/v1/journal/leftover", time.Minute)

		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		finish, finished, failed := resumeEach(t, p)
		scanAfterLease(t, js, finish, failed)
		if err := js.Scan(context.Background(), finish, failed); err != nil {
			t.Fatal(err)
		}
		r := <-finished
		if r.Saga != j.Saga() || r.Origin.URI != "/v1/widgets" || r.Dead.Owner != Owner() || len(r.Snapshot.Items) != 2 {
			t.Errorf("recovered %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
		if len(finished) != 0 {
			t.Error("the saga was taken over twice")
		}
		checkEndMarkerCleared(t, js, s, j.Saga(), failed)
	})
}

// A gateway killed while it stored a segment can leave the segment's
// name listed with nothing under it (the Redis module lists a key before
// it sets it). Nothing the segment preceded was sent, so the journal
// ends before it: the saga is taken over and finished, not left stuck
// on a segment that cannot be read.
func TestScanTakesOverASagaWhoseLastSegmentIsListedOnly(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newMemStorage()
		p := widgets(t)
		j, gone := dieMidWrite(t, s, p, 1)
		defer close(gone)
		written := 0
		for _, k := range s.keysUnder(journalDir(j.Saga())) {
			if _, ok := parseSegment(path.Base(k)); ok {
				written++
			}
		}
		if written == 0 {
			t.Fatal("the dead saga stored no intent")
		}
		s.listOnly(segmentKey(j.Saga(), written)) // the segment it was storing when it died

		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		finish, finished, failed := resumeEach(t, p)
		scanAfterLease(t, js, finish, failed)
		select { // finished on a goroutine of its own, once the write it had in flight is over
		case r := <-finished:
			if r.Saga != j.Saga() || len(r.Snapshot.Items) != 1 {
				t.Errorf("recovered %+v", r)
			}
		case <-time.After(time.Minute):
			t.Fatal("the saga was not taken over")
		}
		time.Sleep(time.Second)
		checkEndMarkerCleared(t, js, s, j.Saga(), failed)
	})
}

// A gateway killed as it stored its journal's first lease record (the
// Redis module lists the key, then sets it) leaves the lease listed with
// nothing under it. Watched so for a lease, its owner stopped there: the
// saga is taken over and finished, not kept from a takeover forever by
// a record that never changes.
func TestScanTakesOverASagaWhoseLeaseIsListedOnly(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newMemStorage()
		p := widgets(t)
		j, gone := dieMidWrite(t, s, p, 1)
		defer close(gone)
		if err := s.Delete(context.Background(), path.Join(journalDir(j.Saga()), leaseName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		s.listOnly(path.Join(journalDir(j.Saga()), leaseName))

		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		finish, finished, failed := resumeEach(t, p)
		scanAfterLease(t, js, finish, failed)
		select {
		case r := <-finished:
			if r.Saga != j.Saga() {
				t.Errorf("recovered %+v", r)
			}
		case <-time.After(time.Minute):
			t.Fatal("a saga whose lease is listed with nothing under it was not taken over")
		}
	})
}

// checkEndMarkerCleared checks that a saga taken over and ended left
// only its end marker (for an owner that lost it to learn how it ended),
// and that a scan a lease later clears that too.
func checkEndMarkerCleared(t *testing.T, js *Journals, s *memStorage, saga string, failed func(saga, doing string, err error)) {
	t.Helper()
	if left := s.keysUnder(journalPrefix); fmt.Sprint(left) != fmt.Sprint([]string{endKey(saga)}) {
		t.Errorf("left %v after the recovery, want the end marker only", left)
	}
	time.Sleep(js.leases.Length)
	if err := js.Scan(context.Background(), func(*Recovered) error { t.Error("an ended saga was taken over"); return nil }, failed); err != nil {
		t.Fatal(err)
	}
	if keys, _ := s.count(); keys != 0 {
		t.Errorf("%d keys left a lease after the recovery: %v %v", keys, s.keys, s.listedOnly)
	}
}
