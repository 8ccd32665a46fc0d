package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/traceprop"
)

const storedTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// Without a span in the request's context a batch makes no span; a
// recovery's sub-requests then carry none of the stored tracing headers,
// and every other header as stored.
func TestNoSpanNoTracingAndNoStoredHeader(t *testing.T) {
	h := &Handler{prop: traceprop.New()}
	if h.tracing(context.Background()) != nil {
		t.Error("tracing without a span in the context")
	}
	var got http.Header
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		got = r.Header.Clone()
		return nil
	})
	send := newSubrequests(httptest.NewRequest("POST", "/api/widgets", nil), next, 1<<10)
	send.strip = h.stripStored(context.Background())
	sub := &batch.SubRequest{Method: "PUT", Path: "/api/widgets/1", Header: http.Header{
		"Traceparent": {storedTraceparent}, "Tracestate": {"a=b"}, "Authorization": {"Bearer x"},
	}}
	if _, err := send.Send(context.Background(), sub); err != nil {
		t.Fatal(err)
	}
	if got.Get("Traceparent") != "" || got.Get("Tracestate") != "" || got.Get("Authorization") != "Bearer x" {
		t.Errorf("the sub-request carried %v", got)
	}
}

// With a span in the context, the spans' own context replaces the
// stored headers: nothing is stripped apart.
func TestSpanTracesAndStripsNothingApart(t *testing.T) {
	h := &Handler{prop: traceprop.New()}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	if h.tracing(ctx) == nil {
		t.Error("no tracing with a span in the context")
	}
	if h.stripStored(ctx) != nil {
		t.Error("stored headers stripped apart from the spans' injection")
	}
}
