package batch

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// In front of an API that stamps updated_at on every save (Rails'
// timestamps, Django's auto_now), stamped_fields leaves the stamp out of
// every comparison a proof makes; the read that resolves an unknown write
// is kept in compensation.found whatever comes of it; and a reason blames
// another writer only where a member the write sent was changed
// (docs/all-or-nothing.md).

func stamped(names ...string) specMod {
	return settings(func(s *policy.Settings) { s.StampedFields = names })
}

// stampingFake is a store that stamps every save, holding widgets 1 and 2
// as saved at t0.
func stampingFake() *fakeAPI {
	f := newFake()
	f.stamps = true
	for _, id := range []string{"1", "2"} {
		f.put(widget(id), map[string]any{"id": id, "name": "widget " + id, "color": "red", "updated_at": "t0"})
	}
	return f
}

// withoutStamp is a record as JSON, its updated_at left out.
func withoutStamp(t *testing.T, rec string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(rec), &m); err != nil {
		t.Fatalf("%q: %v", rec, err)
	}
	delete(m, "updated_at")
	b, _ := json.Marshal(m)
	return string(b)
}

// An update whose answer was lost took effect, and the API stamped it:
// the read that resolves it differs from what the write would leave in
// updated_at alone.
func TestStampedUnknownUpdate(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, mods ...specMod) (*fakeAPI, *wire) {
		f := stampingFake().on("PATCH", "/widgets/1", answer{effectThenErr: errLost})
		mods = append(mods, concurrency(1))
		return f, write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"ours"},{"id":"2","name":"x"}]`, f, mods...))
	}
	t.Run("with stamped_fields it is undone", func(t *testing.T) {
		f, w := run(t, stamped("updated_at"))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
		equal(t, "PUTs sent", len(f.sentWith("PUT")), 1)
		jsonEqual(t, "widget 1 but for its stamp", withoutStamp(t, f.state()["/widgets/1"]), `{"id":"1","name":"widget 1","color":"red"}`)
		c := w.Items[0].Compensation
		if c == nil || c.Method != "PUT" || !strings.Contains(string(c.Found), `"ours"`) || !strings.Contains(string(c.Found), `"updated_at":"t1"`) {
			t.Errorf("compensation %+v: want the PUT, and the read that resolved the write in found", c)
		}
	})
	t.Run("without it is left, naming stamped_fields", func(t *testing.T) {
		f, w := run(t)
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "not_attempted"})
		equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
		jsonEqual(t, "widget 1 as the write left it", f.state()["/widgets/1"], `{"id":"1","name":"ours","color":"red","updated_at":"t1"}`)
		c := w.Items[0].Compensation
		if c == nil || !strings.Contains(c.Error, `"updated_at"`) || !strings.Contains(c.Error, "stamped_fields") || strings.Contains(c.Error, "another writer") {
			t.Fatalf("compensation %+v: want a reason naming updated_at and stamped_fields, blaming no writer", c)
		}
		jsonEqual(t, "found", string(c.Found), f.state()["/widgets/1"])
	})
}

// A real second writer changes a member the batch sent, between the
// unknown write and the read that resolves it: the item is left, and
// the reason names the member and the writer, stamped_fields or not.
func TestStampedSecondWriterIsStillNamed(t *testing.T) {
	t.Parallel()
	f := stampingFake()
	theirs := map[string]any{"id": "1", "name": "theirs", "color": "red", "updated_at": "t9"}
	f.on("PATCH", "/widgets/1", answer{effectThenErr: errLost}).
		on("GET", "/widgets/1", answer{}, answer{hook: func(context.Context, *SubRequest) { f.put(widget("1"), theirs) }})
	w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"ours"},{"id":"2","name":"x"}]`, f, concurrency(1), stamped("updated_at")))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "not_attempted"})
	equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
	jsonEqual(t, "widget 1", f.state()["/widgets/1"], `{"id":"1","name":"theirs","color":"red","updated_at":"t9"}`)
	c := w.Items[0].Compensation
	if c == nil || !strings.Contains(c.Error, `another writer changed "name"`) || strings.Contains(c.Error, "stamped_fields") {
		t.Fatalf("compensation %+v: want the other writer named, with the member", c)
	}
	jsonEqual(t, "found", string(c.Found), f.state()["/widgets/1"])
}

