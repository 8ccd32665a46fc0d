package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// namedWidgets is an upstream that keeps its widgets' names, all "old"
// at first: a read shows what the writes did.
type namedWidgets struct {
	mu     sync.Mutex
	names  map[string]string
	writes map[string]int // writes (not reads) by path
	// before runs as a write arrives, before it is applied.
	before func(sr *batch.SubRequest)
}

func newNamedWidgets() *namedWidgets {
	return &namedWidgets{names: map[string]string{}, writes: map[string]int{}}
}

func (u *namedWidgets) Send(_ context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	id := sr.Path[strings.LastIndex(sr.Path, "/")+1:]
	if sr.Method != http.MethodGet {
		if u.before != nil {
			u.before(sr)
		}
		var body struct{ Name string }
		_ = json.Unmarshal(sr.Body, &body)
		u.mu.Lock()
		u.writes[sr.Path]++
		u.names[id] = body.Name
		u.mu.Unlock()
	}
	u.mu.Lock()
	name := u.names[id]
	u.mu.Unlock()
	if name == "" {
		name = "old"
	}
	return &batch.SubResponse{Status: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":` + id + `,"name":"` + name + `"}`)}, nil
}

func (u *namedWidgets) written() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]int{}
	for k, v := range u.writes {
		out[k] = v
	}
	return out
}

// Records stored ahead of their writes (docs/durability.md, "Records
// stored ahead"): a gateway that dies mid-batch leaves records of
// writes it never sent. The takeover reads those items back, finds them
// as they were, and sends them nothing; it undoes exactly the writes
// that were sent, and every widget is as it was. Where another client
// wrote one of those items before the takeover, that write stands: the
// item is left behind, never put back over it.
func TestRecordsAheadRecoveredByReading(t *testing.T) {
	t.Run("alone", func(t *testing.T) { inBubble(t, func(t *testing.T) { recordsAheadRecovered(t, false) }) })
	t.Run("another writer", func(t *testing.T) { inBubble(t, func(t *testing.T) { recordsAheadRecovered(t, true) }) })
}

func recordsAheadRecovered(t *testing.T, otherWriter bool) {
	s := newMemStorage()
	p := widgets(t) // concurrency 8
	up := newNamedWidgets()
	dead := NewJournals(s, NewLeases(30*time.Millisecond), zap.NewNop())
	j := dead.New(Origin{Server: "srv0", Method: "PATCH", URI: "/widgets"})
	died, gone := make(chan struct{}), make(chan struct{})
	defer close(gone)
	var once sync.Once
	writes := 0
	up.before = func(*batch.SubRequest) {
		up.mu.Lock()
		writes++
		n := writes
		up.mu.Unlock()
		if n == 10 {
			once.Do(func() {
				j.Abandon()
				close(died)
			})
		}
		if n >= 10 {
			<-gone // the gateway died with these writes in flight
		}
	}
	go batch.Run(context.Background(), updatePlan(t, p, 40), batch.Runtime{Send: up, Journal: j})
	<-died
	time.Sleep(time.Millisecond) // the stores already started land
	st, err := dead.load(context.Background(), j.Saga())
	if err != nil {
		t.Fatal(err)
	}
	sent := up.written()
	unsent, theirs := 0, ""
	for _, it := range st.snap.Items {
		if it.Phase == batch.PhaseSending && sent["/widgets/"+it.ID] == 0 {
			unsent++
			theirs = it.ID
		}
	}
	if unsent == 0 {
		t.Fatal("no record of a write never sent is in the journal: nothing went ahead")
	}
	if otherWriter {
		up.mu.Lock()
		up.names[theirs] = "theirs" // another client, while no lock holds it
		up.mu.Unlock()
	}

	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	finished := make(chan *batch.Result, 1)
	finish := func(r *Recovered) error {
		up.before = nil
		res, err := batch.Resume(context.Background(), r.Snapshot, p.Lookup, nil, batch.Runtime{Send: up, Journal: r.Journal})
		finished <- res
		return err
	}
	scanAfterLease(t, js, finish, func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) })
	res := <-finished
	// Another client's write on an item recorded ahead and never sent
	// reads as neither the pre-image nor the batch's write: the item is
	// left behind, the price docs/durability.md names.
	if want := map[bool]batch.Outcome{false: batch.RolledBack, true: batch.RollbackFailed}[otherWriter]; res.Outcome != want {
		t.Errorf("the takeover ended %s, want %s: %s", res.Outcome, want, res.Detail)
	}
	for id, name := range up.names {
		if want := "old"; otherWriter && id == theirs {
			if name != "theirs" {
				t.Errorf("widget %s, which another client wrote, is %q after the takeover", id, name)
			}
		} else if name != want {
			t.Errorf("widget %s is %q after the takeover, want %s", id, name, want)
		}
	}
	after := up.written()
	for path, n := range after {
		if sent[path] == 0 {
			t.Errorf("%s was written %d times by the takeover, though the batch never wrote it", path, n)
		}
	}
	t.Logf("%d records of writes never sent; %d writes before the death, %d after; the takeover ended %s", unsent, len(sent), len(after), res.Outcome)
}

