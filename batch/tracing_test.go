package batch

// Tracing: a CLIENT span per request a run sends, the header that names
// it upstream, and the batch span's attributes and events
// (docs/operations.md, "Traces").

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// traced is a run's tracing into an in-memory recorder, beneath a
// batch span that stands for Caddy's server span.
type traced struct {
	rec   *tracetest.SpanRecorder
	rt    Runtime
	ctx   context.Context
	batch trace.Span
}

func newTraced(s Sender) *traced {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, span := tp.Tracer("test").Start(context.Background(), "server", trace.WithSpanKind(trace.SpanKindServer))
	return &traced{rec: rec, ctx: ctx, batch: span,
		rt: Runtime{Send: s, Trace: &Tracing{Tracer: span.TracerProvider().Tracer("caddy-batch"), Inject: injectW3C}}}
}

// injectW3C writes ctx's span context as W3C trace context, as Caddy's
// default propagators do.
func injectW3C(ctx context.Context, h http.Header) {
	w3c := propagation.TraceContext{}
	for _, f := range w3c.Fields() {
		h.Del(f)
	}
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}

// run runs r on /widgets and ends the batch span.
func (tc *traced) run(t testing.TB, r *http.Request, mods ...specMod) *Result {
	t.Helper()
	res := Run(tc.ctx, mustPlan(t, r, mods...), tc.rt)
	tc.batch.End()
	return res
}

// client are the recorded CLIENT spans, in the order they ended.
func (tc *traced) client() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tc.rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			out = append(out, s)
		}
	}
	return out
}

// server is the recorded batch span.
func (tc *traced) server(t testing.TB) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range tc.rec.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			return s
		}
	}
	t.Fatal("the batch span was not recorded")
	return nil
}

// attrs are a span's attributes, by key, as text.
func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// named are the spans whose name is name.
func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Each item of a batch GET is a CLIENT span, a child of the batch's span,
// and the traceparent its request carries upstream names that span, not
// the one the client sent.
func TestTracingSpanPerItem(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3")
	tc := newTraced(f)
	clientTP := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	tc.run(t, newRequest("GET", "/widgets?ids=1,2,3", "", "Traceparent", clientTP))
	spans := tc.client()
	equal(t, "CLIENT spans", len(spans), 3)
	byID := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		a := attrs(s.Attributes())
		byID[a["batch.item.id"]] = s
		equal(t, "name", s.Name(), "batch item GET")
		equal(t, "parent", s.Parent().SpanID(), tc.batch.SpanContext().SpanID())
		equal(t, "trace", s.SpanContext().TraceID(), tc.batch.SpanContext().TraceID())
		want := map[string]string{"batch.op": "get", "batch.resource": "/widgets", "http.request.method": "GET",
			"url.path": "/widgets/" + a["batch.item.id"], "http.response.status_code": "200",
			"batch.item.outcome": "succeeded", "batch.attempt": "1", "batch.request.kind": "item"}
		for k, v := range want {
			equal(t, k, a[k], v)
		}
		if s.Status().Code == codes.Error {
			t.Errorf("%s: error status on a succeeded item", s.Name())
		}
	}
	for _, c := range f.log() {
		id := strings.TrimPrefix(c.Path, "/widgets/")
		s, ok := byID[id]
		if !ok {
			t.Fatalf("no span for %s", c)
		}
		want := "00-" + s.SpanContext().TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"
		equal(t, c.Path+" traceparent", c.Header.Get("Traceparent"), want)
	}
}

// Without Runtime.Trace nothing is made and the sub-requests carry the
// client's own headers, as they came.
func TestNoTracingLeavesTheHeaders(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	p := mustPlan(t, newRequest("GET", "/widgets?ids=1,2", "", "Traceparent", tp, "Tracestate", "a=b"))
	Run(context.Background(), p, Runtime{Send: f})
	for _, c := range f.log() {
		equal(t, c.Path+" traceparent", c.Header.Get("Traceparent"), tp)
		equal(t, c.Path+" tracestate", c.Header.Get("Tracestate"), "a=b")
	}
}

