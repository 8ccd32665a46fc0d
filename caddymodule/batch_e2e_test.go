package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/problem"
)

// The end-to-end tests of batch operations: a real Caddy, a real
// reverse_proxy, and the fake legacy API over loopback. Their key
// assertion is always the legacy API's final state: what a batch left
// there, whatever it answered.

// batchAnswer is a batch response (the envelope, or problem details with
// the envelope's members).
type batchAnswer = batchwire.Response

// batch decodes a batch answer, failing the test if it is not one.
func (r response) batch(t testing.TB) batchAnswer {
	t.Helper()
	var b batchAnswer
	if err := json.Unmarshal(r.Body, &b); err != nil {
		t.Fatalf("the answer is not a batch response: %v\n%s", err, r.Body)
	}
	return b
}

// checkProblem checks a failed batch's answer: problem+json (RFC 9457)
// with the status repeated in the body and a detail.
func checkProblem(t testing.TB, r response, status int) batchAnswer {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != problem.ContentType {
		t.Errorf("Content-Type %q, want %q", ct, problem.ContentType)
	}
	b := r.batch(t)
	if b.Status != status || b.Title != http.StatusText(status) || !strings.HasPrefix(b.Type, "https://") || b.Detail == "" {
		t.Errorf("problem members type %q title %q status %d detail %q", b.Type, b.Title, b.Status, b.Detail)
	}
	return b
}

// checkEnvelope checks a batch's JSON envelope (not problem+json).
func checkEnvelope(t testing.TB, r response, status int, outcome string) batchAnswer {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	b := r.batch(t)
	if b.Outcome != outcome {
		t.Errorf("outcome %q, want %q: %s", b.Outcome, outcome, r.Body)
	}
	return b
}

// records makes seed records {"id": n, "name": prefix+n} for n in [from, to].
func records(prefix string, from, to int) []map[string]any {
	var out []map[string]any
	for n := from; n <= to; n++ {
		out = append(out, map[string]any{"id": n, "name": prefix + strconv.Itoa(n)})
	}
	return out
}

// seededAPI serves /api/widgets (PUT cannot create, as in many legacy
// APIs) and /api/gadgets (PUT creates), 20 records each, and an empty
// /api/gizmos.
func seededAPI() *legacyapi.API {
	return legacyapi.New(
		legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 20)},
		legacyapi.Collection{Path: "/api/gadgets", PutCreates: true, Seed: records("g", 1, 20)},
		legacyapi.Collection{Path: "/api/gizmos", PutCreates: true, Seed: records("z", 1, 3)},
	)
}

// passThrough lets the next n requests of method on path through
// untouched, so that a fault injected after it hits request n+1: the
// way to aim a fault at one element of a batch CREATE, whose elements
// all go to the collection's path.
func passThrough(method, path string, n int) legacyapi.Fault {
	return legacyapi.Fault{Method: method, Path: path, Times: n}
}

// writes returns the requests that were not reads.
func writes(reqs []legacyapi.Request) []legacyapi.Request {
	var out []legacyapi.Request
	for _, r := range reqs {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			out = append(out, r)
		}
	}
	return out
}

func describeRequests(reqs []legacyapi.Request) string {
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "\n  %s %s %s", r.Method, r.Path, r.Body)
	}
	return b.String()
}

// decodeJSON decodes raw JSON (numbers as float64), for comparisons that
// do not care how a number was written.
func decodeJSON(t testing.TB, raw []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, raw)
	}
	return v
}

