// Package telemetry is what the gateway tells operators of its batches
// beyond the answer: its Prometheus metrics, and the fields its log
// lines give of how a batch ended. It knows nothing of Caddy: the Caddy
// glue passes in the server's name and registers the collectors on each
// config's registry.
package telemetry

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Metrics are the module's Prometheus metrics, named and labelled as Caddy's own
// (caddy_http_...). A label never holds an id, a key or a concrete path:
// "resource" is the resource's template as configured
// ("/api/users/{user}/posts"), so the number of series is bounded by the
// configuration, never by what clients send.
//
// Every collector is made once per process and registered on each
// config's registry as the config is provisioned. Caddy gives every
// config a new registry: collectors made per config would restart at
// zero on each reload, and collectors registered only on the first
// registry would vanish from the scrape after it (caddy-ratelimit's
// counters stuck at 0 after a reload were that bug).
var Metrics = newBatchMetrics()

// BatchMetrics are the module's collectors. Rejected, Finished,
// ObserveLocks and ThrottledWait count what takes more than one
// collector or label; a collector counted in one place alone is counted
// there. The exported ones can be read, as the tests do.
type BatchMetrics struct {
	// Batches are the batch requests, by server, resource, operation,
	// atomicity and outcome.
	Batches       *prometheus.CounterVec
	items         *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	itemsPerBatch *prometheus.HistogramVec
	compensations *prometheus.CounterVec
	lockWait      *prometheus.HistogramVec
	lockConflicts *prometheus.CounterVec
	// Replays are batch writes answered from a stored answer, by
	// server, resource and operation.
	Replays *prometheus.CounterVec
	// Recovered are the sagas of dead owners finished, by outcome.
	Recovered *prometheus.CounterVec
	// ListFallbacks are the unusable LISTs of a list_filter, by server,
	// resource and reason.
	ListFallbacks *prometheus.CounterVec
	// Throttled are the throttling answers waited out, by resource.
	Throttled *prometheus.CounterVec
	pending   prometheus.GaugeFunc
	// Slots are the gauges of the max_in_flight slots.
	Slots *SlotGauges
	// Sagas are the sagas in storage, by state.
	Sagas *prometheus.GaugeVec
	// SagaActions are operators' retries and resolves, by action and
	// result.
	SagaActions *prometheus.CounterVec
	// EventsEmitted are the Caddy events handed to the events app, by
	// event; EventsDropped those that were not, by event and reason.
	EventsEmitted, EventsDropped *prometheus.CounterVec
	// Jobs are the bulk jobs in storage, by state.
	Jobs *prometheus.GaugeVec
	// JobItems are the items bulk jobs finished in this process, by
	// outcome (JobItemsFinished).
	JobItems *prometheus.CounterVec
}

// Label values of the outcome label besides the engine's outcomes, and
// of the request label of the lock metrics.
const (
	OutcomeRejected = "rejected" // refused before anything was sent (docs/wire-format.md, "Bad input")
	LockByBatch     = "batch"
	LockBySingle    = "single"
)