// A write throttled once is one request of two attempts; the item that
// fails has an error status; the undo names the span of the write it
// undoes and follows its proof read; the batch span sums the throttle's
// hold and ends with the outcome.
func TestTracingAttemptsAndUndos(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake().seed("1", "2")
		f.on("PATCH", "/widgets/1", throttle(), answer{})
		f.on("PATCH", "/widgets/2", reply(422, `{}`))
		tc := newTraced(f)
		res := tc.run(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1))
		equal(t, "outcome", res.Outcome, RolledBack)
		spans := tc.client()
		equal(t, "preflight spans", len(named(spans, "batch preflight GET")), 2)
		items := named(spans, "batch item PATCH")
		equal(t, "item spans", len(items), 3)
		var write1 sdktrace.ReadOnlySpan
		for _, s := range items {
			a := attrs(s.Attributes())
			switch {
			case a["batch.item.id"] == "1" && a["batch.attempt"] == "1":
				equal(t, "throttled attempt status", a["http.response.status_code"], "429")
				equal(t, "throttled attempt's outcome", a["batch.item.outcome"], "")
				equal(t, "throttled attempt's span status", s.Status().Code, codes.Unset)
			case a["batch.item.id"] == "1":
				equal(t, "second attempt", a["batch.attempt"], "2")
				equal(t, "item 1 outcome", a["batch.item.outcome"], "succeeded")
				write1 = s
			default:
				equal(t, "item 2 outcome", a["batch.item.outcome"], "failed")
				equal(t, "item 2 span status", s.Status().Code, codes.Error)
			}
		}
		undos := named(spans, "batch undo PUT")
		equal(t, "undo spans", len(undos), 1)
		u := attrs(undos[0].Attributes())
		equal(t, "undo compensation.of", u["batch.compensation.of"], write1.SpanContext().SpanID().String())
		equal(t, "undo outcome", u["batch.item.outcome"], "rolled_back")
		equal(t, "undo parent", undos[0].Parent().SpanID(), tc.batch.SpanContext().SpanID())
		equal(t, "proof spans", len(named(spans, "batch proof GET")), 1)

		b := tc.server(t)
		a := attrs(b.Attributes())
		equal(t, "batch.op", a["batch.op"], "update")
		equal(t, "batch.items", a["batch.items"], "2")
		equal(t, "batch.outcome", a["batch.outcome"], "rolled_back")
		events := map[string]map[string]string{}
		for _, e := range b.Events() {
			events[e.Name] = attrs(e.Attributes)
		}
		equal(t, "throttle_hold count", events["batch.throttle_hold"]["batch.count"], "1")
		equal(t, "outcome event", events["batch.outcome"]["batch.outcome"], "rolled_back")
		equal(t, "outcome event compensations", events["batch.outcome"]["batch.compensations"], "1")
		if _, ok := events["batch.journal_store"]; ok {
			t.Error("a run without a journal has a journal_store event")
		}
	})
}

// A compensation's retries are attempts of the undo's request: every
// attempt but the last ended by the next, 5xx ones with an error status.
func TestTracingCompensationRetries(t *testing.T) {
	t.Parallel()
	f := newFake().on("POST", "/widgets", answer{}, reply(409, `{}`)).
		on("DELETE", "/widgets/1000", reply(503, ``), reply(204, ``))
	tc := newTraced(f)
	p := mustPlan(t, newRequest("POST", "/widgets", elements(2)), concurrency(1), compensationRetries(2))
	newBatchRun(p, tc.rt, noBackoff).do(tc.ctx)
	undos := named(tc.client(), "batch undo DELETE")
	equal(t, "undo attempts", len(undos), 2)
	first, last := attrs(undos[0].Attributes()), attrs(undos[1].Attributes())
	equal(t, "first attempt", first["batch.attempt"], "1")
	equal(t, "first attempt status", undos[0].Status().Code, codes.Error)
	equal(t, "last attempt", last["batch.attempt"], "2")
	equal(t, "last outcome", last["batch.item.outcome"], "rolled_back")
	equal(t, "last status", undos[1].Status().Code, codes.Unset)
}

