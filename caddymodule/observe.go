package caddymodule

import (
	"context"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/recorder"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
	"github.com/caddy-batch/caddy-batch/policy"
)

// observation is what the gateway records of one batch request (docs/operations.md,
// "Operations"): the placeholders for access logs, the batch's one log line,
// and its metrics.
type observation struct {
	logger *zap.Logger
	start  time.Time
	repl   *caddy.Replacer
	sc     scope
	op     policy.Op
	labels telemetry.Labels
	// request identifies the batch request in its log line as Caddy's
	// access log does, so that the two can be joined on uuid.
	request []zap.Field
	// saga names the batch's kept saga, if it keeps a journal: what it
	// leaves behind is kept there, pre-images and all, not in the log.
	saga string

	// What the sub-requests got from the handler chain; see watchedChain.
	answered, unreached atomic.Int32
}

// observe starts the observation of a batch request. It runs on the
// client's goroutine before the fan-out: it makes the request's UUID,
// which writes to the request's vars and log fields.
func (h *Handler) observe(r *http.Request, sc scope, op policy.Op) *observation {
	o := &observation{
		logger: h.logger,
		start:  time.Now(),
		sc:     sc,
		op:     op,
		labels: telemetry.Labels{Server: serverName(r), Resource: sc.resource, Operation: op.String()},
	}
	o.repl, _ = r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if o.repl != nil {
		o.repl.Set("http.batch.op", op.String())
		if id, ok := o.repl.GetString("http.request.uuid"); ok {
			o.request = append(o.request, zap.String("uuid", id))
		}
	}
	o.request = append(o.request,
		zap.String("method", r.Method),
		zap.String("uri", r.RequestURI),
		zap.String("client_ip", clientIP(r)))
	// The line's own fields are appended to these: never into them.
	o.request = slices.Clip(o.request)
	return o
}

// serverName is the name of the Caddy server r came in on: Caddy's own
// metrics' "server" label.
func serverName(r *http.Request) string {
	if s, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		return s.Name()
	}
	return ""
}

// clientIP is the client's address as Caddy's access log gives it: the
// client_ip var (the remote address, or what trusted proxies said it
// was), else the remote address.
func clientIP(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return ip
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// locks is the batch's item locker, measured.
func (o *observation) locks(l itemlock.Locker) itemlock.Locker {
	return telemetry.ObserveLocks(l, o.labels.Server, o.sc.resource, telemetry.LockByBatch)
}

// chain is the rest of the handler chain, as the batch's sub-requests go
// through it, watched for whether the upstream could be reached.
func (o *observation) chain(next caddyhttp.Handler) caddyhttp.Handler {
	return watchedChain{next, o}
}

// rejected records a batch refused before anything was sent.
func (o *observation) rejected(status int, detail string) {
	setOutcome(o.repl, 0, telemetry.OutcomeRejected)
	telemetry.Metrics.Rejected(o.labels, o.sc.atomicity(o.op))
	if ce := o.logger.Check(zapcore.DebugLevel, "batch rejected"); ce != nil {
		ce.Write(append(o.request,
			zap.String("op", o.op.String()),
			zap.String("resource", o.labels.Resource),
			zap.String("outcome", telemetry.OutcomeRejected),
			zap.Int("status", status),
			zap.String("detail", detail))...)
	}
}

// finished records a batch that was run, whose request had ctx. A
// batch that left items behind is an event too, emitted once the saga's
// locks are released (they are, once batch.Run returned).
func (o *observation) finished(ctx context.Context, plan *batch.Plan, res *batch.Result) {
	took := time.Since(o.start)
	setOutcome(o.repl, len(plan.Items), string(res.Outcome))
	telemetry.Metrics.Finished(o.labels, res, took)
	o.log(plan, res, took)
	if res.Outcome == batch.RollbackFailed {
		saga := o.saga
		if res.LeaseLost {
			saga = res.Kept
		}
		lb := batchapp.LeftBehind{Saga: saga, Source: "batch", Server: o.labels.Server, Resource: o.labels.Resource, Op: plan.Op.String(), Result: res}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			lb.TraceID = sc.TraceID().String()
		}
		batchapp.EmitLeftBehind(lb)
	}
	for _, f := range res.ListFailures {
		telemetry.Metrics.ListFallbacks.WithLabelValues(o.labels.Server, o.labels.Resource, f.Reason).Inc()
		if ce := o.logger.Check(zapcore.WarnLevel, "batch: a LIST through list_filter could not be used; its ids were read one by one"); ce != nil {
			ce.Write(append(o.request, zap.String("resource", o.labels.Resource), zap.String("reason", f.Reason), zap.String("detail", f.Detail), zap.Int("ids", f.IDs))...)
		}
	}
	if res.Warning != "" {
		if ce := o.logger.Check(zapcore.WarnLevel, "batch: the resource's configuration does not fit the legacy API"); ce != nil {
			ce.Write(append(o.request, zap.String("resource", o.labels.Resource), zap.String("fix", res.Warning))...)
		}
	}
}

