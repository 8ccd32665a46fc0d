package caddymodule

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/policy"
	"github.com/caddy-batch/caddy-batch/problem"
)

// Idempotency-Key replay (docs/durability.md, "Idempotency-Key replay";
// draft-ietf-httpapi-idempotency-key-header). A batch write that carries the header is
// claimed in Caddy's storage before it runs, and its answer is stored
// there before the client gets it, so that the same request again — on
// this instance or any other sharing the storage — is answered with it
// and sends nothing upstream.

// The states of a record.
const (
	idemInFlight = "in_flight"
	idemDone     = "done"
)

// idemRecord is a record as stored, JSON under durable.IdempotencyPrefix. It
// holds no credentials and not the client's key: only hashes of them, in
// its name.
type idemRecord struct {
	Version int `json:"v"`
	// State is in_flight while the batch runs, done once it answered.
	State string `json:"state"`
	// Fingerprint is the hash of the request's method, path, query and
	// body: the same key with another fingerprint is another request.
	Fingerprint string `json:"fingerprint"`
	// Resource and Op say what the record is about, for an operator
	// reading the storage.
	Resource string `json:"resource"`
	Op       string `json:"op"`
	// Owner is the process running the batch, and LeaseUntil how long
	// its claim stands without being renewed: an in-flight record whose
	// lease lapsed was left by a gateway that stopped mid-batch.
	Owner      string    `json:"owner,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	Created    time.Time `json:"created"`
	// Expires is when the record may be swept: idempotency_ttl after the
	// claim, and again after the answer.
	Expires time.Time `json:"expires"`
	// Outcome is the batch's outcome, once done.
	Outcome string `json:"outcome,omitempty"`
	// Answer is what the client got, once done; its body is left out when
	// it was larger than the limit (AnswerSize says how large).
	Answer     *idemAnswer `json:"answer,omitempty"`
	AnswerSize int         `json:"answer_size,omitempty"`
}

// idemAnswer is an answer as the client got it.
type idemAnswer struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// expired reports whether the record no longer counts: its time is up,
// unless it is a batch still running under a live lease.
func (rec *idemRecord) expired(now time.Time) bool {
	if rec.State == idemInFlight && now.Before(rec.LeaseUntil) {
		return false
	}
	return now.After(rec.Expires)
}

// idempotency claims, replays and stores keyed batch writes in one
// storage. A nil *idempotency (no storage) records nothing.
type idempotency struct {
	storage certmagic.Storage
	logger  *zap.Logger
	owner   string
	now     func() time.Time
	// lease is how long a claim stands unless renewed; it is renewed
	// every lease/3 while the batch runs.
	lease time.Duration
	// poll is the wait between two tries of a held storage lock.
	poll time.Duration
}

// idemLease is long enough that a slow storage write does not let a
// running batch's claim lapse, and short enough that a dead gateway's
// claim is seen as such within a minute.
const idemLease = 30 * time.Second

// answerSlack is what a batch answer may hold beyond max_response_size,
// which bounds its items, and still be kept: the envelope around them.
const answerSlack = 64 << 10

func newIdempotency(storage certmagic.Storage, logger *zap.Logger) *idempotency {
	if storage == nil {
		return nil
	}
	return &idempotency{
		storage: storage,
		logger:  logger,
		owner:   durable.Owner(),
		now:     time.Now,
		lease:   idemLease,
		poll:    durable.LockPoll,
	}
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
	record   *idemRecord
	stop     func() // stops renewing the claim's lease
}

// watch starts following a batch write that carries an Idempotency-Key;
// it returns nil for anything else. body is the digest of the body the
// batch read (Plan.BodyDigest).
func (i *idempotency) watch(r *http.Request, sc scope, op policy.Op, body []byte) *keyedBatch {
	if i == nil || !op.Writes() {
		return nil
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" {
		return nil
	}
	record, lock := durable.IdempotencyRecord(key, durable.Credentials(r.Header), sc.resource, sc.collection, op.String())
	k := &keyedBatch{
		idem:     i,
		r:        r,
		sc:       sc,
		op:       op,
		key:      record,
		lockName: lock,
		body:     hex.EncodeToString(body),
	}
	return k
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
	i, r, s := k.idem, k.r, k.sc.settings
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	refuse := func(d problem.Details, retryAfter string) (bool, error) {
		setOutcome(repl, items, "rejected")
		i.logger.Debug("batch refused by its Idempotency-Key",
			zap.String("op", k.op.String()),
			zap.String("resource", k.sc.resource),
			zap.Int("status", d.Status),
			zap.String("detail", d.Detail))
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		return true, d.Write(w)
	}
	unavailable := func(err error) (bool, error) {
		i.logger.Error("idempotency record unavailable", zap.String("record", k.key), zap.Error(err))
		return refuse(problem.New(http.StatusServiceUnavailable, "idempotency-unavailable",
			"the gateway could not read or claim this Idempotency-Key in its storage; nothing was sent, try again"), "1")
	}

	// The claim is short, but it waits at most item_timeout for another
	// request with the same key that is being checked right now.
	lockCtx, cancel := context.WithTimeout(r.Context(), s.ItemTimeout)
	unlock, err := durable.Lock(lockCtx, i.storage, k.lockName, i.poll, unlockFailed(i.logger, k.lockName))
	cancel()
	switch {
	case err != nil && r.Context().Err() != nil:
		return true, caddyhttp.Error(499, err)
	case errors.Is(err, batch.ErrLocked):
		return refuse(keyInFlight(), "1")
	case err != nil:
		return unavailable(err)
	}
	defer unlock()

	ctx := r.Context()
	now := i.now()
	fp := k.fingerprint()
	rec, err := loadIdemRecord(ctx, i.storage, k.key)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return unavailable(err)
	}
	if rec != nil && !rec.expired(now) {
		switch {
		case rec.Fingerprint != fp:
			return refuse(problem.New(http.StatusUnprocessableEntity, "idempotency-key-reused",
				"this Idempotency-Key was already used for another request (another method, path, query or body); use a new key for a new request"), "")
		case rec.State == idemDone && rec.Answer != nil && rec.AnswerSize == 0:
			return true, k.replay(w, repl, items, rec)
		case rec.State == idemDone:
			return refuse(problem.New(http.StatusConflict, "idempotency-answer-not-kept", fmt.Sprintf(
				"the batch with this Idempotency-Key has finished (outcome %s), but its answer (%d bytes) was larger than max_response_size and was not kept; nothing was sent again",
				rec.Outcome, rec.AnswerSize)), "")
		case now.Before(rec.LeaseUntil):
			return refuse(keyInFlight(), "1")
		default:
			return refuse(problem.New(http.StatusConflict, "idempotency-key-abandoned",
				"the gateway that ran the request with this Idempotency-Key stopped before it answered; an all-or-nothing batch is finished from its journal, but its answer was never kept and cannot be replayed: read the items, and send a new request with a new key"), "")
		}
	}

	k.record = &idemRecord{
		Version:     1,
		State:       idemInFlight,
		Fingerprint: fp,
		Resource:    k.sc.resource,
		Op:          k.op.String(),
		Owner:       i.owner,
		LeaseUntil:  now.Add(i.lease),
		Created:     now,
		Expires:     now.Add(k.sc.gateway.IdempotencyTTL),
	}
	if err := storeIdemRecord(ctx, i.storage, k.key, k.record); err != nil {
		k.record = nil
		return unavailable(err)
	}
	k.stop = k.renew(maxRun(s))
	return false, nil
}

func keyInFlight() problem.Details {
	return problem.New(http.StatusConflict, "idempotency-key-in-use",
		"a request with this Idempotency-Key is still being processed; try again when it has finished")
}

// maxRun bounds how long a batch can run, compensations included: past
// it the claim stops being renewed, even if the batch never answered.
func maxRun(s policy.Settings) time.Duration {
	attempts := time.Duration(s.CompensationRetries + 1)
	return s.BatchTimeout + attempts*(s.CompensationTimeout+2*time.Second) + time.Minute
}

// renew keeps the claim's lease alive until stop is called, for at most
// max. stop waits until no renewal is being written.
func (k *keyedBatch) renew(max time.Duration) (stop func()) {
	quit := make(chan struct{})
	finished := make(chan struct{})
	rec := *k.record
	go func() {
		defer close(finished)
		tick := time.NewTicker(k.idem.lease / 3)
		defer tick.Stop()
		deadline := time.After(max)
		for {
			select {
			case <-quit:
				return
			case <-deadline:
				return
			case <-tick.C:
			}
			rec.LeaseUntil = k.idem.now().Add(k.idem.lease)
			ctx, cancel := context.WithTimeout(context.Background(), k.idem.lease/3)
			if err := storeIdemRecord(ctx, k.idem.storage, k.key, &rec); err != nil {
				k.idem.logger.Warn("renewing an idempotency claim", zap.String("record", k.key), zap.Error(err))
			}
			cancel()
		}
	}()
	return sync.OnceFunc(func() {
		close(quit)
		<-finished
	})
}

// replay answers with a finished batch's stored answer.
func (k *keyedBatch) replay(w http.ResponseWriter, repl *caddy.Replacer, items int, rec *idemRecord) error {
	setOutcome(repl, items, "replayed")
	metrics.replays.WithLabelValues(serverName(k.r), k.sc.resource, k.op.String()).Inc()
	k.idem.logger.Info("batch replayed",
		zap.String("op", k.op.String()),
		zap.String("resource", k.sc.resource),
		zap.Int("status", rec.Answer.Status),
		zap.String("outcome", rec.Outcome))
	w.Header().Set("Idempotent-Replayed", "true")
	return rec.Answer.write(w)
}

// write answers the client with the batch's result. For a keyed batch
// the answer is stored first, so that any retry the client makes once
// it has the answer is replayed; a batch the gateway refused before it
// sent anything (every item not attempted: its items were locked, say)
// gives its key back instead, since running it again is what the client
// was told to do.
func (k *keyedBatch) write(w http.ResponseWriter, res *batch.Result) error {
	if k == nil || k.record == nil {
		return res.Write(w)
	}
	k.stop()
	rec := &answerRecorder{header: http.Header{}}
	if err := res.Write(rec); err != nil {
		return err
	}
	i := k.idem
	ctx, cancel := context.WithTimeout(context.WithoutCancel(k.r.Context()), storageTimeout)
	defer cancel()
	if nothingSent(res) {
		if err := i.storage.Delete(ctx, k.key); err != nil {
			i.logger.Error("releasing an Idempotency-Key", zap.String("record", k.key), zap.Error(err))
		}
		return rec.answer().write(w)
	}
	done := i.answered(k.record, k.sc, res, rec)
	if err := storeIdemRecord(ctx, i.storage, k.key, done); err != nil {
		// The client still gets its answer; a retry finds the claim,
		// whose lease lapses, and is told the answer was not kept.
		i.logger.Error("storing a batch answer for replay", zap.String("record", k.key), zap.Error(err))
	}
	return rec.answer().write(w)
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

// answered is a claimed record done: the batch's answer, as rec
// captured it, kept for replay for idempotency_ttl.
func (i *idempotency) answered(claimed *idemRecord, sc scope, res *batch.Result, rec *answerRecorder) *idemRecord {
	done := *claimed
	done.State, done.Owner, done.LeaseUntil = idemDone, "", time.Time{}
	done.Expires = i.now().Add(sc.gateway.IdempotencyTTL)
	done.Outcome = string(res.Outcome)
	done.Answer = rec.answer()
	if limit := sc.settings.MaxResponseSize + answerSlack; int64(len(done.Answer.Body)) > limit {
		kept := *done.Answer
		kept.Body = nil
		done.Answer, done.AnswerSize = &kept, rec.body.Len()
	}
	return &done
}

// settleRecovered keeps, for replay, the answer of a saga that a recovery
// finished: the client whose gateway died never got an answer, and its
// retry with the same Idempotency-Key must get this one (rolled_back, or
// rollback_failed), not run the batch again, which would have the
// upstream replay its stored answers to the items' keys. The record is
// found as the batch claimed it: by the client's key, credentials,
// resource and operation, all in the saga's snapshot.
func (i *idempotency) settleRecovered(ctx context.Context, sc scope, snap *batch.Snapshot, res *batch.Result) {
	if i == nil {
		return
	}
	key := snap.Key
	if snap.KeyQuoted {
		key = `"` + key + `"`
	}
	recordKey, _ := durable.IdempotencyRecord(key, durable.Credentials(snap.Header), sc.resource, sc.collection, snap.Op)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageTimeout)
	defer cancel()
	claimed, err := loadIdemRecord(ctx, i.storage, recordKey)
	if err != nil || claimed == nil || claimed.State != idemInFlight {
		return // no key was sent (the saga's key was made), or it is settled
	}
	rec := &answerRecorder{header: http.Header{}}
	if err := res.Write(rec); err != nil {
		return
	}
	if err := storeIdemRecord(ctx, i.storage, recordKey, i.answered(claimed, sc, res, rec)); err != nil {
		i.logger.Error("storing a recovered batch's answer for replay", zap.String("record", recordKey), zap.Error(err))
	}
}

func loadIdemRecord(ctx context.Context, s certmagic.Storage, key string) (*idemRecord, error) {
	raw, err := s.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	var rec idemRecord
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Version != 1 {
		// Unreadable: treated as absent, so it is claimed over or swept,
		// rather than blocking its key until someone deletes it.
		return nil, nil
	}
	return &rec, nil
}

func storeIdemRecord(ctx context.Context, s certmagic.Storage, key string, rec *idemRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.Store(ctx, key, raw)
}

// sweepIdempotency deletes the records that have expired, and returns
// how many it deleted. It is the recovery app's to call, periodically: a
// handler starts no background work. Each record is checked again under
// its lock before it goes, so that a key being claimed anew right now
// keeps its new record.
func sweepIdempotency(ctx context.Context, s certmagic.Storage, now time.Time) (int, error) {
	keys, err := s.List(ctx, durable.IdempotencyPrefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("listing idempotency records: %w", err)
	}
	deleted := 0
	var errs []error
	for _, key := range keys {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		gone, err := sweepRecord(ctx, s, key, now)
		if gone {
			deleted++
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return deleted, errors.Join(errs...)
}

func sweepRecord(ctx context.Context, s certmagic.Storage, key string, now time.Time) (bool, error) {
	rec, err := loadIdemRecord(ctx, s, key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading %s: %w", key, err)
	case rec != nil && !rec.expired(now):
		return false, nil
	}
	name := durable.IdempotencyLock(key)
	lockCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	unlock, err := durable.Lock(lockCtx, s, name, durable.LockPoll, nil)
	cancel()
	if errors.Is(err, batch.ErrLocked) {
		return false, nil // being claimed: the next sweep looks again
	}
	if err != nil {
		return false, fmt.Errorf("locking %s: %w", key, err)
	}
	defer unlock()
	if rec, err := loadIdemRecord(ctx, s, key); err != nil || rec != nil && !rec.expired(now) {
		return false, nil
	}
	if err := s.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("deleting %s: %w", key, err)
	}
	return true, nil
}

// answerRecorder keeps the batch's answer, so that it is stored before
// the client gets it.
type answerRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *answerRecorder) Header() http.Header { return a.header }

func (a *answerRecorder) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answerRecorder) Write(b []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(b)
}

func (a *answerRecorder) answer() *idemAnswer {
	h := a.header.Clone()
	h.Del("Content-Length") // set again from the body on every answer
	return &idemAnswer{Status: a.status, Header: h, Body: a.body.Bytes()}
}

// write sends the answer, adding its headers to those already set on w.
func (a *idemAnswer) write(w http.ResponseWriter) error {
	h := w.Header()
	for name, values := range a.Header {
		h[name] = values
	}
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	status := a.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, err := w.Write(a.Body)
	return err
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
