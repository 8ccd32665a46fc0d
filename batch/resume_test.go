package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// A saga that died in the middle of its compensation, after some undos
// were done and recorded, is finished without undoing those again: an
// item already put back is not "proved" a second time (the proof would
// find the pre-image, not the batch's write, and report the item left
// behind) and no undo is sent for it.
func TestResumeAfterSomeUndosWereDone(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3")
	before := f.state()
	dead, undoing := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.on("PATCH", "/widgets/3", reply(500, `{}`))
	// Undos run in reverse order of start: item 1's is done, and the
	// gateway dies while item 0's is in flight (applied, not answered).
	f.on("PUT", "/widgets/1", answer{hook: func(_ context.Context, req *SubRequest) {
		f.store(req)
		once.Do(func() { close(undoing) })
		<-dead
	}})
	j := &memJournal{}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2},{"id":"3","v":3}]`), concurrency(1))
	go newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	<-undoing
	snap := j.stored(t)
	equal(t, "item 1's outcome", snap.Items[1].Outcome, RolledBack)
	equal(t, "item 0's phase", snap.Items[0].Phase, PhaseUndoing)

	res, err := Resume(context.Background(), snap, widgets(t).Lookup, nil, Runtime{Send: f, Journal: &memJournal{snap: snap}})
	if err != nil {
		t.Fatal(err)
	}
	w := write(t, res)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "failed"})
	equal(t, "outcome", w.Outcome, "rolled_back")
	puts := 0
	for _, c := range f.sentWith("PUT") {
		if c.Path == "/widgets/2" {
			puts++
		}
	}
	equal(t, "PUTs to item 1 in all", puts, 1)
	f.checkUnchanged(t, before)
	close(dead)
}

func TestEnvelopeResume(t *testing.T) {
	t.Parallel()
	// A saga killed after the user and one post were created is finished
	// from its journal: the post is deleted before the user.
	api := newShopAPI("/users", "/users/100/posts")
	e := shop(t, func(s *policy.Settings) { s.Concurrency = 1 })
	p, prob := admitEnvelope(t, e, userWithPosts)
	if prob != nil {
		t.Fatal(prob.Detail)
	}
	j := &killingJournal{killAt: 3} // the third write's record never comes back
	res := Run(context.Background(), p, Runtime{Send: api, Journal: j})
	equal(t, "outcome of the killed run", res.Outcome, RolledBack)
	snap := j.snapshot()
	api2 := api // the same legacy API, as the dead gateway left it
	api2.mu.Lock()
	api2.writeLog = nil
	api2.mu.Unlock()
	// Put back what the dead run's own compensation did, as if it had
	// never run: the API as it was when the gateway died.
	api2.put("/users/100", map[string]any{"id": 100, "name": "ada"})
	api2.put("/users/100/posts/101", map[string]any{"id": 101, "title": "hello", "author": "100", "author_id": 100})
	res2, err := Resume(context.Background(), snap, nil, e, Runtime{Send: api2})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "outcome", res2.Outcome, RolledBack)
	equal(t, "store", len(api2.state()), 0)
	writes := api2.writes()
	equalSlices(t, "undos", writes, []string{"DELETE /users/100/posts/101", "DELETE /users/100"})
	equal(t, "described", res2.Items[1].describe(), `operation "p1" (POST /users/100/posts)`)
}

// killingJournal keeps the snapshot as a journal would, and stops
// recording at the killAt'th write about to be sent, as if the gateway
// died there: that write is refused, so it is never sent.
type killingJournal struct {
	mu     sync.Mutex
	killAt int
	sends  int
	dead   bool
	snap   *Snapshot
}

func (j *killingJournal) Begin(_ context.Context, p *Plan) error {
	j.snap = p.Snapshot()
	return nil
}

func (j *killingJournal) Record(_ context.Context, t Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.dead {
		return nil
	}
	if t.Phase == PhaseSending {
		if j.sends++; j.sends == j.killAt {
			j.dead = true
			return fmt.Errorf("killed")
		}
	}
	j.snap.Items[t.Index] = t.Item
	return nil
}

func (j *killingJournal) End(context.Context, *Result) {}
func (j *killingJournal) Fence(context.Context) error  { return nil }

func (j *killingJournal) snapshot() *Snapshot {
	j.mu.Lock()
	defer j.mu.Unlock()
	b, _ := json.Marshal(j.snap)
	var s Snapshot
	_ = json.Unmarshal(b, &s)
	return &s
}
