package e2e

// Traces through Caddy's tracing directive (docs/operations.md,
// "Traces"): the spans a batch makes, the traceparent each sub-request
// carries upstream, the links of a retry, and what no span holds.

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

func init() {
	caddy.RegisterModule(spanTap{})
	httpcaddyfile.RegisterHandlerDirective("batchtest_spans", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return spanTap{}, nil
	})
	httpcaddyfile.RegisterDirectiveOrder("batchtest_spans", httpcaddyfile.After, "tracing")
}

// recordedSpans are every span that ended in a tracer provider a
// spanTap saw, from the moment it saw it: Caddy's provider is a global
// of its tracing package that no config can hand a span processor, so
// the tap attaches one to the provider of the span in a request's
// context.
var (
	recordedSpans = tracetest.NewSpanRecorder()
	tappedMu      sync.Mutex
	tapped        = map[*sdktrace.TracerProvider]bool{}
)

// spanTap is the test's http.handlers.batchtest_spans: put after
// tracing, it attaches recordedSpans to the provider of the request's
// span, and passes the request on.
type spanTap struct{}

func (spanTap) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.batchtest_spans", New: func() caddy.Module { return new(spanTap) }}
}

func (spanTap) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if tp, ok := trace.SpanFromContext(r.Context()).TracerProvider().(*sdktrace.TracerProvider); ok {
		tappedMu.Lock()
		if !tapped[tp] {
			tapped[tp] = true
			tp.RegisterSpanProcessor(recordedSpans)
		}
		tappedMu.Unlock()
	}
	return next.ServeHTTP(w, r)
}

var _ caddyfile.Unmarshaler = (*spanTap)(nil)

func (spanTap) UnmarshalCaddyfile(*caddyfile.Dispenser) error { return nil }

// tracedSite serves /api/widgets and /api/gadgets in a route that
// traces, taps the spans and then runs batch (with opts) before
// reverse_proxy.
func tracedSite(opts string) string {
	return `
	route {
		tracing
		batchtest_spans
		batch {
			concurrency 1
			compensation_retries 1
			` + opts + `
			resource /api/widgets {` + resourceMethods + `
			}
			resource /api/gadgets {` + resourceMethods + `
			}
		}
		reverse_proxy UPSTREAM
	}`
}

// untracedSite is tracedSite without tracing.
func untracedSite() string {
	return strings.Replace(tracedSite(""), "tracing\n", "", 1)
}

// A trace id of the test's own, and the traceparent that starts it.
const (
	clientTrace       = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientTraceparent = "00-" + clientTrace + "-00f067aa0ba902b7-01"
)

// spansOf waits until the trace's server span has ended (it ends after
// the answer is written) and returns the trace's spans.
func spansOf(t testing.TB, traceID string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var spans []sdktrace.ReadOnlySpan
	eventually(t, 5*time.Second, "the batch's server span ends", func() bool {
		spans = spans[:0]
		server := false
		for _, s := range recordedSpans.Ended() {
			if s.SpanContext().TraceID().String() == traceID {
				spans = append(spans, s)
				server = server || s.SpanKind() == trace.SpanKindServer
			}
		}
		return server
	})
	return spans
}

func kindOf(spans []sdktrace.ReadOnlySpan, kind trace.SpanKind) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanKind() == kind {
			out = append(out, s)
		}
	}
	return out
}

func attrsOf(s sdktrace.ReadOnlySpan) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// traceparentOf is the traceparent that names s.
func traceparentOf(s sdktrace.ReadOnlySpan) string {
	return "00-" + s.SpanContext().TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"
}

