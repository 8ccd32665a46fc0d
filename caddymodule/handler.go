// Package caddymodule is the Caddy glue of caddy-batch's handler: the
// http.handlers.batch module, its JSON and Caddyfile configuration, and
// the sub-requests it sends through the rest of the handler chain. The
// options are package options', the batch app and the operator's
// surface package batchapp's. The engine (package batch) and the method
// map (package policy) know nothing of Caddy; this package stays thin.
package caddymodule

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/options"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
	"github.com/caddy-batch/caddy-batch/internal/traceprop"
	"github.com/caddy-batch/caddy-batch/policy"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler gives a legacy REST API batch operations (GET, create, update
// and delete of many items in one request, all-or-nothing or partial)
// and a per-route method map (OPTIONS, 405 and 501 answered by the
// gateway). Batches are fanned out as single-item requests through the
// rest of the handler chain, so put it before authentication, rate
// limits and reverse_proxy (where the Caddyfile directive is ordered):
// every item is then authorized and limited as a single request is.
//
// Placeholders, set on every batch request (refused ones included) for
// access logs:
//
//	{http.batch.op}       get, create, update, delete, or envelope
//	{http.batch.items}    the number of items (0 for a refused batch)
//	{http.batch.outcome}  succeeded, partial, failed, rolled_back,
//	                      rollback_failed, rejected, or replayed (an
//	                      answer replayed for an Idempotency-Key)
//
// The gateway's own answers (OPTIONS, 405, 501, the batch answer and its
// problems) are written by the handler, not returned as errors, so they
// do not go through handle_errors: they are complete answers, and a
// handle_errors route would replace a batch's answer with an error
// page.
type Handler struct {
	// The defaults of every resource's options.
	options.Options

	// The resources of the legacy API: each a collection path with the
	// methods it and its items support. Requests to other paths pass
	// through untouched. Required, unless openapi declares them.
	Resources []Resource `json:"resources,omitempty"`

	// The path of the handler's envelope: a POST there carries
	// single-item operations on the resources above, with references
	// between them, run as one batch (docs/envelope.md). It must match
	// no resource. Default: none (no envelope).
	Envelope string `json:"envelope,omitempty"`

	// The path under which bulk jobs' monitors live, e.g. "/api/jobs": a
	// batch sent with `Prefer: respond-async` then becomes a job that
	// outlives its request, answered `202` with `Location: <jobs>/<id>`
	// (docs/jobs.md, "Start"). It must be matched by the handler's route
	// and by no resource. Default: none (respond-async is ignored, and
	// every batch runs synchronously).
	Jobs string `json:"jobs,omitempty"`

	// The legacy API's OpenAPI document, imported as resources, and the
	// document the gateway publishes (docs/openapi.md, "From OpenAPI").
	// Default: none.
	OpenAPI *OpenAPIConfig `json:"openapi,omitempty"`

	// config is the configuration above, resolved by Provision.
	config
	logger *zap.Logger
	locks  *itemlock.Local
	slots  *pooledSlots
	// untrackSlots stops the metrics counting the slots, at Cleanup.
	untrackSlots func()
	// storageLocks are set when a resource has item_locks storage.
	storageLocks itemlock.Locker
	idem         *idempotency
	journals     *durable.Journals
	// jobs are set when the handler has a jobs path.
	jobs *jobs
	// headless are the resources whose API answered HEAD 405.
	headless *headless
	// prop are the propagators of Caddy's tracing, which write each
	// sub-request's span context (docs/operations.md, "Traces").
	prop *traceprop.Propagation
}

// Resource is one collection of the legacy API and its items.
type Resource struct {
	// The collection's path template, e.g. "/api/users/{user}/posts":
	// literal segments and whole-segment {name} variables. A variable may
	// say what its values are, {user:integer} (integer, uuid or any), so
	// that an item's lock names it in its canonical spelling; without a
	// format a variable is its text. A request path matches with or
	// without a trailing slash. Required.
	Path string `json:"path"`

	// The methods the collection supports, e.g. ["GET", "POST"]. HEAD is
	// implied by GET, and OPTIONS is always answered. Default: none.
	Collection []string `json:"collection,omitempty"`

	// The methods one item supports, e.g. ["GET", "PUT", "DELETE"].
	// Default: none.
	Item []string `json:"item,omitempty"`

	// The item's path template; it must contain {id} and may use the
	// collection's variables. Default: the collection's path + "/{id}",
	// or + "{id}/" when the collection's path ends with a slash.
	ItemPath string `json:"item_path,omitempty"`

	// The batch operations that are on: any of "get", "create",
	// "update", "delete"; an empty list turns every one off. Default:
	// every one the methods allow.
	Batch *[]string `json:"batch,omitempty"`

	// Reads the resource's batch GETs through the legacy API's own LIST
	// filter: one LIST per max_ids ids instead of one GET per id, every
	// id a LIST does not answer read with its own GET. Default: none
	// (one GET per id).
	ListFilter *ListFilterConfig `json:"list_filter,omitempty"`

	// Options for this resource alone, over the handler's.
	options.Options
}

// ListFilterConfig is how the legacy API's LIST is asked for the items of
// a batch (docs/list-filter.md).
type ListFilterConfig struct {
	// The query that selects ids: pairs joined by "&", one of which holds
	// {id} (the pair repeated once per id: "id={id}" is id=1&id=2) or
	// {ids} (the ids joined by commas: "id__in={ids}" is id__in=1,2);
	// the other pairs are sent as written. Required.
	Query string `json:"query"`

	// A JSON pointer to the array in the LIST's answer, e.g. "/results".
	// Default: "" (the answer is the array).
	Items string `json:"items,omitempty"`

	// The most ids one LIST asks for; fewer where the request target
	// would pass 4 KiB. Default: 50.
	MaxIDs int `json:"max_ids,omitempty"`

	// Whether the pre-images of batch updates and deletes are read
	// through the LIST too: the operator's word that a LIST element is
	// the whole item, as a single GET answers it. Default: false.
	Preflight bool `json:"preflight,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.batch",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision resolves every resource's settings and builds the method map
// once, so that ServeHTTP only reads.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	cfg, err := h.resolve(nil, true)
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	h.config = cfg
	h.headless = new(headless)
	h.prop = traceprop.New()
	for _, g := range cfg.gaps {
		h.logger.Warn(g.Warning(), zap.String("resource", g.Resource), zap.String("op", g.Op.String()))
	}
	storage := configStorage(ctx)
	if err := h.provisionLocks(storage); err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	h.slots = h.provisionSlots()
	h.untrackSlots = telemetry.Metrics.Slots.Track(h.slots)
	if err := telemetry.Register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("batch: registering metrics: %w", err)
	}
	app, err := ctx.App("batch")
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	journals, leases := app.(*batchapp.App).Register()
	h.journals = journals
	h.idem = newIdempotency(storage, leases, h.logger)
	if cfg.jobsPath != "" {
		if storage == nil {
			return fmt.Errorf("batch: jobs %s needs Caddy's storage, which this context has none of", cfg.jobsPath)
		}
		h.jobs = newJobs(storage, leases, app.(*batchapp.App), cfg.handler.MaxJobs, h.logger)
		app.(*batchapp.App).SweepJobs()
	}
	return nil
}

// ServeHTTP answers OPTIONS and refused methods for configured paths,
// runs batches, and passes everything else on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// A request made by the recovery (the batch app's) carries a dead
	// saga to finish through this route, not a client's request.
	if rc, ok := batchapp.RecoveryOf(r.Context()); ok {
		return h.offer(w, r, next, rc)
	}
	if trip, ok := batchapp.JobTripOf(r.Context()); ok {
		return h.offerJob(w, r, next, trip)
	}
	if h.isJobMonitor(r.URL.EscapedPath()) {
		return h.serveJobMonitor(w, r)
	}
	if h.published != nil && r.URL.EscapedPath() == h.published.path {
		return h.servePublished(w, r)
	}
	if h.isEnvelope(r.URL.EscapedPath()) {
		return h.serveEnvelope(w, r, next)
	}
	m, ok := h.policy.Lookup(r.URL.EscapedPath())
	if !ok {
		return next.ServeHTTP(w, r)
	}
	d := m.JudgeMethod(r)
	if d.Refusal != policy.MethodAccepted {
		return refuseMethod(w, m, d)
	}
	if d.Override {
		policy.RemoveMethodOverride(r)
		r.Method = d.Method
	}
	switch {
	case r.Method == http.MethodOptions:
		return answerOptions(w, r, next, m.Allow(), m.Methods().Has(policy.MethodPatch))
	case r.Method == http.MethodHead:
		return h.serveHead(w, r, m, next)
	case m.Item:
		return h.serveItem(w, r, m, next)
	}
	if h.jobs != nil && batch.IsAsync(r.Header) {
		op, isJob, err := batch.JobOp(r, m.Resource)
		if err != nil {
			return refuse(w, problem.New(http.StatusBadRequest, "invalid-batch", "reading the body: "+err.Error()), m.Allow())
		}
		if isJob {
			return h.serveJobStart(w, r, h.collectionScope(m), op, collectionJob(m, op))
		}
	}
	a, isBatch := h.admit(r, m)
	if !isBatch {
		return next.ServeHTTP(w, r)
	}
	return h.serveBatch(w, r, a, next)
}

// answerOptions answers OPTIONS on a path the gateway knows with what
// it allows, and hands a CORS preflight on to the CORS handler.
func answerOptions(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, allow string, acceptsPatch bool) error {
	if r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != "" {
		return next.ServeHTTP(w, r) // a CORS preflight is the CORS handler's to answer
	}
	w.Header().Set("Allow", allow)
	if acceptsPatch {
		w.Header().Set("Accept-Patch", "application/json, application/merge-patch+json")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refuse answers with a problem the gateway found; a 405 says what the
// path allows.
func refuse(w http.ResponseWriter, prob problem.Details, allow string) error {
	if prob.Status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", allow)
	}
	return prob.Write(w)
}

// refuseMethod answers a method, or a method override, that the map
// refuses (policy.Match.JudgeMethod).
func refuseMethod(w http.ResponseWriter, m policy.Match, d policy.MethodDecision) error {
	switch d.Refusal {
	case policy.MethodNotImplemented:
		return refuse(w, problem.New(http.StatusNotImplemented, "method-not-implemented", d.Detail), m.Allow())
	case policy.MethodNotAllowed:
		return refuse(w, problem.New(http.StatusMethodNotAllowed, "method-not-allowed", d.Detail), m.Allow())
	}
	return refuse(w, problem.New(http.StatusBadRequest, "invalid-method-override", d.Detail), m.Allow())
}

// serveItem passes a request to one item on, a write under its item's
// lock, a declarative DELETE's 404 turned into 204.
func (h *Handler) serveItem(w http.ResponseWriter, r *http.Request, m policy.Match, next caddyhttp.Handler) error {
	serve := func() error { return next.ServeHTTP(w, r) }
	if r.Method == http.MethodDelete && m.Resource.Settings.DeleteSemantics == policy.Declarative {
		serve = func() error { return serveDeclarativeDelete(w, r, next) }
	}
	if isWrite(r.Method) {
		return h.serveLockedWrite(w, r, m, serve)
	}
	return serve()
}

// serveDeclarativeDelete turns the upstream's 404 to a single-item DELETE
// into 204: under declarative semantics "the item must not exist" holds.
// Only a 404 is held back; any other answer streams through as it comes.
func serveDeclarativeDelete(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rec := caddyhttp.NewResponseRecorder(w, new(bytes.Buffer), func(status int, _ http.Header) bool {
		return status == http.StatusNotFound
	})
	if err := next.ServeHTTP(rec, r); err != nil {
		return err
	}
	if !rec.Buffered() {
		return nil
	}
	h := w.Header()
	for _, name := range []string{"Content-Type", "Content-Length", "Content-Encoding", "Transfer-Encoding"} {
		h.Del(name)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// admission is a batch request past the front door, a collection's or
// the envelope's: what it runs under, its operation, and its plan, or
// the problem that refused it before anything was sent.
type admission struct {
	scope   scope
	op      policy.Op
	plan    *batch.Plan
	refusal *problem.Details
}

// admit tells whether a request to the collection m matched is a batch
// and, if it is, admits it (batch.Admit).
func (h *Handler) admit(r *http.Request, m policy.Match) (a admission, isBatch bool) {
	op, isBatch, plan, prob := batch.Admit(r, m)
	return admission{scope: h.collectionScope(m), op: op, plan: plan, refusal: prob}, isBatch
}

// serveBatch runs an admitted batch or envelope, or answers the problem
// that refused it.
func (h *Handler) serveBatch(w http.ResponseWriter, r *http.Request, a admission, next caddyhttp.Handler) error {
	sc, plan := a.scope, a.plan
	obs := h.observe(r, sc, a.op)
	if a.refusal != nil {
		obs.rejected(a.refusal.Status, a.refusal.Detail)
		return refuse(w, *a.refusal, sc.allow)
	}
	keyed := h.idem.watch(r, sc, plan)
	if done, err := keyed.claim(w, len(plan.Items)); done {
		return err
	}
	send := newSubrequests(r, obs.chain(next), sc.settings.MaxBodySize)
	journal := h.journalFor(r, sc, plan)
	if keyed != nil {
		if dj, ok := journal.(*durable.Journal); ok {
			// A claim lost is the saga's lease lost: its writes stand on both.
			dj.Also(keyed.held)
		} else if !plan.Saga() {
			journal = durable.FencedByClaim(journal, keyed.held)
		}
	}
	obs.saga = sagaOf(journal)
	result := batch.Run(r.Context(), plan, h.runtime(r.Context(), send, obs.locks(sc.locks), journal, r.Header, sc))
	markSaga(r.Context(), obs.saga, result)
	obs.finished(r.Context(), plan, result)
	return keyed.write(w, result)
}

// runtime is what a batch of this handler runs on: its requests sent by
// send, its items locked by locks and journaled by journal, for the
// client whose credentials are in header under sc (the scope_query
// values each sub-request carries complete who it is, in batch's
// throttles); the handler's slots, their observer and the upstream's
// throttles (undos and jobs wait out a throttle of their client as its
// batches do), and the route's tracing.
func (h *Handler) runtime(ctx context.Context, send batch.Sender, locks itemlock.Locker, journal batch.Journal, header http.Header, sc scope) batch.Runtime {
	return batch.Runtime{
		Send: send, Locks: locks, Journal: journal, Slots: h.slots, Observer: h.slots.observer(),
		Throttles: h.slots.throttles, Client: durable.Credentials(header, sc.gateway.ScopeHeaders),
		Trace: h.tracing(ctx),
	}
}

// setOutcome sets the placeholders an access log can use.
func setOutcome(repl *caddy.Replacer, items int, outcome string) {
	if repl == nil {
		return
	}
	repl.Set("http.batch.items", strconv.Itoa(items))
	repl.Set("http.batch.outcome", outcome)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
