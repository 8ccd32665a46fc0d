package e2e

import (
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// The end-to-end tests of method overrides (docs/wire-format.md, "Method
// overrides"): an override
// is judged by the method map as the method it names, an allowed one on a
// POST is applied by the gateway, and none reaches the legacy API, on a
// request that passes through or on any sub-request.

// reportsSite: /api/reports allows only GET and POST on the collection,
// GET on an item; /api/widgets allows everything.
const reportsSite = `
	batch {
		resource /api/reports {
			collection GET POST
			item       GET
			batch      get
		}
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

// TestMethodOverrideRefused (docs/wire-format.md, "Method overrides"): an override is judged as the
// method it names, in each of its four forms; a refused one never reaches
// the legacy API.
func TestMethodOverrideRefused(t *testing.T) {
	api := newLegacyAPI()
	g := startGateway(t, api, reportsSite)
	const allow = "GET, HEAD, POST, OPTIONS"
	tests := []struct {
		name, method, path string
		header             []string
		status             int
		allow              string
		detail             string
	}{
		{name: "X-HTTP-Method-Override: DELETE on POST", method: "POST", path: "/api/reports",
			header: []string{"X-HTTP-Method-Override", "DELETE"}, status: 405, allow: allow, detail: "DELETE"},
		{name: "X-HTTP-Method: DELETE on POST", method: "POST", path: "/api/reports",
			header: []string{"X-HTTP-Method", "DELETE"}, status: 405, allow: allow, detail: "X-HTTP-Method"},
		{name: "X-Method-Override: PUT on POST", method: "POST", path: "/api/reports",
			header: []string{"X-Method-Override", "PUT"}, status: 405, allow: allow, detail: "PUT"},
		{name: "_method=DELETE on POST", method: "POST", path: "/api/reports?_method=DELETE", status: 405, allow: allow, detail: "_method"},
		{name: "_method=delete, lower case", method: "POST", path: "/api/reports?_method=delete", status: 405, allow: allow},
		{name: "_method=DELETE on an item GET", method: "GET", path: "/api/reports/1?_method=DELETE", status: 405, allow: "GET, HEAD, OPTIONS"},
		{name: "a batch GET with _method=DELETE", method: "GET", path: "/api/reports?ids=1&_method=DELETE", status: 405, allow: allow},
		{name: "a method the gateway does not know", method: "POST", path: "/api/reports",
			header: []string{"X-HTTP-Method-Override", "BREW"}, status: 501, detail: "BREW"},
		{name: "overrides that disagree", method: "POST", path: "/api/reports?_method=GET",
			header: []string{"X-HTTP-Method-Override", "POST"}, status: 400, detail: "send one method override"},
		{name: "an allowed override on a GET", method: "GET", path: "/api/widgets/1?_method=DELETE", status: 400, detail: "POST only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			var body any
			if tt.method == "POST" {
				body = map[string]any{"name": "r2"}
			}
			r := g.do(t, tt.method, tt.path, body, tt.header...)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			if got := r.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
			if ct := r.Header.Get("Content-Type"); ct != problem.ContentType {
				t.Errorf("Content-Type %q, want problem+json", ct)
			}
			if p := r.JSON(t); !strings.Contains(p["detail"].(string), tt.detail) {
				t.Errorf("detail %q, want it to name %q", p["detail"], tt.detail)
			}
			if reqs := api.Requests(); len(reqs) > 0 {
				t.Errorf("a refused override reached the legacy API:%s", describeRequests(reqs))
			}
		})
	}
	if items := api.Items("/api/reports"); len(items) != 1 {
		t.Errorf("reports are now %v", items)
	}
	if _, ok := api.Item("/api/widgets", "1"); !ok {
		t.Error("widget 1 was deleted")
	}
}

// TestMethodOverrideApplied: an allowed override on a POST continues as
// the method it names, and no override, header or parameter, reaches a
// sub-request or a request that passes through.
func TestMethodOverrideApplied(t *testing.T) {
	api := newLegacyAPI()
	g := startGateway(t, api, reportsSite)
	override := []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"}
	noOverride := func(t *testing.T) {
		t.Helper()
		reqs := api.Requests()
		if len(reqs) == 0 {
			t.Fatal("nothing reached the legacy API")
		}
		for _, req := range reqs {
			for _, name := range override {
				if v := req.Header.Values(name); len(v) > 0 {
					t.Errorf("%s %s carries %s %q", req.Method, req.Path, name, v)
				}
			}
			if strings.Contains(req.RawQuery, "_method") {
				t.Errorf("%s %s carries the query %q", req.Method, req.Path, req.RawQuery)
			}
		}
	}

	t.Run("a single POST becomes the DELETE it names", func(t *testing.T) {
		api.ResetLog()
		if r := g.do(t, "POST", "/api/widgets/3", nil, "X-HTTP-Method-Override", "DELETE"); r.Status != 200 {
			t.Fatalf("got %v", r)
		}
		if _, ok := api.Item("/api/widgets", "3"); ok {
			t.Error("widget 3 was not deleted")
		}
		if reqs := api.Requests(); len(reqs) != 1 || reqs[0].Method != "DELETE" {
			t.Errorf("the legacy API got%s", describeRequests(reqs))
		}
		noOverride(t)
	})
	t.Run("a single POST with _method=PATCH", func(t *testing.T) {
		api.ResetLog()
		if r := g.do(t, "POST", "/api/widgets/4?_method=PATCH&x=1", map[string]any{"name": "four"}); r.Status != 200 {
			t.Fatalf("got %v", r)
		}
		if rec, _ := api.Item("/api/widgets", "4"); rec["name"] != "four" {
			t.Errorf("widget 4 is %v", rec)
		}
		if reqs := api.Requests(); len(reqs) != 1 || reqs[0].Method != "PATCH" || reqs[0].RawQuery != "x=1" {
			t.Errorf("the legacy API got%s (query %q)", describeRequests(reqs), reqs[0].RawQuery)
		}
		noOverride(t)
	})
	t.Run("a POST with override PATCH and an array body is a batch update", func(t *testing.T) {
		api.ResetLog()
		checkEnvelope(t, g.do(t, "POST", "/api/widgets", `[{"id": 5, "name": "five"}, {"id": 6, "name": "six"}]`,
			"X-HTTP-Method-Override", "PATCH"), 200, "succeeded")
		for id, name := range map[string]string{"5": "five", "6": "six"} {
			if rec, _ := api.Item("/api/widgets", id); rec["name"] != name {
				t.Errorf("widget %s is %v", id, rec)
			}
		}
		if w := writes(api.Requests()); len(w) != 2 || w[0].Method != "PATCH" || w[1].Method != "PATCH" {
			t.Errorf("writes:%s", describeRequests(w))
		}
		noOverride(t)
	})
	t.Run("a POST with _method=DELETE and ids is a batch delete", func(t *testing.T) {
		api.ResetLog()
		checkEnvelope(t, g.do(t, "POST", "/api/widgets?ids=7,8&_method=DELETE", nil), 200, "succeeded")
		for _, id := range []string{"7", "8"} {
			if _, ok := api.Item("/api/widgets", id); ok {
				t.Errorf("widget %s was not deleted", id)
			}
		}
		noOverride(t)
	})
	t.Run("a batch create that names POST: the sub-requests do not carry it", func(t *testing.T) {
		api.ResetLog()
		b := checkEnvelope(t, g.do(t, "POST", "/api/widgets", `[{"name": "n1"}, {"name": "n2"}]`,
			"X-HTTP-Method-Override", "POST", "X-HTTP-Method", "POST", "X-Method-Override", "post"), 201, "succeeded")
		for i, it := range b.Items {
			if rec, ok := api.Item("/api/widgets", it.ID); !ok || rec["name"] != []string{"n1", "n2"}[i] {
				t.Errorf("item %d: %v", i, rec)
			}
		}
		noOverride(t)
	})
	t.Run("a batch GET with _method=GET: the sub-requests do not carry it", func(t *testing.T) {
		api.ResetLog()
		checkEnvelope(t, g.do(t, "GET", "/api/widgets?fields=name&_method=GET&ids=1,2", nil), 200, "succeeded")
		for _, req := range api.Requests() {
			if req.RawQuery != "fields=name" {
				t.Errorf("%s %s carries the query %q, want fields=name", req.Method, req.Path, req.RawQuery)
			}
		}
		noOverride(t)
	})
	t.Run("a request that passes through with _method naming its own method", func(t *testing.T) {
		api.ResetLog()
		if r := g.do(t, "GET", "/api/widgets/1?_method=GET", nil, "X-HTTP-Method", "GET"); r.Status != 200 {
			t.Fatalf("got %v", r)
		}
		noOverride(t)
	})
}
