package batch

// unknown: a write that was sent, but whose answer never came.

import (
	"strings"
	"testing"
	"time"
)

func TestUnknown(t *testing.T) {
	t.Parallel()
	t.Run("partial: no answer is 502, a hang past item_timeout is 504", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{err: errLost}, answer{hang: true}, answer{})
		w := write(t, run1(t, "POST", "/widgets", elements(3), f, partial, concurrency(1), itemTimeout(50*time.Millisecond)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"unknown", "unknown", "succeeded"})
		equalSlices(t, "statuses", w.Statuses(), []int{502, 504, 201})
		equal(t, "status", w.Code, 207)
		equal(t, "outcome", w.Outcome, "partial")
		equal(t, "sub-requests", len(f.log()), 3)
		for _, it := range w.Items[:2] {
			if it.Error == "" {
				t.Errorf("item %d: unknown without an error", it.Index)
			}
			if strings.Contains(it.Error, "connection reset") {
				t.Errorf("item %d: the client is told the raw transport error %q", it.Index, it.Error)
			}
		}
	})
	t.Run("an unknown update is compensated", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/2", answer{effectThenErr: errLost})
		before := f.state()
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back"})
		equalSlices(t, "statuses", w.Statuses(), []int{200, 502})
		equalSlices(t, "compensations", pathsOf(f.sentWith("PUT")), []string{"/widgets/2", "/widgets/1"})
		equal(t, "status", w.Code, 502)
		equal(t, "outcome", w.Outcome, "rolled_back")
		f.checkUnchanged(t, before)
	})
	t.Run("an unknown delete is re-created (restore_deleted put)", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", answer{effectThenErr: errLost})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		// The read that learns the delete happened is the re-create's proof.
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1", "PUT /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
		equal(t, "status", w.Code, 502)
		f.checkUnchanged(t, before)
	})
	t.Run("restore_deleted post: an unknown delete that did not happen is probed, not re-created", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", answer{err: errLost})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), restoreByPost))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1"})
		// The item's own write failed and did not take effect: nothing
		// was changed.
		equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "not_attempted"})
		equal(t, "status", w.Code, 502)
		equal(t, "outcome", w.Outcome, "failed")
		if !strings.Contains(w.Items[0].Error, "did not take effect") {
			t.Errorf("item 0's error %q does not say the read showed no effect", w.Items[0].Error)
		}
		f.checkUnchanged(t, before)
	})
	t.Run("restore_deleted post: an unknown delete that happened is re-created", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", answer{effectThenErr: errLost})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), restoreByPost))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1", "POST /widgets"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
		f.checkUnchanged(t, before)
	})
	t.Run("an unknown create whose element has an id is deleted", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{effectThenErr: errLost})
		w := write(t, run1(t, "POST", "/widgets", `[{"id":"e1","name":"a"}]`, f))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/e1", "POST /widgets", "GET /widgets/e1", "DELETE /widgets/e1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back"})
		equal(t, "status", w.Code, 502)
		equal(t, "store after", len(f.state()), 0)
	})
	t.Run("an unknown create with no id: rollback_failed", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{effectThenErr: errLost}, answer{})
		res := run1(t, "POST", "/widgets", elements(3), f, concurrency(1))
		w := write(t, res)
		equalSlices(t, "sent", f.sent(), []string{"POST /widgets", "POST /widgets", "GET /widgets/1000", "DELETE /widgets/1000"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rollback_failed", "not_attempted"})
		equal(t, "status", w.Code, 500)
		equal(t, "outcome", w.Outcome, "rollback_failed")
		if len(res.LeftBehind) != 1 || !strings.HasPrefix(res.LeftBehind[0], "item 1: ") || !strings.Contains(res.LeftBehind[0], "cannot be learned") {
			t.Errorf("LeftBehind = %q, want item 1 and why", res.LeftBehind)
		}
		if !strings.Contains(w.Detail, "item 1") {
			t.Errorf("detail %q does not name item 1", w.Detail)
		}
	})
	t.Run("an update a proxy answered 502 after it was applied is read, and undone", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/2", answer{effectThenStatus: 502})
		before := f.state()
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "GET /widgets/2", "PUT /widgets/2", "GET /widgets/1", "PUT /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back"})
		equalSlices(t, "statuses", w.Statuses(), []int{200, 502})
		equal(t, "status", w.Code, 502)
		if !strings.Contains(w.Items[1].Error, "may have taken effect") {
			t.Errorf("item 1's error %q does not say the write may have taken effect", w.Items[1].Error)
		}
		f.checkUnchanged(t, before)
	})
	t.Run("a delete answered 504 that did not take effect is failed, after a read", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/1", reply(504, "<h1>Gateway Timeout</h1>"))
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "GET /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "not_attempted"})
		equal(t, "status", w.Code, 504)
		equal(t, "outcome", w.Outcome, "failed")
		f.checkUnchanged(t, before)
	})
	t.Run("a create with no id a proxy answered 502: rollback_failed", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{effectThenStatus: 502})
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rollback_failed"})
		equal(t, "status", w.Code, 500)
	})
	t.Run("partial: a write answered 504 is unknown, and left", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/2", answer{effectThenStatus: 504})
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "unknown"})
		equal(t, "status", w.Code, 207)
		equal(t, "sub-requests", len(f.log()), 2)
	})
	t.Run("the upstream's own 500 and 503 are failures, not unknown", func(t *testing.T) {
		for _, status := range []int{500, 503} {
			f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(status, "down"))
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f, concurrency(1)))
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
			equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "GET /widgets/1", "PUT /widgets/1"})
		}
	})
	t.Run("a read answered 502 is failed, not unknown", func(t *testing.T) {
		f := newFake().seed("1", "2").on("GET", "/widgets/2", reply(502, "<h1>Bad Gateway</h1>"))
		w := write(t, run1(t, "GET", "/widgets?ids=1,2", "", f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "failed"})
	})
	t.Run("ErrNotSent is failed, not unknown, and not compensated", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", answer{}, answer{err: notSent()})
		w := write(t, run1(t, "POST", "/widgets", `[{"name":"a"},{"id":"b","name":"b"},{"name":"c"}]`, f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/b", "POST /widgets", "POST /widgets", "GET /widgets/1000", "DELETE /widgets/1000"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed", "not_attempted"})
		equalSlices(t, "statuses", w.Statuses(), []int{201, 502, 0})
		equal(t, "status", w.Code, 502)
		if strings.Contains(w.Items[1].Error, "10.0.0.1") {
			t.Errorf("the client is told an internal address: %q", w.Items[1].Error)
		}
	})
	t.Run("ErrNotSent in partial mode", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/2", answer{err: notSent()})
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, partial))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "failed"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 502})
		equal(t, "status", w.Code, 207)
	})
}

