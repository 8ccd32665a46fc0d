package batch

import (
	"context"
	"fmt"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/slots"
)

// The engine's cost per batch, with no HTTP: what a change of how a run
// is laid out must not move.

// BenchmarkRunBatchCreate runs a saga that creates 100 items, each
// through a slot of max_in_flight, against the in-memory API.
func BenchmarkRunBatchCreate(b *testing.B) {
	p := mustPlan(b, newRequest("POST", "/widgets", elements(100)))
	fifo := slots.NewFIFO(16)
	b.ReportAllocs()
	for b.Loop() {
		res := Run(context.Background(), p, Runtime{Send: newFake(), Locks: &itemlock.Local{}, Slots: fifo})
		if res.Outcome != Succeeded {
			b.Fatalf("outcome %s", res.Outcome)
		}
	}
}

// BenchmarkRunBatchCreateTraced is BenchmarkRunBatchCreate without and
// with Runtime.Trace, under a provider that records every span and
// exports none: what the spans of a batch's requests cost the engine,
// per item (docs/performance.md, "Tracing").
func BenchmarkRunBatchCreateTraced(b *testing.B) {
	p := mustPlan(b, newRequest("POST", "/widgets", elements(100)))
	fifo := slots.NewFIFO(16)
	for _, traced := range []bool{false, true} {
		b.Run(fmt.Sprintf("trace=%v", traced), func(b *testing.B) {
			ctx, rt := context.Background(), Runtime{Locks: &itemlock.Local{}, Slots: fifo}
			if traced {
				tp := sdktrace.NewTracerProvider()
				var span interface{ End(...trace.SpanEndOption) }
				ctx, span = tp.Tracer("bench").Start(ctx, "batch")
				defer span.End()
				rt.Trace = &Tracing{Tracer: tp.Tracer("caddy-batch"), Inject: injectW3C}
			}
			b.ReportAllocs()
			for b.Loop() {
				rt.Send = newFake()
				if res := Run(ctx, p, rt); res.Outcome != Succeeded {
					b.Fatalf("outcome %s", res.Outcome)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(p.Items)), "ns/item")
		})
	}
}

// BenchmarkRunEnvelopeRefs runs an envelope of 30 operations, each post
// naming the user created before it.
func BenchmarkRunEnvelopeRefs(b *testing.B) {
	e := shop(b)
	p, prob := admitEnvelope(b, e, envelopeWithRefs(10))
	if prob != nil {
		b.Fatalf("refused: %d %s", prob.Status, prob.Detail)
	}
	collections := []string{"/users"}
	for u := range 10 {
		collections = append(collections, fmt.Sprintf("/users/%d/posts", 1000+u))
	}
	fifo := slots.NewFIFO(16)
	b.ReportAllocs()
	for b.Loop() {
		res := Run(context.Background(), p, Runtime{Send: newShopAPI(collections...), Locks: &itemlock.Local{}, Slots: fifo})
		if res.Outcome != Succeeded {
			b.Fatalf("outcome %s", res.Outcome)
		}
	}
}

// envelopeWithRefs is n users, with ids from 1000, each with two posts
// that reference it.
func envelopeWithRefs(n int) string {
	var ops []string
	for u := range n {
		ops = append(ops,
			fmt.Sprintf(`{"id": "u%d", "method": "POST", "url": "/users", "body": {"id": %d, "name": "user%d"}}`, u, 1000+u, u),
			fmt.Sprintf(`{"id": "a%d", "method": "POST", "url": "/users/$u%d/posts", "body": {"title": "one", "author_id": "$u%d#/id"}}`, u, u, u),
			fmt.Sprintf(`{"id": "b%d", "method": "POST", "url": "/users/$u%d/posts", "body": {"title": "two", "author": "$u%d"}}`, u, u, u))
	}
	return `{"operations": [` + strings.Join(ops, ",") + `]}`
}
