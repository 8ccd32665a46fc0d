package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// Idempotency-Key records (docs/durability.md, "Idempotency-Key replay";
// draft-ietf-httpapi-idempotency-key-header): a batch write that carries
// the header is claimed in the storage before it runs, and its answer is
// stored there before the client gets it, so that the same request
// again, on this instance or any other sharing the storage, is answered
// with it and sends nothing upstream.

// The states of a record.
const (
	StateInFlight = "in_flight"
	StateDone     = "done"
)

// Record is an Idempotency-Key record as stored, JSON under
// IdempotencyPrefix. It holds no credentials and not the client's key:
// only hashes of them, in its name.
type Record struct {
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
	Answer     *Answer `json:"answer,omitempty"`
	AnswerSize int     `json:"answer_size,omitempty"`
}

// Answer is an answer as the client got it.
type Answer struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// expired reports whether the record no longer counts: its time is up,
// unless it is a batch still running under a live lease.
func (rec *Record) expired(now time.Time) bool {
	if rec.State == StateInFlight && now.Before(rec.LeaseUntil) {
		return false
	}
	return now.After(rec.Expires)
}

// Keys claims, replays and stores keyed batch writes in one storage.
type Keys struct{ leased }

// NewKeys keeps Idempotency-Key records in storage, claims held under
// leases; logger hears of renewals that fail.
func NewKeys(storage Storage, leases *Leases, logger *zap.Logger) *Keys {
	return &Keys{leased{storage, leases, logger}}
}

// Claim is a keyed batch write about to run.
type Claim struct {
	// Record and Lock are the record's storage key and lock
	// (IdempotencyRecord).
	Record, Lock string
	// Fingerprint tells this request from another with the same key.
	Fingerprint string
	// Resource and Op go into the record, for an operator reading it.
	Resource, Op string
	// Wait bounds the wait for another request with the same key that is
	// being checked right now.
	Wait time.Duration
	// TTL is how long the record is kept (idempotency_ttl).
	TTL time.Duration
	// MaxRun bounds how long the claim is renewed: a batch that never
	// answers must not hold its key forever.
	MaxRun time.Duration
}

// Verdict is what a claim found.
type Verdict int

const (
	// Proceed: the key is this batch's; run it (Decision.Held).
	Proceed Verdict = iota
	// Replay: the batch ran and its answer is kept (Decision.Record).
	Replay
	// InFlight: a request with the key is running, or being checked.
	InFlight
	// Mismatch: the key was used for another request (fingerprint).
	Mismatch
	// NotKept: the batch ran, but its answer was too large to keep
	// (Decision.Record has its outcome and size).
	NotKept
	// Abandoned: the gateway that ran the key's batch stopped before it
	// answered (its claim's lease lapsed).
	Abandoned
	// Unavailable: the storage failed (Decision.Err); nothing was claimed.
	Unavailable
	// Started: a job's start with the key was answered (Decision.Record);
	// only ClaimStart says it, and StartVerdict, once the start's body
	// was read, tells a replay from another request (jobstartkey.go).
	Started
)

// Decision is a claim's verdict, with what goes with it.
type Decision struct {
	Verdict Verdict
	Held    *Held
	Record  *Record
	Err     error
}

// Claim looks the key up and, if it is new (or its record expired),
// claims it for this batch. The error is set only when ctx ended while
// the claim waited for the key's lock: the client is gone.
func (k *Keys) Claim(ctx context.Context, c Claim) (Decision, error) {
	if gs, ok := k.storage.(GuardedStorer); ok {
		if d, done, err := k.claimAtOnce(ctx, gs, c); done {
			return d, err
		}
	}
	return k.claimLocked(ctx, c)
}

// claimLocked is Claim under the record's storage lock: the check and
// the claim in several calls, which no other claim or sweep comes
// between.
func (k *Keys) claimLocked(ctx context.Context, c Claim) (Decision, error) {
	lockCtx, cancel := context.WithTimeout(ctx, c.Wait)
	unlock, err := Lock(lockCtx, k.storage, c.Lock, LockPoll, func(err error) {
		k.logger.Error("releasing a storage lock", zap.String("lock", c.Lock), zap.Error(err))
	})
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return Decision{}, err
	case errors.Is(err, itemlock.ErrLocked):
		return Decision{Verdict: InFlight}, nil
	case err != nil:
		return Decision{Verdict: Unavailable, Err: err}, nil
	}
	defer unlock()

	at := now()
	rec, err := loadRecord(ctx, k.storage, c.Record)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Decision{Verdict: Unavailable, Err: err}, nil
	}
	if rec != nil && !rec.expired(at) {
		return Decision{Verdict: verdictOf(rec, c.Fingerprint, at), Record: rec}, nil
	}
	claimed := k.newClaim(c, at)
	if err := storeIndexed(ctx, k.storage, c.Record, claimed, c.TTL); err != nil {
		return Decision{Verdict: Unavailable, Err: err}, nil
	}
	wrote, _ := json.Marshal(claimed)
	return Decision{Verdict: Proceed, Held: k.hold(c, claimed, wrote, at)}, nil
}