// sameJSON reports whether a and b (Go values or raw JSON) encode the same
// JSON value.
func sameJSON(t testing.TB, a, b any) bool {
	t.Helper()
	enc := func(v any) any {
		raw, ok := v.([]byte)
		if r, isRaw := v.(json.RawMessage); isRaw {
			raw, ok = r, true
		}
		if !ok {
			var err error
			if raw, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		return decodeJSON(t, raw)
	}
	return reflect.DeepEqual(enc(a), enc(b))
}

// sameState fails the test unless the collection holds exactly what it
// held before.
func sameState(t testing.TB, api *legacyapi.API, collection string, before map[string]map[string]any) {
	t.Helper()
	after := api.Items(collection)
	if reflect.DeepEqual(before, after) {
		return
	}
	for id, rec := range after {
		if old, ok := before[id]; !ok {
			t.Errorf("%s: %s was left behind (orphan): %v", collection, id, rec)
		} else if !reflect.DeepEqual(old, rec) {
			t.Errorf("%s: %s is %v, want its pre-image %v", collection, id, rec, old)
		}
	}
	for id, rec := range before {
		if _, ok := after[id]; !ok {
			t.Errorf("%s: %s was deleted and not restored (was %v)", collection, id, rec)
		}
	}
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// received reports whether the fake API has received method path.
func received(api *legacyapi.API, method, path string) bool {
	for _, r := range api.Requests() {
		if r.Method == method && r.Path == path {
			return true
		}
	}
	return false
}

// mentionsItem reports whether a problem's detail names item index, as
// "item 3" or "items 1 and 3".
func mentionsItem(detail string, index int) bool {
	return regexp.MustCompile(`\bitems? (\d+ and )?` + strconv.Itoa(index) + `\b`).MatchString(detail)
}

const resourceMethods = `
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE`

// TestBatchOperationsSucceed runs each of the four batch operations end
// to end and checks the answer, what the legacy API received, and what it
// holds afterwards.
func TestBatchOperationsSucceed(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)

	t.Run("GET: request order, duplicates fetched once, other query parameters kept", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "GET", "/api/widgets?ids=3,1,3,2&fields=name&x=a%20b", nil)
		b := checkEnvelope(t, r, 200, "succeeded")
		if b.Atomicity != "all_or_nothing" || b.Succeeded != 4 || b.Failed != 0 || len(b.Items) != 4 {
			t.Fatalf("envelope %s", r.Body)
		}
		for i, id := range []int{3, 1, 3, 2} {
			it := b.Items[i]
			if it.Index != i || it.ID != strconv.Itoa(id) || it.Status != 200 || it.Outcome != "succeeded" ||
				!sameJSON(t, it.Body, map[string]any{"id": id, "name": "w" + strconv.Itoa(id)}) {
				t.Errorf("item %d: %+v (body %s), want widget %d", i, it, it.Body, id)
			}
		}
		reqs := api.Requests()
		var paths []string
		for _, req := range reqs {
			paths = append(paths, req.Method+" "+req.Path)
			if req.RawQuery != "fields=name&x=a%20b" {
				t.Errorf("%s %s?%s: the other query parameters were not kept as sent", req.Method, req.Path, req.RawQuery)
			}
		}
		slices.Sort(paths)
		if want := []string{"GET /api/widgets/1", "GET /api/widgets/2", "GET /api/widgets/3"}; !slices.Equal(paths, want) {
			t.Errorf("the legacy API received %v, want %v (each id once)", paths, want)
		}
	})

	t.Run("CREATE: 201, ids from the absolute Location, the records exist", func(t *testing.T) {
		api.ResetLog()
		before := api.Items("/api/widgets")
		elems := []map[string]any{{"name": "new-a"}, {"name": "new-b", "color": "red"}, {"name": "new-c"}}
		r := g.do(t, "POST", "/api/widgets", elems)
		b := checkEnvelope(t, r, 201, "succeeded")
		if b.Succeeded != 3 || len(b.Items) != 3 {
			t.Fatalf("envelope %s", r.Body)
		}
		after := api.Items("/api/widgets")
		if len(after) != len(before)+3 {
			t.Errorf("the legacy API holds %d widgets, want %d", len(after), len(before)+3)
		}
		seen := map[string]bool{}
		for i, it := range b.Items {
			loc := it.Headers["Location"]
			if it.Status != 201 || it.Outcome != "succeeded" || !strings.HasPrefix(loc, "http://") {
				t.Errorf("item %d: %+v, want 201 with the upstream's absolute Location", i, it)
			}
			if it.ID == "" || !strings.HasSuffix(loc, "/api/widgets/"+it.ID) || seen[it.ID] {
				t.Errorf("item %d: id %q, Location %q", i, it.ID, loc)
			}
			seen[it.ID] = true
			rec, ok := after[it.ID]
			if _, existed := before[it.ID]; !ok || existed {
				t.Errorf("item %d: widget %s was not created", i, it.ID)
				continue
			}
			want := map[string]any{"id": json.Number(it.ID)}
			for k, v := range elems[i] {
				want[k] = v
			}
			if !sameJSON(t, rec, want) || !sameJSON(t, it.Body, want) {
				t.Errorf("item %d: the legacy API holds %v, the answer says %s, want %v", i, rec, it.Body, want)
			}
		}
		for _, req := range api.Requests() {
			if req.Method != "POST" || req.Path != "/api/widgets" || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/json") {
				t.Errorf("sub-request %s %s (Content-Type %q)", req.Method, req.Path, req.Header.Get("Content-Type"))
			}
		}
	})

	t.Run("UPDATE: PATCH per element, without the id field", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "PATCH", "/api/widgets", `[{"id": 4, "name": "four"}, {"color": "blue", "id": "5"}]`)
		b := checkEnvelope(t, r, 200, "succeeded")
		if len(b.Items) != 2 || b.Items[0].ID != "4" || b.Items[1].ID != "5" {
			t.Fatalf("envelope %s", r.Body)
		}
		for _, tc := range []struct {
			id    string
			patch map[string]any
			rec   map[string]any
		}{
			{"4", map[string]any{"name": "four"}, map[string]any{"id": 4, "name": "four"}},
			{"5", map[string]any{"color": "blue"}, map[string]any{"id": 5, "name": "w5", "color": "blue"}},
		} {
			var sent []legacyapi.Request
			for _, req := range writes(api.Requests()) {
				if req.Path == "/api/widgets/"+tc.id {
					sent = append(sent, req)
				}
			}
			if len(sent) != 1 || sent[0].Method != "PATCH" || !sameJSON(t, sent[0].Body, tc.patch) {
				t.Errorf("widget %s: the legacy API received %s, want one PATCH %v", tc.id, describeRequests(sent), tc.patch)
			}
			if rec, _ := api.Item("/api/widgets", tc.id); !sameJSON(t, rec, tc.rec) {
				t.Errorf("widget %s is %v, want %v", tc.id, rec, tc.rec)
			}
		}
	})

	t.Run("DELETE: the legacy API's 200 {}", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "DELETE", "/api/widgets?ids=6,7", nil)
		b := checkEnvelope(t, r, 200, "succeeded")
		for i, id := range []string{"6", "7"} {
			it := b.Items[i]
			if it.ID != id || it.Status != 200 || it.Outcome != "succeeded" || !sameJSON(t, it.Body, map[string]any{}) {
				t.Errorf("item %d: %+v", i, it)
			}
			if _, ok := api.Item("/api/widgets", id); ok {
				t.Errorf("widget %s still exists", id)
			}
			if !received(api, "DELETE", "/api/widgets/"+id) {
				t.Errorf("no DELETE /api/widgets/%s reached the legacy API", id)
			}
		}
	})
}

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
		{name: "create, 4xx: 409 duplicate id", method: "POST", path: widgets, body: createBody(`{"id": 1, "name": "dup"}`), collection: widgets,
			// The id is checked free before the create: the gateway refuses
			// it, and the legacy API never sees a create of an existing id.
			status: []int{409}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 409, itemError: "already exists"},
		{name: "create, 5xx with an HTML page", method: "POST", path: widgets, body: createBody(`{"name": "second"}`), collection: widgets,
			faults: []legacyapi.Fault{passThrough("POST", widgets, 1), {Method: "POST", Path: widgets, Status: 500, Body: htmlError, Times: 1}},
			status: []int{502}, outcomes: []string{"rolled_back", "failed", "not_attempted"}, itemStatus: 500, bodyText: htmlError},
		{name: "create, hangs past item_timeout after it was applied (id known)", method: "POST", path: widgets,
			body: createBody(`{"id": 700, "name": "second"}`), collection: widgets,
			faults: []legacyapi.Fault{passThrough("POST", widgets, 1), {Method: "POST", Path: widgets, Hang: true, AfterApply: true, Times: 1}},
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
			var body any
			if tt.body != "" {
				body = tt.body
			}
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

// TestBatchRestoreDeletedPost: for a legacy API whose PUT cannot create,
// restore_deleted post re-creates a deleted item by POST to the
// collection with the pre-image, id included; the record comes back with
// its original numeric id, including after a DELETE whose answer never
// came.
func TestBatchRestoreDeletedPost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  legacyapi.Fault
		status int
	}{
		{"the second DELETE fails with 500", legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/4", Status: 500, Body: htmlError}, 502},
		{"the second DELETE hangs after it was applied", legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/4", Hang: true, AfterApply: true}, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := seededAPI()
			g := startGateway(t, api, `
	batch {
		concurrency  1
		item_timeout 300ms
		resource /api/widgets {`+resourceMethods+`
			restore_deleted post
		}
	}
	reverse_proxy UPSTREAM
`)
			api.Inject(tc.fault)
			before := api.Items("/api/widgets")
			b := checkProblem(t, g.do(t, "DELETE", "/api/widgets?ids=3,4,5", nil), tc.status)
			if b.Outcome != "rolled_back" {
				t.Errorf("outcome %q, want rolled_back: %+v", b.Outcome, b.Items)
			}
			sameState(t, api, "/api/widgets", before)
			for _, id := range []string{"3", "4"} {
				if rec, ok := api.Item("/api/widgets", id); !ok || rec["id"] != json.Number(id) {
					t.Errorf("widget %s is %v, want it back with its numeric id", id, rec)
				}
			}
			var posts []legacyapi.Request
			for _, req := range api.Requests() {
				if req.Method == "POST" {
					posts = append(posts, req)
				}
				if req.Method == "PUT" {
					t.Errorf("restore_deleted post sent %s %s", req.Method, req.Path)
				}
			}
			if len(posts) == 0 {
				t.Fatal("no POST re-created a deleted item")
			}
			for _, p := range posts {
				body, _ := decodeJSON(t, p.Body).(map[string]any)
				id, isNumber := body["id"].(float64)
				if p.Path != "/api/widgets" || !isNumber || !sameJSON(t, p.Body, before[strconv.Itoa(int(id))]) {
					t.Errorf("re-create %s %s %s, want POST /api/widgets with the pre-image, numeric id included", p.Method, p.Path, p.Body)
				}
			}
		})
	}
}

// TestBatchRestoreUpdatedPatch: restore_updated patch puts back only the
// fields the update changed, removing (null) those that did not exist.
func TestBatchRestoreUpdatedPatch(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/widgets {
			collection GET PATCH
			item       GET PATCH
			restore_updated patch
		}
	}
	reverse_proxy UPSTREAM
`)
	before := api.Items("/api/widgets")
	r := g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "x", "color": "red"}, {"id": 2, "name": ""}]`)
	b := checkProblem(t, r, 422)
	if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" {
		t.Errorf("outcome %q, items %+v", b.Outcome, b.Items)
	}
	var patches []legacyapi.Request
	for _, req := range writes(api.Requests()) {
		if req.Path == "/api/widgets/1" {
			patches = append(patches, req)
		}
	}
	if len(patches) != 2 || patches[1].Method != "PATCH" ||
		!reflect.DeepEqual(decodeJSON(t, patches[1].Body), map[string]any{"name": "w1", "color": nil}) {
		t.Errorf("writes to widget 1: %s; want the update, then PATCH {\"name\":\"w1\",\"color\":null}", describeRequests(patches))
	}
	sameState(t, api, "/api/widgets", before)
}

