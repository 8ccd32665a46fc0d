package caddymodule

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Idempotency-Key replay (docs/durability.md, "Idempotency-Key replay")
// is durable's; what the gateway adds is the HTTP: the decision of a
// claim as an answer (a replay, or a problem), and the answer to store.

// idempotency claims, replays and stores keyed batch writes in one
// storage. A nil *idempotency (no storage) records nothing.
type idempotency struct {
	keys   *durable.Keys
	logger *zap.Logger
}

// answerSlack is what a batch answer may hold beyond max_response_size,
// which bounds its items, and still be kept: the answer's own members around them.
const answerSlack = 64 << 10

func newIdempotency(storage certmagic.Storage, leases *durable.Leases, logger *zap.Logger) *idempotency {
	if storage == nil {
		return nil
	}
	return &idempotency{keys: durable.NewKeys(batchapp.DurableStorage(storage), leases, logger), logger: logger}
}

// keyedBatch is one batch write that carries an Idempotency-Key, from
// before its body is read to its answer.
type keyedBatch struct {
	idem     *idempotency
	r        *http.Request
	sc       scope
	op       policy.Op
	key      string // the record's storage key
	lockName string // the storage lock around its check and claim
	body     string // the digest of the body the batch read
	held     *durable.Held
}

// watch starts following a batch that writes (an envelope with a write
// among its operations) and carries an Idempotency-Key; it returns nil
// for anything else.
func (i *idempotency) watch(r *http.Request, sc scope, plan *batch.Plan) *keyedBatch {
	if i == nil || !plan.Writes() {
		return nil
	}
	op := plan.Op
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" {
		return nil
	}
	record, lock := durable.IdempotencyRecord(key, durable.Credentials(r.Header, sc.gateway.ScopeHeaders), sc.resource, sc.collection, op.String())
	return &keyedBatch{
		idem:     i,
		r:        r,
		sc:       sc,
		op:       op,
		key:      record,
		lockName: lock,
		body:     hex.EncodeToString(plan.BodyDigest()),
	}
}

// fingerprint is the hash of what makes the request this request. A
// batch DELETE's body, which the gateway never reads, is not in it.
func (k *keyedBatch) fingerprint() string {
	return durable.HashFields(k.r.Method, k.r.URL.EscapedPath(), k.r.URL.RawQuery, k.body)
}

// claim looks the key up and, if it is new (or its record expired),
// claims it for this batch. done reports that the request was answered
// instead: a replay, a 409 or a 422 (or a 503 when the storage fails).
// A nil k claims nothing.
func (k *keyedBatch) claim(w http.ResponseWriter, items int) (done bool, err error) {
	if k == nil {
		return false, nil
	}
	s := k.sc.settings
	d, err := k.idem.keys.Claim(k.r.Context(), durable.Claim{
		Record:      k.key,
		Lock:        k.lockName,
		Fingerprint: k.fingerprint(),
		Resource:    k.sc.resource,
		Op:          k.op.String(),
		// The claim is short, but it waits at most item_timeout for
		// another request with the same key that is being checked
		// right now.
		Wait:   s.ItemTimeout,
		TTL:    k.sc.gateway.IdempotencyTTL,
		MaxRun: maxRun(s),
	})
	if err != nil {
		return true, caddyhttp.Error(499, err)
	}
	repl, _ := k.r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	switch d.Verdict {
	case durable.Proceed:
		k.held = d.Held
		return false, nil
	case durable.Replay:
		return true, k.replay(w, repl, items, d.Record)
	case durable.Unavailable:
		k.idem.logger.Error("idempotency record unavailable", zap.String("record", k.key), zap.Error(d.Err))
	}
	prob, retryAfter := refusal(d)
	setOutcome(repl, items, "rejected")
	k.idem.logger.Debug("batch refused by its Idempotency-Key",
		zap.String("op", k.op.String()),
		zap.String("resource", k.sc.resource),
		zap.Int("status", prob.Status),
		zap.String("detail", prob.Detail))
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	return true, prob.Write(w)
}

// refusal is the problem that answers a claim that found the key taken,
// and the Retry-After that goes with it, if any.
func refusal(d durable.Decision) (problem.Details, string) {
	switch d.Verdict {
	case durable.InFlight:
		return problem.New(http.StatusConflict, "idempotency-key-in-use",
			"a request with this Idempotency-Key is still being processed; try again when it has finished"), "1"
	case durable.Mismatch:
		return problem.New(http.StatusUnprocessableEntity, "idempotency-key-reused",
			"this Idempotency-Key was already used for another request (another method, path, query or body); use a new key for a new request"), ""
	case durable.NotKept:
		return problem.New(http.StatusConflict, "idempotency-answer-not-kept", fmt.Sprintf(
			"the batch with this Idempotency-Key has finished (outcome %s), but its answer (%d bytes) was larger than max_response_size and was not kept; nothing was sent again",
			d.Record.Outcome, d.Record.AnswerSize)), ""
	case durable.Abandoned:
		return problem.New(http.StatusConflict, "idempotency-key-abandoned",
			"the answer to the request with this Idempotency-Key was never recorded: the gateway that ran it stopped, or its storage failed as it answered; an all-or-nothing batch is finished from its journal, but an answer not recorded cannot be replayed: read the items, and send a new request with a new key"), ""
	default:
		return problem.New(http.StatusServiceUnavailable, "idempotency-unavailable",
			"the gateway could not read or claim this Idempotency-Key in its storage; nothing was sent, try again"), "1"
	}
}

