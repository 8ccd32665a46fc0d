package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

func newLegacyAPI() *legacyapi.API {
	widgets := make([]map[string]any, 20)
	for i := range widgets {
		widgets[i] = map[string]any{"id": i + 1, "name": "w" + strconv.Itoa(i+1)}
	}
	return legacyapi.NewRecording(
		legacyapi.Collection{Path: "/api/widgets", Seed: widgets},
		legacyapi.Collection{Path: "/api/gadgets", PutCreates: true, Seed: []map[string]any{{"id": 1, "name": "g1"}, {"id": 2, "name": "g2"}}},
		legacyapi.Collection{Path: "/api/reports", Seed: []map[string]any{{"id": 1, "name": "r1"}}},
		legacyapi.Collection{Path: "/api/tokens", Seed: []map[string]any{{"id": 1, "name": "t1"}}},
	)
}

const methodsSite = `
	batch {
		resource /api/widgets {
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE
		}
		resource /api/gadgets {
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE
			atomicity partial
			delete_semantics declarative
		}
		resource /api/reports {
			collection GET
			item       GET
			batch      none
		}
		resource /api/tokens {
			collection POST
			item       DELETE
		}
	}
	reverse_proxy UPSTREAM
`

// TestMethodMap holds the gateway to the method map (docs/wire-format.md,
// "Method map"), row by row: the
// status, the Allow and Accept-Patch headers, the body's type, and
// whether the request reached the legacy API at all.
func TestMethodMap(t *testing.T) {
	g := startGateway(t, newLegacyAPI(), methodsSite)
	tests := []struct {
		name         string
		method, path string
		header       []string
		body         any
		status       int
		allow        string // "" when the answer must carry none
		acceptPatch  bool
		problem      bool
		reached      bool // the legacy API received it
	}{
		{name: "OPTIONS on a collection: 204 with the map's methods, HEAD and OPTIONS",
			method: "OPTIONS", path: "/api/widgets", status: 204, allow: "GET, HEAD, POST, PATCH, DELETE, OPTIONS", acceptPatch: true},
		{name: "OPTIONS on an item", method: "OPTIONS", path: "/api/widgets/1",
			status: 204, allow: "GET, HEAD, PUT, PATCH, DELETE, OPTIONS", acceptPatch: true},
		{name: "OPTIONS on a read-only item: no Accept-Patch", method: "OPTIONS", path: "/api/reports/1",
			status: 204, allow: "GET, HEAD, OPTIONS"},
		{name: "OPTIONS with a trailing slash", method: "OPTIONS", path: "/api/reports/",
			status: 204, allow: "GET, HEAD, OPTIONS"},
		{name: "OPTIONS without GET: no HEAD", method: "OPTIONS", path: "/api/tokens/1",
			status: 204, allow: "DELETE, OPTIONS"},
		{name: "CORS preflight passes through", method: "OPTIONS", path: "/api/widgets",
			header: []string{"Origin", "http://app.example", "Access-Control-Request-Method", "PATCH"},
			status: 405, reached: true}, // the legacy API's own answer
		{name: "DELETE on a read-only item: 405 with Allow", method: "DELETE", path: "/api/reports/1",
			status: 405, allow: "GET, HEAD, OPTIONS", problem: true},
		{name: "PUT on a collection: 405", method: "PUT", path: "/api/widgets", body: map[string]any{"id": 1},
			status: 405, allow: "GET, HEAD, POST, PATCH, DELETE, OPTIONS", problem: true},
		{name: "POST on an item: 405", method: "POST", path: "/api/widgets/1", body: map[string]any{"name": "x"},
			status: 405, allow: "GET, HEAD, PUT, PATCH, DELETE, OPTIONS", problem: true},
		{name: "HEAD where GET is not allowed: 405", method: "HEAD", path: "/api/tokens/1",
			status: 405, allow: "DELETE, OPTIONS", problem: true},
		{name: "repeated slashes cannot slip past the map", method: "DELETE", path: "//api//reports/1",
			status: 405, allow: "GET, HEAD, OPTIONS", problem: true},
		{name: "dot segments cannot slip past the map", method: "DELETE", path: "/api/x/../reports/1",
			status: 405, allow: "GET, HEAD, OPTIONS", problem: true},
		{name: "an escaped slash in an id stays in the item", method: "DELETE", path: "/api/reports/1%2F..%2F2",
			status: 405, allow: "GET, HEAD, OPTIONS", problem: true},
		{name: "unknown method: 501", method: "BREW", path: "/api/widgets/1", status: 501, problem: true},
		{name: "lower-case method is not GET: 501", method: "get", path: "/api/widgets/1", status: 501, problem: true},
		{name: "HEAD passes through where GET is allowed", method: "HEAD", path: "/api/widgets/2", status: 200, reached: true},
		{name: "item GET passes through", method: "GET", path: "/api/widgets/1", status: 200, reached: true},
		{name: "LIST passes through with its paging", method: "GET", path: "/api/widgets?offset=2&limit=3", status: 200, reached: true},
		{name: "single create passes through", method: "POST", path: "/api/widgets", body: map[string]any{"name": "single"}, status: 201, reached: true},
		{name: "collection DELETE without ids is a bad batch while batch delete is on", method: "DELETE", path: "/api/widgets", status: 400, problem: true},
		{name: "imperative DELETE of a missing item: the 404 stands", method: "DELETE", path: "/api/widgets/999", status: 404, reached: true},
		{name: "declarative DELETE of a missing item: 204", method: "DELETE", path: "/api/gadgets/999", status: 204, reached: true},
		{name: "declarative DELETE of an item: the upstream's answer", method: "DELETE", path: "/api/gadgets/2", status: 200, reached: true},
		{name: "unconfigured path passes through", method: "GET", path: "/elsewhere/1", status: 404, reached: true},
		{name: "unconfigured method on an unconfigured path passes through", method: "BREW", path: "/elsewhere", status: 404, reached: true},
		{name: "batch operation that is off: 405", method: "GET", path: "/api/reports?ids=1",
			status: 405, allow: "GET, HEAD, OPTIONS", problem: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(g.API.Requests())
			r := g.do(t, tt.method, tt.path, tt.body, tt.header...)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			if tt.allow != "" || !tt.reached {
				if got := r.Header.Get("Allow"); got != tt.allow {
					t.Errorf("Allow %q, want %q", got, tt.allow)
				}
			}
			if got := r.Header.Get("Accept-Patch"); (got != "") != tt.acceptPatch ||
				tt.acceptPatch && got != "application/json, application/merge-patch+json" {
				t.Errorf("Accept-Patch %q, want present: %v", got, tt.acceptPatch)
			}
			isProblem := r.Header.Get("Content-Type") == problem.ContentType
			if isProblem != tt.problem {
				t.Errorf("Content-Type %q, want problem: %v", r.Header.Get("Content-Type"), tt.problem)
			}
			if tt.problem && tt.method != "HEAD" {
				p := r.JSON(t)
				if p["status"] != float64(tt.status) || p["title"] != http.StatusText(tt.status) ||
					!strings.HasPrefix(p["type"].(string), "https://") || p["detail"] == "" {
					t.Errorf("problem body %s", r.Body)
				}
			}
			after := g.API.Requests()
			if reached := len(after) > before; reached != tt.reached {
				t.Fatalf("reached the legacy API: %v, want %v (%v)", reached, tt.reached, after[before:])
			}
			if tt.reached && after[len(after)-1].Method != tt.method {
				t.Errorf("the legacy API got %s, want %s", after[len(after)-1].Method, tt.method)
			}
		})
	}
	if _, ok := g.API.Item("/api/reports", "1"); !ok {
		t.Error("a refused DELETE removed /api/reports/1")
	}
	if _, ok := g.API.Item("/api/gadgets", "2"); ok {
		t.Error("a declarative DELETE did not reach the legacy API")
	}
}

// TestDeclarativeDeleteKeepsOtherAnswers checks that only a 404 is held
// back: the legacy API's other answers, bodies and headers pass as sent.
func TestDeclarativeDeleteKeepsOtherAnswers(t *testing.T) {
	api := newLegacyAPI()
	g := startGateway(t, api, methodsSite)
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/1", Status: 409, ContentType: "text/plain", Body: "locked"})
	r := g.do(t, "DELETE", "/api/gadgets/1", nil)
	if r.Status != 409 || string(r.Body) != "locked" || r.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("got %v %q", r, r.Header.Get("Content-Type"))
	}
	r = g.do(t, "DELETE", "/api/gadgets/404", nil)
	if r.Status != 204 || len(r.Body) != 0 || r.Header.Get("Content-Type") != "" || r.Header.Get("Content-Length") != "" {
		t.Fatalf("got %v with headers %v", r, r.Header)
	}
}