// A batch that stops (an item failed) settles the items whose records
// went ahead and which were never sent: once stored (with the first
// undo's record), a recovery knows they were never sent, and does not
// read them.
func TestRecordsAheadSettledWhenTheBatchStops(t *testing.T) {
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{})
	up := newNamedWidgets()
	checked := false
	up.before = func(sr *batch.SubRequest) {
		if sr.Method == http.MethodPatch && sr.Path == "/widgets/3" {
			return
		}
		if sr.Method != http.MethodPut || checked {
			return
		}
		checked = true // the first undo: its record is stored
		st, err := js.load(context.Background(), j.Saga())
		if err != nil {
			t.Error(err)
			return
		}
		sent := up.written()
		for _, it := range st.snap.Items {
			if it.Phase == batch.PhaseSending && sent["/widgets/"+it.ID] == 0 {
				t.Errorf("item %s: recorded as being sent, never sent, and not settled", it.ID)
			}
		}
	}
	fail := &failing{namedWidgets: up, path: "/widgets/3"}
	p := oneAtATime(t, 8) // one at a time: the next item's record is ahead when item 3 fails
	res := batch.Run(context.Background(), p, batch.Runtime{Send: fail, Journal: j})
	if res.Outcome != batch.RolledBack || !checked {
		t.Fatalf("outcome %s (an undo checked: %v): %s", res.Outcome, checked, res.Detail)
	}
}

// settledSlow is a storage whose first store of a settled record waits
// until release is closed, telling entered as it starts.
type settledSlow struct {
	*memStorage
	entered func()
	release chan struct{}
}

func (s settledSlow) Store(ctx context.Context, key string, b []byte) error {
	if bytes.Contains(b, []byte(`"phase":5`)) {
		s.entered()
		<-s.release
	}
	return s.memStorage.Store(ctx, key, b)
}

