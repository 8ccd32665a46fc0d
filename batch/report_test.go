package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

var errLost = errors.New("connection reset by peer") // sent, no answer came

func notSent() error { return fmt.Errorf("dial tcp 10.0.0.1:3000: connection refused: %w", ErrNotSent) }

// statusCase is one row of the status table (docs/wire-format.md, "Batch
// requests and responses"), with the item outcomes
// it produces.
type statusCase struct {
	name           string
	method, target string
	body           string
	mods           []specMod
	fake           func() *fakeAPI
	status         int
	outcome        string
	items          []string // item outcomes, in request order
	itemStatus     []int
	problem        bool // application/problem+json, else application/json
}

func TestBatchStatus(t *testing.T) {
	t.Parallel()
	seeded := func() *fakeAPI { return newFake().seed("1", "2", "3") }
	tests := []statusCase{
		// every item succeeded → 200 (batch CREATE: 201)
		{name: "every item succeeded: get", method: "GET", target: "/widgets?ids=1,2", fake: seeded,
			status: 200, outcome: "succeeded", items: []string{"succeeded", "succeeded"}, itemStatus: []int{200, 200}},
		{name: "every item succeeded: create", method: "POST", target: "/widgets", body: elements(2), fake: newFake,
			status: 201, outcome: "succeeded", items: []string{"succeeded", "succeeded"}, itemStatus: []int{201, 201}},
		{name: "every item succeeded: update", method: "PATCH", target: "/widgets", body: `[{"id":"1","name":"a"},{"id":2,"name":"b"}]`, fake: seeded,
			status: 200, outcome: "succeeded", items: []string{"succeeded", "succeeded"}, itemStatus: []int{200, 200}},
		{name: "every item succeeded: delete", method: "DELETE", target: "/widgets?ids=1,2,3", fake: seeded,
			status: 200, outcome: "succeeded", items: []string{"succeeded", "succeeded", "succeeded"}, itemStatus: []int{204, 204, 204}},
		{name: "every item succeeded: partial create", method: "POST", target: "/widgets", body: elements(2), mods: []specMod{partial}, fake: newFake,
			status: 201, outcome: "succeeded", items: []string{"succeeded", "succeeded"}, itemStatus: []int{201, 201}},

		// partial mode, some or all items failed → 207
		{name: "partial, some failed", method: "POST", target: "/widgets", body: elements(3), mods: []specMod{partial, concurrency(1)},
			fake: func() *fakeAPI {
				return newFake().on("POST", "/widgets", answer{}, reply(422, `{"error":"bad"}`), answer{})
			},
			status: 207, outcome: "partial", items: []string{"succeeded", "failed", "succeeded"}, itemStatus: []int{201, 422, 201}},
		{name: "partial, all failed", method: "GET", target: "/widgets?ids=8,9", mods: []specMod{partial}, fake: seeded,
			status: 207, outcome: "failed", items: []string{"failed", "failed"}, itemStatus: []int{404, 404}},
		{name: "partial, a write unanswered", method: "DELETE", target: "/widgets?ids=1,2", mods: []specMod{partial, concurrency(1)},
			fake:   func() *fakeAPI { return seeded().on("DELETE", "/widgets/2", answer{err: errLost}) },
			status: 207, outcome: "partial", items: []string{"succeeded", "unknown"}, itemStatus: []int{204, 502}},

		// all_or_nothing failed and everything done was undone → the first
		// failing item's 4xx; 502 for an upstream 5xx or unreachable
		// upstream; 504 for a timeout
		{name: "all_or_nothing, a 4xx, undone", method: "POST", target: "/widgets", body: elements(3), mods: []specMod{concurrency(1)},
			fake: func() *fakeAPI {
				return newFake().on("POST", "/widgets", answer{}, reply(409, `{"error":"conflict"}`))
			},
			status: 409, outcome: "rolled_back", items: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: []int{201, 409, 0}, problem: true},
		{name: "all_or_nothing, a 4xx with nothing to undo", method: "POST", target: "/widgets", body: elements(2), mods: []specMod{concurrency(1)},
			fake:   func() *fakeAPI { return newFake().on("POST", "/widgets", reply(400, `{"error":"bad"}`)) },
			status: 400, outcome: "failed", items: []string{"failed", "not_attempted"}, itemStatus: []int{400, 0}, problem: true},
		{name: "all_or_nothing, the first failing item by index, not by time", method: "PATCH", target: "/widgets",
			body: `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`, mods: []specMod{concurrency(3)},
			fake: func() *fakeAPI {
				thirdFailed := make(chan struct{})
				return seeded().
					on("PATCH", "/widgets/2", answer{status: 422, body: `{}`, hook: func(context.Context, *SubRequest) { <-thirdFailed }}).
					on("PATCH", "/widgets/3", answer{status: 409, body: `{}`, hook: func(context.Context, *SubRequest) { close(thirdFailed) }})
			},
			status: 422, outcome: "rolled_back", items: []string{"rolled_back", "failed", "failed"}, itemStatus: []int{200, 422, 409}, problem: true},
		{name: "all_or_nothing, an upstream 5xx", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`, mods: []specMod{concurrency(1)},
			fake:   func() *fakeAPI { return seeded().on("PATCH", "/widgets/2", reply(503, `{}`)) },
			status: 502, outcome: "rolled_back", items: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: []int{200, 503, 0}, problem: true},
		{name: "all_or_nothing, an upstream 500 on a delete", method: "DELETE", target: "/widgets?ids=1,2", mods: []specMod{concurrency(1)},
			fake:   func() *fakeAPI { return seeded().on("DELETE", "/widgets/2", reply(500, `oops`)) },
			status: 502, outcome: "rolled_back", items: []string{"rolled_back", "failed"}, itemStatus: []int{204, 500}, problem: true},
		{name: "all_or_nothing, upstream unreachable (ErrNotSent)", method: "POST", target: "/widgets", body: elements(3), mods: []specMod{concurrency(1)},
			fake:   func() *fakeAPI { return newFake().on("POST", "/widgets", answer{}, answer{err: notSent()}) },
			status: 502, outcome: "rolled_back", items: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: []int{201, 502, 0}, problem: true},
		{name: "all_or_nothing, item timeout", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`,
			mods: []specMod{concurrency(1), itemTimeout(50 * time.Millisecond)},
			fake: func() *fakeAPI { return seeded().on("PATCH", "/widgets/2", answer{hang: true}) },
			// The hung write never took effect: a read shows the item as
			// before, so only item 0 is undone.
			status: 504, outcome: "rolled_back", items: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: []int{200, 504, 0}, problem: true},

		// all_or_nothing failed and something could not be undone → 500
		{name: "all_or_nothing, an undo failed", method: "POST", target: "/widgets", body: elements(3), mods: []specMod{concurrency(1), compensationRetries(1)},
			fake: func() *fakeAPI {
				return newFake().on("POST", "/widgets", answer{}, reply(409, `{}`)).on("DELETE", "/widgets/1000", reply(503, ``))
			},
			status: 500, outcome: "rollback_failed", items: []string{"rollback_failed", "failed", "not_attempted"}, itemStatus: []int{201, 409, 0}, problem: true},
		{name: "all_or_nothing, an unknown create with no id", method: "POST", target: "/widgets", body: elements(2), mods: []specMod{concurrency(1)},
			fake:   func() *fakeAPI { return newFake().on("POST", "/widgets", answer{}, answer{err: errLost}) },
			status: 500, outcome: "rollback_failed", items: []string{"rolled_back", "rollback_failed"}, itemStatus: []int{201, 502}, problem: true},

		// A batch GET in all_or_nothing mode fails as a whole.
		{name: "all_or_nothing GET, an item missing", method: "GET", target: "/widgets?ids=1,9,2", mods: []specMod{concurrency(1)}, fake: seeded,
			status: 404, outcome: "failed", items: []string{"succeeded", "failed", "not_attempted"}, itemStatus: []int{200, 404, 0}, problem: true},
		{name: "all_or_nothing GET, an upstream 500", method: "GET", target: "/widgets?ids=1,2", mods: []specMod{concurrency(1)},
			fake:   func() *fakeAPI { return seeded().on("GET", "/widgets/1", reply(500, `boom`)) },
			status: 502, outcome: "failed", items: []string{"failed", "not_attempted"}, itemStatus: []int{500, 0}, problem: true},
		{name: "partial GET, every item stands", method: "GET", target: "/widgets?ids=1,9,2", mods: []specMod{partial, concurrency(1)}, fake: seeded,
			status: 207, outcome: "partial", items: []string{"succeeded", "failed", "succeeded"}, itemStatus: []int{200, 404, 200}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake()
			res := run(mustPlan(t, newRequest(tt.method, tt.target, tt.body), tt.mods...), f)
			w := write(t, res)
			equal(t, "status", w.Code, tt.status)
			equal(t, "outcome", w.Outcome, tt.outcome)
			equalSlices(t, "item outcomes", w.Outcomes(), tt.items)
			equalSlices(t, "item statuses", w.Statuses(), tt.itemStatus)
			w.checkIndices(t, len(tt.items))
			succeeded := strings.Count(strings.Join(w.Outcomes(), " "), "succeeded")
			equal(t, "succeeded member", w.Succeeded, succeeded)
			equal(t, "Result.Status", res.Status, tt.status)
			if tt.problem {
				equal(t, "Content-Type", w.ContentType, "application/problem+json")
				equal(t, "problem status", w.Status, tt.status)
				equal(t, "problem title", w.Title, http.StatusText(tt.status))
				if !strings.HasPrefix(w.Type, "https://") || w.Detail == "" {
					t.Errorf("problem type %q, detail %q", w.Type, w.Detail)
				}
				equal(t, "atomicity", w.Atomicity, "all_or_nothing")
			} else {
				equal(t, "Content-Type", w.ContentType, "application/json")
				if w.Type != "" || w.Detail != "" {
					t.Errorf("a non-problem answer has type %q, detail %q", w.Type, w.Detail)
				}
			}
			for _, it := range w.Items {
				if it.Outcome == "not_attempted" && (it.Status != 0 || it.Body != nil || it.BodyText != "") {
					t.Errorf("not_attempted item %d carries a response: %+v", it.Index, it)
				}
			}
		})
	}
}

// The detail of a failed batch names the first failing item: its index,
// its id and its status.
func TestFailedBatchDetail(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3").on("PATCH", "/widgets/2", reply(409, `{}`))
	w := write(t, run(mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`), concurrency(1)), f))
	for _, s := range []string{"item 1", `"2"`, "409"} {
		if !strings.Contains(w.Detail, s) {
			t.Errorf("detail %q does not name %s", w.Detail, s)
		}
	}
	equal(t, "failed member", w.Failed, 1)
}
