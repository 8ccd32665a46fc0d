package e2e

import (
	"net/http"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchWriteResentByTheTransport: the upstream applies a write and
// the connection drops before the answer. The request carries an
// Idempotency-Key and a GetBody, so Go's transport (under reverse_proxy)
// silently sends it again on a new connection, and the gateway only sees
// the answer to the copy: 404 for a DELETE, 409 for a CREATE with an id,
// a second 201 for a CREATE without one. Whatever the batch answers, it
// must be true of the legacy API's final state.
func TestBatchWriteResentByTheTransport(t *testing.T) {
	tests := []struct {
		name, method, path, body, collection string
		faults                               []legacyapi.Fault
	}{
		{"update", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": ""}]`, "/api/widgets",
			[]legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Drop: true, AfterApply: true, Times: 1}}},
		{"delete", "DELETE", "/api/gadgets?ids=1,2,3", "", "/api/gadgets",
			[]legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/2", Drop: true, AfterApply: true, Times: 1}}},
		{"create with an id", "POST", "/api/widgets", `[{"name": "a"}, {"id": 700, "name": "b"}, {"name": "c"}]`, "/api/widgets",
			[]legacyapi.Fault{passThrough("POST", "/api/widgets", 1), {Method: "POST", Path: "/api/widgets", Drop: true, AfterApply: true, Times: 1}}},
		{"create without an id", "POST", "/api/widgets", `[{"name": "a"}, {"name": "b"}, {"name": "c"}]`, "/api/widgets",
			[]legacyapi.Fault{passThrough("POST", "/api/widgets", 1), {Method: "POST", Path: "/api/widgets", Drop: true, AfterApply: true, Times: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := seededAPI()
			g := startGateway(t, api, faultSite)
			g.do(t, "GET", "/api/widgets/20", nil) // an idle connection to reuse
			for _, f := range tt.faults {
				api.Inject(f)
			}
			before := api.Items(tt.collection)
			body := optionalBody(tt.body)
			r := g.do(t, tt.method, tt.path, body)
			b := r.batch(t)
			answerMatchesState(t, b, before, api.Items(tt.collection))
			if t.Failed() {
				t.Logf("answer: %d %s", r.Status, r.Body)
			}
		})
	}
}

// TestUndoAppliedButUnanswered: with strong ETags, an undo's first
// attempt takes effect but a proxy answers it 502, so the retry's
// condition fails on the undo's own result (412). The item is as the
// undo leaves it, and is reported rolled_back, not left behind.
func TestUndoAppliedButUnanswered(t *testing.T) {
	for _, op := range []struct {
		name, method, path, body, collection, undo, undone string
	}{
		{"update, restored by put", "PATCH", "/api/widgets", `[{"id": 1, "name": "one"}, {"id": 2, "name": ""}]`, "/api/widgets", "PUT", "/api/widgets/1"},
		{"delete, re-created by put", "DELETE", "/api/gadgets?ids=1,2", "", "/api/gadgets", "PUT", "/api/gadgets/1"},
	} {
		t.Run(op.name, func(t *testing.T) {
			api := legacyapi.NewRecording(
				legacyapi.Collection{Path: "/api/widgets", ETags: true, Seed: records("w", 1, 3)},
				legacyapi.Collection{Path: "/api/gadgets", ETags: true, PutCreates: true, Seed: records("g", 1, 3)},
			)
			g := startGateway(t, api, faultSite)
			if op.collection == "/api/gadgets" {
				api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/2", Status: 409, ContentType: "text/plain", Body: "locked"})
			}
			api.Inject(legacyapi.Fault{Method: op.undo, Path: op.undone, Status: 502, Body: htmlError, AfterApply: true, Times: 1})
			before := api.Items(op.collection)
			var body any
			if op.body != "" {
				body = op.body
			}
			r := g.do(t, op.method, op.path, body)
			b := checkProblem(t, r, r.Status)
			if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" {
				t.Fatalf("outcome %q, item 0 %q (compensation %+v), want rolled_back: %s", b.Outcome, b.Items[0].Outcome, b.Items[0].Compensation, r.Body)
			}
			if c := b.Items[0].Compensation; c == nil || c.Attempts != 2 || c.Status != http.StatusPreconditionFailed {
				t.Errorf("compensation %+v, want two attempts, the second answered 412", c)
			}
			sameState(t, api, op.collection, before)
		})
	}
}