// An undo leaves only once the stores before its own landed: the one
// that carries the settled record of a write that went ahead and was
// never sent may land after a later one that holds the undo alone, and
// a recovery must find the item settled once anything was undone (it
// once did not, one run in twenty of the test above).
func TestUndoWaitsForTheStoresBeforeIt(t *testing.T) {
	ctx := context.Background()
	entered := make(chan struct{})
	s := settledSlow{memStorage: newMemStorage(), entered: sync.OnceFunc(func() { close(entered) }), release: make(chan struct{})}
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{})
	plan := updatePlan(t, widgets(t), 3)
	if err := j.Begin(ctx, plan); err != nil {
		t.Fatal(err)
	}
	item := func(i int, ph batch.Phase) batch.Transition {
		return batch.Transition{Index: i, Phase: ph, Item: batch.ItemSnapshot{ID: fmt.Sprint(i + 1), Phase: ph}}
	}
	if err := j.Record(ctx, item(0, batch.PhaseSending)); err != nil {
		t.Fatal(err)
	}
	j.RecordAhead(ctx, item(1, batch.PhaseSending))
	for st, _ := js.load(ctx, j.Saga()); st == nil || st.snap.Items[1].Phase != batch.PhaseSending; st, _ = js.load(ctx, j.Saga()) {
		time.Sleep(time.Millisecond)
	}
	if err := j.Record(ctx, item(1, batch.PhaseSettled)); err != nil { // never sent
		t.Fatal(err)
	}
	j.RecordAhead(ctx, item(2, batch.PhaseSending)) // its store takes item 1's settled record
	<-entered
	undone := make(chan error, 1)
	go func() { undone <- j.Record(ctx, item(0, batch.PhaseUndoing)) }()
	select {
	case err := <-undone:
		st, _ := js.load(ctx, j.Saga())
		t.Errorf("the undo was let go (%v) while the storage held item 1 as %s", err, st.snap.Items[1].Phase)
		close(s.release)
	case <-time.After(200 * time.Millisecond):
		close(s.release)
		if err := <-undone; err != nil {
			t.Fatal(err)
		}
	}
	j.End(ctx, &batch.Result{Outcome: batch.RolledBack})
}

// failing fails the writes to path with 500, and sends the rest on.
type failing struct {
	*namedWidgets
	path string
}

func (f *failing) Send(ctx context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	if sr.Method != http.MethodGet && sr.Path == f.path {
		return &batch.SubResponse{Status: 500, Header: http.Header{}}, nil
	}
	return f.namedWidgets.Send(ctx, sr)
}

// Many all-or-nothing updates at once, their records going ahead, on a
// storage whose every call takes a random while and one store in five
// fails: every batch ends (none waits for a store that never comes), and
// no write leaves before the storage holds its record.
func TestRecordsAheadUnderFaults(t *testing.T) {
	inBubble(t, recordsAheadUnderFaults)
}

func recordsAheadUnderFaults(t *testing.T) {
	s := newFaulty()
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(1, 2))
	s.setHook(func(_ context.Context, op, _ string) error {
		mu.Lock()
		d, fail := time.Duration(rnd.IntN(2000))*time.Microsecond, op == "store" && rnd.IntN(5) == 0
		mu.Unlock()
		time.Sleep(d)
		if fail {
			return errors.New("connection reset")
		}
		return nil
	})
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	reader := NewJournals(s.memStorage, NewLeases(time.Minute), zap.NewNop()) // reads what is stored, unhindered
	var wg sync.WaitGroup
	for b := range 40 {
		wg.Go(func() {
			j := js.New(Origin{})
			up := newNamedWidgets()
			up.before = func(sr *batch.SubRequest) {
				if sr.Method != http.MethodPatch {
					return
				}
				st, err := reader.load(context.Background(), j.Saga())
				if err == nil {
					for _, it := range st.snap.Items {
						if it.Sent != nil && it.Sent.Path == sr.Path {
							return
						}
					}
				}
				t.Errorf("batch %d: %s %s sent before the storage held its record (%v)", b, sr.Method, sr.Path, err)
			}
			done := make(chan *batch.Result, 1)
			go func() {
				done <- batch.Run(context.Background(), updatePlan(t, widgets(t), 5+b%20), batch.Runtime{Send: up, Journal: j})
			}()
			select {
			case res := <-done:
				// failed: a record not stored, nothing written.
				if res.Outcome != batch.Succeeded && res.Outcome != batch.RolledBack && res.Outcome != batch.Failed {
					t.Errorf("batch %d ended %s: %s", b, res.Outcome, res.Detail)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("batch %d did not end within 20s", b)
			}
		})
	}
	wg.Wait()
	s.setHook(nil) // the removals that failed are tried again, and end
}