func newBatchMetrics() *BatchMetrics {
	// From a lock taken at once to batch_timeout and beyond: a failed
	// batch answers after its undos too.
	durationBuckets := []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	labels := func(more ...string) []string { return append([]string{"server", "resource", "operation"}, more...) }
	return &BatchMetrics{
		Batches: counter("requests_total",
			`Batch requests, by outcome: a batch outcome, or "rejected" for a batch refused before anything was sent.`,
			labels("atomicity", "outcome")),
		items: counter("items_total",
			"Items of batch requests, by item outcome.",
			labels("outcome")),
		duration: histogram("request_duration_seconds",
			"Time from a batch's arrival to its answer, undos included, of batches that were run.",
			durationBuckets, labels("outcome")),
		itemsPerBatch: histogram("items_per_request",
			"Items per batch request, of batches that were run.",
			[]float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}, labels()),
		compensations: counter("compensations_total",
			"Items of all-or-nothing batches that had to be undone, by result: rolled_back, or rollback_failed (left as the batch made them).",
			labels("result")),
		lockWait: histogram("lock_wait_seconds",
			"Time taken to get an item lock, or to give up on it, by the request that wanted it: a batch, or a single-item write.",
			durationBuckets, []string{"server", "resource", "request"}),
		lockConflicts: counter("lock_conflicts_total",
			"Item locks given up on because another write through the gateway held the item until the wait's timeout (answered 409), by the request that gave up.",
			[]string{"server", "resource", "request"}),
		Replays: counter("idempotent_replays_total",
			"Batch writes answered from the stored answer of an earlier request with the same Idempotency-Key, with nothing sent upstream.",
			labels()),
		Recovered: counter("journals_recovered_total",
			"Sagas of dead owners this process finished from their journals, by the batch outcome they ended with: rolled_back, or rollback_failed.",
			[]string{"outcome"}),
		ListFallbacks: counter("list_fallbacks_total",
			`LISTs sent through a resource's list_filter that answered nothing usable, so that their ids were read one by one, by reason: "no_answer", "status" (not 2xx), or "body" (not JSON, or no array where items points).`,
			[]string{"server", "resource", "reason"}),
		Throttled: counter("throttled_total",
			"Sub-requests the legacy API throttled (429, or 503 with Retry-After) that waited the pause it asked for and were sent again (docs/security.md, \"Throttling\").",
			[]string{"resource"}),
		pending: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "journals_pending",
			Help: "Sagas this process keeps a journal for: running, or being finished for a dead owner.",
		}, func() float64 { return float64(durable.Pending()) }),
		Slots: newSlotGauges(metricsNamespace, metricsSubsystem),
		Sagas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "sagas",
			Help: "Sagas in the storage, by state: running, orphaned, stuck, left_behind; every instance sharing a storage reports the same count (aggregate with max).",
		}, []string{"state"}),
		SagaActions: counter("saga_actions_total",
			`Operators' actions on sagas through this instance's admin endpoint, by action (retry, resolve) and result: "resolved", "left_behind", or "refused".`,
			[]string{"action", "result"}),
		EventsEmitted: counter("events_emitted_total", "Caddy events (batch.saga.left_behind, batch.saga.resolved, batch.job.finished) handed to the events app, by event.", []string{"event"}),
		EventsDropped: counter("events_dropped_total", `Caddy events not emitted, by event and reason: "queue_full" (the handlers were slower than the events came) or "no_config" (no running config, at exit).`, []string{"event", "reason"}),
		Jobs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystem,
			Name: "jobs",
			Help: "Bulk jobs in the storage, by state (an ended one until it is swept, past its job_ttl); every instance sharing a storage reports the same count (aggregate with max).",
		}, []string{"state"}),
		JobItems: counter("job_items_total",
			"Items of bulk jobs this process finished, by item outcome (succeeded, failed, unknown), as each window of a job ends; items not attempted are not counted.",
			[]string{"outcome"}),
	}
}

// metricsNamespace and metricsSubsystem prefix every collector's name:
// caddy_http_batch_<name>, beside Caddy's own caddy_http_ metrics.
const metricsNamespace, metricsSubsystem = "caddy", "http_batch"

func counter(name, help string, labels []string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
	}, labels)
}

func histogram(name, help string, buckets []float64, labels []string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help, Buckets: buckets,
	}, labels)
}

func (m *BatchMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Batches, m.items, m.duration, m.itemsPerBatch, m.compensations, m.lockWait, m.lockConflicts, m.Replays, m.Recovered, m.ListFallbacks, m.Throttled, m.pending, m.Slots, m.Sagas, m.SagaActions, m.EventsEmitted, m.EventsDropped, m.Jobs, m.JobItems}
}

// ThrottledWait counts a throttling answer waited out on resource (its
// template).
func (m *BatchMetrics) ThrottledWait(resource string) {
	m.Throttled.WithLabelValues(resource).Inc()
}

// JobItemsFinished counts the items a window of a bulk job finished, by
// outcome: durable's JobHooks.Finished.
func (m *BatchMetrics) JobItemsFinished(items []batch.ItemResult) {
	counts := map[batch.Outcome]int{}
	for _, it := range items {
		if it.Outcome != "" && it.Outcome != batch.NotAttempted {
			counts[it.Outcome]++
		}
	}
	for outcome, n := range counts {
		m.JobItems.WithLabelValues(string(outcome)).Add(float64(n))
	}
}

// Register registers the module's collectors on a config's registry.
// Every batch handler of the config does so; the second finds them
// there already.
func Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range Metrics.collectors() {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}

// Labels are the labels every batch metric starts with: the Caddy
// server's name (as Caddy's own metrics' "server" label), the
// resource's template (or the envelope's path) and the operation.
type Labels struct {
	Server, Resource, Operation string
}

func (l Labels) values(more ...string) []string {
	return append([]string{l.Server, l.Resource, l.Operation}, more...)
}

// Rejected counts a batch refused before anything was sent.
func (m *BatchMetrics) Rejected(l Labels, atomicity policy.Atomicity) {
	m.Batches.WithLabelValues(l.values(atomicity.String(), OutcomeRejected)...).Inc()
}

// Finished counts a batch that was run, and its items.
func (m *BatchMetrics) Finished(l Labels, res *batch.Result, took time.Duration) {
	m.Batches.WithLabelValues(l.values(res.Atomicity.String(), string(res.Outcome))...).Inc()
	m.duration.WithLabelValues(l.values(string(res.Outcome))...).Observe(took.Seconds())
	m.itemsPerBatch.WithLabelValues(l.values()...).Observe(float64(len(res.Items)))
	counts := map[batch.Outcome]int{}
	for _, it := range res.Items {
		counts[it.Outcome]++
	}
	// The items the report names as left behind, unresolved unknown
	// writes included.
	rolledBack, left := counts[batch.RolledBack], len(res.LeftBehind)
	for outcome, n := range counts {
		m.items.WithLabelValues(l.values(string(outcome))...).Add(float64(n))
	}
	if rolledBack > 0 {
		m.compensations.WithLabelValues(l.values(string(batch.RolledBack))...).Add(float64(rolledBack))
	}
	if left > 0 {
		m.compensations.WithLabelValues(l.values(string(batch.RollbackFailed))...).Add(float64(left))
	}
}