// TestBatchPartial: in partial mode every item stands on its own: 207,
// successes stay. A client may choose the mode with Prefer only where
// allow_override is on.
func TestBatchPartial(t *testing.T) {
	const site = `
	batch {
		concurrency 1
		resource /api/widgets {` + resourceMethods + `
			atomicity partial
		}
		resource /api/gadgets {` + resourceMethods + `
			allow_override
		}
		resource /api/gizmos {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
	update := `[{"id": 1, "name": "one"}, {"id": 2, "name": ""}, {"id": 3, "name": "three"}]`
	tests := []struct {
		name       string
		method     string
		path, body string
		prefer     string
		status     int
		outcomes   []string
		applied    string // Preference-Applied
	}{
		{name: "atomicity partial: update", method: "PATCH", path: "/api/widgets", body: update,
			status: 207, outcomes: []string{"succeeded", "failed", "succeeded"}},
		{name: "atomicity partial: delete", method: "DELETE", path: "/api/widgets?ids=1,404,3",
			status: 207, outcomes: []string{"succeeded", "failed", "succeeded"}},
		{name: "allow_override: Prefer atomicity=partial", method: "PATCH", path: "/api/gadgets", body: update, prefer: "atomicity=partial",
			status: 207, outcomes: []string{"succeeded", "failed", "succeeded"}, applied: "atomicity=partial"},
		{name: "allow_override without Prefer: all_or_nothing", method: "PATCH", path: "/api/gadgets", body: update,
			status: 422, outcomes: []string{"rolled_back", "failed", "not_attempted"}},
		{name: "allow_override: Prefer atomicity=all-or-nothing on an all_or_nothing resource", method: "PATCH", path: "/api/gadgets", body: update,
			prefer: "atomicity=all-or-nothing", status: 422, outcomes: []string{"rolled_back", "failed", "not_attempted"}, applied: "atomicity=all-or-nothing"},
		{name: "no allow_override: Prefer is ignored", method: "PATCH", path: "/api/gizmos", body: `[{"id": 1, "name": "one"}, {"id": 2, "name": ""}]`,
			prefer: "atomicity=partial", status: 422, outcomes: []string{"rolled_back", "failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := seededAPI()
			g := startGateway(t, api, site)
			collection := strings.Split(tt.path, "?")[0]
			before := api.Items(collection)
			var header []string
			if tt.prefer != "" {
				header = []string{"Prefer", tt.prefer}
			}
			var body any
			if tt.body != "" {
				body = tt.body
			}
			r := g.do(t, tt.method, tt.path, body, header...)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			if got := r.Header.Get("Preference-Applied"); got != tt.applied {
				t.Errorf("Preference-Applied %q, want %q", got, tt.applied)
			}
			b := r.batch(t)
			if got := b.Outcomes(); !slices.Equal(got, tt.outcomes) {
				t.Errorf("item outcomes %v, want %v", got, tt.outcomes)
			}
			if tt.status != 207 {
				checkProblem(t, r, tt.status)
				sameState(t, api, collection, before)
				return
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") || b.Outcome != "partial" || b.Atomicity != "partial" {
				t.Errorf("Content-Type %q atomicity %q outcome %q, want application/json partial partial", ct, b.Atomicity, b.Outcome)
			}
			after := api.Items(collection)
			switch tt.method {
			case "PATCH":
				if after["1"]["name"] != "one" || after["3"]["name"] != "three" || !reflect.DeepEqual(after["2"], before["2"]) {
					t.Errorf("state %v: the successes must stay, the failure change nothing", after)
				}
			case "DELETE":
				if _, ok := after["1"]; ok || len(after) != len(before)-2 {
					t.Errorf("state %v: the successful deletes must stay", after)
				}
			}
		})
	}
}

// TestBatchDeclarativeDelete: under delete_semantics declarative a missing
// id succeeds (204), and a rollback does not re-create it.
func TestBatchDeclarativeDelete(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/gadgets {`+resourceMethods+`
			delete_semantics declarative
		}
	}
	reverse_proxy UPSTREAM
`)
	t.Run("succeeds", func(t *testing.T) {
		b := checkEnvelope(t, g.do(t, "DELETE", "/api/gadgets?ids=1,999,2", nil), 200, "succeeded")
		if it := b.Items[1]; it.ID != "999" || it.Status != 204 || it.Outcome != "succeeded" {
			t.Errorf("the missing item: %+v, want 204 succeeded", it)
		}
		for _, id := range []string{"1", "2", "999"} {
			if _, ok := api.Item("/api/gadgets", id); ok {
				t.Errorf("gadget %s exists", id)
			}
		}
	})
	t.Run("rolled back: nothing is re-created for the missing id", func(t *testing.T) {
		api.ResetLog()
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/4", Status: 500, Body: htmlError})
		before := api.Items("/api/gadgets")
		b := checkProblem(t, g.do(t, "DELETE", "/api/gadgets?ids=3,998,4", nil), 502)
		if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" {
			t.Errorf("outcome %q, items %v", b.Outcome, b.Outcomes())
		}
		sameState(t, api, "/api/gadgets", before)
		for _, req := range writes(api.Requests()) {
			if req.Path == "/api/gadgets/998" || strings.Contains(string(req.Body), "998") {
				t.Errorf("the missing item was written: %s %s %s", req.Method, req.Path, req.Body)
			}
		}
	})
}

// TestBatchRefusedByTheGateway: every batch the gateway refuses is
// problem+json with a detail that says what is wrong (for an item, which
// one), and the legacy API receives nothing at all.
func TestBatchRefusedByTheGateway(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		max_items     5
		max_body_size 1KiB
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
			batch get
		}
	}
	reverse_proxy UPSTREAM
