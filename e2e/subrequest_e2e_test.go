package e2e

import (
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

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

// TestBatchSubRequestIsolation (docs/operations.md, "Sub-requests and reloads"): a sub-request sees what
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

// TestBatchIdsAreEscapedIntoThePath: ids with characters that mean
// something in a URL reach their own item, and only it, in every
// operation and in the undo of a failed one.
func TestBatchIdsAreEscapedIntoThePath(t *testing.T) {
	odd := []string{"a b", "x?y", "c#d", "100%", "ü", "semi;colon", "comma,id", "q=1&r=2"}
	var seed []map[string]any
	for _, id := range odd {
		seed = append(seed, map[string]any{"id": id, "name": "odd " + id})
	}
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/odd", PutCreates: true, Seed: seed})
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

// TestBatchConcurrencyBound: at most concurrency sub-requests of a batch
// are in flight at once, and they do run side by side.
func TestBatchConcurrencyBound(t *testing.T) {
	api := seededAPI()
	counting := &inFlightMeter{Handler: api}
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
	if n := counting.peakInFlight(); n > 3 || n < 2 {
		t.Errorf("%d sub-requests in flight at once, want 2 or 3 (concurrency 3)", n)
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