// newClaim is the record of c claimed at at.
func (k *Keys) newClaim(c Claim, at time.Time) *Record {
	return &Record{
		Version:     1,
		State:       StateInFlight,
		Fingerprint: c.Fingerprint,
		Resource:    c.Resource,
		Op:          c.Op,
		Owner:       Owner(),
		LeaseUntil:  at.Add(k.leases.Length),
		Created:     at,
		Expires:     at.Add(c.TTL),
	}
}

// hold is the claim of c, stored at at as wrote, its lease renewed from
// now on.
func (k *Keys) hold(c Claim, claimed *Record, wrote []byte, at time.Time) *Held {
	held := &Held{keys: k, key: c.Record, record: claimed, lease: newHolder(k.leases.Length), wrote: wrote}
	held.lease.prove(at)
	held.release = k.leases.Hold(held.renew, c.MaxRun)
	return held
}

// verdictOf is what a live record says of a request with fingerprint.
func verdictOf(rec *Record, fingerprint string, now time.Time) Verdict {
	switch {
	case rec.Fingerprint != fingerprint:
		return Mismatch
	case rec.State == StateDone && rec.Answer != nil && rec.AnswerSize == 0:
		return Replay
	case rec.State == StateDone:
		return NotKept
	case now.Before(rec.LeaseUntil):
		return InFlight
	default:
		return Abandoned
	}
}

// Held is a claimed key, its lease renewed until the batch answers. Its
// lease is fenced as a saga's is (docs/durability.md, "A saga never
// writes after it lost its lease"): a renewal writes only over the
// record this process last wrote, so that a claim a recovery settled
// meanwhile is never turned back into one in flight.
type Held struct {
	keys    *Keys
	key     string
	record  *Record
	release func()
	lease   *holder

	mu    sync.Mutex
	wrote []byte // the record as this process last stored it
	// maybe is what a store after it wrote that answered an error,
	// which may have landed (a reply lost): this process's own too; nil
	// when none is in doubt.
	maybe []byte
}

// Key is the record's storage key.
func (h *Held) Key() string { return h.key }

// Lost reports whether the claim is lost: another instance settled or
// claimed the key, or the claim lapsed by this process's clock.
func (h *Held) Lost() bool { return h.lease.lostErr() != nil }

// renew renews the claim's lease: the claimed record again, with a
// later LeaseUntil, written only over what this process last wrote.
func (h *Held) renew() {
	if h.Lost() {
		return
	}
	start := now()
	rec := *h.record
	rec.LeaseUntil = start.Add(h.keys.leases.Length)
	next, _ := json.Marshal(&rec)
	ctx, cancel := context.WithTimeout(context.Background(), h.keys.leases.Length/3)
	defer cancel()
	if err := h.storeOver(ctx, nil, next); err != nil {
		var lost *lostLease
		if errors.As(err, &lost) {
			h.lease.lose(lost.why)
		}
		h.keys.logger.Warn("renewing an idempotency claim", zap.String("record", h.key), zap.Error(err))
		return
	}
	h.lease.prove(start)
}

// storeOver stores entry (if any; an expiry entry, filed first) and
// next as the record, if the record is still what this process last
// wrote (or what a store since wrote that answered an error); a
// *lostLease if it is not.
func (h *Held) storeOver(ctx context.Context, entry *KeyValue, next []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := overOwn(h.wrote, h.maybe, func(was []byte) error { return h.storeOverFrom(ctx, was, entry, next) })
	switch _, lost := errors.AsType[*lostLease](err); {
	case err == nil:
		h.wrote, h.maybe = next, nil
	case !lost:
		h.maybe = next
	}
	return err
}