`)
	big := `[{"name": "` + strings.Repeat("x", 2000) + `"}]`
	tests := []struct {
		name         string
		method, path string
		body         string
		contentType  string
		status       int
		item         int    // the item the detail must name; -1 for none
		id           string // the id it must name too, if any
	}{
		{"body is not JSON", "POST", "/api/widgets", `[{"name": "a"},`, "", 400, -1, ""},
		{"update body is an object", "PATCH", "/api/widgets", `{"id": 1, "name": "a"}`, "", 400, -1, ""},
		{"update body is not JSON", "PATCH", "/api/widgets", `[{"id": 1`, "", 400, -1, ""},
		{"an element is not an object", "POST", "/api/widgets", `[{"name": "a"}, 7]`, "", 400, 1, ""},
		{"empty array", "POST", "/api/widgets", `[]`, "", 400, -1, ""},
		{"empty ids", "GET", "/api/widgets?ids=", "", "", 400, -1, ""},
		{"empty ids on delete", "DELETE", "/api/widgets?ids=", "", "", 400, -1, ""},
		{"an empty id", "DELETE", "/api/widgets?ids=1,,2", "", "", 400, 1, ""},
		{"an update element without the id field", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"name": "b"}]`, "", 400, 1, ""},
		{"an update element with an empty id", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "", "name": "b"}]`, "", 400, 1, ""},
		{"the same id twice in an update", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "1", "name": "b"}]`, "", 400, 1, "1"},
		{"the same id twice in a delete", "DELETE", "/api/widgets?ids=1,2,1", "", "", 400, 2, "1"},
		{"too many ids", "GET", "/api/widgets?ids=1,2,3,4,5,6", "", "", 413, -1, ""},
		{"too many ids on delete", "DELETE", "/api/widgets?ids=1,2,3,4,5,6", "", "", 413, -1, ""},
		{"too many elements", "POST", "/api/widgets", `[{},{},{},{},{},{}]`, "", 413, -1, ""},
		{"body too large", "POST", "/api/widgets", big, "", 413, -1, ""},
		{"create body of another type", "POST", "/api/widgets", `[{"name": "a"}]`, "text/plain", 415, -1, ""},
		{"update body of another type", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}]`, "application/xml", 415, -1, ""},
		{"batch delete is off", "DELETE", "/api/gadgets?ids=1,2", "", "", 405, -1, ""},
		{"batch create is off", "POST", "/api/gadgets", `[{"name": "a"}]`, "", 405, -1, ""},
		{"batch update is off", "PATCH", "/api/gadgets", `[{"id": 1, "name": "a"}]`, "", 405, -1, ""},
		{"hostile id ..", "GET", "/api/widgets?ids=1,..", "", "", 400, 1, ".."},
		{"hostile id .", "DELETE", "/api/widgets?ids=1,.", "", "", 400, 1, "."},
		{"hostile id %2e%2e", "GET", "/api/widgets?ids=1,%2e%2e", "", "", 400, 1, ".."},
		{"hostile id %2E%2E on delete", "DELETE", "/api/widgets?ids=1,%2E%2E", "", "", 400, 1, ".."},
		{"hostile id 1%2F2", "DELETE", "/api/widgets?ids=1,1%2F2", "", "", 400, 1, "1/2"},
		{"hostile id a%5Cb", "GET", "/api/widgets?ids=1,a%5Cb", "", "", 400, 1, "a\\b"},
		{"hostile id %00", "DELETE", "/api/widgets?ids=1,%00", "", "", 400, 1, "\x00"},
		{"hostile id %0A", "GET", "/api/widgets?ids=1,x%0Ay", "", "", 400, 1, "x\ny"},
		{"hostile update id ..", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "..", "name": "b"}]`, "", 400, 1, ".."},
		{"hostile update id with /", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "1/../2", "name": "b"}]`, "", 400, 1, "1/../2"},
		{"hostile update id with \\", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "a\\b", "name": "b"}]`, "", 400, 1, "a\\b"},
		{"hostile update id with NUL", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "a\u0000", "name": "b"}]`, "", 400, 1, "a\x00"},
		{"hostile create id ..", "POST", "/api/widgets", `[{"name": "a"}, {"id": "..", "name": "b"}]`, "", 400, 1, ".."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			before := api.Items("/api/widgets")
			var body any
			if tt.body != "" {
				body = []byte(tt.body)
			}
			var header []string
			if tt.contentType != "" {
				header = []string{"Content-Type", tt.contentType}
			}
			r := g.do(t, tt.method, tt.path, body, header...)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			if ct := r.Header.Get("Content-Type"); ct != problem.ContentType {
				t.Errorf("Content-Type %q, want %q", ct, problem.ContentType)
			}
			p := r.JSON(t)
			detail, _ := p["detail"].(string)
			if p["status"] != float64(tt.status) || p["title"] != http.StatusText(tt.status) || detail == "" {
				t.Errorf("problem %s", r.Body)
			}
			if tt.item >= 0 && !mentionsItem(detail, tt.item) {
				t.Errorf("detail %q does not name item %d", detail, tt.item)
			}
			if tt.id != "" && !strings.Contains(detail, tt.id) && !strings.Contains(detail, strconv.Quote(tt.id)) {
				t.Errorf("detail %q does not name the id %q", detail, tt.id)
			}
			if tt.status == 405 && r.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			if reqs := api.Requests(); len(reqs) > 0 {
				t.Errorf("the legacy API received:%s", describeRequests(reqs))
			}
			sameState(t, api, "/api/widgets", before)
		})
	}
}

// TestBatchSubRequestHeaders: the client's credentials and tracing reach
// every sub-request; each write carries its own Idempotency-Key derived
// from the batch's, never the client's; what describes only the batch
// request does not travel.
func TestBatchSubRequestHeaders(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency 4
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	const clientKey = "client-key-7"
	clientHeader := func(key string) []string {
		return []string{
			"Authorization", "Bearer secret-token",
			"Cookie", "session=abc; theme=dark",
			"X-Trace", "trace-123",
			"Accept-Encoding", "br",
			"If-Match", `"v1"`,
			"Idempotency-Key", key,
		}
	}
	// A long body, so that no sub-request's Content-Length can equal the
	// batch's by chance.
	pad := strings.Repeat("p", 300)
	ops := []struct {
		name, method, path, body string
		contentType              string
		writes                   int
	}{
		{"GET", "GET", "/api/widgets?ids=1,2,3", "", "", 0},
		{"CREATE", "POST", "/api/widgets", `[{"name": "a", "pad": "` + pad + `"}, {"name": "b"}, {"name": "c"}]`, "", 3},
		{"UPDATE", "PATCH", "/api/widgets", `[{"id": 4, "name": "a", "pad": "` + pad + `"}, {"id": 5, "name": "b"}, {"id": 6, "name": "c"}]`,
			"application/merge-patch+json; charset=utf-8", 3},
		{"DELETE", "DELETE", "/api/gadgets?ids=7,8,9", "", "", 3},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			api.ResetLog()
			var body any
			if op.body != "" {
				body = op.body
			}
			header := clientHeader(clientKey)
			if op.contentType != "" {
				header = append(header, "Content-Type", op.contentType)
			}
			r := g.do(t, op.method, op.path, body, header...)
			if r.Status/100 != 2 {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
			reqs := api.Requests()
			if len(reqs) == 0 {
				t.Fatal("no sub-request reached the legacy API")
			}
			keys := map[string]bool{}
			for _, req := range reqs {
				h := req.Header
				where := req.Method + " " + req.Path
				for name, want := range map[string]string{"Authorization": "Bearer secret-token", "Cookie": "session=abc; theme=dark", "X-Trace": "trace-123"} {
					if got := strings.Join(h.Values(name), ", "); got != want {
						t.Errorf("%s: %s %q, want %q", where, name, got, want)
					}
				}
				if v := h.Values("If-Match"); len(v) > 0 {
					t.Errorf("%s: If-Match %q was forwarded", where, v)
				}
				if ae := h.Get("Accept-Encoding"); strings.Contains(ae, "br") {
					t.Errorf("%s: the client's Accept-Encoding %q was forwarded", where, ae)
				}
				if cl := h.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(req.Body)) {
					t.Errorf("%s: Content-Length %s for a body of %d bytes", where, cl, len(req.Body))
				}
				if len(req.Body) > 0 && h.Get("Content-Type") != "application/json" {
					t.Errorf("%s: Content-Type %q", where, h.Get("Content-Type"))
				}
				key := h.Get("Idempotency-Key")
				if key == clientKey || strings.Trim(key, `"`) == clientKey {
					t.Errorf("%s: the client's Idempotency-Key was forwarded", where)
				}
				if req.Method == "GET" {
					continue
				}
				if key == "" {
					t.Errorf("%s: a write without Idempotency-Key", where)
				} else if keys[key] {
					t.Errorf("%s: Idempotency-Key %q used twice", where, key)
				}
				keys[key] = true
			}
			if len(keys) != op.writes {
				t.Errorf("%d distinct Idempotency-Keys, want %d", len(keys), op.writes)
			}
		})
	}

	// Derived: the same batch with the same client key sends the same
	// keys; with another client key, other keys. The gateway replays a
	// key it has seen from the same credentials without sending anything
	// (TestIdempotencyReplay), so the second run comes from other
	// credentials: the items' keys depend on the client's key alone.
	update := `[{"id": 10, "name": "a"}, {"id": 11, "name": "b"}, {"id": 12, "name": "c"}]`
	keysOf := func(clientKey string, extra ...string) map[string]string {
		api.ResetLog()
		if r := g.do(t, "PATCH", "/api/widgets", update, append(clientHeader(clientKey), extra...)...); r.Status != 200 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		out := map[string]string{}
		for _, req := range writes(api.Requests()) {
			out[req.Path] = req.Header.Get("Idempotency-Key")
		}
		return out
	}
	first, again, other := keysOf("batch-A"), keysOf("batch-A", "Authorization", "Bearer another-token"), keysOf("batch-B")
	if len(first) != 3 || !reflect.DeepEqual(first, again) {
		t.Errorf("the same client key gave keys %v, then %v: they are not derived from it", first, again)
	}
	for path, k := range other {
		if slices.Contains(slices.Collect(maps.Values(first)), k) {
			t.Errorf("%s: key %q also derived from another client key", path, k)
		}
	}
}

