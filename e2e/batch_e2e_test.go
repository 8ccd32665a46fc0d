package e2e

import (
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

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
			body := optionalBody(tt.body)
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

// TestBatchNestedAndTrailingSlash: a resource under a path variable (with
// an escaped value) and a collection path with a trailing slash fan out
// to the right item paths, and undo there.
func TestBatchNestedAndTrailingSlash(t *testing.T) {
	api := legacyapi.NewRecording(
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
