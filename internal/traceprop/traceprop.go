// Package traceprop writes a span context into a sub-request's header
// with the propagators Caddy's tracing directive uses: those that
// OTEL_PROPAGATORS names, W3C trace context and baggage by default
// (docs/operations.md, "Traces"). Every header they write is deleted
// first, so that none is left as copied from the client's request.
package traceprop

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// otBaggagePrefix begins the headers in which the OpenTracing
// propagator ("ottrace") carries baggage, one entry a header; Fields
// does not list them.
const otBaggagePrefix = "Ot-Baggage-"

// Propagation is the set of propagators of the process, read once.
type Propagation struct {
	prop propagation.TextMapPropagator
	// keys are the canonical names of the headers prop writes; prefixes
	// begin (canonically) those it writes one per baggage entry.
	keys, prefixes []string
}

// New reads the propagators as Caddy's tracing directive does
// (autoprop: OTEL_PROPAGATORS, else W3C trace context and baggage).
func New() *Propagation {
	p := &Propagation{prop: autoprop.NewTextMapPropagator()}
	for _, f := range p.prop.Fields() {
		key := http.CanonicalHeaderKey(f)
		p.keys = append(p.keys, key)
		if key == "Ot-Tracer-Traceid" {
			p.prefixes = append(p.prefixes, otBaggagePrefix)
		}
	}
	return p
}

// Strip deletes from h every header the propagators write.
func (p *Propagation) Strip(h http.Header) {
	for _, key := range p.keys {
		delete(h, key)
	}
	if len(p.prefixes) == 0 {
		return
	}
	for name := range h {
		for _, prefix := range p.prefixes {
			if strings.HasPrefix(name, prefix) {
				delete(h, name)
			}
		}
	}
}

// Inject writes ctx's span context (and baggage) into h afresh.
func (p *Propagation) Inject(ctx context.Context, h http.Header) {
	p.Strip(h)
	p.prop.Inject(ctx, propagation.HeaderCarrier(h))
}

// Remote is the span context a stored header names: what the
// propagators read, else its W3C traceparent (a kept saga keeps only
// traceparent and tracestate of the tracing headers). It is invalid when
// the header names none.
func (p *Propagation) Remote(h http.Header) trace.SpanContext {
	carrier := propagation.HeaderCarrier(h)
	if sc := trace.SpanContextFromContext(p.prop.Extract(context.Background(), carrier)); sc.IsValid() {
		return sc
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
}