// TestBatchSubRequestIsolation (SPEC section 8): a sub-request sees what
// a single-item request would: the batch request's vars, its request
// UUID, and the same route groups.
func TestBatchSubRequestIsolation(t *testing.T) {
	t.Run("vars and the request UUID reach every sub-request", func(t *testing.T) {
		api := seededAPI()
		g := startGateway(t, api, `
	vars user alice
	batch {
		concurrency 8
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM {
		header_up X-User {vars.user}
		header_up X-Request-ID {http.request.uuid}
	}
	log {
		output batchtest
		format json
	}
`)
		var ids []string
		for i := 1; i <= 20; i++ {
			ids = append(ids, strconv.Itoa(i))
		}
		uuids := map[string]bool{}
		for _, req := range []struct{ method, path, body string }{
			{"GET", "/api/widgets?ids=" + strings.Join(ids, ","), ""},
			{"PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}, {"id": 4, "name": "d"}]`},
		} {
			api.ResetLog()
			var body any
			if req.body != "" {
				body = req.body
			}
			if r := g.do(t, req.method, req.path, body); r.Status != 200 {
				t.Fatalf("%s: status %d: %s", req.method, r.Status, r.Body)
			}
			var uuid string
			for _, e := range testLogs.entries("http.log.access.log0") {
				if rq, _ := e["request"].(map[string]any); rq["method"] == req.method && rq["uri"] == req.path {
					uuid, _ = e["uuid"].(string)
				}
			}
			if uuid == "" {
				t.Fatalf("%s: the access log has no uuid for the batch request", req.method)
			}
			if uuids[uuid] {
				t.Errorf("%s: two batches share the UUID %s", req.method, uuid)
			}
			uuids[uuid] = true
			for _, sub := range api.Requests() {
				if got := sub.Header.Get("X-User"); got != "alice" {
					t.Errorf("%s %s: X-User %q, want alice (from vars)", sub.Method, sub.Path, got)
				}
				if got := sub.Header.Get("X-Request-ID"); got != uuid {
					t.Errorf("%s %s: X-Request-ID %q, want the batch request's UUID %q", sub.Method, sub.Path, got, uuid)
				}
			}
		}
	})

	t.Run("route group: the next handler in the batch's handle block", func(t *testing.T) {
		api := seededAPI()
		g := startGateway(t, api, `
	handle /api/* {
		# route keeps the order: in a handle block respond would sort
		# before batch
		route {
			batch {
				resource /api/widgets {`+resourceMethods+`
				}
			}
			respond "inner" 418
		}
	}
	handle {
		reverse_proxy UPSTREAM
	}
`)
		single := g.do(t, "GET", "/api/widgets/1", nil)
		if single.Status != 418 || string(single.Body) != "inner" {
			t.Fatalf("a single-item request got %v, want 418 inner", single)
		}
		b := checkProblem(t, g.do(t, "GET", "/api/widgets?ids=1,2", nil), 418)
		if len(b.Items) == 0 || b.Items[0].Status != 418 || b.Items[0].BodyText != "inner" {
			t.Errorf("items %+v, want what a single-item request gets: 418 inner", b.Items)
		}
		if reqs := api.Requests(); len(reqs) > 0 {
			t.Errorf("the sibling handle's reverse_proxy was reached:%s", describeRequests(reqs))
		}
	})

	t.Run("route group: a sibling handle is skipped for sub-requests", func(t *testing.T) {
		// Nothing follows batch in its handle block, so a request the
		// module passes on runs off the end of the block; the sibling
		// handle is in the same group, so Caddy skips it and answers an
		// empty 200. A sub-request must get exactly that, not reach the
		// sibling's reverse_proxy.
		api := seededAPI()
		g := startGateway(t, api, `
	handle /api/* {
		batch {
			resource /api/widgets {`+resourceMethods+`
			}
		}
	}
	handle {
		reverse_proxy UPSTREAM
	}
`)
		single := g.do(t, "GET", "/api/widgets/1", nil)
		if single.Status != 200 || len(single.Body) != 0 {
			t.Fatalf("a single-item request got %v, want Caddy's empty 200", single)
		}
		if reqs := api.Requests(); len(reqs) > 0 {
			t.Fatalf("a single-item request reached the legacy API:%s", describeRequests(reqs))
		}
		b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids=1,2", nil), 200, "succeeded")
		for _, it := range b.Items {
			if it.Status != 200 || len(it.Body) != 0 || it.BodyText != "" {
				t.Errorf("item %+v, want what a single-item request gets: an empty 200", it)
			}
		}
		if reqs := api.Requests(); len(reqs) > 0 {
			t.Errorf("sub-requests reached the sibling handle's reverse_proxy:%s", describeRequests(reqs))
		}
	})
}

// TestBatchOperationsLogging: one log line per batch with the facts an
// operator needs (ERROR with the ids for rollback_failed), and the
// placeholders for access logs.
func TestBatchOperationsLogging(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	log_append batch_op {http.batch.op}
	log_append batch_items {http.batch.items}
	log_append batch_outcome {http.batch.outcome}
	batch {
		concurrency 1
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
	log {
		output batchtest
		format json
	}
`)
	// widgets' PUT cannot create, so the default restore_deleted put
	// cannot bring back a deleted widget: an honest rollback_failed.
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	tests := []struct {
		method, path, body string
		status             int
		op                 string
		items              int
		outcome            string
		level              string
		compensations      bool
	}{
		{"GET", "/api/widgets?ids=1,2,3", "", 200, "get", 3, "succeeded", "info", false},
		{"POST", "/api/widgets", `[{"name": "a"}, {"name": "b"}]`, 201, "create", 2, "succeeded", "info", false},
		{"PATCH", "/api/widgets", `[{"id": 4, "name": "a"}, {"id": 5, "name": ""}]`, 422, "update", 2, "rolled_back", "info", true},
		{"DELETE", "/api/widgets?ids=17,18,19", "", 500, "delete", 3, "rollback_failed", "error", true},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			testLogs.reset()
			var body any
			if tt.body != "" {
				body = tt.body
			}
			r := g.do(t, tt.method, tt.path, body)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			entries := testLogs.entries("http.handlers.batch")
			if len(entries) != 1 {
				t.Fatalf("%d batch log lines, want 1: %v", len(entries), entries)
			}
			e := entries[0]
			if e["level"] != tt.level || e["op"] != tt.op || e["resource"] != "/api/widgets" ||
				e["items"] != float64(tt.items) || e["outcome"] != tt.outcome {
				t.Errorf("log line %v, want level %s op %s resource /api/widgets items %d outcome %s", e, tt.level, tt.op, tt.items, tt.outcome)
			}
			if d, ok := e["duration"].(float64); !ok || d <= 0 {
				t.Errorf("duration %v", e["duration"])
			}
			if c, ok := e["compensations"].(float64); !ok || (c > 0) != tt.compensations {
				t.Errorf("compensations %v, want some: %v", e["compensations"], tt.compensations)
			}
			if tt.outcome == "rollback_failed" {
				lb, _ := e["left_behind"].([]any)
				if len(lb) != 1 || !strings.Contains(fmt.Sprint(lb[0]), "17") {
					t.Errorf("left_behind %v, want widget 17 alone", e["left_behind"])
				}
				if _, ok := api.Item("/api/widgets", "17"); ok {
					t.Error("widget 17 exists: then it was not left behind")
				}
				for _, id := range []string{"18", "19"} {
					if _, ok := api.Item("/api/widgets", id); !ok {
						t.Errorf("widget %s was deleted", id)
					}
				}
				b := r.batch(t)
				if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed", "not_attempted"}) {
					t.Errorf("item outcomes %v", got)
				}
			}
			var access map[string]any
			for _, a := range testLogs.entries("http.log.access.log0") {
				if rq, _ := a["request"].(map[string]any); rq["uri"] == tt.path && rq["method"] == tt.method {
					access = a
				}
			}
			if access == nil {
				t.Fatalf("no access log entry for %s %s", tt.method, tt.path)
			}
			if access["batch_op"] != tt.op || fmt.Sprint(access["batch_items"]) != strconv.Itoa(tt.items) || access["batch_outcome"] != tt.outcome {
				t.Errorf("access log batch_op %v batch_items %v batch_outcome %v, want %s %d %s",
					access["batch_op"], access["batch_items"], access["batch_outcome"], tt.op, tt.items, tt.outcome)
			}
		})
	}
}

// switchableUpstream serves the fake legacy API on a loopback address
// that stays the same while a test takes the server down (new
// connections refused, open ones closed once they have answered) and
// brings it back.
type switchableUpstream struct {
	api      *legacyapi.API
	addr     string
	mu       sync.Mutex
	server   *http.Server
	listener net.Listener
	servers  []*http.Server
}

func newSwitchableUpstream(t testing.TB, api *legacyapi.API) *switchableUpstream {
	t.Helper()
	u := &switchableUpstream{api: api, addr: "127.0.0.1:0"}
	u.up(t)
	t.Cleanup(func() {
		api.Close()
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, s := range u.servers {
			s.Close()
		}
	})
	return u
}

func (u *switchableUpstream) up(t testing.TB) {
	t.Helper()
	l, err := net.Listen("tcp", u.addr)
	if err != nil {
		t.Fatalf("listening on %s again: %v", u.addr, err)
	}
	srv := &http.Server{Handler: u.api}
	go srv.Serve(l)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.addr, u.server, u.listener = l.Addr().String(), srv, l
	u.servers = append(u.servers, srv)
}

// down refuses new connections; a request in flight still gets its
// answer, and its connection is closed after it.
func (u *switchableUpstream) down() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.server.SetKeepAlivesEnabled(false)
	u.listener.Close()
}

// refusedAttempt reports whether reverse_proxy has logged a round trip of
// method that failed (the upstream was down).
func refusedAttempt(method string) bool {
	for _, e := range testLogs.entries("http.handlers.reverse_proxy") {
		rq, _ := e["request"].(map[string]any)
		if e["msg"] == "upstream roundtrip" && e["error"] != nil && rq["method"] == method {
			return true
		}
	}
	return false
}

// TestBatchUpstreamDownMidBatch takes the legacy API down while a batch
// runs (the second item is slow; the third cannot connect). If it comes
// back while the compensations retry, the batch is undone (502); if it
// stays down, the answer is an honest 500 rollback_failed naming exactly
// the items left behind, with an ERROR log line.
func TestBatchUpstreamDownMidBatch(t *testing.T) {
	ops := []struct {
		name         string
		method, path string
		body         string
		collection   string
		delayed      legacyapi.Fault // the second item's request
	}{
		{"update", "PATCH", "/api/widgets", `[{"id": 11, "name": "a"}, {"id": 12, "name": "b"}, {"id": 13, "name": "c"}]`, "/api/widgets",
			legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/12", Delay: 400 * time.Millisecond}},
		{"delete", "DELETE", "/api/gadgets?ids=11,12,13", "", "/api/gadgets",
			legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/12", Delay: 400 * time.Millisecond}},
		{"create", "POST", "/api/widgets", `[{"name": "a"}, {"name": "b"}, {"name": "c"}]`, "/api/widgets",
			legacyapi.Fault{Method: "POST", Path: "/api/widgets", Delay: 400 * time.Millisecond, Times: 1}},
	}
	for _, op := range ops {
		for _, comesBack := range []bool{true, false} {
			name := op.name + ", the upstream stays down"
			if comesBack {
				name = op.name + ", the upstream comes back"
			}
			t.Run(name, func(t *testing.T) {
				api := seededAPI()
				up := newSwitchableUpstream(t, api)
				retries := 1
				if comesBack {
					retries = 5 // 100ms, 200ms, 400ms... between attempts: room to come back
				}
				g := startGatewayTo(t, api, up.addr, fmt.Sprintf(`
	batch {
		concurrency          1
		compensation_retries %d
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`, retries))
				before := api.Items(op.collection)
				if op.name == "create" {
					api.Inject(passThrough("POST", "/api/widgets", 1))
				}
				api.Inject(op.delayed)

				answer := make(chan response, 1)
				go func() {
					var body any
					if op.body != "" {
						body = op.body
					}
					answer <- g.do(t, op.method, op.path, body)
				}()
				// The second item's request has arrived and waits: take the
				// upstream down under it.
				eventually(t, 5*time.Second, "the second item's request", func() bool {
					n := 0
					for _, r := range api.Requests() {
						if r.Method == op.delayed.Method && (r.Path == op.delayed.Path) {
							n++
						}
					}
					return n >= 2 || op.name != "create" && n >= 1
				})
				up.down()
				if comesBack {
					// A compensation starts with the read that proves it.
					eventually(t, 5*time.Second, "a compensation refused", func() bool { return refusedAttempt(http.MethodGet) })
					up.up(t)
				}
				r := <-answer

				if !comesBack {
					b := checkProblem(t, r, 500)
					if b.Outcome != "rollback_failed" {
						t.Errorf("outcome %q, want rollback_failed", b.Outcome)
					}
					if got, want := b.Outcomes(), []string{"rollback_failed", "rollback_failed", "failed"}; !slices.Equal(got, want) {
						t.Errorf("item outcomes %v, want %v", got, want)
					}
					if b.Items[2].Status != 502 {
						t.Errorf("the item that could not connect: status %d, want 502", b.Items[2].Status)
					}
					// Exactly the items named are left as the batch made them.
					after := api.Items(op.collection)
					answerMatchesState(t, b, before, after)
					left := map[string]bool{b.Items[0].ID: true, b.Items[1].ID: true}
					switch op.name {
					case "update":
						if after["11"]["name"] != "a" || after["12"]["name"] != "b" || !reflect.DeepEqual(after["13"], before["13"]) {
							t.Errorf("state 11 %v 12 %v 13 %v: want 11 and 12 changed (named), 13 untouched", after["11"], after["12"], after["13"])
						}
					case "delete":
						_, has11 := after["11"]
						_, has12 := after["12"]
						if has11 || has12 || !reflect.DeepEqual(after["13"], before["13"]) {
							t.Errorf("want 11 and 12 deleted (named), 13 untouched: %v", after)
						}
					case "create":
						var created []string
						for id := range after {
							if _, ok := before[id]; !ok {
								created = append(created, id)
								if !left[id] {
									t.Errorf("widget %s %v was created but the answer does not name it", id, after[id])
								}
							}
						}
						if len(created) != 2 {
							t.Errorf("created %v, want the two named", created)
						}
					}
					entries := testLogs.entries("http.handlers.batch")
					if len(entries) != 1 || entries[0]["level"] != "error" || entries[0]["outcome"] != "rollback_failed" {
						t.Fatalf("batch log %v, want one ERROR line", entries)
					}
					lb := fmt.Sprint(entries[0]["left_behind"])
					for id := range left {
						if id == "" || !strings.Contains(lb, id) {
							t.Errorf("left_behind %s does not name id %q", lb, id)
						}
					}
					if strings.Contains(lb, "13") || mentionsItem(lb, 2) {
						t.Errorf("left_behind %s names the item that never happened", lb)
					}
					return
				}
				b := checkProblem(t, r, 502)
				if b.Outcome != "rolled_back" {
					t.Errorf("outcome %q, want rolled_back", b.Outcome)
				}
				answerMatchesState(t, b, before, api.Items(op.collection))
				if got, want := b.Outcomes(), []string{"rolled_back", "rolled_back", "failed"}; !slices.Equal(got, want) {
					t.Errorf("item outcomes %v, want %v", got, want)
				}
				sameState(t, api, op.collection, before)
			})
		}
	}
}

// TestBatchGetFailures: an all-or-nothing batch GET fails as a whole when
// an item fails; in partial mode each item stands on its own.
func TestBatchGetFailures(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
			allow_override
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/5", Status: 500, Body: htmlError})
	t.Run("a missing item: 404", func(t *testing.T) {
		b := checkProblem(t, g.do(t, "GET", "/api/widgets?ids=1,404", nil), 404)
		if b.Outcome != "failed" || b.Items[1].Status != 404 || b.Items[1].Outcome != "failed" || !mentionsItem(b.Detail, 1) {
			t.Errorf("outcome %q detail %q items %+v", b.Outcome, b.Detail, b.Items)
		}
	})
	t.Run("an upstream 5xx: 502", func(t *testing.T) {
		b := checkProblem(t, g.do(t, "GET", "/api/widgets?ids=5", nil), 502)
		if b.Outcome != "failed" || b.Items[0].Status != 500 || b.Items[0].BodyText != htmlError {
			t.Errorf("outcome %q items %+v", b.Outcome, b.Items)
		}
	})
	t.Run("partial: 207", func(t *testing.T) {
		r := g.do(t, "GET", "/api/widgets?ids=1,404,5,2", nil, "Prefer", "atomicity=partial")
		b := checkEnvelope(t, r, 207, "partial")
		if got, want := b.Outcomes(), []string{"succeeded", "failed", "failed", "succeeded"}; !slices.Equal(got, want) || b.Succeeded != 2 || b.Failed != 2 {
			t.Errorf("outcomes %v (succeeded %d failed %d), want %v", got, b.Succeeded, b.Failed, want)
		}
		if !sameJSON(t, b.Items[3].Body, map[string]any{"id": 2, "name": "w2"}) {
			t.Errorf("item 3 body %s", b.Items[3].Body)
		}
	})
}

// TestBatchIdsAreEscapedIntoThePath: ids with characters that mean
// something in a URL reach their own item, and only it, in every
// operation and in the undo of a failed one.
func TestBatchIdsAreEscapedIntoThePath(t *testing.T) {
	odd := []string{"a b", "x?y", "c#d", "100%", "ü", "semi;colon", "comma,id", "q=1&r=2"}
	var seed []map[string]any
	for _, id := range odd {
		seed = append(seed, map[string]any{"id": id, "name": "odd " + id})
	}
	api := legacyapi.New(legacyapi.Collection{Path: "/api/odd", PutCreates: true, Seed: seed})
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/odd {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	var query []string
	for _, id := range odd {
		query = append(query, url.QueryEscape(id))
	}
	ids := strings.Join(query, ",")
	before := api.Items("/api/odd")

	t.Run("GET", func(t *testing.T) {
		b := checkEnvelope(t, g.do(t, "GET", "/api/odd?ids="+ids, nil), 200, "succeeded")
		for i, id := range odd {
			if it := b.Items[i]; it.ID != id || !sameJSON(t, it.Body, before[id]) {
				t.Errorf("item %d: id %q body %s, want %v", i, it.ID, it.Body, before[id])
			}
		}
	})
	t.Run("UPDATE that fails: every odd id restored", func(t *testing.T) {
		var elems []map[string]any
		for _, id := range odd {
			elems = append(elems, map[string]any{"id": id, "name": "changed"})
		}
		elems[len(elems)-1]["name"] = ""
		b := checkProblem(t, g.do(t, "PATCH", "/api/odd", elems), 422)
		if b.Outcome != "rolled_back" {
			t.Errorf("outcome %q", b.Outcome)
		}
		sameState(t, api, "/api/odd", before)
	})
	t.Run("DELETE that fails: every odd id re-created", func(t *testing.T) {
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/odd/" + url.PathEscape(odd[len(odd)-1]), Status: 500, Body: htmlError})
		b := checkProblem(t, g.do(t, "DELETE", "/api/odd?ids="+ids, nil), 502)
		if b.Outcome != "rolled_back" {
			t.Errorf("outcome %q", b.Outcome)
		}
		sameState(t, api, "/api/odd", before)
	})
	t.Run("CREATE that fails: the created odd ids deleted", func(t *testing.T) {
		b := checkProblem(t, g.do(t, "POST", "/api/odd", `[{"id": "new one", "name": "n"}, {"id": "new?two#", "name": "n"}, {"name": ""}]`), 422)
		if b.Outcome != "rolled_back" || b.Items[0].ID != "new one" || b.Items[1].ID != "new?two#" {
			t.Errorf("outcome %q items %+v", b.Outcome, b.Items)
		}
		sameState(t, api, "/api/odd", before)
	})
	for _, req := range api.Requests() {
		item := strings.HasPrefix(req.Path, "/api/odd/") && strings.Count(req.Path, "/") == 3
		if req.Path != "/api/odd" && !item || req.RawQuery != "" {
			t.Errorf("%s %s?%s: not an item or the collection of /api/odd", req.Method, req.Path, req.RawQuery)
		}
	}
}

// TestBatchTimeout: batch_timeout bounds a batch; what it cut short is
// undone like any failure, and the answer is 504.
func TestBatchTimeout(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency   1
		batch_timeout 400ms
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	for _, id := range []string{"1", "2", "3"} {
		api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + id, Delay: 250 * time.Millisecond})
	}
	before := api.Items("/api/widgets")
	b := checkProblem(t, g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]`), 504)
	if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" || b.Items[2].Outcome != "not_attempted" {
		t.Errorf("outcome %q items %v", b.Outcome, b.Outcomes())
	}
	sameState(t, api, "/api/widgets", before)
	if received(api, "PATCH", "/api/widgets/3") {
		t.Error("an item was started after batch_timeout")
	}
}