// TestResentWrite holds the engine to what a resent write means: the
// answer is to the second copy, and the first may have done the work.
func TestResentWrite(t *testing.T) {
	t.Parallel()
	t.Run("a resent delete answered 404 is unknown, and undone", func(t *testing.T) {
		f := newFake().seed("1", "2").on("DELETE", "/widgets/2", answer{resent: true})
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back"})
		equalSlices(t, "statuses", w.Statuses(), []int{204, 404})
		equal(t, "outcome", w.Outcome, "rolled_back")
		if !strings.Contains(w.Items[1].Error, "sent twice") {
			t.Errorf("item 1 error %q does not say it was sent twice", w.Items[1].Error)
		}
		f.checkUnchanged(t, before)
	})
	t.Run("declarative: a resent delete answered 404 succeeds, and is undone with the batch", func(t *testing.T) {
		f := newFake().seed("1", "2", "3").
			on("DELETE", "/widgets/1", answer{resent: true}).
			on("DELETE", "/widgets/3", reply(500, "down"))
		before := f.state()
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2,3", "", f, concurrency(1), declarative))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "failed"})
		equalSlices(t, "compensations", pathsOf(f.sentWith("PUT")), []string{"/widgets/2", "/widgets/1"})
		f.checkUnchanged(t, before)
	})
	t.Run("a resent write answered 2xx stands", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/1", answer{resent: true})
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`, f))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded"})
		equal(t, "status", w.Code, 200)
	})
}
