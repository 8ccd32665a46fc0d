package batch

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/policy"
)

// A traced window of a job is a span under its parent (its run's span,
// not the span in its context), and each request of the window a CLIENT
// span under the window's.
func TestWindowSpanUnderItsParent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tracer := tp.Tracer("test")
	_, run := tracer.Start(context.Background(), "run")
	// The span of the window's request through the routes, which the
	// window must not go under.
	tripCtx, trip := tracer.Start(context.Background(), "trip", trace.WithSpanKind(trace.SpanKindServer))
	f := newFake()
	f.on(http.MethodPost, "/widgets", answer{}, reply(http.StatusConflict, `{"error":"taken"}`), answer{})
	w := jobWindow(policy.OpCreate, 40, element("", `{"name":"a"}`), element("", `{"name":"b"}`), element("", `{"name":"c"}`))
	site := Site{Runtime: Runtime{Send: f, Trace: &Tracing{Tracer: tracer, Inject: injectW3C}}, Lookup: widgets(t, concurrency(1)).Lookup, Parent: run.SpanContext()}
	if _, err := ExecuteWindow(tripCtx, w, site, WindowOpts{}); err != nil {
		t.Fatal(err)
	}
	trip.End()
	run.End()

	windows := named(rec.Ended(), windowSpanName)
	if len(windows) != 1 {
		t.Fatalf("%d window spans, want 1", len(windows))
	}
	ws := windows[0]
	if ws.Parent().SpanID() != run.SpanContext().SpanID() || ws.SpanContext().TraceID() != run.SpanContext().TraceID() {
		t.Errorf("the window's span is under %s, want the run's %s", ws.Parent().SpanID(), run.SpanContext().SpanID())
	}
	a := attrs(ws.Attributes())
	if a["batch.window.first"] != "40" || a["batch.items"] != "3" || a["batch.items.succeeded"] != "2" || a["batch.items.failed"] != "1" {
		t.Errorf("the window's span's attributes %v", a)
	}
	client := 0
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindClient {
			continue
		}
		client++
		if s.Parent().SpanID() != ws.SpanContext().SpanID() {
			t.Errorf("request span %s is under %s, not the window's", s.Name(), s.Parent().SpanID())
		}
	}
	if client != 3 {
		t.Errorf("%d request spans, want 3", client)
	}
	for i, c := range f.sentWith(http.MethodPost) {
		if tp := c.Header.Get("Traceparent"); tp == "" || tp[3:35] != run.SpanContext().TraceID().String() {
			t.Errorf("create %d carried traceparent %q, not one of the run's trace", i, tp)
		}
	}
}

// With no parent, or no tracing, a window makes no span of its own.
func TestWindowSpanNeedsAParentAndTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
	_, run := tracer.Start(context.Background(), "run")
	for _, site := range []Site{
		{Runtime: Runtime{Trace: &Tracing{Tracer: tracer, Inject: injectW3C}}},
		{Runtime: Runtime{}, Parent: run.SpanContext()},
	} {
		site.Runtime.Send, site.Lookup = newFake(), widgets(t).Lookup
		w := jobWindow(policy.OpCreate, 0, element("", `{"name":"a"}`))
		if _, err := ExecuteWindow(context.Background(), w, site, WindowOpts{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(named(rec.Ended(), windowSpanName)); n != 0 {
		t.Errorf("%d window spans, want none", n)
	}
}

// Under Notable, a window's requests are spans only where they made a
// difference: the item that failed, and both attempts of the one sent
// again; the rest carry the window's span upstream.
func TestWindowNotableSpansOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)).Tracer("test")
		_, run := tracer.Start(context.Background(), "run")
		f := newFake()
		f.on(http.MethodPost, "/widgets", answer{}, reply(http.StatusConflict, `{"error":"taken"}`), throttle(), answer{})
		w := jobWindow(policy.OpCreate, 0, element("", `{"name":"a"}`), element("", `{"name":"b"}`), element("", `{"name":"c"}`))
		site := Site{Runtime: Runtime{Send: f, Trace: &Tracing{Tracer: tracer, Inject: injectW3C, Notable: true}},
			Lookup: widgets(t, concurrency(1)).Lookup, Parent: run.SpanContext()}
		res, err := ExecuteWindow(context.Background(), w, site, WindowOpts{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Items[0].Outcome != Succeeded || res.Items[1].Outcome != Failed || res.Items[2].Outcome != Succeeded {
			t.Fatalf("outcomes %s %s %s", res.Items[0].Outcome, res.Items[1].Outcome, res.Items[2].Outcome)
		}
		window := named(rec.Ended(), windowSpanName)[0]
		got := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindClient {
				a := attrs(s.Attributes())
				got[a["batch.item.index"]+"/"+a["batch.attempt"]] = s
				if s.Parent().SpanID() != window.SpanContext().SpanID() {
					t.Errorf("span %s/%s is not the window's child", a["batch.item.index"], a["batch.attempt"])
				}
			}
		}
		if len(got) != 3 || got["1/1"] == nil || got["2/1"] == nil || got["2/2"] == nil {
			t.Fatalf("request spans %v, want item 1's and both attempts of item 2", got)
		}
		failed := attrs(got["1/1"].Attributes())
		if failed["http.response.status_code"] != "409" || failed["batch.item.outcome"] != "failed" || got["1/1"].Status().Code != codes.Error {
			t.Errorf("the failed item's span %v, status %v", failed, got["1/1"].Status())
		}
		if a := attrs(got["2/1"].Attributes()); a["http.response.status_code"] != "429" {
			t.Errorf("the throttled attempt's span %v", a)
		}
		sent := f.sentWith(http.MethodPost)
		if tp := sent[0].Header.Get("Traceparent"); tp[36:52] != window.SpanContext().SpanID().String() {
			t.Errorf("the first item carried %q, want the window's span", tp)
		}
		if tp := sent[3].Header.Get("Traceparent"); tp[36:52] != got["2/2"].SpanContext().SpanID().String() {
			t.Errorf("the re-sent item carried %q, want its own span", tp)
		}
	})
}
