package caddymodule

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
	"github.com/caddy-batch/caddy-batch/policy"
)

// What a job's start owes its client before a job is kept
// (docs/jobs.md, "Start"): an Idempotency-Key on it answers the same
// job again, never a second one; and the route's authentication, which
// runs after this handler, sees the job's first request before the
// start is answered.

// startMaxRun bounds how long the claim of a start's Idempotency-Key is
// renewed: the start reads a body of up to max_job_body_size and sends
// the job's first item. A start still going past it is not replayed: a
// retry is told its answer was not recorded.
const startMaxRun = 15 * time.Minute

// keyedStart is a job's start that carries an Idempotency-Key and
// claimed it, from before its body is read to its answer. A nil
// *keyedStart keeps nothing.
type keyedStart struct {
	held   *durable.Held
	record string
	ttl    time.Duration
	logger *zap.Logger
	// made is set once the job is kept: the key is then never given
	// back, since a retry must not make a second job.
	made, answered bool
}

// startKeyTTL is how long a start's key is kept: idempotency_ttl, and
// at least as long as the job it started may be (job_timeout, then
// job_ttl), so that a retry finds the job gone (410) rather than makes
// another.
func startKeyTTL(g policy.GatewaySettings) time.Duration {
	return max(g.IdempotencyTTL, g.JobTimeout+g.JobTTL)
}

// claimStart claims the start's Idempotency-Key, if it carries one, for
// the client's identity: the key to keep the answer under, or done when
// the request was answered instead: a replay of the job the key started
// (or 410 once it is gone), or 409, 422, 503 as a batch's key is refused
// (refusal).
func (h *Handler) claimStart(w http.ResponseWriter, r *http.Request, sc scope, op policy.Op, client string, admit jobAdmission) (k *keyedStart, done bool, err error) {
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" || h.idem == nil {
		return nil, false, nil
	}
	record, lock := durable.JobStartRecord(key, client, sc.resource, sc.collection, op.String())
	ttl := startKeyTTL(sc.gateway)
	d, err := h.idem.keys.ClaimStart(r.Context(), durable.Claim{
		Record: record, Lock: lock, Resource: sc.resource, Op: op.String(),
		// Another start with the key being checked right now is waited
		// for as a batch's is.
		Wait: sc.settings.ItemTimeout, TTL: ttl, MaxRun: startMaxRun,
	})
	if err != nil {
		return nil, true, caddyhttp.Error(499, err)
	}
	switch d.Verdict {
	case durable.Proceed:
		return &keyedStart{held: d.Held, record: record, ttl: ttl, logger: h.logger}, false, nil
	case durable.Started:
		return nil, true, h.replayStart(w, r, sc, op, d.Record, admit)
	case durable.Unavailable:
		h.logger.Error("idempotency record of a job's start unavailable", zap.String("record", record), zap.Error(d.Err))
	}
	prob, retryAfter := refusal(d)
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	return nil, true, prob.Write(w)
}

// startFingerprint is the hash of what makes a job's start this start:
// its method, path and query (a GET or DELETE job's ids), its elements
// (batch.JobPlan.Digest: an array and JSON Lines of the same elements
// are the same start), and its atomicity (an envelope's member, or a
// Prefer under allow_override: the same elements all-or-nothing are
// another start).
func startFingerprint(r *http.Request, plan *batch.JobPlan) string {
	return durable.HashFields(startFields(r, plan, plan.Atomicity.String())...)
}

func startFields(r *http.Request, plan *batch.JobPlan, more ...string) []string {
	return append([]string{"job start", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, hex.EncodeToString(plan.Digest)}, more...)
}

// startReplays reports whether rec, the record of a keyed start, is of
// this start; atomicityUnchecked says its fingerprint was made by a
// build that left the atomicity out of it (kept up to job_timeout plus
// job_ttl, through an upgrade), so that the job it started must be of
// plan's atomicity too.
func startReplays(rec *durable.Record, r *http.Request, plan *batch.JobPlan) (replays, atomicityUnchecked bool) {
	if durable.StartVerdict(rec, startFingerprint(r, plan)) == durable.Replay {
		return true, false
	}
	if durable.StartVerdict(rec, durable.HashFields(startFields(r, plan)...)) == durable.Replay {
		return true, true
	}
	return false, false
}

