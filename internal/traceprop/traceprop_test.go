package traceprop

import (
	"context"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

var span = trace.NewSpanContext(trace.SpanContextConfig{
	TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
	SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
	TraceFlags: trace.FlagsSampled,
})

func client() http.Header {
	return http.Header{
		"Traceparent":       {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"Tracestate":        {"client=1"},
		"B3":                {"0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1"},
		"Ot-Tracer-Traceid": {"0af7651916cd43dd"},
		"Ot-Baggage-User":   {"client"},
		"Authorization":     {"Bearer x"},
	}
}

// Under each set of propagators, every header they write names the
// span injected, none is left as the client sent it, and other headers
// stay.
func TestInjectWritesEveryHeaderAfresh(t *testing.T) {
	tests := []struct {
		env     string
		written []string
		gone    []string
		kept    []string
	}{
		{env: "", written: []string{"Traceparent"}, gone: []string{"Tracestate"}, kept: []string{"B3", "Ot-Tracer-Traceid", "Ot-Baggage-User"}},
		{env: "tracecontext,baggage,b3", written: []string{"Traceparent", "B3"}, gone: []string{"Tracestate"}},
		{env: "ottrace", written: []string{"Ot-Tracer-Traceid", "Ot-Tracer-Spanid"}, gone: []string{"Ot-Baggage-User"}, kept: []string{"Traceparent", "B3"}},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Setenv("OTEL_PROPAGATORS", tt.env)
			p := New()
			h := client()
			p.Inject(trace.ContextWithSpanContext(context.Background(), span), h)
			for _, name := range tt.written {
				if v := h.Get(name); v == "" || v == client().Get(name) {
					t.Errorf("%s = %q, want it written afresh", name, v)
				}
			}
			for _, name := range tt.gone {
				if v, ok := h[name]; ok {
					t.Errorf("%s = %q, want it deleted", name, v)
				}
			}
			for _, name := range append(tt.kept, "Authorization") {
				if h.Get(name) != client().Get(name) {
					t.Errorf("%s = %q, want it kept", name, h.Get(name))
				}
			}
			// The OpenTracing header may carry half the trace id: the
			// span id says which span it names.
			if got := p.Remote(h); got.SpanID() != span.SpanID() {
				t.Errorf("Remote = %v, want the span injected", got)
			}
		})
	}
}

// Strip leaves no header of the propagators.
func TestStrip(t *testing.T) {
	t.Setenv("OTEL_PROPAGATORS", "tracecontext,baggage")
	h := client()
	h.Set("Baggage", "k=v")
	New().Strip(h)
	for _, name := range []string{"Traceparent", "Tracestate", "Baggage"} {
		if _, ok := h[name]; ok {
			t.Errorf("%s left", name)
		}
	}
}
