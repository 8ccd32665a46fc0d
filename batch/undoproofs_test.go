package batch

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"

	"context"
	"net/http"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// An update whose outcome was unknown and that a read resolved keeps
// the proof that read was: when its undo fails and the saga is kept, an
// operator's Retry proves the item again, and leaves what another
// writer made of it since (it sent the undo with no proof at all, over
// the other writer's values). The control: an update answered.
func TestRetryOfAReadResolvedUpdateIsProvedAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		patch answer
	}{
		{"answered", answer{}},
		{"unknown, resolved by a read", answer{effectThenErr: errLost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake().seed("1", "2").
				on("PATCH", "/widgets/1", tc.patch).
				on("PATCH", "/widgets/2", reply(500, `{}`)).
				// The first restore fails; a later one would be carried out.
				on("PUT", "/widgets/1", reply(500, `{}`), answer{})
			j := &memJournal{}
			p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1), compensationRetries(0))
			res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
			if res.Outcome != RollbackFailed {
				t.Fatalf("saga outcome %v, want rollback_failed", res.Outcome)
			}
			snap := j.stored(t)
			// Hours later, another writer changes item 1 through the gateway.
			theirs := map[string]any{"id": "1", "name": "theirs", "color": "blue", "v": 7}
			f.put(widget("1"), theirs)
			before := f.state()
			if _, err := Retry(context.Background(), snap, res.Items, widgets(t, compensationRetries(0)).Lookup, nil, Runtime{Send: f, Journal: &memJournal{snap: snap}}); err != nil {
				t.Fatal(err)
			}
			f.checkUnchanged(t, before)
		})
	}
}

// A PATCH that removes a member (null, RFC 7396) answered with no item
// (204): the proof, the pre-image merged with the patch held member by
// member, asks that member to be gone still, so another writer's value
// for it fails the proof (it was in neither, and the restore overwrote
// it).
func TestRemovedMemberSetByAnotherWriterFailsTheProof(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	f.on("PATCH", "/widgets/1", answer{hook: func(_ context.Context, req *SubRequest) { f.store(req) }, status: http.StatusNoContent})
	f.on("PATCH", "/widgets/2", answer{hook: func(context.Context, *SubRequest) {
		// Another writer (not through the gateway, or a field the gateway
		// does not lock) sets the member the batch removed.
		f.put(widget("1"), map[string]any{"id": "1", "name": "widget 1", "color": "blue"})
	}, status: 500, body: `{}`})
	res := run1(t, "PATCH", "/widgets", `[{"id":"1","color":null},{"id":"2","v":1}]`, f, concurrency(1))
	w := write(t, res)
	if w.Items[0].Outcome == "rolled_back" {
		t.Errorf("item 1 rolled_back: the undo overwrote the other writer's color (now %s)", f.state()[widget("1")])
	}
}

// A DELETE restored by POST whose answer names no id (204, or a body
// without the id field) is rollback_failed with no created_id: an
// operator's Retry does not POST the pre-image again (on an API that
// assigns ids it made a second copy).
func TestRetryDoesNotPostARestoreAgain(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	f.on("DELETE", "/widgets/2", reply(500, `{}`))
	// The POST restore creates under a new id and names none.
	created := 0
	f.on("POST", "/widgets", answer{hook: func(_ context.Context, req *SubRequest) {
		created++
		f.put(widget("new"+string(rune('0'+created))), map[string]any{"id": "new", "name": "widget 1"})
	}, status: http.StatusNoContent})
	j := &memJournal{}
	p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), concurrency(1), restoreByPost, compensationRetries(0))
	res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	if w := write(t, res); w.Items[0].Outcome != "rollback_failed" {
		t.Fatalf("the re-create by POST that named no id: %s, want rollback_failed", w.Items[0].Outcome)
	}
	snap := j.stored(t)
	if _, err := Retry(context.Background(), snap, res.Items, widgets(t, restoreByPost, compensationRetries(0)).Lookup, nil, Runtime{Send: f, Journal: &memJournal{snap: snap}}); err != nil {
		t.Fatal(err)
	}
	if created > 1 {
		t.Errorf("the POST restore was sent %d times: the retry made a duplicate (%v)", created, f.state())
	}
}

// An envelope's undo waits for everything that depends on it, through
// a read between two writes of the same item too (it waited only for
// its direct dependents that were applied: both undos ran at once, a's
// proof saw a's pre-image that c had written back and counted a put
// back, then c's restore put a's write back, answered rolled_back).
func TestEnvelopeUndoOrderThroughARead(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users").put("/users/7", map[string]any{"id": 7, "name": "orig"})
	api.on("POST", "/users", reply(422, `{"error":"no"}`))
	api.on("PUT", "/users/7", answer{delay: 50 * time.Millisecond})
	before := api.state()
	body := `{"operations": [
		{"id": "a", "method": "PATCH", "url": "/users/7", "body": {"name": "x"}},
		{"id": "g", "method": "GET", "url": "/users/7", "depends_on": ["a"]},
		{"id": "c", "method": "PATCH", "url": "/users/7", "body": {"name": "orig"}, "depends_on": ["g"]},
		{"id": "f", "method": "POST", "url": "/users", "body": {"name": "bad"}, "depends_on": ["c"]}
	]}`
	e := shop(t, func(s *policy.Settings) { s.Concurrency = 2 })
	w := runEnvelope(t, e, body, api)
	if w.Outcome == "rolled_back" {
		api.checkUnchanged(t, before)
	}
}