// storeOverFrom is storeOver of next where the record holds was. h.mu is
// held.
func (h *Held) storeOverFrom(ctx context.Context, was []byte, entry *KeyValue, next []byte) error {
	if gs, ok := h.keys.storage.(GuardedStorer); ok {
		if done, err := h.storeOverAtOnce(ctx, gs, was, entry, next); done {
			return err
		}
	}
	if entry != nil {
		if err := h.keys.storage.Store(ctx, entry.Key, entry.Value); err != nil {
			return fmt.Errorf("indexing %s under its expiry: %w", h.key, err)
		}
	}
	if err := h.holdsOwn(ctx, was); err != nil {
		return err
	}
	return h.keys.storage.Store(ctx, h.key, next)
}

// holdsOwn returns nil while the record still holds was, this process's
// own; a *lostLease once it is gone or another instance's.
func (h *Held) holdsOwn(ctx context.Context, was []byte) error {
	b, err := h.keys.storage.Load(ctx, h.key)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &lostLease{why: "the key's record is gone from storage"}
	case err != nil:
		return err
	case !bytes.Equal(b, was):
		return &lostLease{"another instance settled or claimed the key", true}
	}
	return nil
}

// FencedByClaim is journal (nil: none), a batch's that is no saga
// (partial: it journals nothing), whose writes stand on the claim held as a saga's
// stand on its lease (docs/durability.md, "A saga never writes after it
// lost its lease"): none leaves once the claim is lost, or while it is
// not proven with a sixth of it to spare, since a retry of the batch may
// be running it by then.
func FencedByClaim(journal batch.Journal, held *Held) batch.Journal {
	if journal == nil {
		journal = batch.NoJournal{}
	}
	return claimFenced{Journal: journal, claim: held.lease}
}

type claimFenced struct {
	batch.Journal
	claim *holder
}

func (c claimFenced) Fence(ctx context.Context) error {
	if err := c.claim.fence(ctx); err != nil {
		return err
	}
	return c.Journal.Fence(ctx)
}

// Release stops renewing the claim, which lapses: the key is then
// abandoned, as when the gateway stops mid-batch.
func (h *Held) Release() { h.release() }

// GiveBack deletes the claim: the batch sent nothing, and running it
// again is what its client was told to do. Only its own: a record a
// recovery settled meanwhile, or another instance claimed once this
// claim lapsed, is theirs, and stays (deleting it would let a retry run
// a batch that has run, or runs). The lease is proven first, while it
// is still renewed, so that the record cannot change hands between the
// read that finds it this claim's and the delete.
func (h *Held) GiveBack(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	err := h.lease.fence(ctx)
	h.release()
	if _, lost := errors.AsType[*batch.LeaseLost](err); lost {
		return nil
	}
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	err = overOwn(h.wrote, h.maybe, func(was []byte) error {
		if err := h.holdsOwn(ctx, was); err != nil {
			return err
		}
		return h.keys.storage.Delete(ctx, h.key)
	})
	if _, lost := errors.AsType[*lostLease](err); lost {
		return nil // gone, or another's: nothing of this claim's to give back
	}
	return err
}

// Answered stores the batch's answer for replay, for ttl; an answer whose
// body is larger than limit is kept without it. If it fails, the client
// still gets its answer; a retry finds the claim, whose lease lapses,
// and is told the answer was not kept.
//
// A claim that is lost is not written over: whoever ended the saga
// settles the key (ErrClaimLost).
func (h *Held) Answered(ctx context.Context, a *Answer, outcome string, ttl time.Duration, limit int64) error {
	h.release()
	if h.Lost() {
		return ErrClaimLost
	}
	return h.storeAnswer(ctx, a, outcome, ttl, limit)
}

// AnsweredLater stores, in the background, an answer that Answered could
// not store (the storage failed), once a second until it is stored,
// another instance settled the key, or a lease passed: a retry in the
// meantime is told the answer was not recorded (in flight, then
// abandoned), never given another.
func (h *Held) AnsweredLater(a *Answer, outcome string, ttl time.Duration, limit int64) {
	go func() {
		for range max(int(h.keys.leases.Length/time.Second), 3) {
			time.Sleep(time.Second)
			err := h.storeAnswer(context.Background(), a, outcome, ttl, limit)
			if err == nil || errors.Is(err, ErrClaimLost) {
				return
			}
		}
		h.keys.logger.Warn("the answer of a keyed batch could not be stored for replay; a retry with its key is told so", zap.String("record", h.key))
	}()
}

// storeAnswer stores the batch's answer over the claim, where the claim
// is still this process's.
func (h *Held) storeAnswer(ctx context.Context, a *Answer, outcome string, ttl time.Duration, limit int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	return h.storeDone(ctx, h.keys.answered(h.record, a, outcome, ttl, limit), ttl)
}

