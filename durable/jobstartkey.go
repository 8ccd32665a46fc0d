package durable

import (
	"context"
	"math"
	"path"
	"time"
)

// A job's start that carries an Idempotency-Key (docs/jobs.md, "Start")
// is claimed as a keyed batch write is (records.go), with one difference:
// a start's body is a stream of up to max_job_body_size, read once, as it
// is stored, so its fingerprint is known only once the body was read.
// The claim is therefore made before the body is read with no
// fingerprint, and the answered record carries it:
//
//   - a claim that finds the key's start still reading its body (or
//     registering its job) is InFlight, whatever its body;
//   - one that finds the start answered is Started: the caller reads its
//     own body, fingerprints it, and StartVerdict tells a replay from
//     another request.

// JobStartRecord names the Idempotency-Key record of a job's start, and
// its storage lock, from what scopes it: the client's key as sent, the
// client's identity (the hash a job is kept under, which counts
// scope_query values too), the resource's template, the collection's
// path and the operation. Its name is hashed apart from a synchronous
// batch's (IdempotencyRecord), so that a key never stands for a batch
// and a job at once; it lives among them, and is swept with them.
func JobStartRecord(key, client, resource, collection, op string) (storageKey, lockName string) {
	name := HashFields("batch job start v1", key, client, resource, collection, op)
	storageKey = path.Join(IdempotencyPrefix, name)
	return storageKey, IdempotencyLock(storageKey)
}

// ClaimStart looks the key of a job's start up and, if it is new (or its
// record expired), claims it, with no fingerprint yet: StartAnswered
// gives it one. A live record of another start in flight is InFlight, or
// Abandoned once its lease lapsed; an answered one is Started; any other
// (a key claimed by something else than a job's start) is Mismatch. As
// Claim, the error is set only when ctx ended while the claim waited.
func (k *Keys) ClaimStart(ctx context.Context, c Claim) (Decision, error) {
	c.Fingerprint = ""
	d, err := k.Claim(ctx, c)
	if err == nil && d.Verdict == Mismatch && d.Record.State == StateDone && d.Record.Answer != nil && d.Record.AnswerSize == 0 {
		d.Verdict = Started
	}
	return d, err
}

// StartVerdict is what an answered start's record says of a start whose
// fingerprint, its body read, is fingerprint: Replay when it is the same
// request, Mismatch otherwise.
func StartVerdict(rec *Record, fingerprint string) Verdict {
	if fingerprint != "" && rec.Fingerprint == fingerprint {
		return Replay
	}
	return Mismatch
}

// StartAnswered keeps a's answer to a job's start, whose fingerprint is
// fingerprint, for replay, for ttl: the whole answer, whatever its size
// (a status and a token). As Answered, a claim that is lost is not
// written over (ErrClaimLost); if the storage fails the claim is left to
// lapse, and a retry is told the answer was not recorded.
func (h *Held) StartAnswered(ctx context.Context, fingerprint string, a *Answer, ttl time.Duration) error {
	h.release()
	if h.Lost() {
		return ErrClaimLost
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	done := h.keys.answered(h.record, a, startOutcome, ttl, math.MaxInt64)
	done.Fingerprint = fingerprint
	return h.storeDone(ctx, done, ttl)
}

// startOutcome is the outcome an answered start's record names, for an
// operator reading the storage: the job's own is in its status.
const startOutcome = "job_started"
