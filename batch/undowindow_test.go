package batch

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// windowJournal keeps each item's last record, by its index in the
// window, as a job's window log reads back.
type windowJournal struct {
	NoJournal
	mu   sync.Mutex
	last map[int]ItemSnapshot
}

func (j *windowJournal) Record(_ context.Context, t Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.last == nil {
		j.last = map[int]ItemSnapshot{}
	}
	j.last[t.Index] = t.Item
	return nil
}

// logged is w with each item as the journal last recorded it, read
// back from JSON as storage would give it.
func (j *windowJournal) logged(t *testing.T, w *Snapshot) *Snapshot {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := *w
	out.Items = append([]ItemSnapshot(nil), w.Items...)
	for i, it := range j.last {
		b, err := json.Marshal(it)
		if err != nil {
			t.Fatal(err)
		}
		out.Items[i] = ItemSnapshot{}
		if err := json.Unmarshal(b, &out.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	return &out
}

func undoWindow(t *testing.T, w *Snapshot, f *fakeAPI, j Journal, mods ...specMod) *WindowResult {
	t.Helper()
	res, err := UndoWindow(context.Background(), w, Site{Runtime: Runtime{Send: f, Journal: j}, Lookup: widgets(t, mods...).Lookup}, WindowOpts{})
	if err != nil {
		t.Fatalf("UndoWindow: %v", err)
	}
	return res
}

// An all-or-nothing window reads every target before it writes any,
// starts nothing after a failure, and records each write's undo: the
// window undone from its log leaves the API as it was.
func TestAllOrNothingWindowUndoneFromItsLog(t *testing.T) {
	f := newFake().seed("1", "2", "3", "4")
	f.on(http.MethodPatch, widget("3"), reply(http.StatusUnprocessableEntity, `<p>no</p>`, "Content-Type", "text/html"))
	before := f.state()
	j := &windowJournal{}
	w := jobWindow(policy.OpUpdate, 512, element("1", `{"id":"1","color":"blue"}`), element("2", `{"id":"2","color":"blue"}`),
		element("3", `{"id":"3","color":"blue"}`), element("4", `{"id":"4","color":"blue"}`))
	res := runWindow(t, w, f, j, WindowOpts{AllOrNothing: true}, concurrency(1))
	if res.Items[2].Outcome != Failed || res.Items[3].Outcome != NotAttempted || res.Items[0].Outcome != Succeeded {
		t.Fatalf("outcomes %s %s %s %s; want succeeded, succeeded, failed, not_attempted",
			res.Items[0].Outcome, res.Items[1].Outcome, res.Items[2].Outcome, res.Items[3].Outcome)
	}
	log := f.log()
	for i, c := range log[:4] {
		if c.Method != http.MethodGet {
			t.Fatalf("request %d was %s %s, want the four preflight reads first: %v", i, c.Method, c.Path, f.sent())
		}
	}
	undone := undoWindow(t, j.logged(t, w), f, j, concurrency(1))
	if undone.Items[0].Outcome != RolledBack || undone.Items[1].Outcome != RolledBack || undone.Items[2].Outcome != Failed || undone.Items[0].Index != 512 {
		t.Errorf("after the undo: %+v; want the two writes rolled_back at their job indexes, the failure kept", undone.Items)
	}
	f.checkUnchanged(t, before)
}

// A carried-on all-or-nothing window keeps what its items that ran did
// when the preflight of one yet to run fails: they are undone by the
// job, not forgotten as never attempted.
func TestAllOrNothingWindowCarriedOnKeepsWhatRan(t *testing.T) {
	f := newFake().seed("1")
	done := element("1", `{"id":"1","color":"blue"}`)
	done.Phase, done.Outcome, done.Status, done.Applied = PhaseAnswered, Succeeded, http.StatusOK, true
	w := jobWindow(policy.OpUpdate, 0, done, element("9", `{"id":"9","color":"blue"}`))
	res := runWindow(t, w, f, nil, WindowOpts{AllOrNothing: true})
	if res.Items[0].Outcome != Succeeded || res.Items[1].Outcome != Failed {
		t.Errorf("outcomes %s, %s; want the item that ran still succeeded, the missing one failed", res.Items[0].Outcome, res.Items[1].Outcome)
	}
	if n := len(f.sentWith(http.MethodPatch)); n != 0 {
		t.Errorf("sent %d updates, want none: the window failed its preflight", n)
	}
}

// An update recorded as being sent, with no answer, that a carry-on
// finds took effect succeeded; its undo is what the item reads now
// against its recorded pre-image, so the job's undo puts the item back.
func TestResolvedForwardWriteGetsItsUndo(t *testing.T) {
	f := newFake().put(widget("1"), map[string]any{"id": "1", "name": "widget 1", "color": "blue"})
	j := &windowJournal{}
	sending := element("1", `{"id":"1","color":"blue"}`)
	sending.Phase, sending.Applied, sending.Preimage = PhaseSending, true, json.RawMessage(`{"id":"1","name":"widget 1","color":"red"}`)
	sending.Sent = &SubRequest{Method: http.MethodPatch, Path: widget("1"), Body: []byte(`{"id":"1","color":"blue"}`)}
	w := jobWindow(policy.OpUpdate, 0, sending)
	res := runWindow(t, w, f, j, WindowOpts{AllOrNothing: true}, itemTimeout(1))
	if res.Items[0].Outcome != Succeeded {
		t.Fatalf("outcome %s, want the write found to have taken effect", res.Items[0].Outcome)
	}
	undone := undoWindow(t, j.logged(t, w), f, j)
	if undone.Items[0].Outcome != RolledBack {
		t.Errorf("undo %s (%+v), want rolled_back", undone.Items[0].Outcome, undone.Items[0].Compensation)
	}
	if got := f.state()[widget("1")]; got != `{"color":"red","id":"1","name":"widget 1"}` {
		t.Errorf("item 1 reads %s after the undo, want its pre-image", got)
	}
}
