package batch

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The span of a job's window (docs/operations.md, "Traces"), a child of
// its run's span and the parent of the window's requests' spans.
const (
	windowSpanName = "batch.job.window"

	attrWindowFirst = attribute.Key("batch.window.first")
	attrSucceeded   = attribute.Key("batch.items.succeeded")
	attrFailed      = attribute.Key("batch.items.failed")
	attrNotStarted  = attribute.Key("batch.items.not_attempted")
	attrStopped     = attribute.Key("batch.window.stopped")
	attrRefused     = attribute.Key("batch.window.refused")
)

// windowSpan starts the span of a window whose first item is the job's
// item first and which holds n items, beneath parent, and answers the
// context its requests are sent under; with nothing traced, or no
// parent, it starts none and answers ctx (a nil span, whose end does
// nothing).
func (tr *runTrace) windowSpan(ctx context.Context, parent trace.SpanContext, first, n int) (context.Context, trace.Span) {
	if tr == nil || !parent.IsValid() {
		return ctx, nil
	}
	return tr.t.Tracer.Start(trace.ContextWithSpanContext(ctx, parent), windowSpanName,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrWindowFirst.Int(first), attrItems.Int(n)))
}

// endWindow ends a window's span (nil: none) with what the window did.
func endWindow(span trace.Span, res *WindowResult) {
	if span == nil {
		return
	}
	var succeeded, failed, notStarted int
	for _, it := range res.Items {
		switch it.Outcome {
		case Succeeded:
			succeeded++
		case NotAttempted:
			notStarted++
		default:
			failed++
		}
	}
	span.SetAttributes(attrSucceeded.Int(succeeded), attrFailed.Int(failed), attrNotStarted.Int(notStarted),
		attrStopped.Bool(res.Stopped), attrRefused.Int(len(res.Refused)))
	if len(res.Refused) > 0 {
		span.SetStatus(codes.Error, "credentials refused")
	}
	span.End()
}