// maxRun bounds how long a batch can run, compensations included, with
// a minute to spare: past it the claim stops being renewed, even if the
// batch never answered.
func maxRun(s policy.Settings) time.Duration {
	return s.BatchTimeout + batch.CompensationBudget(s) + time.Minute
}

// replay answers with a finished batch's stored answer.
func (k *keyedBatch) replay(w http.ResponseWriter, repl *caddy.Replacer, items int, rec *durable.Record) error {
	setOutcome(repl, items, "replayed")
	telemetry.Metrics.Replays.WithLabelValues(serverName(k.r), k.sc.resource, k.op.String()).Inc()
	k.idem.logger.Info("batch replayed",
		zap.String("op", k.op.String()),
		zap.String("resource", k.sc.resource),
		zap.Int("status", rec.Answer.Status),
		zap.String("outcome", rec.Outcome))
	w.Header().Set("Idempotent-Replayed", "true")
	return rec.Answer.Write(w)
}

// write answers the client with the batch's result. For a keyed batch
// the answer is stored first, so that any retry the client makes once
// it has the answer is replayed; a batch the gateway refused before it
// sent anything (every item not attempted: its items were locked, say)
// gives its key back instead, since running it again is what the client
// was told to do.
func (k *keyedBatch) write(w http.ResponseWriter, res *batch.Result) error {
	if k == nil || k.held == nil {
		return res.Write(w)
	}
	rec := durable.NewAnswerRecorder()
	if err := res.Write(rec); err != nil {
		k.held.Release()
		return err
	}
	if nothingSent(res) {
		if err := k.held.GiveBack(k.r.Context()); err != nil {
			k.idem.logger.Error("releasing an Idempotency-Key", zap.String("record", k.key), zap.Error(err))
		}
		return rec.Answer().Write(w)
	}
	if res.LeaseLost && !res.Orphaned {
		// Whoever ends the saga settles the key (docs/durability.md, "A saga never writes after it lost its lease"):
		// this answer is not the saga's end, and must not replay as it.
		// An orphaned saga's is: nobody else will end it.
		k.held.Release()
		return rec.Answer().Write(w)
	}
	ttl, limit := k.sc.gateway.IdempotencyTTL, k.sc.settings.MaxResponseSize+answerSlack
	switch err := k.held.Answered(k.r.Context(), rec.Answer(), string(res.Outcome), ttl, limit); {
	case errors.Is(err, durable.ErrClaimLost):
		k.idem.logger.Warn("a batch's Idempotency-Key was settled by another instance; its answer is not stored", zap.String("record", k.key))
	case err != nil:
		// The client still gets its answer; it is stored later if the
		// storage comes back, and meanwhile a retry is told that it
		// was not recorded.
		k.idem.logger.Error("storing a batch answer for replay; trying again in the background", zap.String("record", k.key), zap.Error(err))
		k.held.AnsweredLater(rec.Answer(), string(res.Outcome), ttl, limit)
	}
	return rec.Answer().Write(w)
}

// nothingSent reports whether the batch ended before any item started.
func nothingSent(res *batch.Result) bool {
	for _, it := range res.Items {
		if it.Outcome != batch.NotAttempted {
			return false
		}
	}
	return true
}

// settleRecovered keeps, for replay, the answer of a saga that a recovery
// finished (durable.Keys.SettleRecovered). The record is found as the
// batch claimed it: by the client's key, credentials, resource and
// operation, all in the saga's snapshot.
func (i *idempotency) settleRecovered(ctx context.Context, sc scope, snap *batch.Snapshot, began time.Time, res *batch.Result) {
	if i == nil {
		return
	}
	key := snap.Key
	if snap.KeyQuoted {
		key = `"` + key + `"`
	}
	recordKey, _ := durable.IdempotencyRecord(key, durable.Credentials(snap.Header, sc.gateway.ScopeHeaders),
		sc.resource, sc.collection, snap.Op)
	rec := durable.NewAnswerRecorder()
	if err := res.Write(rec); err != nil {
		return
	}
	if err := i.keys.SettleRecovered(ctx, recordKey, began, rec.Answer(), string(res.Outcome), sc.gateway.IdempotencyTTL, sc.settings.MaxResponseSize+answerSlack); err != nil {
		i.logger.Error("storing a recovered batch's answer for replay", zap.String("record", recordKey), zap.Error(err))
	}
}

// configStorage returns the config's storage, or nil from a context
// made without a config (caddy.NewContext alone), whose Storage panics.
func configStorage(ctx caddy.Context) (s certmagic.Storage) {
	defer func() {
		if recover() != nil {
			s = nil
		}
	}()
	return ctx.Storage()
}
