package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Bulk jobs (docs/durability.md, "Bulk jobs in storage") are durable's
// (the store, the driver) and the engine's (admission, windows); what
// the gateway adds is who may start one, the answers, and the route a
// job's requests take: through this handler's next, as a batch's do.

// jobRetryAfter is the Retry-After of a started job and of a status
// before the job ended, in seconds: how often a client polls.
const jobRetryAfter = "5"

// jobs is what a handler with a jobs path starts and watches jobs with.
type jobs struct {
	store *durable.Jobs
	// app runs the jobs, and carries on those that wait for an owner.
	app *batchapp.App
	// running holds a token per job this handler runs, max_jobs of them.
	running chan struct{}
	logger  *zap.Logger
}

func newJobs(storage certmagic.Storage, leases *durable.Leases, app *batchapp.App, maxJobs int, logger *zap.Logger) *jobs {
	return &jobs{
		store:   durable.NewJobs(batchapp.DurableStorage(storage), leases, logger).WithHooks(batchapp.JobHooks()),
		app:     app,
		running: make(chan struct{}, maxJobs),
		logger:  logger,
	}
}

// acquire takes a max_jobs slot, if one is free, and answers its release.
func (j *jobs) acquire() (release func(), ok bool) {
	select {
	case j.running <- struct{}{}:
		return func() { <-j.running }, true
	default:
		return nil, false
	}
}

// serveJobStart makes a job of a batch, or an envelope, sent with
// Prefer: respond-async (op, in scope sc, its body read by admit), runs
// its first item through the route, and answers 202 with its status and token, kept for replay
// under its Idempotency-Key if it has one: the rest runs on this
// instance where one of max_jobs is free, and waits queued otherwise,
// for the next scan of any instance with room. Or it replays the job its
// key started; or refuses it, with nothing stored and nothing sent (or,
// refused by the route's authentication, nothing but its first
// request).
func (h *Handler) serveJobStart(w http.ResponseWriter, r *http.Request, sc scope, op policy.Op, admit jobAdmission) error {
	ctx := r.Context()
	client, ok := jobClient(r, sc)
	if !ok {
		return problem.New(http.StatusForbidden, "job-needs-identity",
			"a bulk job is made only for a client that says who it is: send Authorization or a Cookie"+identityHint(sc)+
				", or send the batch without Prefer: respond-async to run it synchronously").Write(w)
	}
	key, done, err := h.claimStart(w, r, sc, op, client, admit)
	if done {
		return err
	}
	defer key.settle(ctx)
	release, runsHere := h.jobs.acquire()
	defer func() {
		if release != nil {
			release()
		}
	}()
	quota := durable.Quota{PerClient: sc.gateway.MaxJobsPerClient, Queued: sc.gateway.MaxQueuedJobs, Waits: !runsHere}
	if err := h.jobs.store.CheckQuota(ctx, client, quota); err != nil {
		return h.refuseJob(w, err)
	}
	staging, plan, prob, err := h.stageJob(r, sc, admit)
	switch {
	case err != nil:
		return h.refuseJob(w, err)
	case prob != nil:
		return refuse(w, *prob, sc.allow)
	}
	created := time.Now().UTC()
	rec := &durable.JobRecord{
		Op: op.String(), Resource: sc.resource, Path: plan.Spec.Path, Query: plan.Spec.Query,
		Atomicity: plan.Atomicity.String(), Items: plan.Items, Key: plan.Spec.Key, KeyQuoted: plan.Spec.KeyQuoted,
		Created: created, Deadline: created.Add(sc.gateway.JobTimeout), TTL: sc.gateway.JobTTL,
		Origin: originOf(r), Client: client, JobsPath: h.jobsPath, StartTrace: batchapp.StartTrace(ctx),
	}
	rec.Origin.Resource, rec.Origin.ScopeQuery = sc.resource, sc.settings.ScopeQuery
	held, token, err := h.jobs.store.Register(ctx, staging, rec, plan.Spec.Header, quota)
	if err != nil {
		staging.Discard(context.WithoutCancel(ctx))
		return h.refuseJob(w, err)
	}
	// The first item goes even for a job that will wait: the route's
	// authentication answers now, or never refuses the start.
	if refused := h.probeJob(context.WithoutCancel(ctx), held, batchapp.ThroughRoutes); refused != nil {
		return answerRefusedStart(w, refused)
	}
	key.keep()
	if runsHere {
		h.jobs.app.RunJob(held, release)
		release = nil // the run gives it back
	} else if err := held.Queue(ctx); err != nil {
		// Its lease lapses instead, and a scan takes it then.
		h.logger.Warn("queueing a bulk job; it is taken once its lease lapses", zap.String("job", rec.ID), zap.Error(err))
	}
	status, err := h.jobs.store.Status(ctx, rec.ID, token)
	if err != nil {
		return h.refuseJob(w, err)
	}
	return key.answer(ctx, w, startFingerprint(r, plan), func(w http.ResponseWriter) error {
		return answerStarted(w, rec.JobsPath+"/"+rec.ID, plan, status, token)
	})
}

