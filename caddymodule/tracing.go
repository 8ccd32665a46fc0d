package caddymodule

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// instrumentation names the module's spans' scope.
const instrumentation = "github.com/caddy-batch/caddy-batch"

// tracing is how a batch whose request has ctx makes its spans
// (docs/operations.md, "Traces"): beneath the span Caddy's tracing
// directive put in ctx, with that span's provider (Caddy's is not the
// global one). With no tracing before batch there is no span context,
// and nothing at all is made or written: the sub-requests carry what
// the client sent. A request the sampler left out still gets child
// spans, which are not exported either, so that its headers name no
// span of another request.
func (h *Handler) tracing(ctx context.Context) *batch.Tracing {
	span := trace.SpanFromContext(ctx)
	if !span.SpanContext().IsValid() {
		return nil
	}
	return &batch.Tracing{Tracer: span.TracerProvider().Tracer(instrumentation), Inject: h.prop.Inject}
}

// The batch span's attributes set here, beside those the engine sets.
const (
	attrSaga     = attribute.Key("batch.saga")
	attrKept     = attribute.Key("batch.saga.kept")
	attrFinish   = attribute.Key("batch.finish")
	attrLinkKind = attribute.Key("batch.link")
)

// markSaga names a batch's saga on its span, and the saga it kept what
// it left behind under when it lost its lease.
func markSaga(ctx context.Context, saga string, res *batch.Result) {
	span := trace.SpanFromContext(ctx)
	if saga == "" || !span.IsRecording() {
		return
	}
	span.SetAttributes(attrSaga.String(saga))
	if res.LeaseLost && res.Kept != "" {
		span.SetAttributes(attrKept.String(res.Kept))
	}
}

// linkFinish links the span of a recovery's or an operator's retry,
// which starts a trace of its own, to the batch's span, whose context
// the journal kept (the header it stored).
func (h *Handler) linkFinish(ctx context.Context, job batchapp.Job, saga string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	kind := "recovered"
	if job.Retry {
		kind = "retried"
	}
	if sc := h.prop.Remote(job.Snap.Header); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attrLinkKind.String(kind)}})
	}
	span.SetAttributes(attrFinish.String(kind))
	if saga != "" {
		span.SetAttributes(attrSaga.String(saga))
	}
}

// sendStored sends the sub-requests of a batch that runs again from its
// stored header (a taken-over saga, a job's window) through next, as r,
// made from that header, would go: without the tracing headers the
// stored header holds (stripStored).
func (h *Handler) sendStored(r *http.Request, next caddyhttp.Handler, sc scope) *subrequests {
	send := newSubrequests(r, next, sc.settings.MaxBodySize)
	send.strip = h.stripStored(r.Context())
	return send
}

// stripStored removes the tracing headers a saga's stored header holds
// from a recovery's sub-request, which no span names: the batch's
// context is not sent through the routes again.
func (h *Handler) stripStored(ctx context.Context) func(http.Header) {
	if trace.SpanFromContext(ctx).SpanContext().IsValid() {
		return nil // the spans' own context replaces them
	}
	return h.prop.Strip
}