// observedLocks measures the waits for item locks, and counts the ones
// given up on, whichever request (a saga, a partial batch's write, a
// single write) wanted them: the engine takes its locks through this
// Locker, so what it does with them need not be known here.
type observedLocks struct {
	itemlock.Locker
	labels []string // server, resource, request
}

// ObserveLocks wraps l for one request to server; l may be nil (no
// locks).
func ObserveLocks(l itemlock.Locker, server, resource, request string) itemlock.Locker {
	if l == nil {
		return nil
	}
	return observedLocks{l, []string{server, resource, request}}
}

func (l observedLocks) Lock(ctx context.Context, key string) (func(), error) {
	start := time.Now()
	unlock, err := l.Locker.Lock(ctx, key)
	Metrics.lockWait.WithLabelValues(l.labels...).Observe(time.Since(start).Seconds())
	// A wait cut short by the client going away is no conflict.
	if err != nil && errors.Is(err, itemlock.ErrLocked) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		Metrics.lockConflicts.WithLabelValues(l.labels...).Inc()
	}
	return unlock, err
}

// LockAll takes a batch's locks together (itemlock.LockAll); the wait
// is observed once per key, so that lock_wait_seconds counts items
// whether their locks were taken one at a time or together.
func (l observedLocks) LockAll(ctx context.Context, keys []string) ([]func(), int, error) {
	start := time.Now()
	unlocks, failed, err := itemlock.LockAll(ctx, l.Locker, keys)
	waited := time.Since(start).Seconds()
	n := len(keys)
	if err != nil {
		n = failed + 1
	}
	for range n {
		Metrics.lockWait.WithLabelValues(l.labels...).Observe(waited)
	}
	if err != nil && errors.Is(err, itemlock.ErrLocked) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		Metrics.lockConflicts.WithLabelValues(l.labels...).Inc()
	}
	return unlocks, failed, err
}

// Lost forwards itemlock.LossReporter, where the wrapped locks report
// their losses.
func (l observedLocks) Lost(keys func() []string) error {
	if lr, ok := l.Locker.(itemlock.LossReporter); ok {
		return lr.Lost(keys)
	}
	return nil
}

// SlotCounter is what the gauges of sub-requests in flight and waiting
// read from a handler's max_in_flight slots (slots.FIFO).
type SlotCounter interface {
	InFlight() int
	Waiting() int
	Cap() int
}

// SlotGauges reports the sub-requests in flight and waiting for a slot,
// summed over the slots of every handler in the process. Handlers of
// consecutive configs share their slots (max_in_flight holds across a
// reload), so each set of slots is counted once however many handlers
// track it.
type SlotGauges struct {
	inFlight, waiting, limit *prometheus.Desc

	mu      sync.Mutex
	tracked map[SlotCounter]int // how many handlers track each
}

func newSlotGauges(ns, sub string) *SlotGauges {
	return &SlotGauges{
		inFlight: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "subrequests_in_flight"),
			"Sub-requests of batches holding a slot of max_in_flight.", nil, nil),
		waiting: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "subrequests_waiting"),
			"Sub-requests of batches waiting for a slot of max_in_flight.", nil, nil),
		limit: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "in_flight_limit"),
			"The number of slots of max_in_flight: fixed, or where max_in_flight auto has taken it.", nil, nil),
		tracked: map[SlotCounter]int{},
	}
}

// Track adds sc to the gauges until the returned function is called.
func (g *SlotGauges) Track(sc SlotCounter) (untrack func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tracked[sc]++
	return sync.OnceFunc(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.tracked[sc]--; g.tracked[sc] == 0 {
			delete(g.tracked, sc)
		}
	})
}

func (g *SlotGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.inFlight
	ch <- g.waiting
	ch <- g.limit
}

func (g *SlotGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.tracked) == 0 {
		return // no handler bounds its sub-requests: a 0 would be a lie
	}
	var inFlight, waiting, limit int
	for sc := range g.tracked {
		inFlight += sc.InFlight()
		waiting += sc.Waiting()
		limit += sc.Cap()
	}
	ch <- prometheus.MustNewConstMetric(g.inFlight, prometheus.GaugeValue, float64(inFlight))
	ch <- prometheus.MustNewConstMetric(g.waiting, prometheus.GaugeValue, float64(waiting))
	ch <- prometheus.MustNewConstMetric(g.limit, prometheus.GaugeValue, float64(limit))
}