// jobAdmission reads and checks a job's body as a stream, handing its
// items to chunk as they pass (batch.AdmitJob of a collection's batch,
// batch.AdmitEnvelopeJob of the envelope's operations).
type jobAdmission func(r *http.Request, lim batch.JobLimits, chunk func(first int, items []batch.ItemSnapshot) error) (*batch.JobPlan, *problem.Details, error)

// collectionJob is the admission of a batch job of op on the collection
// m matched.
func collectionJob(m policy.Match, op policy.Op) jobAdmission {
	return func(r *http.Request, lim batch.JobLimits, chunk func(int, []batch.ItemSnapshot) error) (*batch.JobPlan, *problem.Details, error) {
		return batch.AdmitJob(r, m, op, lim, chunk)
	}
}

// envelopeJob is the admission of an envelope job.
func (h *Handler) envelopeJob(r *http.Request, lim batch.JobLimits, chunk func(int, []batch.ItemSnapshot) error) (*batch.JobPlan, *problem.Details, error) {
	return batch.AdmitEnvelopeJob(r, h.envelope, lim, chunk)
}

// stageJob reads and checks the job's body as a stream, storing its
// items in chunks as they pass: the staged input and the job's plan, or
// the problem that refused it (the chunks stored so far discarded), or
// the storage's error.
func (h *Handler) stageJob(r *http.Request, sc scope, admit jobAdmission) (*durable.Staging, *batch.JobPlan, *problem.Details, error) {
	ctx := r.Context()
	staging, err := h.jobs.store.Stage(ctx, sc.gateway.JobTTL)
	if err != nil {
		return nil, nil, nil, err
	}
	plan, prob, err := admit(r, jobLimits(sc), func(first int, items []batch.ItemSnapshot) error {
		return staging.Chunk(ctx, first, items)
	})
	if prob == nil {
		return staging, plan, nil, nil
	}
	staging.Discard(context.WithoutCancel(ctx))
	if err != nil {
		h.logger.Warn("storing a bulk job's input", zap.Error(err))
	}
	return nil, nil, prob, nil
}

// answerStarted answers a started job: 202, where its monitor is
// (location), and its status with the token.
func answerStarted(w http.ResponseWriter, location string, plan *batch.JobPlan, status *durable.JobStatus, token string) error {
	h := w.Header()
	h.Set("Location", location)
	applied := "respond-async"
	if plan.PreferenceApplied != "" {
		applied += ", " + plan.PreferenceApplied // the atomicity asked for
	}
	h.Set("Preference-Applied", applied)
	h.Set("Retry-After", jobRetryAfter)
	// The token is in the body only: access logs write headers in clear;
	// and no cache keeps it.
	h.Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusAccepted, startedJob{JobStatus: status, Token: token})
}

// startedJob is a started job's answer: its status, and its token.
type startedJob struct {
	*durable.JobStatus
	// Token is what the job's monitors take, as Authorization: Bearer.
	Token string `json:"token"`
}

// offerJob is ServeHTTP for a request the batch app sends through the
// routes for a job (batchapp.JobTrip): the handler that serves the job
// offers itself, its chain after it being next while it serves the
// request; any other handler, or this one reached again by the job's
// own sub-requests, passes the request on.
func (h *Handler) offerJob(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, trip *batchapp.JobTrip) error {
	rec := trip.Record()
	if h.jobs != nil && rec.JobsPath == h.jobsPath {
		if h.envelope != nil && rec.Op == policy.OpEnvelope.String() && rec.Path == h.envelope.Path {
			if trip.Offer(jobHost{h: h, r: r, next: next, sc: h.envelopeScope()}) {
				return nil
			}
		} else if m, ok := h.policy.Lookup(rec.Path); ok && !m.Item {
			if sc := h.collectionScope(m); sc.resource == rec.Resource && trip.Offer(jobHost{h: h, r: r, next: next, sc: sc}) {
				return nil
			}
		}
	}
	return next.ServeHTTP(w, r)
}

