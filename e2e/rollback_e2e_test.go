package e2e

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// faultSite runs batches one item at a time, so a fault aimed at the
// second item always finds the first applied and the third not started.
const faultSite = `
	batch {
		concurrency          1
		item_timeout         300ms
		compensation_retries 2
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/gadgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

const htmlError = `<!DOCTYPE html><html><head><title>500 Internal Server Error</title></head><body><h1>Internal Server Error</h1><p>the legacy stack fell over</p></body></html>`

// TestBatchAllOrNothingFaults fails the second of three items of an
// all-or-nothing CREATE, UPDATE or DELETE in each way an upstream can
// fail, and checks the batch's answer and, above all, that the legacy API
// ends as it began.
func TestBatchAllOrNothingFaults(t *testing.T) {
	const (
		widgets = "/api/widgets"
		gadgets = "/api/gadgets"
	)
	updateBody := func(second string) string {
		return `[{"id": 1, "name": "one"}, {"id": 2, "name": ` + second + `}, {"id": 3, "name": "three"}]`
	}
	createBody := func(second string) string {
		return `[{"name": "first"}, ` + second + `, {"name": "third"}]`
	}
	tests := []struct {
		name         string
		method, path string
		body         string
		collection   string
		faults       []legacyapi.Fault
		status       []int    // the batch's status: any of these
		outcomes     []string // per item; "" is any
		itemStatus   int      // the failing item's (index 1) status; 0 is any
		bodyText     string   // the failing item's body_text holds this
		itemError    string   // the failing item's error holds this
		compensated  bool     // the failing item was undone too
		notSent      string   // the path item 2 would have written
	}{
		// UPDATE
		{name: "update, 4xx: the legacy API's own 422 page", method: "PATCH", path: widgets, body: updateBody(`""`), collection: widgets,
			status: []int{422}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 422, bodyText: "Validation failed", notSent: "/api/widgets/3"},
		{name: "update, 5xx with an HTML page", method: "PATCH", path: widgets, body: updateBody(`"two"`), collection: widgets,
			faults: []legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Status: 500, Body: htmlError}},
			status: []int{502}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 500, bodyText: htmlError, notSent: "/api/widgets/3"},
		{name: "update, hangs past item_timeout after it was applied", method: "PATCH", path: widgets, body: updateBody(`"two"`), collection: widgets,
			faults: []legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Hang: true, AfterApply: true}},
			status: []int{504}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 504, compensated: true, notSent: "/api/widgets/3"},
		{name: "update, connection dropped after it was applied", method: "PATCH", path: widgets, body: updateBody(`"two"`), collection: widgets,
			faults: []legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Drop: true, AfterApply: true}},
			status: []int{502}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 502, compensated: true, notSent: "/api/widgets/3"},
		// A proxy in front of the legacy API answers 502 or 504 when the
		// API's own answer does not reach it: the write may have been
		// applied, so the saga reads the item to learn, and undoes it.
		{name: "update, a proxy's 502 after it was applied", method: "PATCH", path: widgets, body: updateBody(`"two"`), collection: widgets,
			faults: []legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Status: 502, Body: htmlError, AfterApply: true}},
			status: []int{502}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 502, bodyText: htmlError, compensated: true, notSent: "/api/widgets/3"},
		{name: "update, a proxy's 504, not applied", method: "PATCH", path: widgets, body: updateBody(`"two"`), collection: widgets,
			faults: []legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Status: 504, Body: htmlError}},
			status: []int{504}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 504, itemError: "did not take effect", notSent: "/api/widgets/3"},
		// Dropped once: Go's transport may resend the PATCH (it carries an
		// Idempotency-Key) on a new connection, and then it succeeds; the
		// third item fails either way, so the batch must end undone.
		{name: "update, connection dropped once after it was applied", method: "PATCH", path: widgets,
			body: `[{"id": 1, "name": "one"}, {"id": 2, "name": "two"}, {"id": 3, "name": ""}]`, collection: widgets,
			faults: []legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/2", Drop: true, AfterApply: true, Times: 1}},
			status: []int{502, 422}, outcomes: []string{"rolled_back", "rolled_back", ""}, compensated: true},

		// CREATE
		{name: "create, 4xx: the legacy API's own 422 page", method: "POST", path: widgets, body: createBody(`{"name": ""}`), collection: widgets,
			status: []int{422}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 422, bodyText: "Validation failed"},
		{name: "create, 5xx with an HTML page", method: "POST", path: widgets, body: createBody(`{"name": "second"}`), collection: widgets,
			faults: []legacyapi.Fault{passThrough("POST", widgets, 1), {Method: "POST", Path: widgets, Status: 500, Body: htmlError, Times: 1}},
			status: []int{502}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 500, bodyText: htmlError},
		{name: "create, hangs past item_timeout after it was applied (id known)", method: "POST", path: widgets,
			body: createBody(`{"id": 700, "name": "second"}`), collection: widgets,
			faults: []legacyapi.Fault{passThrough("POST", widgets, 1), {Method: "POST", Path: widgets, Hang: true, AfterApply: true, Times: 1}},
			status: []int{504}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 504, compensated: true},
		{name: "create, a proxy's 504 after it was applied (id known)", method: "POST", path: widgets,
			body: createBody(`{"id": 700, "name": "second"}`), collection: widgets,
			faults: []legacyapi.Fault{passThrough("POST", widgets, 1), {Method: "POST", Path: widgets, Status: 504, Body: htmlError, AfterApply: true, Times: 1}},
			status: []int{504}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 504, compensated: true},
		{name: "create, connection dropped after it was applied (id known)", method: "POST", path: widgets,
			body: createBody(`{"id": 700, "name": "second"}`), collection: widgets,
			faults: []legacyapi.Fault{passThrough("POST", widgets, 1), {Method: "POST", Path: widgets, Drop: true, AfterApply: true}},
			status: []int{502}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 502, compensated: true},

		// DELETE (gadgets: PUT re-creates, so the default restore_deleted put works)
		{name: "delete, 4xx from the legacy API", method: "DELETE", path: gadgets + "?ids=1,2,3", collection: gadgets,
			faults: []legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/2", Status: 409, ContentType: "text/plain", Body: "locked"}},
			status: []int{409}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 409, bodyText: "locked", notSent: "/api/gadgets/3"},
		{name: "delete, 5xx with an HTML page", method: "DELETE", path: gadgets + "?ids=1,2,3", collection: gadgets,
			faults: []legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/2", Status: 503, Body: htmlError}},
			status: []int{502}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 503, bodyText: htmlError, notSent: "/api/gadgets/3"},
		{name: "delete, hangs past item_timeout after it was applied", method: "DELETE", path: gadgets + "?ids=1,2,3", collection: gadgets,
			faults: []legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/2", Hang: true, AfterApply: true}},
			status: []int{504}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 504, compensated: true, notSent: "/api/gadgets/3"},
		{name: "delete, a proxy's 502 after it was applied", method: "DELETE", path: gadgets + "?ids=1,2,3", collection: gadgets,
			faults: []legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/2", Status: 502, Body: htmlError, AfterApply: true}},
			status: []int{502}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 502, compensated: true, notSent: "/api/gadgets/3"},
		{name: "delete, connection dropped after it was applied", method: "DELETE", path: gadgets + "?ids=1,2,3", collection: gadgets,
			faults: []legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/2", Drop: true, AfterApply: true}},
			status: []int{502}, outcomes: []string{"rolled_back", "rolled_back", "not_attempted"}, itemStatus: 502, compensated: true, notSent: "/api/gadgets/3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := seededAPI()
			g := startGateway(t, api, faultSite)
			for _, f := range tt.faults {
				api.Inject(f)
			}
			before := api.Items(tt.collection)
			body := optionalBody(tt.body)
			r := g.do(t, tt.method, tt.path, body)
			if !slices.Contains(tt.status, r.Status) {
				t.Fatalf("status %d, want one of %v: %s", r.Status, tt.status, r.Body)
			}
			b := checkProblem(t, r, r.Status)
			if b.Outcome != "rolled_back" || b.Atomicity != "all_or_nothing" || b.Succeeded != 0 || b.Failed < 1 || len(b.Items) != 3 {
				t.Errorf("envelope: atomicity %q outcome %q succeeded %d failed %d, %d items; want all_or_nothing rolled_back 0 >=1 3",
					b.Atomicity, b.Outcome, b.Succeeded, b.Failed, len(b.Items))
			}
			for i, want := range tt.outcomes {
				if i < len(b.Items) && want != "" && b.Items[i].Outcome != want {
					t.Errorf("item %d outcome %q, want %q", i, b.Items[i].Outcome, want)
				}
			}
			if len(b.Items) == 3 {
				it := b.Items[1]
				if tt.itemStatus != 0 && it.Status != tt.itemStatus {
					t.Errorf("failing item status %d, want %d", it.Status, tt.itemStatus)
				}
				if tt.bodyText != "" && !strings.Contains(it.BodyText, tt.bodyText) {
					t.Errorf("failing item body_text %q, want it to hold %q", it.BodyText, tt.bodyText)
				}
				if tt.itemError != "" && !strings.Contains(it.Error, tt.itemError) {
					t.Errorf("failing item error %q, want it to hold %q", it.Error, tt.itemError)
				}
				if tt.compensated && (it.Compensation == nil || it.Compensation.Status < 200 || it.Compensation.Status > 299) {
					t.Errorf("failing item was not undone: compensation %+v", it.Compensation)
				}
				if c := b.Items[0].Compensation; c == nil || c.Status < 200 || c.Status > 299 {
					t.Errorf("item 0 was not undone: compensation %+v", c)
				}
			}
			sameState(t, api, tt.collection, before)
			if tt.notSent != "" {
				for _, req := range writes(api.Requests()) {
					if req.Path == tt.notSent {
						t.Errorf("the not-attempted item was written: %s %s", req.Method, req.Path)
					}
				}
			}
			if tt.method == "POST" && len(b.Items) == 3 && b.Items[2].Outcome == "not_attempted" {
				for _, req := range api.Requests() {
					if strings.Contains(string(req.Body), "third") {
						t.Errorf("the not-attempted element was sent: %s %s %s", req.Method, req.Path, req.Body)
					}
				}
			}
		})
	}
}

// TestBatchCreateUnknownWithoutID: a created item whose answer never came
// and whose id nobody knows cannot be undone. The batch must say so
// (500 rollback_failed naming the item, ERROR log line), and be exact:
// what it names is what is left behind, nothing more.
func TestBatchCreateUnknownWithoutID(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, faultSite)
	api.Inject(passThrough("POST", "/api/widgets", 1))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Hang: true, AfterApply: true, Times: 1})
	before := api.Items("/api/widgets")

	r := g.do(t, "POST", "/api/widgets", `[{"name": "first"}, {"name": "lost"}, {"name": "third"}]`)
	b := checkProblem(t, r, 500)
	if b.Outcome != "rollback_failed" {
		t.Errorf("outcome %q, want rollback_failed", b.Outcome)
	}
	if got, want := b.Outcomes(), []string{"rolled_back", "rollback_failed", "not_attempted"}; !slices.Equal(got, want) {
		t.Errorf("item outcomes %v, want %v", got, want)
	}
	if it := b.Items[1]; it.Status != 504 || it.ID != "" {
		t.Errorf("the hung item: status %d id %q, want 504 and no id", it.Status, it.ID)
	}
	if !mentionsItem(b.Detail, 1) {
		t.Errorf("detail %q does not name item 1", b.Detail)
	}
	after := api.Items("/api/widgets")
	answerMatchesState(t, b, before, after)
	var left []map[string]any
	for id, rec := range after {
		if _, ok := before[id]; !ok {
			left = append(left, rec)
		}
	}
	if len(left) != 1 || left[0]["name"] != "lost" || len(after) != len(before)+1 {
		t.Errorf("left behind %v, want exactly the hung item's record", left)
	}
	entries := testLogs.entries("http.handlers.batch")
	if len(entries) != 1 || entries[0]["level"] != "error" || entries[0]["outcome"] != "rollback_failed" {
		t.Fatalf("log entries %v, want one ERROR rollback_failed", entries)
	}
	if lb := fmt.Sprint(entries[0]["left_behind"]); !mentionsItem(lb, 1) || mentionsItem(lb, 0) {
		t.Errorf("left_behind %s, want item 1 alone", lb)
	}
}

// TestBatchPreflightMissingTarget: an UPDATE or DELETE of an id that does
// not exist fails with 404 before anything is written.
func TestBatchPreflightMissingTarget(t *testing.T) {
	for _, tc := range []struct{ name, method, path, body string }{
		{"update", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": 404, "name": "b"}, {"id": 3, "name": "c"}]`},
		{"delete", "DELETE", "/api/widgets?ids=1,404,3", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := seededAPI()
			g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
			restore_deleted post
		}
	}
	reverse_proxy UPSTREAM