// replayStart answers a start whose key started a job (rec): its body
// read through, and fingerprinted, without keeping it; the same start
// again is answered 202 with the job's status now and the same token,
// a body of another start 422, and a job removed or expired 410.
func (h *Handler) replayStart(w http.ResponseWriter, r *http.Request, sc scope, op policy.Op, rec *durable.Record, admit jobAdmission) error {
	plan, prob, _ := admit(r, jobLimits(sc), func(int, []batch.ItemSnapshot) error { return nil })
	if prob != nil {
		return refuse(w, *prob, sc.allow)
	}
	replays, atomicityUnchecked := startReplays(rec, r, plan)
	if !replays {
		p, _ := refusal(durable.Decision{Verdict: durable.Mismatch})
		return p.Write(w)
	}
	var first startedJob
	if err := json.Unmarshal(rec.Answer.Body, &first); err != nil || first.JobStatus == nil {
		h.logger.Error("the kept answer of a job's start is unreadable", zap.String("resource", sc.resource), zap.Error(err))
		p, _ := refusal(durable.Decision{Verdict: durable.Abandoned})
		return p.Write(w)
	}
	status, err := h.jobs.store.Status(r.Context(), first.ID, first.Token)
	switch {
	case errors.Is(err, durable.ErrUnknownJob):
		return problem.New(http.StatusGone, "job-gone",
			"the job this Idempotency-Key started is gone: it was removed (DELETE) or kept past job_ttl; the key starts no other job: to run the batch again, send it with a new Idempotency-Key").Write(w)
	case err != nil:
		return h.refuseJob(w, err)
	case atomicityUnchecked && status.Atomicity != plan.Atomicity.String():
		p, _ := refusal(durable.Decision{Verdict: durable.Mismatch})
		return p.Write(w)
	}
	telemetry.Metrics.Replays.WithLabelValues(serverName(r), sc.resource, op.String()).Inc()
	h.logger.Info("bulk job start replayed", zap.String("job", first.ID), zap.String("state", status.State))
	for _, name := range []string{"Location", "Preference-Applied"} {
		if v := rec.Answer.Header.Values(name); len(v) > 0 {
			w.Header()[name] = slices.Clone(v)
		}
	}
	w.Header().Set("Idempotent-Replayed", "true")
	w.Header().Set("Retry-After", jobRetryAfter)
	w.Header().Set("Cache-Control", "no-store")
	return writeJSON(w, http.StatusAccepted, startedJob{JobStatus: status, Token: first.Token})
}

// answer answers the started job as write writes it, kept first for
// replay under the key with the start's fingerprint. An answer that
// cannot be kept still goes to the client; its claim lapses, and a retry
// is told the answer was not recorded.
func (k *keyedStart) answer(ctx context.Context, w http.ResponseWriter, fingerprint string, write func(http.ResponseWriter) error) error {
	if k == nil {
		return write(w)
	}
	rec := durable.NewAnswerRecorder()
	if err := write(rec); err != nil {
		return err
	}
	k.answered = true
	switch err := k.held.StartAnswered(ctx, fingerprint, rec.Answer(), k.ttl); {
	case errors.Is(err, durable.ErrClaimLost):
		k.logger.Warn("the Idempotency-Key of a job's start lapsed or was claimed elsewhere before its answer; the answer is not kept", zap.String("record", k.record))
	case err != nil:
		k.logger.Error("keeping the answer of a job's start for replay; a retry with its key is told it was not recorded", zap.String("record", k.record), zap.Error(err))
	}
	return rec.Answer().Write(w)
}

// settle gives the key back for a start refused before its job was kept
// (running it again is what its client is told to do), or leaves the
// claim of one kept but not answered to lapse (a retry is told the
// answer was not recorded, and makes no second job).
func (k *keyedStart) settle(ctx context.Context) {
	switch {
	case k == nil || k.answered:
	case k.made:
		k.held.Release()
	default:
		if err := k.held.GiveBack(ctx); err != nil {
			k.logger.Error("giving back the Idempotency-Key of a refused job's start", zap.String("record", k.record), zap.Error(err))
		}
	}
}

// keep marks the job made: its key is never given back.
func (k *keyedStart) keep() {
	if k != nil {
		k.made = true
	}
}

// probeJob runs the held job's first item through the route, before the
// start is answered: an authentication after this handler that refuses
// it (401, 403, 407) refuses the start, and the job is abandoned,
// nothing of it kept; its answer is returned to be the start's. Any
// other outcome lets the job go on from its second item (a storage
// failure included: Run carries on from what was stored).
func (h *Handler) probeJob(ctx context.Context, held *durable.HeldJob, through durable.Through) *batch.SubResponse {
	rec := held.Record()
	refused, err := held.RunFirst(ctx, through)
	if err != nil {
		h.logger.Warn("running a bulk job's first item before its start's answer; its run carries on from what was stored",
			zap.String("job", rec.ID), zap.Error(err))
		return nil
	}
	if refused == nil {
		return nil
	}
	h.logger.Info("bulk job refused by the route's authentication at its first item; nothing is kept",
		zap.String("resource", rec.Resource), zap.Int("status", refused.Status))
	if err := held.Abandon(ctx); err != nil {
		h.logger.Error("deleting a bulk job refused at its first item; the sweep deletes what is left",
			zap.String("job", rec.ID), zap.Error(err))
	}
	return refused
}

// answerRefusedStart answers a start with the route's refusal of its
// first request: its status, challenge and body as the route wrote them.
func answerRefusedStart(w http.ResponseWriter, refused *batch.SubResponse) error {
	h := w.Header()
	for _, name := range []string{"Www-Authenticate", "Proxy-Authenticate", "Content-Type"} {
		if v := refused.Header.Values(name); len(v) > 0 {
			h[name] = slices.Clone(v)
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(refused.Body)))
	w.WriteHeader(refused.Status)
	_, err := w.Write(refused.Body)
	return err
}

// jobLimits are the limits of sc's jobs, in place of a synchronous
// batch's max_items and max_body_size.
func jobLimits(sc scope) batch.JobLimits {
	g := sc.gateway
	return batch.JobLimits{MaxItems: g.MaxJobItems, MaxAtomic: g.MaxAtomicJobItems, MaxBody: g.MaxJobBodySize, MaxElement: sc.settings.MaxBodySize}
}