// TestBatchClientGoesAway: a client that hangs up mid-batch must not
// leave an all-or-nothing batch half done: the write in flight finishes,
// nothing new starts, and what happened is undone (or, if everything
// happened, stands), detached from the client's cancellation.
func TestBatchClientGoesAway(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/2", Delay: 400 * time.Millisecond})
	before := api.Items("/api/widgets")
	impatient := &http.Client{Timeout: 150 * time.Millisecond}
	req, _ := http.NewRequest("PATCH", g.URL+"/api/widgets", strings.NewReader(`[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]`))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := impatient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client got an answer (%d) before it gave up", resp.StatusCode)
	}
	var line map[string]any
	eventually(t, 5*time.Second, "the batch's log line", func() bool {
		for _, e := range testLogs.entries("http.handlers.batch") {
			if e["op"] == "update" {
				line = e
				return true
			}
		}
		return false
	})
	after := api.Items("/api/widgets")
	changed := 0
	for _, id := range []string{"1", "2", "3"} {
		if !reflect.DeepEqual(after[id], before[id]) {
			changed++
		}
	}
	if changed != 0 && changed != 3 {
		t.Errorf("half a batch was left: %d of 3 items changed (log: %v)", changed, line)
	}
	if changed == 0 && line["outcome"] != "rolled_back" && line["outcome"] != "failed" {
		t.Errorf("nothing changed, but the batch's outcome is %v", line["outcome"])
	}
}