// jobHost is a handler serving a job's request (batchapp.JobHost).
type jobHost struct {
	h    *Handler
	r    *http.Request
	next caddyhttp.Handler
	sc   scope
}

func (jh jobHost) Room() (func(), bool) { return jh.h.jobs.acquire() }

// Site sends a window's requests through the chain after the handler,
// as the job's request would have gone, with the headers the job
// forwards (the request's), under the job's resource's settings with a
// job's bounds (job_concurrency, job_throttle_wait: jobLookup).
func (jh jobHost) Site() batch.Site {
	h, sc := jh.h, jh.sc
	// The journal is the window's log, which the driver sets; the
	// route's tracing, if it traces, the batch app puts under the job's
	// span (batchapp.ThroughRoutes).
	send := h.sendStored(jh.r, jh.next, sc)
	site := batch.Site{Runtime: h.runtime(jh.r.Context(), send, sc.locks, nil, jh.r.Header, sc), Lookup: h.jobLookup}
	if e := h.envelope; e != nil {
		// An envelope job's windows run as the envelope, with a job's
		// bounds, each operation under its resource's (jobLookup).
		site.Envelope = &batch.Envelope{Path: e.Path, Settings: e.Settings.ForJob(), Atomicity: e.Atomicity, Lookup: h.jobLookup}
	}
	return site
}

// jobClient is the identity a job is counted and kept under: the hash of
// the request's Authorization, Cookie, scope_headers and scope_query
// values; ok is false when the request has none of them.
func jobClient(r *http.Request, sc scope) (string, bool) {
	present := r.Header.Get("Authorization") != "" || r.Header.Get("Cookie") != ""
	for _, name := range sc.gateway.ScopeHeaders {
		present = present || r.Header.Get(name) != ""
	}
	query := r.URL.Query()
	fields := []string{durable.Credentials(r.Header, sc.gateway.ScopeHeaders)}
	names := slices.Sorted(slices.Values(sc.settings.ScopeQuery))
	for _, name := range names {
		values := query[name]
		present = present || slices.ContainsFunc(values, func(v string) bool { return v != "" })
		fields = append(fields, "query "+name, url.Values{name: values}.Encode())
	}
	return durable.HashFields(fields...), present
}

// identityHint names the other ways sc's clients say who they are.
func identityHint(sc scope) string {
	hint := ""
	if len(sc.gateway.ScopeHeaders) > 0 {
		hint += fmt.Sprintf(", a header of scope_headers %v", sc.gateway.ScopeHeaders)
	}
	if len(sc.settings.ScopeQuery) > 0 {
		hint += fmt.Sprintf(", a query parameter of scope_query %v", sc.settings.ScopeQuery)
	}
	return hint
}

// refuseJob answers a start or a monitor that durable refused: a quota
// (429), a job unknown to the token (404), or the storage failing (503).
func (h *Handler) refuseJob(w http.ResponseWriter, err error) error {
	var qe *durable.QuotaError
	switch {
	case errors.As(err, &qe):
		return refuseQuota(w, qe)
	case errors.Is(err, durable.ErrUnknownJob):
		return problem.New(http.StatusNotFound, "unknown-job",
			"no job with this id is kept for this token: a job answers only Authorization: Bearer <the token its start answered>, until job_ttl after its end").Write(w)
	}
	h.logger.Error("bulk jobs' storage", zap.Error(err))
	w.Header().Set("Retry-After", jobRetryAfter)
	return problem.New(http.StatusServiceUnavailable, "storage-unavailable",
		"the storage failed while the job was read or stored: try again").Write(w)
}

func refuseQuota(w http.ResponseWriter, qe *durable.QuotaError) error {
	w.Header().Set("Retry-After", strconv.Itoa(int(qe.RetryAfter.Seconds())))
	return problem.New(http.StatusTooManyRequests, "job-quota-exceeded", qe.Reason).Write(w)
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}
