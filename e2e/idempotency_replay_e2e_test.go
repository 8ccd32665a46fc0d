package e2e

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The end-to-end tests of Idempotency-Key replay (docs/durability.md,
// "Idempotency-Key replay"): a real
// Caddy whose storage is a folder of the test's, so that a test can read
// and age the records it left.

// idemSite is a batch handler for seededAPI's widgets and gadgets.
const idemSite = `
	batch {
		scope_query tenant
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/gadgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

// startIdemGateway serves site with file_system storage in dir.
func startIdemGateway(t *testing.T, api *legacyapi.API, dir, site string) *gateway {
	t.Helper()
	return startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+dir, site)
}

// newUpstream serves api on a free loopback port until the test ends,
// and returns its host:port.
func newUpstream(t testing.TB, api http.Handler) string {
	t.Helper()
	upstream := httptest.NewServer(api)
	t.Cleanup(func() {
		if a, ok := api.(*legacyapi.API); ok {
			a.Close()
		}
		upstream.Close()
	})
	return upstream.Listener.Addr().String()
}

// checkReplay checks that again is first replayed: the same status,
// headers and body, marked Idempotent-Replayed, and that nothing reached
// the legacy API for it.
func checkReplay(t *testing.T, api *legacyapi.API, first, again response) {
	t.Helper()
	if again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the answer is not marked Idempotent-Replayed: %v", again)
	}
	if again.Status != first.Status || !bytes.Equal(again.Body, first.Body) {
		t.Errorf("replayed %v\n    first %v", again, first)
	}
	for _, name := range []string{"Content-Type", "Content-Length", "X-Content-Type-Options", "Retry-After", "Preference-Applied", "Www-Authenticate"} {
		if got, want := again.Header.Values(name), first.Header.Values(name); !slices.Equal(got, want) {
			t.Errorf("replayed %s %q, first %q", name, got, want)
		}
	}
	if reqs := api.Requests(); len(reqs) > 0 {
		t.Errorf("a replay sent %d requests upstream:%s", len(reqs), describeRequests(reqs))
	}
}

// TestIdempotencyReplay: every batch write with a key is answered the
// second time from storage, whatever its atomicity, and sends nothing
// upstream; without a key, or for a batch GET, it runs again.
func TestIdempotencyReplay(t *testing.T) {
	api := seededAPI()
	g := startIdemGateway(t, api, t.TempDir(), `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
			atomicity partial
		}
	}
	reverse_proxy UPSTREAM
