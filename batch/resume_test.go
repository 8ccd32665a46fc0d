package batch

import (
	"context"
	"sync"
	"testing"
)

// A saga that died in the middle of its compensation, after some undos
// were done and recorded, is finished without undoing those again: an
// item already put back is not "proved" a second time (the proof would
// find the pre-image, not the batch's write, and report the item left
// behind) and no undo is sent for it.
func TestResumeAfterSomeUndosWereDone(t *testing.T) {
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
	go newSaga(p, Runtime{Send: f, Journal: j}, noBackoff).run(context.Background())
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
