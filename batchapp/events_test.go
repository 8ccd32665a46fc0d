package batchapp

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
)

// recordEvents makes the package's emitter deliver to the test, for the
// test's life.
func recordEvents(t *testing.T) <-chan queued {
	got := make(chan queued, 10)
	old := events
	events = &emitter{ch: make(chan queued, eventQueueSize), deliver: func(q queued) { got <- q }}
	t.Cleanup(func() { events = old })
	return got
}

// A left_behind event lists at most 100 items, with the count of all of
// them, each with its reason, and no pre-image.
func TestLeftBehindEventIsBounded(t *testing.T) {
	got := recordEvents(t)
	res := &batch.Result{Outcome: batch.RollbackFailed}
	for i := range 150 {
		res.Items = append(res.Items, batch.ItemResult{Index: i, ID: "w", Outcome: batch.RollbackFailed,
			Compensation: &batch.Compensation{Error: "answered 404", Found: []byte(`{"secret":"PREIMAGE"}`)}})
	}
	res.Items = append(res.Items, batch.ItemResult{Index: 150, Outcome: batch.RolledBack})
	for i := range 150 {
		res.LeftBehind = append(res.LeftBehind, fmt.Sprintf("item %d (id %q): answered 404", i, "w"))
	}
	EmitLeftBehind(LeftBehind{Saga: "s1", Source: "batch", Result: res})
	q := <-got
	items := q.data["items"].([]map[string]any)
	if q.name != EventLeftBehind || q.data["count"] != 150 || len(items) != 100 || q.data["truncated"] != true || q.data["kept"] != true {
		t.Fatalf("event %s %v", q.name, q.data)
	}
	if items[0]["reason"] != "answered 404" || items[0]["id"] != "w" {
		t.Errorf("item %v", items[0])
	}
	for _, it := range items {
		for k := range it {
			if k != "index" && k != "id" && k != "reason" {
				t.Errorf("item member %q", k)
			}
		}
	}
}

// A left_behind event lists the items the result's LeftBehind names, as
// the answer and the log line do: a saga that lost its lease and was
// orphaned leaves its unknown items behind too, not only those whose
// undo failed. An entry no item of the result wrote (another instance's)
// is carried with its reason alone.
func TestLeftBehindEventListsTheResultsLeftBehind(t *testing.T) {
	got := recordEvents(t)
	res := &batch.Result{
		Outcome: batch.RollbackFailed,
		Items: []batch.ItemResult{
			{Index: 0, ID: "1", Outcome: batch.RollbackFailed, Error: "undo answered 500"},
			{Index: 1, ID: "2", Outcome: batch.Unknown, Error: "sent, no answer"},
			{Index: 2, ID: "3", Outcome: batch.RolledBack},
			{Index: 3, OperationID: "p: q", Method: "POST", URL: "/w", Outcome: batch.Unknown, Error: "timeout: 5s"},
		},
		LeftBehind: []string{
			`item 0 (id "1"): undo answered 500`,
			`item 1 (id "2"): sent, no answer`,
			`operation "p: q" (POST /w): timeout: 5s`,
			`item 9: written by the batch`,
		},
	}
	EmitLeftBehind(LeftBehind{Saga: "kept1", Source: "batch", Result: res})
	q := <-got
	items := q.data["items"].([]map[string]any)
	if q.data["count"] != 4 || len(items) != 4 || q.data["truncated"] != false {
		t.Fatalf("left_behind event count %v, items %v; want the result's 4 LeftBehind entries", q.data["count"], items)
	}
	want := []map[string]any{
		{"index": 0, "id": "1", "reason": "undo answered 500"},
		{"index": 1, "id": "2", "reason": "sent, no answer"},
		{"index": 3, "id": "", "op": "p: q", "reason": "timeout: 5s"},
		{"reason": "item 9: written by the batch"},
	}
	for i := range want {
		if !maps.Equal(items[i], want[i]) {
			t.Errorf("item %d = %v, want %v", i, items[i], want[i])
		}
	}
}

// A full queue drops the event and counts it; no emit waits for the
// handlers.
func TestFullQueueDrops(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	e := &emitter{ch: make(chan queued, 1), deliver: func(queued) {
		entered <- struct{}{}
		<-release
	}}
	dropped := telemetry.Metrics.EventsDropped.WithLabelValues("test.event", "queue_full")
	before := value(dropped)
	done := make(chan struct{})
	go func() {
		e.emit("test.event", nil)
		<-entered // the handler runs the first, and blocks
		e.emit("test.event", nil)
		e.emit("test.event", nil)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an emit waited for the handlers")
	}
	if n := value(dropped) - before; n != 1 {
		t.Errorf("dropped %v events, want 1", n)
	}
	close(release)
	<-entered
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// A job's end is a batch.job.finished event with what the job was and
// how it ended, and nothing else: no token, no body.
func TestJobFinishedEvent(t *testing.T) {
	got := recordEvents(t)
	ended := time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC)
	EmitJobFinished(&durable.JobStatus{ID: "j1", State: durable.JobPartial, Outcome: "partial", Op: "create", Resource: "/api/widgets",
		Atomicity: "partial", Items: 10, Done: 10, Succeeded: 7, Failed: 3, Takeovers: 1, Ended: &ended, Results: "/api/jobs/j1/results"})
	q := <-got
	want := map[string]any{"id": "j1", "state": "partial", "outcome": "partial", "reason": "", "op": "create", "resource": "/api/widgets",
		"atomicity": "partial", "items": 10, "done": 10, "succeeded": 7, "failed": 3, "takeovers": 1}
	if q.name != EventJobFinished || !maps.Equal(q.data, want) {
		t.Errorf("event %s %v, want %s %v", q.name, q.data, EventJobFinished, want)
	}
}