`)
			before := api.Items("/api/widgets")
			var body any
			if tc.body != "" {
				body = tc.body
			}
			b := checkProblem(t, g.do(t, tc.method, tc.path, body), 404)
			if b.Outcome != "failed" || b.Items[1].Status != 404 || b.Items[1].Outcome != "failed" {
				t.Errorf("outcome %q, items %+v", b.Outcome, b.Items)
			}
			for i, it := range b.Items {
				if i != 1 && it.Outcome != "not_attempted" {
					t.Errorf("item %d outcome %q, want not_attempted", i, it.Outcome)
				}
			}
			if !mentionsItem(b.Detail, 1) {
				t.Errorf("detail %q does not name item 1", b.Detail)
			}
			if w := writes(api.Requests()); len(w) > 0 {
				t.Errorf("writes reached the legacy API: %s", describeRequests(w))
			}
			sameState(t, api, "/api/widgets", before)
		})
	}
}

// answerMatchesState fails the test unless the legacy API holds what the
// batch's answer says: every item for succeeded, nothing changed for
// rolled_back or failed, and for rollback_failed nothing changed but the
// items it names (a created item without an id can only be counted).
func answerMatchesState(t testing.TB, b batchAnswer, before, after map[string]map[string]any) {
	t.Helper()
	var added, gone, changed []string
	for id, rec := range after {
		if old, ok := before[id]; !ok {
			added = append(added, id)
		} else if !reflect.DeepEqual(old, rec) {
			changed = append(changed, id)
		}
	}
	for id := range before {
		if _, ok := after[id]; !ok {
			gone = append(gone, id)
		}
	}
	named, unnamed := map[string]bool{}, 0
	for _, it := range b.Items {
		if b.Outcome == "succeeded" || it.Outcome == "rollback_failed" || it.Outcome == "unknown" {
			if it.ID == "" {
				unnamed++
			}
			named[it.ID] = true
		}
	}
	var unexplained []string
	for _, id := range slices.Concat(added, gone, changed) {
		if !named[id] {
			unexplained = append(unexplained, id)
		}
	}
	switch b.Outcome {
	case "succeeded":
		if len(unexplained) > 0 {
			t.Errorf("the batch succeeded, but these records are not what its items say: %v (added %v, gone %v, changed %v)", unexplained, added, gone, changed)
		}
	case "rolled_back", "failed":
		if len(added)+len(gone)+len(changed) > 0 {
			t.Errorf("the batch says %s, but the legacy API was left changed: added %v, gone %v, changed %v", b.Outcome, added, gone, changed)
		}
	case "rollback_failed":
		if len(unexplained) > unnamed {
			t.Errorf("rollback_failed names %v (and %d items without id), but the legacy API was also left changed at %v", named, unnamed, unexplained)
		}
	default:
		t.Errorf("outcome %q", b.Outcome)
	}
}