// A batch GET through the list filter is one LIST span carrying how many
// ids it reads, and no index or id.
func TestTracingList(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2", "3")
	tc := newTraced(f)
	tc.run(t, newRequest("GET", "/widgets?ids=1,2,3,4", ""), listFilter(policy.ListFilterSpec{}))
	spans := tc.client()
	lists := named(spans, "batch list GET")
	equal(t, "LIST spans", len(lists), 1)
	a := attrs(lists[0].Attributes())
	equal(t, "batch.items", a["batch.items"], "4")
	if _, ok := a["batch.item.index"]; ok {
		t.Error("a LIST span carries an index")
	}
	equal(t, "url.path", a["url.path"], "/widgets")
	equal(t, "fallback item spans", len(named(spans, "batch item GET")), 1)
}

// No body, pre-image, credential or query value goes into a span.
func TestTracingPlantsNoSecrets(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.put(widget("1"), map[string]any{"id": "1", "secret": "PREIMAGE-MARKER"})
	f.put(widget("2"), map[string]any{"id": "2", "secret": "PREIMAGE-MARKER"})
	f.on("PATCH", "/widgets/2", reply(422, `{"detail":"ANSWER-MARKER"}`))
	tc := newTraced(f)
	tc.run(t, newRequest("PATCH", "/widgets?tenant=QUERY-MARKER", `[{"id":"1","v":"BODY-MARKER"},{"id":"2","v":"BODY-MARKER"}]`,
		"Authorization", "Bearer CREDENTIAL-MARKER", "Cookie", "s=CREDENTIAL-MARKER"), concurrency(1), scopeQuery("tenant"))
	if len(tc.client()) == 0 {
		t.Fatal("no span recorded")
	}
	for _, s := range tc.rec.Ended() {
		text := spanText(t, s)
		for _, m := range []string{"PREIMAGE-MARKER", "ANSWER-MARKER", "QUERY-MARKER", "BODY-MARKER", "CREDENTIAL-MARKER"} {
			if strings.Contains(text, m) {
				t.Errorf("span %q holds %s: %s", s.Name(), m, text)
			}
		}
	}
}

// spanText is everything a span exports, as text.
func spanText(t testing.TB, s sdktrace.ReadOnlySpan) string {
	t.Helper()
	b, err := json.Marshal(tracetest.SpanStubFromReadOnlySpan(s))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// An envelope's operations are item spans, each with its own operation
// and resource, and the one whose url names a created item carries its
// id; the batch span is the envelope's.
func TestTracingEnvelope(t *testing.T) {
	t.Parallel()
	p, prob := admitEnvelope(t, shop(t), userWithPosts)
	if prob != nil {
		t.Fatalf("refused: %d %s", prob.Status, prob.Detail)
	}
	f := newShopAPI("/users", "/users/100/posts")
	tc := newTraced(f)
	tc.rt.Locks = &itemlock.Local{}
	if res := Run(tc.ctx, p, tc.rt); res.Outcome != Succeeded {
		t.Fatalf("outcome %s", res.Outcome)
	}
	tc.batch.End()
	items := named(tc.client(), "batch item POST")
	equal(t, "item spans", len(items), 3)
	resources := map[string]int{}
	for _, s := range items {
		a := attrs(s.Attributes())
		equal(t, "batch.op", a["batch.op"], "create")
		resources[a["batch.resource"]]++
		if a["batch.item.id"] == "" {
			t.Errorf("span %v names no created id", a)
		}
	}
	equal(t, "spans on /users", resources["/users"], 1)
	equal(t, "spans on posts", resources["/users/{user}/posts"], 2)
	b := attrs(tc.server(t).Attributes())
	equal(t, "the batch span's op", b["batch.op"], "envelope")
	equal(t, "the batch span's resource", b["batch.resource"], "/batch")
}
