package batch

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memJournal keeps a saga's snapshot as a storage journal would, as JSON.
type memJournal struct {
	mu   sync.Mutex
	snap *Snapshot
	end  *Result
}

func (j *memJournal) Fence(context.Context) error { return nil }

func (j *memJournal) Begin(_ context.Context, p *Plan) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.snap = p.Snapshot()
	return nil
}

func (j *memJournal) Record(_ context.Context, t Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.snap.Items[t.Index] = t.Item
	return nil
}

func (j *memJournal) End(_ context.Context, r *Result) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.end = r
}

// stored returns the snapshot as it would be read back from storage.
func (j *memJournal) stored(t *testing.T) *Snapshot {
	j.mu.Lock()
	b, err := json.Marshal(j.snap)
	j.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// A saga whose gateway died while its third write was in flight (applied
// at the upstream, never answered) is finished from its journal by
// another: everything it did is undone, the write in flight included.
func TestResumeUndoesADeadSaga(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, method, target, body string
		hung                       string
	}{
		{"update", "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2},{"id":"3","v":3},{"id":"4","v":4}]`, "PATCH /widgets/3"},
		{"delete", "DELETE", "/widgets?ids=1,2,3,4", "", "DELETE /widgets/3"},
		{"create with ids", "POST", "/widgets", `[{"id":"a","v":1},{"id":"b","v":2},{"id":"c","v":3},{"id":"d","v":4}]`, "POST /widgets"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testResumeUndoesADeadSaga(t, tt.method, tt.target, tt.body, tt.hung) })
		})
	}
}

// testResumeUndoesADeadSaga runs in a bubble: the write the dead saga
// had in flight is resolved an item_timeout after the takeover, on the
// bubble's clock.
func testResumeUndoesADeadSaga(t *testing.T, method, target, body, hung string) {
	f := newFake().seed("1", "2", "3", "4")
	before := f.state()
	dead, inFlight := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(ctx context.Context, req *SubRequest) {
		// The third write reaches the upstream and is applied; the
		// gateway dies before its answer.
		if req.Method+" "+req.Path == hung && (req.Method != "POST" || string(req.Body) == `{"id":"c","v":3}`) {
			f.store(req)
			once.Do(func() { close(inFlight) })
			<-dead
		}
	}
	hungMethod, hungPath, _ := cutSpace(hung)
	f.on(hungMethod, hungPath, answer{hook: hook})
	j := &memJournal{}
	p := mustPlan(t, newRequest(method, target, body), concurrency(1))
	go newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	<-inFlight
	snap := j.stored(t)
	if snap.Items[2].Phase != PhaseSending {
		t.Fatalf("item 2's phase %s, want sending", snap.Items[2].Phase)
	}

	f.on(hungMethod, hungPath) // the upstream is back to normal
	other := &memJournal{snap: snap}
	start := time.Now()
	res, err := Resume(context.Background(), snap, widgets(t).Lookup, nil, Runtime{Send: f, Journal: other})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 10*time.Second {
		t.Errorf("the write the dead saga had in flight was resolved %s after the takeover, before its item_timeout (10s) was over", took)
	}
	w := write(t, res)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "rolled_back", "not_attempted"})
	equal(t, "outcome", w.Outcome, "rolled_back")
	if other.end != res {
		t.Error("the journal was not ended")
	}
	f.checkUnchanged(t, before)
	close(dead)
}

func cutSpace(s string) (string, string, bool) {
	for i := range s {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func TestResumeRefusesWhatItDoesNotKnow(t *testing.T) {
	t.Parallel()
	lookup := widgets(t).Lookup
	for _, snap := range []*Snapshot{
		{Version: 99, Op: "update", Path: "/widgets"},
		{Version: SnapshotVersion, Op: "get", Path: "/widgets"},
		{Version: SnapshotVersion, Op: "update", Path: "/gadgets"},
	} {
		if _, err := Resume(context.Background(), snap, lookup, nil, Runtime{Send: newFake()}); err == nil {
			t.Errorf("%+v was resumed", snap)
		}
	}
}

// appliedThenDies is an undo the store applies, after which its gateway
// dies before the answer: undoing is closed once it is applied, and the
// answer waits for dead.
func appliedThenDies(f *fakeAPI, undoing, dead chan struct{}) answer {
	return answer{hook: func(_ context.Context, req *SubRequest) {
		f.store(req)
		close(undoing)
		<-dead
	}}
}

// A saga that died after sending an undo (applied, not answered) is
// finished without sending the undo again over what it restored.
func TestResumeAfterAnUndoWasSent(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	before := f.state()
	dead, undoing := make(chan struct{}), make(chan struct{})
	f.on("PATCH", "/widgets/2", reply(500, `{}`))
	f.on("PUT", "/widgets/1", appliedThenDies(f, undoing, dead))
	j := &memJournal{}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`), concurrency(1))
	go newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	<-undoing
	snap := j.stored(t)
	equal(t, "item 0's phase", snap.Items[0].Phase, PhaseUndoing)
	f.put(widget("2"), map[string]any{"id": "2", "name": "widget 2", "color": "red"})
	res, err := Resume(context.Background(), snap, widgets(t).Lookup, nil, Runtime{Send: f, Journal: &memJournal{snap: snap}})
	if err != nil {
		t.Fatal(err)
	}
	w := write(t, res)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
	equal(t, "PUTs sent in all", len(f.sentWith("PUT")), 1)
	f.checkUnchanged(t, before)
	close(dead)
}