// countingHandler counts the requests the legacy API is answering at once.
type countingHandler struct {
	http.Handler
	mu       sync.Mutex
	now, max int
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.now++
	c.max = max(c.max, c.now)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.now--
		c.mu.Unlock()
	}()
	c.Handler.ServeHTTP(w, r)
}

// TestBatchConcurrencyBound: at most concurrency sub-requests of a batch
// are in flight at once, and they do run side by side.
func TestBatchConcurrencyBound(t *testing.T) {
	api := seededAPI()
	counting := &countingHandler{Handler: api}
	upstream := httptest.NewServer(counting)
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	g := startGatewayTo(t, api, upstream.Listener.Addr().String(), `
	batch {
		concurrency 3
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	var ids []string
	for i := 1; i <= 12; i++ {
		ids = append(ids, strconv.Itoa(i))
		api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/" + strconv.Itoa(i), Delay: 50 * time.Millisecond})
	}
	checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids="+strings.Join(ids, ","), nil), 200, "succeeded")
	counting.mu.Lock()
	defer counting.mu.Unlock()
	if counting.max > 3 || counting.max < 2 {
		t.Errorf("%d sub-requests in flight at once, want 2 or 3 (concurrency 3)", counting.max)
	}
}

// headerRewriter lets a test change the headers of the legacy API's
// answers, which the fake cannot do itself.
type headerRewriter struct {
	http.Handler
	rewrite func(r *http.Request, h http.Header)
}

func (hr headerRewriter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hr.Handler.ServeHTTP(&rewritingWriter{ResponseWriter: w, r: r, rewrite: hr.rewrite}, r)
}

type rewritingWriter struct {
	http.ResponseWriter
	r       *http.Request
	rewrite func(r *http.Request, h http.Header)
}

func (w *rewritingWriter) WriteHeader(code int) {
	w.rewrite(w.r, w.Header())
	w.ResponseWriter.WriteHeader(code)
}

func (w *rewritingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestBatchItemAnswerHeaders: an item keeps its Location, ETag and
// Retry-After; the batch answer carries the largest Retry-After and
// nothing else of the items' headers; and a created item's id comes from
// the body when there is no Location.
func TestBatchItemAnswerHeaders(t *testing.T) {
	api := seededAPI()
	upstream := httptest.NewServer(headerRewriter{Handler: api, rewrite: func(r *http.Request, h http.Header) {
		h.Set("X-Upstream-Only", "internal")
		h.Set("Set-Cookie", "upstream=1")
		switch r.Method + " " + r.URL.Path {
		case "GET /api/widgets/1":
			h.Set("ETag", `"w1-v7"`)
		case "GET /api/widgets/2":
			h.Set("Retry-After", "30")
		case "GET /api/widgets/3":
			h.Set("Retry-After", "120")
		case "POST /api/gadgets":
			h.Del("Location")
		}
	}})
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	g := startGatewayTo(t, api, upstream.Listener.Addr().String(), `
	batch {
		concurrency 1
		allow_override
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/2", Status: 503, Body: "busy"})
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/3", Status: 503, Body: "busy"})

	t.Run("GET: item headers, the largest Retry-After, nothing leaks", func(t *testing.T) {
		r := g.do(t, "GET", "/api/widgets?ids=1,2,3,4", nil, "Prefer", "atomicity=partial")
		b := checkEnvelope(t, r, 207, "partial")
		if got := b.Items[0].Headers["ETag"]; got != `"w1-v7"` {
			t.Errorf("item 0 ETag %q", got)
		}
		if b.Items[1].Headers["Retry-After"] != "30" || b.Items[2].Headers["Retry-After"] != "120" {
			t.Errorf("items' Retry-After %q %q", b.Items[1].Headers["Retry-After"], b.Items[2].Headers["Retry-After"])
		}
		if got := r.Header.Get("Retry-After"); got != "120" {
			t.Errorf("batch Retry-After %q, want the largest: 120", got)
		}
		for _, name := range []string{"X-Upstream-Only", "Set-Cookie", "ETag", "Location"} {
			if v := r.Header.Values(name); len(v) > 0 {
				t.Errorf("an item's %s reached the batch answer: %q", name, v)
			}
		}
		for i, it := range b.Items {
			for name := range it.Headers {
				if name == "X-Upstream-Only" || name == "Set-Cookie" {
					t.Errorf("item %d keeps the upstream's %s", i, name)
				}
			}
		}
	})

	t.Run("CREATE without Location: ids from the body, and the undo finds them", func(t *testing.T) {
		b := checkEnvelope(t, g.do(t, "POST", "/api/gadgets", `[{"name": "a"}, {"name": "b"}]`), 201, "succeeded")
		for i, it := range b.Items {
			if rec, ok := api.Item("/api/gadgets", it.ID); it.ID == "" || !ok || rec["name"] != []string{"a", "b"}[i] {
				t.Errorf("item %d: id %q names %v", i, it.ID, rec)
			}
		}
		before := api.Items("/api/gadgets")
		r := g.do(t, "POST", "/api/gadgets", `[{"name": "c"}, {"name": ""}]`)
		if b := checkProblem(t, r, 422); b.Outcome != "rolled_back" || b.Items[0].ID == "" {
			t.Errorf("outcome %q item 0 %+v", b.Outcome, b.Items[0])
		}
		sameState(t, api, "/api/gadgets", before)
	})
}

// TestBatchPerOperationAtomicity: "atomicity <op> <mode>" sets the mode of
// one operation only.
func TestBatchPerOperationAtomicity(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
			atomicity create partial
		}
	}
	reverse_proxy UPSTREAM
`)
	b := checkEnvelope(t, g.do(t, "POST", "/api/widgets", `[{"name": "kept"}, {"name": ""}]`), 207, "partial")
	if rec, ok := api.Item("/api/widgets", b.Items[0].ID); !ok || rec["name"] != "kept" {
		t.Errorf("the created item did not stay: %v", rec)
	}
	before := api.Items("/api/widgets")
	if b := checkProblem(t, g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "x"}, {"id": 2, "name": ""}]`), 422); b.Outcome != "rolled_back" {
		t.Errorf("update outcome %q, want rolled_back (all_or_nothing)", b.Outcome)
	}
	sameState(t, api, "/api/widgets", before)
}

