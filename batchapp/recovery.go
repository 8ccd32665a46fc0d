package batchapp

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/recorder"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
)

// scan looks for journals to finish (durable's Scan), once, and counts
// the sagas by state for the gauge.
func (a *App) scan(ctx context.Context) {
	a.state.mu.Lock()
	a.state.failedBefore, a.state.failed = a.state.failed, map[string]string{}
	a.state.mu.Unlock()
	if err := a.journals.Scan(ctx, a.finish, a.failedOnce); err != nil && ctx.Err() == nil {
		a.logger.Warn("listing saga journals in storage", zap.Error(err))
	}
	a.countSagas(ctx)
}

// sweepIdempotency deletes the Idempotency-Key records that expired
// (docs/durability.md, "Expiry and the sweep"), unless another instance
// of the cluster is sweeping.
func (a *App) sweepIdempotency(ctx context.Context) {
	swept, err := a.sweeper.Sweep(ctx, durable.Now())
	switch {
	case err != nil && ctx.Err() == nil:
		a.logger.Warn("sweeping expired Idempotency-Key records; the next sweep tries again", zap.Error(err))
	case swept.Deleted > 0 || swept.Indexed > 0:
		a.logger.Debug("swept expired Idempotency-Key records", zap.Int("deleted", swept.Deleted),
			zap.Int("kept", swept.Kept), zap.Int("buckets", swept.Buckets), zap.Int("indexed", swept.Indexed))
	}
}

// sweepJobs deletes the bulk jobs past their job_ttl, and the input of
// starts never registered (docs/durability.md, "Bulk jobs in storage"),
// unless another instance of the cluster is sweeping them.
func (a *App) sweepJobs(ctx context.Context) {
	swept, err := a.jobSweeper.Sweep(ctx, durable.Now())
	switch {
	case err != nil && ctx.Err() == nil:
		a.logger.Warn("sweeping expired bulk jobs; the next sweep tries again", zap.Error(err))
	case swept.Deleted > 0 || swept.Indexed > 0:
		a.logger.Debug("swept expired bulk jobs", zap.Int("deleted", swept.Deleted),
			zap.Int("kept", swept.Kept), zap.Int("buckets", swept.Buckets), zap.Int("indexed", swept.Indexed))
	}
}

// finish resumes a saga this process took over (durable's scan calls
// it), and logs what became of it: one line per saga, ERROR when items
// were left behind. An error is durable's to log and give the saga back.
func (a *App) finish(r *durable.Recovered) error {
	start := time.Now()
	res, err := a.finishThrough(r.Origin, Job{Snap: r.Snapshot, Journal: r.Journal})
	if err != nil {
		return err
	}
	a.logRecovered(r, res, time.Since(start))
	if res.Outcome == batch.RollbackFailed {
		EmitLeftBehind(LeftBehind{Saga: r.Saga, Source: "recovery", Server: r.Origin.Server, Resource: r.Snapshot.Path, Op: r.Snapshot.Op, Result: res})
	}
	return nil
}

func (a *App) logRecovered(r *durable.Recovered, res *batch.Result, took time.Duration) {
	telemetry.Metrics.Recovered.WithLabelValues(string(res.Outcome)).Inc()
	level, msg := zapcore.InfoLevel, "recovered a batch whose gateway died"
	if res.Outcome == batch.RollbackFailed {
		level, msg = zapcore.ErrorLevel, "recovered a batch whose gateway died: items left behind"
	}
	ce := a.logger.Check(level, msg)
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("saga", r.Saga),
		zap.String("server", r.Origin.Server),
		zap.String("host", r.Origin.Host),
		zap.String("op", r.Snapshot.Op),
		zap.String("path", r.Snapshot.Path),
		zap.Int("items", len(r.Snapshot.Items)),
		zap.Time("started", r.Started),
		zap.String("dead_owner", r.Dead.Owner),
		zap.Time("lease_lapsed", r.Dead.Expires),
		zap.String("outcome", string(res.Outcome)),
		zap.Int("compensations", res.Compensations),
		zap.Duration("duration", took),
	}
	ce.Write(append(fields, telemetry.OutcomeFields(res, r.Saga)...)...)
}

// failedOnce logs that a saga could not be taken over or finished, once
// per saga and reason: the recovery tries again every interval.
func (a *App) failedOnce(saga, doing string, err error) {
	why := doing + ": " + err.Error()
	first := a.firstFailure(saga, why)
	if doing == "finishing the saga" || doing == "reading the saga's journal" {
		a.journals.MarkStuck(context.Background(), saga, why)
	}
	if first {
		a.logger.Error("a saga whose gateway died could not be finished; it stays in storage and is tried again",
			zap.String("saga", saga), zap.String("while", doing), zap.Error(err))
	}
}

// firstFailure records that what (a saga, a job) failed for why, and
// reports whether it did not already in this scan or the one before:
// what fails the same way every interval is logged once.
func (a *App) firstFailure(what, why string) bool {
	a.state.mu.Lock()
	defer a.state.mu.Unlock()
	seen := a.state.failed[what] == why || a.state.failedBefore[what] == why
	a.state.failed[what] = why
	return !seen
}

// Job is a saga to finish from its journal.
type Job struct {
	Snap    *batch.Snapshot
	Journal batch.Journal
	// Retry is an operator's (batch.Retry: undos under the current
	// config); Prev, for a kept saga, are its items as the saga answered
	// them, whose Idempotency-Key answer stays the first.
	Prev  []batch.ItemResult
	Retry bool
}

