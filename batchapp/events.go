package batchapp

import (
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
)

// The Caddy events the module emits (docs/operations.md, "Events"),
// which an operator's events handlers can subscribe to.
const (
	EventLeftBehind  = "batch.saga.left_behind"
	EventResolved    = "batch.saga.resolved"
	EventJobFinished = "batch.job.finished"
)

// maxEventItems bounds the items a left_behind event lists; count says
// how many there were.
const maxEventItems = 100

// eventQueueSize bounds the events waiting for the handlers.
const eventQueueSize = 256

// queued is an event waiting for the handlers, and the batch app of the
// config that ran when it happened.
type queued struct {
	name string
	data map[string]any
	at   *App
}

// emitter hands events to Caddy's events app from a goroutine of its
// own: Emit runs the handlers before it returns, and a batch must not
// wait for them, nor hold its items' locks while they run. A full queue
// drops the event and counts it; it never blocks.
type emitter struct {
	ch      chan queued
	once    sync.Once
	deliver func(queued) // the events app's Emit, as emitTo does
}

var events = &emitter{ch: make(chan queued, eventQueueSize), deliver: emitTo}

// emit queues an event, or drops it if the queue is full.
func (e *emitter) emit(name string, data map[string]any) {
	e.once.Do(func() { go e.run() })
	select {
	case e.ch <- queued{name: name, data: data, at: operated.Load()}:
	default:
		telemetry.Metrics.EventsDropped.WithLabelValues(name, "queue_full").Inc()
	}
}

// run delivers the queued events, one at a time and in order, for the
// life of the process.
func (e *emitter) run() {
	for q := range e.ch {
		e.deliver(q)
	}
}

// emitTo emits q through the events app of the config that ran when it
// happened, or, if that config has been unloaded since (its context
// ended, and its handlers with it), of the config running now. With
// none (the process is exiting) it is dropped, counted and logged.
func emitTo(q queued) {
	at := q.at
	if at == nil || at.ctx.Err() != nil {
		at = operated.Load()
	}
	if at == nil || at.events == nil {
		telemetry.Metrics.EventsDropped.WithLabelValues(q.name, "no_config").Inc()
		caddy.Log().Warn("batch: an event was dropped: no config is running to emit it through", zap.String("event", q.name), zap.Any("saga", q.data["saga"]), zap.Any("job", q.data["id"]))
		return
	}
	at.events.Emit(at.ctx, q.name, q.data)
	telemetry.Metrics.EventsEmitted.WithLabelValues(q.name).Inc()
}

// LeftBehind is a saga that ended with items left behind: where it ran,
// whose it is, and the result that says which items and why.
type LeftBehind struct {
	// Saga is the kept saga's id; "" with journal off, where nothing is
	// kept.
	Saga string
	// Source is what ran it: "batch", "recovery" or "retry".
	Source string
	// Server is the Caddy server it came in on; Resource its resource
	// (the template for a batch, the collection's path after a recovery
	// or retry); Op its operation.
	Server, Resource, Op string
	Result               *batch.Result
	// TraceID is the batch's trace, if it was traced.
	TraceID string
}

// EmitLeftBehind queues a batch.saga.left_behind event: the items left
// behind (at most 100, with their count) and why, never a pre-image or
// a body.
func EmitLeftBehind(lb LeftBehind) {
	count := len(lb.Result.LeftBehind)
	var items []map[string]any
	for _, left := range lb.Result.LeftItems(maxEventItems) {
		item := map[string]any{"reason": left.Reason}
		if left.Index >= 0 {
			item["index"], item["id"] = left.Index, left.ID
		}
		if left.OperationID != "" {
			item["op"] = left.OperationID
		}
		items = append(items, item)
	}
	data := map[string]any{
		"saga": lb.Saga, "kept": lb.Saga != "", "source": lb.Source, "server": lb.Server,
		"resource": lb.Resource, "op": lb.Op, "outcome": string(lb.Result.Outcome),
		"count": count, "items": items, "truncated": count > len(items),
	}
	if lb.TraceID != "" {
		data["trace_id"] = lb.TraceID
	}
	events.emit(EventLeftBehind, data)
}

// emitResolved queues a batch.saga.resolved event: saga, left with items
// items behind, was resolved by "retry" or "operator" (with the
// operator's reason).
func emitResolved(saga, by, server, resource, op, reason string, items int) {
	data := map[string]any{"saga": saga, "by": by, "server": server, "resource": resource, "op": op, "items": items}
	if reason != "" {
		data["reason"] = reason
	}
	events.emit(EventResolved, data)
}

// EmitJobFinished queues a batch.job.finished event for a bulk job that
// ended, from its final status: what it was and how it ended, never its
// token (a status holds none) nor an item's body.
func EmitJobFinished(st *durable.JobStatus) {
	data := map[string]any{
		"id": st.ID, "state": st.State, "outcome": st.Outcome, "reason": st.Reason,
		"op": st.Op, "resource": st.Resource, "atomicity": st.Atomicity,
		"items": st.Items, "done": st.Done, "succeeded": st.Succeeded, "failed": st.Failed,
		"takeovers": st.Takeovers,
	}
	events.emit(EventJobFinished, data)
}
