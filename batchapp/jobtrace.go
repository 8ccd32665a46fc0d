package batchapp

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
)

// A job's trace (docs/operations.md, "Traces"): each run of it on an
// instance, under one lease epoch, is a root span "batch.job" of a trace
// of its own, linked to the span of the client's start; each window a
// child of it, and the requests of a window that made a difference (an
// item failed, a request sent again) children of the window's: the
// others' requests carry the window's span upstream (batch.Tracing's
// Notable), so that a job of 100,000 items is not as many spans. The
// start's first item, which its request runs, is traced whole, under
// the start's span.
// What traces is the route: the tracer is the one of the span Caddy's
// tracing directive gave the window's request through the routes
// (JobHost.Site's Runtime.Trace), so a job under no tracing makes
// nothing; and the run's span starts with its first traced window.

// The run span's name and attributes (docs/operations.md, "Bulk jobs").
const (
	jobSpanName = "batch.job"

	attrJob       = attribute.Key("batch.job.id")
	attrOp        = attribute.Key("batch.op")
	attrResource  = attribute.Key("batch.resource")
	attrAtomicity = attribute.Key("batch.atomicity")
	attrItems     = attribute.Key("batch.items")
	attrEpoch     = attribute.Key("batch.job.epoch")
	attrRunEnd    = attribute.Key("batch.job.run_end")
	attrState     = attribute.Key("batch.job.state")
	attrOutcome   = attribute.Key("batch.outcome")
	attrDone      = attribute.Key("batch.items.done")
	attrSucceeded = attribute.Key("batch.items.succeeded")
	attrFailed    = attribute.Key("batch.items.failed")
	attrLinkKind  = attribute.Key("batch.link")
)

// How a run ended, its span's batch.job.run_end.
const (
	runEnded      = "ended"       // the job ended
	runHandedOver = "handed_over" // its config stopped, its lease released
	runPaused     = "paused"      // the upstream refused its credentials
	runStopped    = "stopped"     // its lease lost, or the storage failing
)

// jobTrace is one run's span, made once a window goes through a route
// that traces.
type jobTrace struct {
	held  *durable.HeldJob
	began time.Time

	mu   sync.Mutex
	root trace.Span // nil until a traced window
}

type jobTraceCtxKeyType struct{}

var jobTraceCtxKey jobTraceCtxKeyType

// withJobTrace is ctx with the trace of the run of held.
func withJobTrace(ctx context.Context, held *durable.HeldJob) (context.Context, *jobTrace) {
	jt := &jobTrace{held: held, began: time.Now()}
	return context.WithValue(ctx, jobTraceCtxKey, jt), jt
}

// traced is site, whose Runtime.Trace is the route's tracing (nil: the
// route does not trace), with the span its window is traced beneath:
// the run's span, for a window of a run (ctx carries its jobTrace); the
// span in ctx for a start's first item, which its start request runs;
// none, and no tracing, when there is neither.
func traced(ctx context.Context, site batch.Site) batch.Site {
	t := site.Runtime.Trace
	if t == nil || t.Tracer == nil {
		return site
	}
	if jt, ok := ctx.Value(jobTraceCtxKey).(*jobTrace); ok {
		site.Parent = jt.span(t.Tracer)
		notable := *t
		notable.Notable = true
		site.Runtime.Trace = &notable
	} else {
		site.Parent = trace.SpanContextFromContext(ctx)
	}
	if !site.Parent.IsValid() {
		site.Runtime.Trace = nil
	}
	return site
}

// span is the run's span context, the span started with tracer on the
// run's first traced window: a new root, begun when the run began,
// linked to the start's span.
func (jt *jobTrace) span(tracer trace.Tracer) trace.SpanContext {
	jt.mu.Lock()
	defer jt.mu.Unlock()
	if jt.root == nil {
		rec := jt.held.Record()
		opts := []trace.SpanStartOption{
			trace.WithNewRoot(), trace.WithTimestamp(jt.began), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(attrJob.String(rec.ID), attrOp.String(rec.Op), attrResource.String(rec.Resource),
				attrAtomicity.String(rec.Atomicity), attrItems.Int(rec.Items), attrEpoch.Int(jt.held.Epoch())),
		}
		if sc := StartSpan(rec.StartTrace); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attrLinkKind.String("started")}}))
		}
		_, jt.root = tracer.Start(context.Background(), jobSpanName, opts...)
	}
	return jt.root.SpanContext()
}

// end ends the run's span, if one was made, with how the run ended (err
// is Run's) and what it left the job as.
func (jt *jobTrace) end(err error) {
	jt.mu.Lock()
	defer jt.mu.Unlock()
	if jt.root == nil {
		return
	}
	how := runHandedOver
	if st := jt.held.FinalStatus(); st != nil {
		how = runEnded
		jt.root.SetAttributes(attrState.String(st.State), attrDone.Int(st.Done),
			attrSucceeded.Int(st.Succeeded), attrFailed.Int(st.Failed))
		if st.Outcome != "" {
			jt.root.SetAttributes(attrOutcome.String(st.Outcome))
		}
	} else if p, ok := jt.held.Stored(); ok {
		if p.State == durable.JobPaused {
			how = runPaused
		}
		jt.root.SetAttributes(attrState.String(p.State), attrDone.Int(p.Done),
			attrSucceeded.Int(p.Succeeded), attrFailed.Int(p.Failed))
	}
	if err != nil {
		// Never the error's text: it can name storage paths.
		how = runStopped
		jt.root.SetStatus(codes.Error, "the run stopped before the job's end")
	}
	jt.root.SetAttributes(attrRunEnd.String(how))
	jt.root.End()
}

// StartTrace is the span context of the span in ctx (a start request's,
// under Caddy's tracing) as a W3C traceparent, for the job's record;
// empty when ctx has none.
func StartTrace(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier.Get("traceparent")
}

// StartSpan is the span context a job's record keeps (StartTrace),
// invalid for none.
func StartSpan(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}