// A 3-id batch GET under tracing: three CLIENT spans, children of the
// server span, each carrying the item's attributes, and the traceparent
// each GET carries to the API names its own span.
func TestTracingSpanPerSubRequest(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, tracedSite(""))
	r := g.do(t, "GET", "/api/widgets?ids=1,2,3", nil, "Traceparent", clientTraceparent)
	if r.Status != 200 {
		t.Fatalf("answered %s", r)
	}
	spans := spansOf(t, clientTrace)
	server := kindOf(spans, trace.SpanKindServer)
	client := kindOf(spans, trace.SpanKindClient)
	if len(server) != 1 || len(client) != 3 {
		t.Fatalf("%d server and %d client spans, want 1 and 3", len(server), len(client))
	}
	b := attrsOf(server[0])
	if b["batch.op"] != "get" || b["batch.items"] != "3" || b["batch.outcome"] != "succeeded" || b["batch.resource"] != "/api/widgets" {
		t.Errorf("the batch span's attributes %v", b)
	}
	byPath := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range client {
		a := attrsOf(s)
		if s.Parent().SpanID() != server[0].SpanContext().SpanID() || s.Name() != "batch item GET" ||
			a["batch.item.outcome"] != "succeeded" || a["http.response.status_code"] != "200" || a["batch.attempt"] != "1" {
			t.Errorf("span %s %v, parent %s", s.Name(), a, s.Parent().SpanID())
		}
		byPath[a["url.path"]] = s
	}
	for _, req := range api.Requests() {
		s, ok := byPath[req.Path]
		if !ok {
			t.Fatalf("no span for %s %s", req.Method, req.Path)
		}
		if got := req.Header.Get("Traceparent"); got != traceparentOf(s) {
			t.Errorf("%s carried traceparent %q, want its span's %q", req.Path, got, traceparentOf(s))
		}
	}
}

// Without tracing nothing is recorded, and each sub-request carries the
// client's tracing headers byte for byte.
func TestNoTracingNothingMade(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, untracedSite())
	const trace2 = "5bf92f3577b34da6a3ce929d0e0e4736"
	header := []string{"Traceparent", "00-" + trace2 + "-00f067aa0ba902b7-01", "Tracestate", "client=1", "B3", trace2 + "-00f067aa0ba902b7-1"}
	if r := g.do(t, "GET", "/api/widgets?ids=1,2", nil, header...); r.Status != 200 {
		t.Fatalf("answered %s", r)
	}
	for _, req := range api.Requests() {
		for i := 0; i < len(header); i += 2 {
			if got := req.Header.Get(header[i]); got != header[i+1] {
				t.Errorf("%s %s carried %s %q, want the client's %q", req.Method, req.Path, header[i], got, header[i+1])
			}
		}
	}
	for _, s := range recordedSpans.Ended() {
		if s.SpanContext().TraceID().String() == trace2 {
			t.Errorf("span %q recorded without tracing", s.Name())
		}
	}
}

// Under OTEL_PROPAGATORS with b3, the client's b3 is written afresh
// too: both headers name the item's span.
func TestTracingPropagatorsWriteAfresh(t *testing.T) {
	t.Setenv("OTEL_PROPAGATORS", "tracecontext,baggage,b3")
	api := seededAPI()
	g := startGateway(t, api, tracedSite(""))
	const trace3 = "6bf92f3577b34da6a3ce929d0e0e4736"
	bogusB3 := trace3 + "-bbbbbbbbbbbbbbbb-1"
	if r := g.do(t, "GET", "/api/widgets?ids=1", nil, "Traceparent", "00-"+trace3+"-00f067aa0ba902b7-01", "B3", bogusB3); r.Status != 200 {
		t.Fatalf("answered %s", r)
	}
	client := kindOf(spansOf(t, trace3), trace.SpanKindClient)
	if len(client) != 1 {
		t.Fatalf("%d client spans, want 1", len(client))
	}
	sc := client[0].SpanContext()
	req := api.Requests()[0]
	if got := req.Header.Get("Traceparent"); got != traceparentOf(client[0]) {
		t.Errorf("traceparent %q, want %q", got, traceparentOf(client[0]))
	}
	if got := req.Header.Get("B3"); !strings.HasPrefix(got, sc.TraceID().String()+"-"+sc.SpanID().String()) {
		t.Errorf("b3 %q, want it to name the span %s", got, sc.SpanID())
	}
}