// TestBatchLongErrorPageIsCut: a non-JSON body goes in body_text, cut at
// 4 KiB.
func TestBatchLongErrorPageIsCut(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	page := "<html><body>" + strings.Repeat("é stack frame\n", 1000) + "</body></html>"
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/1", Status: 500, Body: page})
	b := checkProblem(t, g.do(t, "GET", "/api/widgets?ids=1", nil), 502)
	text := b.Items[0].BodyText
	if len(text) == 0 || len(text) > 4096 || !strings.HasPrefix(page, text) || len(b.Items[0].Body) != 0 {
		t.Errorf("body_text of %d bytes (a prefix of the page: %v), want at most 4096", len(text), strings.HasPrefix(page, text))
	}
}

// TestBatchNestedAndTrailingSlash: a resource under a path variable (with
// an escaped value) and a collection path with a trailing slash fan out
// to the right item paths, and undo there.
func TestBatchNestedAndTrailingSlash(t *testing.T) {
	api := legacyapi.New(
		legacyapi.Collection{Path: "/api/users/a%20b/posts", PutCreates: true, Seed: records("p", 1, 5)},
		legacyapi.Collection{Path: "/api/users/7/posts", PutCreates: true, Seed: records("q", 1, 5)},
	)
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/users/{user}/posts {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	for _, coll := range []string{"/api/users/a%20b/posts", "/api/users/7/posts/"} {
		t.Run(coll, func(t *testing.T) {
			api.ResetLog()
			canonical := strings.TrimSuffix(coll, "/")
			before := api.Items(canonical)
			b := checkEnvelope(t, g.do(t, "GET", coll+"?ids=1,2", nil), 200, "succeeded")
			if !sameJSON(t, b.Items[1].Body, before["2"]) {
				t.Errorf("item 1: %s, want %v", b.Items[1].Body, before["2"])
			}
			api.Inject(legacyapi.Fault{Method: "DELETE", Path: canonical + "/4", Status: 500, Body: htmlError})
			checkProblem(t, g.do(t, "DELETE", coll+"?ids=3,4", nil), 502)
			checkProblem(t, g.do(t, "POST", coll, `[{"name": "n"}, {"name": ""}]`), 422)
			checkProblem(t, g.do(t, "PATCH", coll, `[{"id": 5, "name": "n"}, {"id": 1, "name": ""}]`), 422)
			sameState(t, api, canonical, before)
			for _, req := range api.Requests() {
				if req.Path != canonical && !strings.HasPrefix(req.Path, canonical+"/") || strings.Contains(req.Path, "//") {
					t.Errorf("%s %s: want %s or one of its items", req.Method, req.Path, canonical)
				}
			}
		})
	}
}

// TestBatchChunkedBodyTooLarge: max_body_size holds for a body sent
// without Content-Length too.
func TestBatchChunkedBodyTooLarge(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		max_body_size 1KiB
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	body := `[{"name": "` + strings.Repeat("x", 3000) + `"}]`
	// An io.Reader of unknown length: Go sends it chunked.
	req, err := http.NewRequest("POST", g.URL+"/api/widgets", io.MultiReader(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || resp.Header.Get("Content-Type") != problem.ContentType {
		t.Errorf("%d %s: want 413 problem+json", resp.StatusCode, raw)
	}
	if reqs := api.Requests(); len(reqs) > 0 {
		t.Errorf("the legacy API received:%s", describeRequests(reqs))
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
			var body any
			if tt.body != "" {
				body = tt.body
			}
			r := g.do(t, tt.method, tt.path, body)
			b := r.batch(t)
			answerMatchesState(t, b, before, api.Items(tt.collection))
			if t.Failed() {
				t.Logf("answer: %d %s", r.Status, r.Body)
			}
		})
	}
}
