package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// admitEnvelopeJob admits body as an envelope job on shop, its items
// gathered.
func admitEnvelopeJob(t *testing.T, e *Envelope, body string, header ...string) (*JobPlan, []ItemSnapshot, *problemView) {
	t.Helper()
	var items []ItemSnapshot
	plan, prob, err := AdmitEnvelopeJob(newRequest("POST", "/batch", body, header...), e, testJobLimits(), func(first int, chunk []ItemSnapshot) error {
		if first != len(items) {
			t.Fatalf("chunk at %d, want %d", first, len(items))
		}
		items = append(items, chunk...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if prob != nil {
		rec := httptest.NewRecorder()
		if err := prob.Write(rec); err != nil {
			t.Fatal(err)
		}
		return nil, nil, decodeProblem(t, rec)
	}
	return plan, items, nil
}

func testJobLimits() JobLimits {
	return JobLimits{MaxItems: 100000, MaxAtomic: 5000, MaxBody: 64 << 20, MaxElement: 1 << 20}
}

// An envelope job's operations are kept as the client wrote them, with
// the job indexes of what each depends on; the object and JSON Lines
// give the same items and digest.
func TestEnvelopeJobAdmitsOperationsAsTheyCome(t *testing.T) {
	ops := []string{
		`{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}}`,
		`{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"title": "hello", "author_id": "$u#/id"}}`,
		`{"id": "g", "method": "GET", "url": "/users/7", "depends_on": ["p"]}`,
	}
	e := shop(t, func(s *policy.Settings) { s.AllowOverride = true })
	object, items, prob := admitEnvelopeJob(t, e, `{"atomicity": "partial", "operations": [`+strings.Join(ops, ",")+`]}`)
	if prob != nil {
		t.Fatalf("refused: %d %s", prob.Status, prob.Detail)
	}
	lines, lineItems, prob := admitEnvelopeJob(t, e, strings.Join(ops, "\n"), "Content-Type", ndjson, "Prefer", "atomicity=partial")
	if prob != nil {
		t.Fatalf("JSON Lines refused: %d %s", prob.Status, prob.Detail)
	}
	if object.Items != 3 || object.Atomicity != policy.Partial || object.Spec.Op != "envelope" || object.Spec.Path != "/batch" {
		t.Errorf("plan %+v, want 3 partial operations of the envelope /batch", object)
	}
	if string(object.Digest) != string(lines.Digest) || len(lineItems) != 3 {
		t.Error("the object and JSON Lines of the same operations differ")
	}
	want := []struct {
		id   string
		deps string
	}{{"u", "[]"}, {"p", "[0]"}, {"g", "[1]"}}
	for i, w := range want {
		if items[i].OperationID != w.id || fmt.Sprint(items[i].Deps) != w.deps || string(items[i].Element) != ops[i] {
			t.Errorf("item %d: %q deps %v element %s; want %q deps %s, as sent", i, items[i].OperationID, items[i].Deps, items[i].Element, w.id, w.deps)
		}
	}
}

func TestEnvelopeJobRefusals(t *testing.T) {
	e := shop(t)
	for _, c := range []struct {
		name, body, ct string
		status         int
		says           string
	}{
		{"a later reference", `{"operations": [{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {}}, {"id": "u", "method": "POST", "url": "/users", "body": {}}]}`, "", 400, "no earlier operation"},
		{"a bad line", `{"id": "u", "method": "POST", "url": "/users", "body": {}}` + "\n" + `{"id": "u", "method": "POST", "url": "/users", "body": {}}`, ndjson, 400, "line 2"},
		{"atomicity after the operations", `{"operations": [{"id": "u", "method": "POST", "url": "/users", "body": {}}], "atomicity": "partial"}`, "", 400, "before \"operations\""},
		{"an unknown member", `{"operations": [], "ops": []}`, "", 400, `"ops"`},
		{"two writes of one item", `{"operations": [{"id": "a", "method": "PATCH", "url": "/users/7", "body": {}}, {"id": "b", "method": "DELETE", "url": "/users/7"}]}`, "", 400, "both write"},
		{"no operations", `{"operations": []}`, "", 400, "no operations"},
		{"a method the map refuses", `{"operations": [{"id": "r", "method": "POST", "url": "/reports", "body": {}}]}`, "", 405, "not allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			header := []string{}
			if c.ct != "" {
				header = append(header, "Content-Type", c.ct)
			}
			_, _, prob := admitEnvelopeJob(t, e, c.body, header...)
			if prob == nil || prob.Status != c.status || !strings.Contains(prob.Detail, c.says) {
				t.Errorf("got %+v, want %d saying %q", prob, c.status, c.says)
			}
		})
	}
}

// A window of an envelope job runs its operations with what those
// before it did: a reference to one in an earlier window is filled from
// its result, one that depends on an earlier one that failed is not
// attempted (424), and the items' indexes and keys are the job's.
func TestEnvelopeWindowUsesOperationsBeforeIt(t *testing.T) {
	api := newShopAPI("/users", "/users/7/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"}).put("/users/8", map[string]any{"id": 8, "name": "alan"})
	e := shop(t)
	_, items, prob := admitEnvelopeJob(t, e, strings.Join([]string{
		`{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}}`,
		`{"id": "x", "method": "POST", "url": "/users", "body": {"name": "bad"}}`,
		`{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"title": "hi", "by": "$u#/name"}}`,
		`{"id": "q", "method": "PATCH", "url": "/users/$u", "body": {"name": "ADA"}, "depends_on": ["p"]}`,
		`{"id": "y", "method": "PATCH", "url": "/users/8", "body": {"name": "G"}, "depends_on": ["x"]}`,
	}, "\n"), "Content-Type", ndjson, "Prefer", "atomicity=partial")
	if prob != nil {
		t.Fatalf("refused: %s", prob.Detail)
	}
	done := map[int]ItemResult{
		0: {Index: 0, OperationID: "u", ID: "7", Outcome: Succeeded, Body: json.RawMessage(`{"id":7,"name":"grace"}`)},
		1: {Index: 1, OperationID: "x", Outcome: Failed, Status: 422},
	}
	w := &Snapshot{Version: SnapshotVersion, Op: "envelope", Path: "/batch", Key: "job", Base: 2, Items: items[2:]}
	res, err := ExecuteWindow(context.Background(), w, Site{Runtime: Runtime{Send: api, Locks: &itemlock.Local{}}, Lookup: e.Lookup, Envelope: e},
		WindowOpts{Done: done})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, it := range res.Items {
		got = append(got, fmt.Sprintf("%d %s %s %d", it.Index, it.OperationID, it.Outcome, it.Status))
	}
	equalSlices(t, "items", got, []string{"2 p succeeded 201", "3 q succeeded 200", "4 y not_attempted 424"})
	if !strings.Contains(res.Items[2].Error, `"x"`) {
		t.Errorf("y's error %q, want it to name x", res.Items[2].Error)
	}
	posts := api.sentWith(http.MethodPost)
	if len(posts) != 1 || posts[0].Path != "/users/7/posts" || !strings.Contains(string(posts[0].Body), `"by":"grace"`) || posts[0].Header.Get("Idempotency-Key") != "job:2" {
		t.Errorf("sent %v, want p's create under user 7, filled from u's answer, with the job's key for item 2", api.sent())
	}
}

// An all-or-nothing envelope window locks and preflights what it knows,
// stops at a failure, and is undone from its log: dependents first, the
// operations before it left to their own windows' undo.
func TestEnvelopeWindowAllOrNothingUndone(t *testing.T) {
	api := newShopAPI("/users", "/users/7/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"}).put("/users/8", map[string]any{"id": 8, "name": "alan"})
	api.on("PATCH", "/users/8", answer{status: 422, body: `{"error":"no"}`})
	e := shop(t)
	_, items, prob := admitEnvelopeJob(t, e, strings.Join([]string{
		`{"id": "u", "method": "PUT", "url": "/users/7", "body": {"id": 7, "name": "grace"}}`,
		`{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"title": "hi"}}`,
		`{"id": "q", "method": "PATCH", "url": "/users/8", "body": {"name": "A"}, "depends_on": ["p"]}`,
	}, "\n"), "Content-Type", ndjson)
	if prob != nil {
		t.Fatalf("refused: %s", prob.Detail)
	}
	before := api.state()
	done := map[int]ItemResult{0: {Index: 0, OperationID: "u", ID: "7", Outcome: Succeeded}}
	w := &Snapshot{Version: SnapshotVersion, Op: "envelope", Path: "/batch", Key: "job", Base: 1, Items: items[1:]}
	j := &windowJournal{}
	site := Site{Runtime: Runtime{Send: api, Locks: &itemlock.Local{}, Journal: j}, Lookup: e.Lookup, Envelope: e}
	res, err := ExecuteWindow(context.Background(), w, site, WindowOpts{Done: done, AllOrNothing: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Items[0].Outcome != Succeeded || res.Items[1].Outcome != Failed {
		t.Fatalf("outcomes %s %s, want p created, q failed", res.Items[0].Outcome, res.Items[1].Outcome)
	}
	undone, err := UndoWindow(context.Background(), j.logged(t, w), site, WindowOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if undone.Items[0].Outcome != RolledBack || undone.Items[1].Outcome != Failed {
		t.Errorf("after the undo %s %s, want p rolled_back, q failed", undone.Items[0].Outcome, undone.Items[1].Outcome)
	}
	api.checkUnchanged(t, before)
}

// An envelope's saga resumed from a journal that recorded an operation
// whose references could not be filled (settled failed, no target) is
// finished without touching it: recovery used to take every started
// item for one with a target.
func TestResumeEnvelopeWithAnUnfilledOperation(t *testing.T) {
	api := newShopAPI("/users", "/users/7/posts").put("/users/7", map[string]any{"id": 7, "name": "grace"})
	before := api.state()
	e := shop(t)
	p, prob := admitEnvelope(t, e, `{"operations": [
		{"id": "u", "method": "PUT", "url": "/users/7", "body": {"id": 7, "name": "Grace"}},
		{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"by": "$u#/missing"}}
	]}`)
	if prob != nil {
		t.Fatalf("refused: %s", prob.Detail)
	}
	j := &memJournal{}
	res := Run(context.Background(), p, Runtime{Send: api, Journal: j, Locks: &itemlock.Local{}})
	if res.Outcome != RolledBack || res.Items[1].Status != http.StatusBadRequest {
		t.Fatalf("the envelope: %s, p %d; want rolled_back, p failing to fill", res.Outcome, res.Items[1].Status)
	}
	again, err := Resume(context.Background(), j.stored(t), e.Lookup, e, Runtime{Send: api, Journal: &memJournal{snap: j.stored(t)}, Locks: &itemlock.Local{}})
	if err != nil {
		t.Fatal(err)
	}
	if again.Outcome != RolledBack {
		t.Errorf("resumed: %s, want rolled_back", again.Outcome)
	}
	api.checkUnchanged(t, before)
}
