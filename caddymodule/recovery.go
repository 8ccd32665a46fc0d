package caddymodule

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/policy"
)

// recoverLoop looks for journals to finish, and sweeps expired
// Idempotency-Key records, at start and then every recovery_interval,
// until Stop.
func (a *App) recoverLoop() {
	defer close(a.stopped)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(time.Duration(a.RecoveryInterval))
	defer tick.Stop()
	for {
		a.scan(ctx)
		a.sweepIdempotency(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sweepIdempotency deletes the Idempotency-Key records that expired
// (docs/durability.md, "Idempotency-Key replay"): one instance's sweep
// serves every instance of a
// cluster, and a sweep that races another only deletes what both found
// expired.
func (a *App) sweepIdempotency(ctx context.Context) {
	n, err := sweepIdempotency(ctx, a.journals.storage, time.Now())
	switch {
	case err != nil && ctx.Err() == nil:
		a.logger.Warn("sweeping expired Idempotency-Key records", zap.Error(err))
	case n > 0:
		a.logger.Debug("swept expired Idempotency-Key records", zap.Int("deleted", n))
	}
}

// scan takes over every saga in storage whose owner's lease lapsed.
func (a *App) scan(ctx context.Context) {
	sagas, err := a.journals.sagas(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.logger.Warn("listing saga journals in storage", zap.Error(err))
		}
		return
	}
	for _, saga := range sagas {
		if ctx.Err() != nil {
			return
		}
		if owned.has(saga) {
			continue
		}
		l, err := a.journals.leaseOf(ctx, saga)
		switch {
		case errors.Is(err, errNoIntent):
			a.sweep(ctx, saga)
		case err != nil:
			a.failedOnce(saga, "reading the saga's lease", err)
		case time.Now().After(l.Expires):
			a.takeOver(ctx, saga)
		}
	}
}

// takeOver claims a dead owner's saga and finishes it on a goroutine of
// its own. The claim is a new lease, written under the saga's storage
// lock after reading again that the old one lapsed, so that of several
// instances that find the saga at once only one takes it; the lock is
// held for the claim only, the lease for as long as the saga runs.
func (a *App) takeOver(ctx context.Context, saga string) {
	unlock, ok := a.lock(ctx, saga)
	if !ok {
		return // another instance is claiming it; its lease will show
	}
	defer unlock()
	dead, err := a.journals.leaseOf(ctx, saga)
	if err != nil || !time.Now().After(dead.Expires) {
		return
	}
	until := time.Now().Add(a.journals.lease)
	b, _ := json.Marshal(lease{Owner: durable.Owner(), Expires: until})
	sctx, cancel := context.WithTimeout(ctx, storageTimeout)
	err = a.journals.storage.Store(sctx, leaseKey(saga), b)
	cancel()
	if err != nil {
		a.failedOnce(saga, "claiming the saga's lease", err)
		return
	}
	if !owned.add(saga) {
		return
	}
	st, err := a.journals.load(ctx, saga)
	if err != nil {
		owned.done()
		owned.forget(saga)
		a.failedOnce(saga, "reading the saga's journal", err)
		return
	}
	go a.finish(saga, dead, st, until)
}

// lock takes the storage lock under which a saga is claimed, without
// waiting for an instance that holds it.
func (a *App) lock(ctx context.Context, saga string) (unlock func(), ok bool) {
	// A storage that cannot try a lock is given two seconds in Lock.
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	unlock, err := durable.Lock(lctx, a.journals.storage, lockName(saga), 0, func(err error) {
		a.logger.Warn("releasing a saga's storage lock", zap.String("saga", saga), zap.Error(err))
	})
	return unlock, err == nil
}

// sweep removes what is left of a journal whose removal was cut short
// (segment 0, its intent, is deleted first), once nothing was written to
// it for a lease: a journal being created is never without segment 0 for
// longer than its first write.
func (a *App) sweep(ctx context.Context, saga string) {
	info, err := a.journals.storage.Stat(ctx, journalDir(saga))
	if err != nil || time.Since(info.Modified) < a.journals.lease {
		return
	}
	if err := a.journals.storage.Delete(ctx, journalDir(saga)); err != nil {
		a.failedOnce(saga, "removing what is left of a finished saga's journal", err)
	}
}

// finish resumes a saga this process took over, and logs what became of
// it: one line per saga, ERROR when items were left behind.
func (a *App) finish(saga string, dead lease, st *storedSaga, until time.Time) {
	start := time.Now()
	j := a.journals.takeOver(saga, st.next, until)
	job := &recovery{snap: st.snap, journal: j}
	err := a.probe(st.intent, job)
	if err == nil {
		err = job.err
	}
	if err != nil {
		// Resume ends the journal only when it ran; otherwise the
		// journal stays for a later try, ours or another instance's,
		// once the lease lapses.
		j.stopRenewal()
		owned.done()
		owned.forget(saga)
		a.failedOnce(saga, "finishing the saga", err)
		return
	}
	a.logRecovered(saga, dead, st, job.res, time.Since(start))
}

func (a *App) logRecovered(saga string, dead lease, st *storedSaga, res *batch.Result, took time.Duration) {
	metrics.recovered.WithLabelValues(string(res.Outcome)).Inc()
	level, msg := zapcore.InfoLevel, "recovered a batch whose gateway died"
	if res.Outcome == batch.RollbackFailed {
		level, msg = zapcore.ErrorLevel, "recovered a batch whose gateway died: items left behind"
	}
	ce := a.logger.Check(level, msg)
	if ce == nil {
		return
	}
	in := st.intent
	fields := []zap.Field{
		zap.String("saga", saga),
		zap.String("server", in.Server),
		zap.String("host", in.Host),
		zap.String("op", st.snap.Op),
		zap.String("path", st.snap.Path),
		zap.Int("items", len(st.snap.Items)),
		zap.Time("started", in.Started),
		zap.String("dead_owner", dead.Owner),
		zap.Time("lease_lapsed", dead.Expires),
		zap.String("outcome", string(res.Outcome)),
		zap.Int("compensations", res.Compensations),
		zap.Duration("duration", took),
	}
	ce.Write(append(fields, outcomeFields(res)...)...)
}

// failedOnce logs that a saga could not be taken over or finished, once
// per saga and reason: the recovery tries again every interval.
func (a *App) failedOnce(saga, doing string, err error) {
	why := doing + ": " + err.Error()
	a.state.mu.Lock()
	seen := a.state.failed[saga] == why
	a.state.failed[saga] = why
	a.state.mu.Unlock()
	if !seen {
		a.logger.Error("a saga whose gateway died could not be finished; it stays in storage and is tried again",
			zap.String("saga", saga), zap.String("while", doing), zap.Error(err))
	}
}

// recovery is a saga to finish, carried to the batch handler by a request
// through the server's routes (see probe and Handler.resume).
type recovery struct {
	snap    *batch.Snapshot
	journal batch.Journal
	reached bool // a batch handler serving the saga's resource took it
	res     *batch.Result
	err     error
}

type recoveryCtxKeyType struct{}

var recoveryCtxKey recoveryCtxKeyType

// probe sends the client's request again, bodiless and marked as a
// recovery, through the routes of the server the batch came in on. It
// takes the route the batch took (host, path and other matchers, rewrites
// before the batch handler), and the batch handler it reaches finishes
// the saga with the handler chain after it, as its own sub-requests go:
// authentication, load balancing and TLS apply as they did for the batch.
// No access log is written, and no error route runs: nothing is answered
// to anyone.
func (a *App) probe(in *intent, job *recovery) error {
	srv, err := a.server(in.Server)
	if err != nil {
		return err
	}
	u, err := url.ParseRequestURI(in.URI)
	if err != nil {
		return fmt.Errorf("the journal's request URI %q: %w", in.URI, err)
	}
	header := job.snap.Header.Clone()
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
	// Not the config's context: a saga being finished must not be cut
	// by a config reload, as a client's batch is not.
	ctx := context.WithValue(context.Background(), recoveryCtxKey, job)
	rec := newRecorder(0)
	req = caddyhttp.PrepareRequest(req.WithContext(ctx), caddy.NewReplacer(), rec, srv)
	end := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	err = srv.Routes.Compile(end).ServeHTTP(rec, req)
	if !job.reached {
		why := "it reached no batch handler that serves " + job.snap.Path
		if err != nil {
			why += " (" + err.Error() + ")"
		}
		return fmt.Errorf("the batch's request (%s %s, host %s) through server %s: %s", in.Method, in.URI, in.Host, in.Server, why)
	}
	return nil
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

// resume is ServeHTTP for a recovery's request: the handler that serves
// the saga's resource, or its envelope, finishes it through next; any
// other passes it on.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, job *recovery) error {
	sc, ok := h.scopeOf(job.snap)
	if !ok || job.reached {
		return next.ServeHTTP(w, r)
	}
	job.reached = true
	rt := batch.Runtime{
		Send:    newSubrequests(r, next, sc.settings.MaxBodySize),
		Locks:   sc.locks,
		Journal: job.journal,
		Slots:   h.slots,
	}
	job.res, job.err = batch.Resume(r.Context(), job.snap, h.policy.Lookup, h.envelope, rt)
	if job.err == nil {
		h.idem.settleRecovered(r.Context(), sc, job.snap, job.res)
	}
	return nil
}

// scopeOf is the scope a saga from a journal ran under, if this handler
// serves it: its resource's collection, or the handler's envelope.
func (h *Handler) scopeOf(snap *batch.Snapshot) (scope, bool) {
	if snap.Op == policy.OpEnvelope.String() {
		if h.envelope == nil || h.envelope.Path != snap.Path {
			return scope{}, false
		}
		return h.envelopeScope(), true
	}
	m, ok := h.policy.Lookup(snap.Path)
	if !ok || m.Item {
		return scope{}, false
	}
	return h.collectionScope(m), true
}

// journalFor is the journal of a batch, or nil if it keeps none: only an
// all-or-nothing write batch is a saga.
func (h *Handler) journalFor(r *http.Request, sc scope, p *batch.Plan) batch.Journal {
	if h.journals == nil || !sc.gateway.Journal || p.Atomicity != policy.AllOrNothing || !p.Op.Writes() {
		return nil
	}
	return h.journals.newJournal(r)
}