// A Finisher runs a Job to its end and answers what became of the
// saga. The batch handler that serves the saga's resource makes one over
// the recovery's request and the handler chain after it.
type Finisher func() (*batch.Result, error)

// A Recovery is what the request by which the app finishes a saga
// carries through the server's routes (see finishThrough): the Job, and
// the call that the batch handler serving the saga's resource offers its
// Finisher to.
type Recovery struct {
	job   Job
	taken atomic.Bool
	call  func(Finisher)
}

// Job is the saga the recovery's request carries.
func (rc *Recovery) Job() Job { return rc.job }

// Offer gives the recovery the handler's Finisher, which it calls at
// once, before Offer returns: the handler chain the saga runs through is
// the offering handler's to call only while it serves the request. The
// first offer is taken; a later one, from a batch handler the saga's own
// sub-requests reach, is refused (false), and that handler passes the
// request on.
func (rc *Recovery) Offer(finish Finisher) bool {
	if !rc.taken.CompareAndSwap(false, true) {
		return false
	}
	rc.call(finish)
	return true
}

type recoveryCtxKeyType struct{}

var recoveryCtxKey recoveryCtxKeyType

// RecoveryOf is the saga a request made by the recovery carries, if it
// is one: the batch handler offers to finish it instead of serving a
// client.
func RecoveryOf(ctx context.Context) (*Recovery, bool) {
	rc, ok := ctx.Value(recoveryCtxKey).(*Recovery)
	return rc, ok
}

// finishThrough sends the client's request again, bodiless and marked
// as a recovery of job, through the routes of the server the batch came
// in on (throughRoutes), and answers what the Finisher offered by the
// batch handler it reaches returned.
func (a *App) finishThrough(in durable.Origin, job Job) (*batch.Result, error) {
	var (
		res       *batch.Result
		finishErr error
	)
	rc := &Recovery{job: job, call: func(finish Finisher) { res, finishErr = finish() }}
	routed, err := a.throughRoutes(in, job.Snap.Header, recoveryCtxKey, rc)
	if err != nil {
		return nil, err
	}
	if !rc.taken.Load() {
		return nil, notReached(in, job.Snap.Path, routed)
	}
	return res, finishErr
}

// throughRoutes sends the request in describes, with header and no body,
// through the routes of its server, its context carrying value under
// key, and answers the routes' error. The request takes the route the
// client's took (host, path and other matchers, rewrites before the
// batch handler); the batch handler it reaches takes value and runs
// what it carries through the handler chain after it, as a client's
// batch's sub-requests go: authentication, load balancing and TLS apply
// as they did for the client. No access log is written, and no error
// route runs: nothing is answered to anyone.
func (a *App) throughRoutes(in durable.Origin, header http.Header, key, value any) (routed error, err error) {
	srv, err := a.server(in.Server)
	if err != nil {
		return nil, err
	}
	req, err := originRequest(in, header)
	if err != nil {
		return nil, err
	}
	// The client's span context is not sent through the routes again: a
	// tracing there starts a trace of the request's own, which the
	// batch handler links to the batch's (docs/operations.md, "Traces").
	a.prop.Strip(req.Header)
	// Not the config's context: what the request carries must not be
	// cut by a config reload, as a client's batch is not.
	ctx := context.WithValue(context.Background(), key, value)
	rec := recorder.New(0)
	req = caddyhttp.PrepareRequest(req.WithContext(ctx), caddy.NewReplacer(), rec, srv)
	end := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	return srv.Routes.Compile(end).ServeHTTP(rec, req), nil
}

// notReached is the error of a request through the routes that reached
// no batch handler serving path.
func notReached(in durable.Origin, path string, routed error) error {
	why := "it reached no batch handler that serves " + path
	if routed != nil {
		why += " (" + routed.Error() + ")"
	}
	return fmt.Errorf("the request (%s %s, host %s) through server %s: %s", in.Method, in.URI, in.Host, in.Server, why)
}

// originRequest is the request a journal's origin describes, with the
// batch's header and no body.
func originRequest(in durable.Origin, header http.Header) (*http.Request, error) {
	u, err := url.ParseRequestURI(in.URI)
	if err != nil {
		return nil, fmt.Errorf("the journal's request URI %q: %w", in.URI, err)
	}
	header = header.Clone()
	if header == nil {
		header = http.Header{}
	}
	req := &http.Request{
		Method:     in.Method,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     header,
		Host:       in.Host,
		RemoteAddr: in.RemoteAddr,
		RequestURI: in.URI,
		Body:       http.NoBody,
	}
	if in.TLS {
		// Enough for what handlers ask of a TLS request (the scheme,
		// X-Forwarded-Proto): the connection itself is long gone.
		host, _, err := net.SplitHostPort(in.Host)
		if err != nil {
			host = in.Host
		}
		req.TLS = &tls.ConnectionState{HandshakeComplete: true, ServerName: host}
	}
	return req, nil
}

// server finds the Caddy server named in a journal.
func (a *App) server(name string) (*caddyhttp.Server, error) {
	v, err := a.ctx.AppIfConfigured("http")
	if err != nil {
		return nil, fmt.Errorf("the config has no http app to finish the saga through: %w", err)
	}
	if srv := v.(*caddyhttp.App).Servers[name]; srv != nil {
		return srv, nil
	}
	return nil, fmt.Errorf("the config has no server %q, which the batch came in on", name)
}