// A batch update whose first item is throttled once and whose second
// fails: the re-send is the second attempt of the item's span, every
// write is preceded by its preflight read's span, and the undo follows
// its proof and names the write it undoes; the batch span has its saga,
// outcome and events.
func TestTracingResendsAndUndos(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, tracedSite("max_throttle_wait 5s"))
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/1", Status: 429, Header: http.Header{"Retry-After": {"1"}}, Times: 1})
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/2", Status: 422, Body: `{}`, ContentType: "application/json"})
	const trace4 = "7bf92f3577b34da6a3ce929d0e0e4736"
	r := g.do(t, "PATCH", "/api/widgets", `[{"id":1,"name":"a"},{"id":2,"name":"b"}]`, "Traceparent", "00-"+trace4+"-00f067aa0ba902b7-01")
	if r.Status != 409 && r.Status != 422 {
		t.Fatalf("answered %s, want the batch rolled back", r)
	}
	spans := spansOf(t, trace4)
	names := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range kindOf(spans, trace.SpanKindClient) {
		names[s.Name()] = append(names[s.Name()], s)
	}
	if len(names["batch preflight GET"]) != 2 || len(names["batch item PATCH"]) != 3 || len(names["batch undo PUT"]) != 1 || len(names["batch proof GET"]) != 1 {
		t.Fatalf("client spans by name: %v", countNames(names))
	}
	var written sdktrace.ReadOnlySpan
	for _, s := range names["batch item PATCH"] {
		if a := attrsOf(s); a["url.path"] == "/api/widgets/1" && a["batch.attempt"] == "2" && a["batch.item.outcome"] == "succeeded" {
			written = s
		}
	}
	if written == nil {
		t.Fatal("no second attempt of widget 1's PATCH that succeeded")
	}
	if u := attrsOf(names["batch undo PUT"][0]); u["batch.compensation.of"] != written.SpanContext().SpanID().String() || u["batch.item.outcome"] != "rolled_back" {
		t.Errorf("the undo's span %v, want it to name %s", u, written.SpanContext().SpanID())
	}
	server := kindOf(spans, trace.SpanKindServer)[0]
	b := attrsOf(server)
	if b["batch.saga"] == "" || b["batch.outcome"] != "rolled_back" {
		t.Errorf("the batch span's attributes %v", b)
	}
	events := map[string]bool{}
	for _, e := range server.Events() {
		events[e.Name] = true
	}
	for _, want := range []string{"batch.lock_wait", "batch.journal_store", "batch.throttle_hold", "batch.outcome"} {
		if !events[want] {
			t.Errorf("the batch span has no %s event: %v", want, events)
		}
	}
}