// A write that was answered, then stamped again before the undo's proof
// read (a callback that touches the row): the read differs from the
// write's answer in updated_at alone.
func TestStampedProofRead(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, mods ...specMod) (*fakeAPI, *wire) {
		f := stampingFake()
		touched := map[string]any{"id": "1", "name": "ours", "color": "red", "updated_at": "t7"}
		f.on("PATCH", "/widgets/2", reply(500, ``)).
			on("GET", "/widgets/1", answer{}, answer{hook: func(context.Context, *SubRequest) { f.put(widget("1"), touched) }})
		mods = append(mods, concurrency(1))
		return f, write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"ours"},{"id":"2","name":"x"}]`, f, mods...))
	}
	t.Run("with stamped_fields it is undone", func(t *testing.T) {
		f, w := run(t, stamped("updated_at"))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
		jsonEqual(t, "widget 1 but for its stamp", withoutStamp(t, f.state()["/widgets/1"]), `{"id":"1","name":"widget 1","color":"red"}`)
	})
	t.Run("without it is left, naming stamped_fields", func(t *testing.T) {
		f, w := run(t)
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
		c := w.Items[0].Compensation
		if c == nil || !strings.Contains(c.Error, `the difference is only in "updated_at", which the batch's write did not send`) || strings.Contains(c.Error, "another writer") {
			t.Fatalf("compensation %+v: want a reason naming updated_at and stamped_fields", c)
		}
	})
}

// The read that finds an unknown write did not take effect is kept too:
// the item failed, and its compensation says what was found.
func TestFoundWhenAnUnknownWriteDidNotTakeEffect(t *testing.T) {
	t.Parallel()
	f := stampingFake().on("PATCH", "/widgets/1", answer{err: errLost})
	before := f.state()
	w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"ours"},{"id":"2","name":"x"}]`, f, concurrency(1), stamped("updated_at")))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "not_attempted"})
	f.checkUnchanged(t, before)
	c := w.Items[0].Compensation
	if c == nil || c.Method != "" {
		t.Fatalf("compensation %+v: want the read alone", c)
	}
	jsonEqual(t, "found", string(c.Found), before["/widgets/1"])
}

// stamped_fields leaves out only what it names: a member the API did
// not stamp still counts, and so does the id.
func TestDifferingLeavesOutOnlyStampedMembers(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		have, want string
		subset     bool
		leaveOut   []string
		differ     []string
	}{
		{`{"id":1,"a":1,"updated_at":"t2"}`, `{"id":1,"a":1,"updated_at":"t1"}`, false, []string{"updated_at"}, nil},
		{`{"id":1,"a":1,"updated_at":"t2"}`, `{"id":1,"a":1,"updated_at":"t1"}`, false, nil, []string{"updated_at"}},
		{`{"id":1,"a":2,"updated_at":"t2"}`, `{"id":1,"a":1}`, false, []string{"updated_at"}, []string{"a"}},
		{`{"id":1,"a":1,"b":2}`, `{"id":1,"a":1}`, false, nil, []string{"b"}},
		{`{"id":1,"a":1,"b":2}`, `{"id":1,"a":1}`, true, nil, nil},
		{`{"id":2,"a":1}`, `{"id":1,"a":1}`, true, []string{"updated_at"}, []string{"id"}},
		{`{"a":1}`, `{"a":1,"updated_at":"t1"}`, true, []string{"updated_at"}, nil},
	} {
		got, ok := differing([]byte(tt.have), []byte(tt.want), tt.subset, tt.leaveOut)
		if !ok || strings.Join(got, ",") != strings.Join(tt.differ, ",") {
			t.Errorf("differing(%s, %s, subset %v, leaving out %v) = %v, %v; want %v", tt.have, tt.want, tt.subset, tt.leaveOut, got, ok, tt.differ)
		}
	}
}

// A saga that died after its undo was applied, unanswered, is finished
// by a read that finds the pre-image but for the stamp the undo's own
// save put on it: that counts as undone, and nothing is sent again.
func TestStampedResumeAfterAnUndoWasSent(t *testing.T) {
	t.Parallel()
	f := stampingFake()
	dead, undoing := make(chan struct{}), make(chan struct{})
	f.on("PATCH", "/widgets/2", reply(500, `{}`))
	f.on("PUT", "/widgets/1", appliedThenDies(f, undoing, dead))
	defer close(dead)
	j := &memJournal{}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","name":"ours"},{"id":"2","name":"x"}]`), concurrency(1), stamped("updated_at"))
	go newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	<-undoing
	snap := j.stored(t)
	res, err := Resume(context.Background(), snap, widgets(t, stamped("updated_at")).Lookup, nil, Runtime{Send: f, Journal: &memJournal{snap: snap}})
	if err != nil {
		t.Fatal(err)
	}
	w := write(t, res)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
	equal(t, "PUTs sent in all", len(f.sentWith("PUT")), 1)
	jsonEqual(t, "widget 1 but for its stamp", withoutStamp(t, f.state()["/widgets/1"]), `{"id":"1","name":"widget 1","color":"red"}`)
}