// createsUnnamed makes answers of an upstream that creates each item
// under an id of its own (901, 902, … across the answers it makes) and
// answers 201 naming none: neither Location nor id.
func createsUnnamed(f *fakeAPI) func() answer {
	n := 0
	return func() answer {
		return answer{hook: func(context.Context, *SubRequest) {
			n++
			f.put(widget(fmt.Sprint(900+n)), map[string]any{"id": fmt.Sprint(900 + n), "v": 1})
		}, status: http.StatusCreated, body: `{"ok":true}`}
	}
}

// A saga that lost its lease, orphaned, undoes its own writes, each
// first read to see whether it is undone already: for a create whose id
// only the element named (201 with neither Location nor id), nothing at
// that id proves nothing, since the upstream may have put the item under
// an id of its own (it counted as undone, and the client was answered
// rolled_back with both items left).
func TestOrphanedElementIDCreateIsNotRolledBack(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.on("POST", "/widgets", createsUnnamed(f)())
	j := &fencingJournal{lease: lostAfter(3, time.Now().Add(time.Hour)), orphaned: true, f: f}
	p := mustPlan(t, newRequest("POST", "/widgets", `[{"id":"a","v":1},{"id":"b","v":1},{"id":"c","v":1}]`), concurrency(1))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background()))
	if w.Outcome == string(RolledBack) && len(f.state()) > 0 {
		t.Errorf("answered rolled_back with %d created items left: %v", len(f.state()), f.state())
	}
}

// Control: the same creates, the lease kept and the third failing: the
// proof finds nothing at the element's id and says rollback_failed.
func TestElementIDCreateIsRollbackFailed(t *testing.T) {
	t.Parallel()
	f := newFake()
	created := createsUnnamed(f)
	f.on("POST", "/widgets", created(), created(), reply(500, `{}`))
	p := mustPlan(t, newRequest("POST", "/widgets", `[{"id":"a","v":1},{"id":"b","v":1},{"id":"c","v":1}]`), concurrency(1))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: &memJournal{}}, noBackoff).do(context.Background()))
	equal(t, "outcome", w.Outcome, string(RollbackFailed))
}

// A POST restore (restore_deleted post) is not sent again within the
// compensation after an attempt that went unanswered (on an API that
// assigns ids, the first copy's item was a duplicate no report named).
func TestPostRestoreNotSentAgainAfterNoAnswer(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	f.on("DELETE", "/widgets/2", reply(500, `{}`))
	n := 0
	mk := func(_ context.Context, req *SubRequest) {
		n++
		f.put(widget(fmt.Sprint("new", n)), map[string]any{"id": fmt.Sprint("new", n), "name": "widget 1"})
	}
	f.on("POST", "/widgets", answer{hook: mk, err: errLost},
		answer{hook: mk, status: http.StatusCreated, body: `{"id":"new2","name":"widget 1"}`, header: http.Header{"Location": {"/widgets/new2"}}})
	res := run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), restoreByPost, compensationRetries(1))
	if w := write(t, res); n > 1 || w.Items[0].Outcome != "rollback_failed" {
		t.Errorf("the POST restore was sent %d times, item 0 %s; want once, rollback_failed (what it made, if anything, is not known); store %v", n, w.Items[0].Outcome, f.state())
	}
}

// A create answered 303 See Other naming an existing item (RFC 9110
// §9.3.3 lets an API point a create at an existing equivalent item): its
// read holds what the element sent, which proves nothing, and the item
// is left, never deleted (it was, though the batch never wrote it).
func TestCreate303ToAnExistingItemIsNotDeleted(t *testing.T) {
	t.Parallel()
	f := newFake().put(widget("7"), map[string]any{"id": "7", "name": "x", "color": "red"})
	f.on("POST", "/widgets", reply(http.StatusSeeOther, ``, "Location", "/widgets/7"), answer{}, reply(500, `{}`))
	before := f.state()
	res := run1(t, "POST", "/widgets", `[{"name":"x","color":"red"},{"name":"y"},{"name":"z"}]`, f, concurrency(1))
	if w := write(t, res); w.Items[0].Outcome != "rollback_failed" {
		t.Errorf("item 0 %s, want rollback_failed: what the redirect names may not be the batch's", w.Items[0].Outcome)
	}
	if _, ok := f.state()[widget("7")]; !ok {
		t.Errorf("item 7, which existed before the batch, was deleted by its undo (before: %v)", before)
	}
}

// restore_updated patch on an API that applies PATCH as RFC 7396
// (nested objects merged): the restore removes a nested member the batch
// added (it sent the pre-image's value of each member, which left the
// added one, and answered rolled_back).
func TestPatchRestoreRemovesANestedMemberAdded(t *testing.T) {
	t.Parallel()
	f := newFake().put(widget("1"), map[string]any{"id": "1", "address": map[string]any{"city": "A"}}).seed("2")
	rfc7396 := answer{hook: func(_ context.Context, req *SubRequest) {
		f.mu.Lock()
		cur, _ := json.Marshal(f.records[widget("1")])
		f.mu.Unlock()
		var rec map[string]any
		_ = json.Unmarshal(jsonvalue.MergePatch(cur, req.Body), &rec)
		f.put(widget("1"), rec)
	}, status: http.StatusNoContent}
	f.on("PATCH", "/widgets/1", rfc7396)
	f.on("PATCH", "/widgets/2", reply(500, `{}`))
	before := f.state()
	w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","address":{"country":"X"}},{"id":"2","v":1}]`, f, concurrency(1), restoreByPatch))
	equal(t, "item 0", w.Items[0].Outcome, "rolled_back")
	f.checkUnchanged(t, before)
}
