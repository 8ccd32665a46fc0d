package batch

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// docs/security.md, "Sizing the limits": max_response_size bounds the whole batch answer. An item
// whose body would take the answer past it is left out, says why, and
// fails: an all-or-nothing batch fails (502), a partial one answers 207,
// a write batch is undone.

// padWidgets seeds ids with records of the same size and returns the
// size of the JSON body a GET of one answers with.
func padWidgets(f *fakeAPI, pad int, ids ...string) int64 {
	var size int
	for _, id := range ids {
		rec := map[string]any{"id": id, "pad": strings.Repeat("x", pad)}
		f.put(widget(id), rec)
		b, _ := json.Marshal(rec)
		size = len(b)
	}
	return int64(size)
}

// checkLeftOut asserts that item i of w is a body left out for
// max_response_size (limit bytes), and that the bodies kept fit in it.
func checkLeftOut(t testing.TB, w *wire, limit int64, left ...int) {
	t.Helper()
	var kept int64
	for i, it := range w.Items {
		kept += int64(len(it.Body) + len(it.BodyText))
		isLeft := false
		for _, l := range left {
			isLeft = isLeft || l == i
		}
		mentions := strings.Contains(it.Error, fmt.Sprintf("max_response_size (%d bytes)", limit))
		switch {
		case isLeft && (it.Body != nil || it.BodyText != "" || !mentions):
			t.Errorf("items[%d]: body %d bytes, error %q; want the body left out, and why", i, len(it.Body), it.Error)
		case !isLeft && mentions:
			t.Errorf("items[%d] was left out: %q", i, it.Error)
		}
	}
	if kept > limit {
		t.Errorf("the answer carries %d bytes of bodies, more than max_response_size (%d)", kept, limit)
	}
}

func TestMaxResponseSizeGet(t *testing.T) {
	t.Parallel()
	f := newFake()
	size := padWidgets(f, 400, "1", "2", "3", "4", "5")
	limit := 2*size + size/2
	w := write(t, run1(t, "GET", "/widgets?ids=1,2,3,4,5", "", f, concurrency(1), maxResponseSize(limit)))
	equal(t, "status", w.Code, 502)
	equal(t, "Content-Type", w.ContentType, problem.ContentType)
	equal(t, "outcome", w.Outcome, "failed")
	equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded", "failed", "not_attempted", "not_attempted"})
	equalSlices(t, "statuses", w.Statuses(), []int{200, 200, 200, 0, 0})
	equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "GET /widgets/3"})
	checkLeftOut(t, w, limit, 2)
	if !strings.Contains(w.Items[2].Error, fmt.Sprintf("this item's body (%d bytes)", size)) {
		t.Errorf("items[2].error = %q; want it to give the body's size", w.Items[2].Error)
	}
	if !strings.Contains(w.Detail, "max_response_size") {
		t.Errorf("detail = %q; want it to name max_response_size", w.Detail)
	}
}

// In a partial batch, the items that do not fit fail and the others go
// on: a smaller body after them still fits.
func TestMaxResponseSizePartial(t *testing.T) {
	t.Parallel()
	f := newFake()
	size := padWidgets(f, 400, "1", "2", "3")
	padWidgets(f, 0, "5")
	text := strings.Repeat("<p>down</p>", int(size)/11+1) // a body_text counts as a body
	f.on("GET", "/widgets/4", reply(500, text, "Content-Type", "text/html"))
	limit := 2*size + size/2
	w := write(t, run1(t, "GET", "/widgets?ids=1,2,3,4,5", "", f, partial, concurrency(1), maxResponseSize(limit)))
	equal(t, "status", w.Code, 207)
	equal(t, "Content-Type", w.ContentType, "application/json")
	equal(t, "outcome", w.Outcome, "partial")
	equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded", "failed", "failed", "succeeded"})
	equal(t, "succeeded", w.Succeeded, 3)
	equal(t, "failed", w.Failed, 2)
	checkLeftOut(t, w, limit, 2, 3)
	if w.Items[4].Body == nil {
		t.Error("items[4] has no body: it fits after those left out")
	}
}

// An all-or-nothing write batch whose answer does not fit is undone,
// the item whose answer was left out included: its write took effect.
func TestMaxResponseSizeUndoesWrites(t *testing.T) {
	t.Parallel()
	f := newFake()
	padWidgets(f, 400, "1", "2", "3")
	before := f.state()
	elems := `[{"id":"1","name":"n"},{"id":"2","name":"n"},{"id":"3","name":"n"}]`
	merged, _ := json.Marshal(map[string]any{"id": "1", "name": "n", "pad": strings.Repeat("x", 400)})
	limit := int64(2*len(merged) + len(merged)/2)
	w := write(t, run1(t, "PATCH", "/widgets", elems, f, concurrency(1), maxResponseSize(limit)))
	equal(t, "status", w.Code, 502)
	equal(t, "Content-Type", w.ContentType, problem.ContentType)
	equal(t, "outcome", w.Outcome, "rolled_back")
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "rolled_back"})
	checkLeftOut(t, w, limit, 2)
	f.checkUnchanged(t, before)
	if !strings.Contains(w.Detail, "max_response_size") || !strings.Contains(w.Detail, "undone") {
		t.Errorf("detail = %q; want it to name max_response_size and say what was undone", w.Detail)
	}
}

// A partial batch's write that took effect stays succeeded when its
// answer is left out: failed would say it did not happen.
func TestMaxResponseSizePartialWrite(t *testing.T) {
	t.Parallel()
	f := newFake()
	padWidgets(f, 400, "1", "2", "3")
	elems := `[{"id":"1","name":"n"},{"id":"2","name":"n"},{"id":"3","name":"n"}]`
	merged, _ := json.Marshal(map[string]any{"id": "1", "name": "n", "pad": strings.Repeat("x", 400)})
	limit := int64(2*len(merged) + len(merged)/2)
	w := write(t, run1(t, "PATCH", "/widgets", elems, f, partial, concurrency(1), maxResponseSize(limit)))
	equal(t, "status", w.Code, 200)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded", "succeeded"})
	checkLeftOut(t, w, limit, 2)
	for path, rec := range f.state() {
		if !strings.Contains(rec, `"name":"n"`) {
			t.Errorf("%s = %s, want it updated", path, rec)
		}
	}
}

// A repeated id's body is held once but written once for each time the
// batch names it, and counted so.
func TestMaxResponseSizeRepeatedID(t *testing.T) {
	t.Parallel()
	f := newFake()
	size := padWidgets(f, 400, "1")
	limit := 2*size + size/2
	w := write(t, run1(t, "GET", "/widgets?ids=1,1,1", "", f, maxResponseSize(limit)))
	equal(t, "status", w.Code, 502)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "failed", "failed"})
	equal(t, "GETs sent", len(f.log()), 1)
	checkLeftOut(t, w, limit, 0, 1, 2)
	if !strings.Contains(w.Items[0].Error, "3 times") {
		t.Errorf("items[0].error = %q; want it to say the id is named 3 times", w.Items[0].Error)
	}

	w = write(t, run1(t, "GET", "/widgets?ids=1,1", "", newFake().seed("1"), maxResponseSize(limit)))
	equal(t, "two copies fit: status", w.Code, 200)
}