// finishSpan waits for the server span of a recovery or retry (how:
// "recovered" or "retried") to end, and returns it.
func finishSpan(t testing.TB, how string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	eventually(t, 5*time.Second, "the "+how+" saga's span ends", func() bool {
		for _, s := range recordedSpans.Ended() {
			if s.SpanKind() == trace.SpanKindServer && attrsOf(s)["batch.finish"] == how {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

func countNames(names map[string][]sdktrace.ReadOnlySpan) map[string]int {
	m := map[string]int{}
	for k, v := range names {
		m[k] = len(v)
	}
	return m
}

// Markers planted in every secret a batch handles — credentials, the
// elements' bodies, the items' pre-images, a scope_query value, the
// API's error answer — are in no recorded span.
func TestTracingHoldsNoSecret(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: []map[string]any{
		{"id": 1, "name": "PREIMAGE-MARKER"}, {"id": 2, "name": "PREIMAGE-MARKER"},
	}})
	g := startGateway(t, api, tracedSite("scope_query tenant\n\t\t\tmax_throttle_wait 5s"))
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/1", Status: 429, Header: http.Header{"Retry-After": {"1"}}, Times: 1})
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/2", Status: 422, Body: `{"detail":"ANSWER-MARKER"}`, ContentType: "application/json"})
	const trace5 = "8bf92f3577b34da6a3ce929d0e0e4736"
	g.do(t, "PATCH", "/api/widgets?tenant=QUERY-MARKER", `[{"id":1,"name":"BODY-MARKER"},{"id":2,"name":"BODY-MARKER"}]`,
		"Traceparent", "00-"+trace5+"-00f067aa0ba902b7-01", "Authorization", "Bearer CREDENTIAL-MARKER",
		"Cookie", "session=CREDENTIAL-MARKER", "X-Api-Key", "CREDENTIAL-MARKER")
	spans := spansOf(t, trace5)
	if len(kindOf(spans, trace.SpanKindClient)) < 4 {
		t.Fatalf("%d client spans: the batch did not run as planned", len(kindOf(spans, trace.SpanKindClient)))
	}
	for _, s := range spans {
		raw, err := json.Marshal(tracetest.SpanStubFromReadOnlySpan(s))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"PREIMAGE-MARKER", "BODY-MARKER", "QUERY-MARKER", "CREDENTIAL-MARKER", "ANSWER-MARKER"} {
			if strings.Contains(string(raw), m) {
				t.Errorf("span %q holds %s: %s", s.Name(), m, raw)
			}
		}
	}
}

// An operator's retry of a kept saga starts a trace of its own, linked
// to the batch's span, which the kept saga's traceparent names; its undo
// spans are children of the retry's span, and the stored traceparent
// reaches no request.
func TestTracingRetryLinksToTheBatch(t *testing.T) {
	api := seededAPI()
	site := strings.Replace(operatedSite("put"), "route {", "route {\n\t\ttracing\n\t\tbatchtest_spans", 1)
	g := startAdminGateway(t, api, site)
	const trace6 = "9bf92f3577b34da6a3ce929d0e0e4736"
	stored := "00-" + trace6 + "-00f067aa0ba902b7-01"
	saga := leaveWidget17Behind(t, g, "Traceparent", stored)
	batchSpan := kindOf(spansOf(t, trace6), trace.SpanKindServer)[0]
	api.ResetLog()
	g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}})

	retry := finishSpan(t, "retried")
	if got := attrsOf(retry)["batch.saga"]; got != saga {
		t.Errorf("the retry's span names saga %q, want %q", got, saga)
	}
	if retry.SpanContext().TraceID() == batchSpan.SpanContext().TraceID() {
		t.Error("the retry runs in the batch's trace, not one of its own")
	}
	links := retry.Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != batchSpan.SpanContext().SpanID() || links[0].SpanContext.TraceID() != batchSpan.SpanContext().TraceID() {
		t.Errorf("the retry's links %+v, want the batch's span %s", links, batchSpan.SpanContext().SpanID())
	}
	undos := 0
	for _, s := range recordedSpans.Ended() {
		if s.SpanContext().TraceID() == retry.SpanContext().TraceID() && s.SpanKind() == trace.SpanKindClient {
			undos++
			if s.Parent().SpanID() != retry.SpanContext().SpanID() {
				t.Errorf("span %s is not the retry's child", s.Name())
			}
		}
	}
	if undos == 0 {
		t.Error("the retry made no client span")
	}
	for _, req := range api.Requests() {
		if tp := req.Header.Get("Traceparent"); strings.Contains(tp, trace6) {
			t.Errorf("%s %s carried the stored traceparent %q", req.Method, req.Path, tp)
		}
	}
}

// storedTraceparent is the traceparent a journal in dir holds: the
// dead batch's span, after Caddy's tracing wrote it into the header.
var storedTraceparent = regexp.MustCompile(`00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]`)

// A recovery of a saga whose gateway died under tracing starts a trace
// of its own, linked to the span context the journal kept; no request
// it sends carries the stored traceparent.
func TestTracingRecoveryLinksToTheDeadBatch(t *testing.T) {
	tc := deadSagaCases[0]
	tc.traced = true
	dir, addr := t.TempDir(), freeAddr(t)
	api := tc.api()
	upstream, before := deadSaga(t, tc, api, dir, addr, 2*time.Second)
	var stored string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && stored == "" {
			raw, _ := os.ReadFile(path)
			stored = storedTraceparent.FindString(string(raw))
		}
		return nil
	})
	if stored == "" {
		t.Fatal("the journal holds no traceparent")
	}
	deadTrace, deadSpan := stored[3:35], stored[36:52]
	api.ResetLog()
	startJournalGatewayAt(t, api, upstream, addr, dir, "lease 1s\n\t\trecovery_interval 100ms", "\tbatchtest_spans\n"+tc.recoverySite())
	waitRecovered(t, api, tc.collection, before, dir, 15*time.Second)

	recovery := finishSpan(t, "recovered")
	if recovery.SpanContext().TraceID().String() == deadTrace {
		t.Error("the recovery runs in the dead batch's trace")
	}
	if links := recovery.Links(); len(links) != 1 || links[0].SpanContext.TraceID().String() != deadTrace || links[0].SpanContext.SpanID().String() != deadSpan {
		t.Errorf("the recovery's links %+v, want the stored %s", links, stored)
	}
	for _, req := range api.Requests() {
		if strings.Contains(req.Header.Get("Traceparent"), deadTrace) {
			t.Errorf("%s %s carried the stored traceparent", req.Method, req.Path)
		}
	}
}