`)
	ops := []struct {
		name, method, path, body string
		status                   int
	}{
		{"create", "POST", "/api/widgets", `[{"id": 101, "name": "a"}, {"id": 102, "name": "b"}]`, 201},
		{"update", "PATCH", "/api/widgets", `[{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]`, 200},
		{"delete", "DELETE", "/api/widgets?ids=3,4", "", 200},
		{"partial create", "POST", "/api/gadgets", `[{"id": 201, "name": "a"}, {"id": 1, "name": "taken"}]`, 207},
		{"partial delete", "DELETE", "/api/gadgets?ids=5,6", "", 200},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			var body any
			if op.body != "" {
				body = op.body
			}
			key := []string{"Idempotency-Key", `"key-` + op.name + `"`}
			api.ResetLog()
			first := g.do(t, op.method, op.path, body, key...)
			if first.Status != op.status {
				t.Fatalf("first answer %v, want %d", first, op.status)
			}
			if first.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("the first answer is marked replayed")
			}
			if len(api.Requests()) == 0 {
				t.Fatal("the first request sent nothing upstream")
			}
			api.ResetLog()
			checkReplay(t, api, first, g.do(t, op.method, op.path, body, key...))
		})
	}
	t.Run("no key runs again", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "PATCH", "/api/widgets", `[{"id": 7, "name": "x"}]`)
		r2 := g.do(t, "PATCH", "/api/widgets", `[{"id": 7, "name": "x"}]`)
		if r.Status != 200 || r2.Status != 200 || r2.Header.Get("Idempotent-Replayed") != "" || len(writes(api.Requests())) != 2 {
			t.Errorf("%v then %v; writes upstream:%s", r, r2, describeRequests(writes(api.Requests())))
		}
	})
	t.Run("batch GET is not recorded", func(t *testing.T) {
		api.ResetLog()
		for range 2 {
			if r := g.do(t, "GET", "/api/widgets?ids=8", nil, "Idempotency-Key", "get-key"); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("%v", r)
			}
		}
		if n := len(api.Requests()); n != 2 {
			t.Errorf("%d requests upstream, want 2", n)
		}
	})
}

// TestIdempotencyRolledBackCreateReplayed is the reported bug: a client
// that retried a rolled-back batch CREATE with the same key got "201
// succeeded" naming an item that no longer existed, because the upstream
// (which honours keys) replayed its stored answer to the per-item key of
// an item the gateway had since deleted. Now the retry gets the stored
// rolled-back answer, and nothing reaches the upstream.
func TestIdempotencyRolledBackCreateReplayed(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/things", HonorKeys: true, AssignIDs: true})
	g := startIdemGateway(t, api, t.TempDir(), `
	batch {
		resource /api/things {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(passThrough("POST", "/api/things", 1))
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/things", Status: 500, Body: "database down", Times: 1})
	key := []string{"Idempotency-Key", `"retry-me"`}
	body := `[{"name": "a"}, {"name": "b"}]`

	first := g.do(t, "POST", "/api/things", body, key...)
	b := checkProblem(t, first, 502)
	if b.Outcome != "rolled_back" {
		t.Fatalf("first outcome %q, want rolled_back: %s", b.Outcome, first.Body)
	}
	if items := api.Items("/api/things"); len(items) != 0 {
		t.Fatalf("the rollback left %v", items)
	}
	api.ResetLog()
	replaysBefore := metricValue(t, "idempotent_replays_total")
	again := g.do(t, "POST", "/api/things", body, key...)
	checkReplay(t, api, first, again)
	if n := metricValue(t, "idempotent_replays_total") - replaysBefore; n != 1 {
		t.Errorf("caddy_http_batch_idempotent_replays_total grew by %v, want 1", n)
	}
	if b := again.batch(t); b.Outcome != "rolled_back" {
		t.Errorf("the retry's outcome %q, want the stored rolled_back", b.Outcome)
	}
	if items := api.Items("/api/things"); len(items) != 0 {
		t.Errorf("the retry left %v", items)
	}
}

// TestIdempotencyAnswerHeaders: a replay carries the headers the first
// answer had: Retry-After, Preference-Applied, WWW-Authenticate.
func TestIdempotencyAnswerHeaders(t *testing.T) {
	api := seededAPI()
	upstream := httptest.NewServer(headerRewriter{Handler: api, rewrite: func(r *http.Request, h http.Header) {
		switch r.Method + " " + r.URL.Path {
		case "DELETE /api/widgets/5":
			h.Set("Retry-After", "120")
		case "GET /api/widgets/6":
			h.Set("WWW-Authenticate", `Bearer realm="widgets"`)
		}
	}})
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	g := startGatewayStorage(t, api, upstream.Listener.Addr().String(), "storage file_system "+t.TempDir(), `
	batch {
		allow_override
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/5", Status: 503, Body: "busy"})
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/6", Status: 401, Body: "who are you?"})
	cases := []struct {
		name, path string
		header     []string
		status     int
		want       map[string]string
	}{
		{"Retry-After and Preference-Applied", "/api/widgets?ids=4,5", []string{"Prefer", "atomicity=partial"}, 207,
			map[string]string{"Retry-After": "120", "Preference-Applied": "atomicity=partial"}},
		{"WWW-Authenticate", "/api/widgets?ids=6", nil, 401,
			map[string]string{"Www-Authenticate": `Bearer realm="widgets"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			header := append([]string{"Idempotency-Key", "headers-" + c.name}, c.header...)
			api.ResetLog()
			first := g.do(t, "DELETE", c.path, nil, header...)
			if first.Status != c.status {
				t.Fatalf("first %v, want %d", first, c.status)
			}
			for name, want := range c.want {
				if got := first.Header.Get(name); got != want {
					t.Fatalf("first answer's %s %q, want %q: %v", name, got, want, first)
				}
			}
			api.ResetLog()
			checkReplay(t, api, first, g.do(t, "DELETE", c.path, nil, header...))
		})
	}
}