// unreachable reports that the upstream could not be reached at all: the
// batch sent sub-requests, none got an answer, and at least one failed
// as a request to a dead upstream does (see watchedChain).
func (o *observation) unreachable() bool {
	return o.unreached.Load() > 0 && o.answered.Load() == 0
}

// log writes the batch's one log line: ERROR, as Caddy logs a single
// request's 5xx, when the rollback left items behind (naming them, why,
// and what they were before the batch, for a repair by hand) and when the
// upstream could not be reached at all; INFO otherwise.
func (o *observation) log(plan *batch.Plan, res *batch.Result, took time.Duration) {
	level, msg := zapcore.InfoLevel, "batch"
	switch {
	case res.Outcome == batch.RollbackFailed:
		level, msg = zapcore.ErrorLevel, "batch rollback failed: items left behind"
	case o.unreachable():
		level, msg = zapcore.ErrorLevel, "batch failed: the upstream could not be reached"
	}
	ce := o.logger.Check(level, msg)
	if ce == nil {
		return
	}
	fields := append(o.request,
		zap.String("op", plan.Op.String()),
		zap.String("resource", o.labels.Resource),
		zap.Int("items", len(plan.Items)),
		zap.String("atomicity", res.Atomicity.String()),
		zap.String("outcome", string(res.Outcome)),
		zap.Int("status", res.Status),
		zap.Duration("duration", took),
		zap.Int("compensations", res.Compensations),
	)
	if res.ListRequests > 0 {
		fields = append(fields, zap.Int("list_requests", res.ListRequests), zap.Int("fallbacks", res.ListFallbacks))
	}
	saga := o.saga
	if res.LeaseLost {
		// The saga whose lease was lost is the new owner's to end and
		// log; what this instance left behind is the saga it kept.
		fields = append(fields, zap.String("lost_saga", o.saga), zap.Bool("lease_lost", true))
		saga = res.Kept
	}
	if saga != "" && res.Outcome == batch.RollbackFailed {
		fields = append(fields, zap.String("saga", saga))
	}
	ce.Write(append(fields, telemetry.OutcomeFields(res, saga)...)...)
}

// watchedChain tells, for each sub-request, whether the handler chain
// answered it, as classify reads it. A sub-request is unreached when the
// upstream could not be dialled, no upstream was available (503), or the
// connection broke before the answer: how Caddy would log the same single
// request at ERROR. A refusal by a handler after batch (401 from an
// authentication handler, say) is the chain's answer; a sub-request cut
// by its timeout or by the client leaving is neither.
type watchedChain struct {
	next caddyhttp.Handler
	o    *observation
}

func (c watchedChain) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	err := c.next.ServeHTTP(w, r)
	rec, _ := w.(*recorder.Recorder)
	switch classify(r.Context(), rec, err) {
	case chainWrote, chainRefused:
		c.o.answered.Add(1)
	case chainNoUpstream, chainNotSent, chainLost:
		c.o.unreached.Add(1)
	}
	return err
}