// storeDone stores done, the claim answered, over the claim where it is
// still this process's, filed under its expiry in buckets for ttl.
func (h *Held) storeDone(ctx context.Context, done *Record, ttl time.Duration) error {
	b, err := json.Marshal(done)
	if err != nil {
		return err
	}
	entry := expiryWrite(h.key, done.sweepsAfter(), bucketWidth(ttl))
	err = h.storeOver(ctx, &entry, b)
	if _, lost := errors.AsType[*lostLease](err); lost {
		return ErrClaimLost
	}
	return err
}

// ErrClaimLost is the answer of a claim that another instance settled
// or claimed meanwhile: its answer is not recorded.
var ErrClaimLost = errors.New("the Idempotency-Key's claim was lost to another instance, which settles the key")

// answered is a claimed record done: the batch's answer kept for replay
// for ttl.
func (k *Keys) answered(claimed *Record, a *Answer, outcome string, ttl time.Duration, limit int64) *Record {
	done := *claimed
	done.State, done.Owner, done.LeaseUntil = StateDone, "", time.Time{}
	done.Expires = now().Add(ttl)
	done.Outcome = outcome
	done.Answer = a
	if int64(len(a.Body)) > limit {
		kept := *a
		kept.Body = nil
		done.Answer, done.AnswerSize = &kept, len(a.Body)
	}
	return &done
}

// SettleRecovered keeps, for replay, the answer of a saga that began at
// began and that a recovery finished, when its record (key) is still in
// flight: the client whose gateway died never got an answer, and its
// retry with the same Idempotency-Key must get this one (rolled_back,
// or rollback_failed), not run the batch again. A key with no in-flight
// record (the saga's client sent none, or it is settled) is left alone,
// and so is one claimed after the saga began: the key expired and
// another batch claimed it anew, whose answer this is not.
func (k *Keys) SettleRecovered(ctx context.Context, key string, began time.Time, a *Answer, outcome string, ttl time.Duration, limit int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	claimed, err := loadRecord(ctx, k.storage, key)
	if err != nil || claimed == nil || claimed.State != StateInFlight || !began.IsZero() && claimed.Created.After(began) {
		return nil
	}
	return storeIndexed(ctx, k.storage, key, k.answered(claimed, a, outcome, ttl, limit), ttl)
}

// loadRecord reads a record for a claim: a garbled one is treated as
// absent, and claimed over, rather than blocking its key until someone
// deletes it; a newer build's is an error (errNewerRecord), never
// claimed over: its batch may be running on an instance already
// upgraded, and a claim here would run it twice.
func loadRecord(ctx context.Context, s Storage, key string) (*Record, error) {
	rec, err := readRecord(ctx, s, key)
	if errors.Is(err, errUnreadable) && !errors.Is(err, errNewerRecord) {
		return nil, nil
	}
	return rec, err
}

// errUnreadable marks a record this build cannot read: garbled, or of
// another version (a newer build's, in a cluster being upgraded:
// errNewerRecord too).
var errUnreadable = errors.New("not a record this gateway reads")

// errNewerRecord marks a record of a version newer than this build's.
var errNewerRecord = fmt.Errorf("%w: a newer gateway's (every instance of the cluster must be upgraded before this key can be used here)", errUnreadable)

func readRecord(ctx context.Context, s Storage, key string) (*Record, error) {
	raw, err := s.Load(ctx, key)
	if err != nil {
		return nil, err
	}
	rec, err := parseRecord(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return rec, nil
}

// parseRecord is the record raw holds, if this build reads it:
// errUnreadable where it is garbled (or nil), errNewerRecord where it
// is of a newer version.
func parseRecord(raw []byte) (*Record, error) {
	var rec Record
	switch err := json.Unmarshal(raw, &rec); {
	case err == nil && rec.Version > 1:
		return nil, errNewerRecord
	case err != nil || rec.Version != 1:
		return nil, errUnreadable
	}
	return &rec, nil
}

// storeIndexed writes a record whose expiry is new, filed under it
// first (expiry.go), in buckets for ttl.
func storeIndexed(ctx context.Context, s Storage, key string, rec *Record, ttl time.Duration) error {
	if err := fileExpiry(ctx, s, key, rec.sweepsAfter(), bucketWidth(ttl)); err != nil {
		return err
	}
	return storeRecord(ctx, s, key, rec)
}

func storeRecord(ctx context.Context, s Storage, key string, rec *Record) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.Store(ctx, key, raw)
}
