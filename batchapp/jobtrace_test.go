package batchapp

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/batch"
)

// The start's span context survives the job's record as a traceparent;
// an untraced start keeps none.
func TestStartTraceRoundTrip(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	ctx, span := tp.Tracer("test").Start(context.Background(), "start")
	defer span.End()
	kept := StartTrace(ctx)
	if got := StartSpan(kept); !got.Equal(trace.SpanContextFromContext(ctx).WithRemote(true)) {
		t.Errorf("%q read back as %v, want %v", kept, got, span.SpanContext())
	}
	if kept := StartTrace(context.Background()); kept != "" || StartSpan(kept).IsValid() {
		t.Errorf("an untraced start kept %q", kept)
	}
	if StartSpan("not-a-traceparent").IsValid() {
		t.Error("a malformed traceparent read as a span context")
	}
}

// A first item (no run in its context) goes under the span of its
// start, in its context; with no span there, or no tracing on the
// route, nothing is traced.
func TestTracedFirstItem(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	tracing := &batch.Tracing{Tracer: tp.Tracer("test")}
	ctx, span := tp.Tracer("test").Start(context.Background(), "start")
	defer span.End()
	site := traced(ctx, batch.Site{Runtime: batch.Runtime{Trace: tracing}})
	if !site.Parent.Equal(span.SpanContext()) || site.Runtime.Trace == nil || site.Runtime.Trace.Notable {
		t.Errorf("the first item's site: parent %v, tracing %+v; want the start's span, every request traced", site.Parent, site.Runtime.Trace)
	}
	if site := traced(context.Background(), batch.Site{Runtime: batch.Runtime{Trace: tracing}}); site.Runtime.Trace != nil || site.Parent.IsValid() {
		t.Errorf("a first item with no span in its context is traced: %+v", site)
	}
	if site := traced(ctx, batch.Site{}); site.Runtime.Trace != nil || site.Parent.IsValid() {
		t.Errorf("a route that does not trace traced a first item: %+v", site)
	}
}
