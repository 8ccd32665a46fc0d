package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// GuardedStorer is a storage that checks and stores in one call, at once
// (the Redis fast path): no other call comes between its checks and its
// writes. An Idempotency-Key's claim is then one call where it is five
// (lock, read, entry, record, unlock), and its answer or renewal one
// where it is three (docs/durability.md, "The Redis fast path").
type GuardedStorer interface {
	// StoreIf stores writes, in order, as Store would, if nobody holds
	// the storage lock free ("": none checked; an error wrapping
	// itemlock.ErrLocked if held) and key holds want (nil: key is absent;
	// ErrKeyGone or ErrKeyChanged if not). Whether it stored or not, it
	// answers what key held (nil: absent) when it looked. ErrUndecidable:
	// key holds a value the storage cannot compare (another instance
	// compressed or encrypted it).
	StoreIf(ctx context.Context, free, key string, want []byte, writes []KeyValue) (held []byte, err error)
}

// KeyValue is one write of a GuardedStorer.
type KeyValue struct {
	Key   string
	Value []byte
}

// expiryWrite is fileExpiry's write, for a GuardedStorer.
func expiryWrite(recordKey string, expires time.Time, width time.Duration) KeyValue {
	b, _ := json.Marshal(expiryEntry{Version: 1, Record: recordKey, Expires: expires})
	return KeyValue{expiryKey(recordKey, expires, width), b}
}

// claimAtOnce is Claim on a GuardedStorer. Instead of taking the
// record's storage lock, each call checks that nobody holds it: an
// older build's claim and a sweep still hold it around what they read
// and write, so they and this claim exclude each other as two locked
// claims do. A new key costs one call; a record found expired (or
// unreadable), one more, written only over the bytes that were read.
// done is false where the storage cannot decide (ErrUndecidable): the
// caller claims the generic way.
func (k *Keys) claimAtOnce(ctx context.Context, gs GuardedStorer, c Claim) (d Decision, done bool, err error) {
	waitCtx, cancel := context.WithTimeout(ctx, c.Wait)
	defer cancel()
	var want []byte // what the record must hold: nil, absent
	for {
		at := now()
		claimed := k.newClaim(c, at)
		raw, _ := json.Marshal(claimed)
		writes := []KeyValue{expiryWrite(c.Record, claimed.sweepsAfter(), bucketWidth(c.TTL)), {c.Record, raw}}
		held, err := gs.StoreIf(ctx, c.Lock, c.Record, want, writes)
		switch {
		case err == nil:
			return Decision{Verdict: Proceed, Held: k.hold(c, claimed, raw, at)}, true, nil
		case errors.Is(err, ErrUndecidable):
			return Decision{}, false, nil
		case errors.Is(err, itemlock.ErrLocked):
			// Being checked elsewhere, right now: wait, as Lock would.
			select {
			case <-time.After(LockPoll):
				continue
			case <-waitCtx.Done():
			}
		case errors.Is(err, ErrKeyGone), errors.Is(err, ErrKeyChanged):
			rec, perr := parseRecord(held)
			if errors.Is(perr, errNewerRecord) {
				return Decision{Verdict: Unavailable, Err: fmt.Errorf("%s: %w", c.Record, perr)}, true, nil
			}
			if rec != nil && !rec.expired(at) {
				return Decision{Verdict: verdictOf(rec, c.Fingerprint, at), Record: rec}, true, nil
			}
			want = held // absent, expired or unreadable: claimed over
			if waitCtx.Err() == nil {
				continue
			}
		default:
			return Decision{Verdict: Unavailable, Err: err}, true, nil
		}
		if ctx.Err() != nil {
			return Decision{}, true, ctx.Err()
		}
		return Decision{Verdict: InFlight}, true, nil
	}
}

// storeOverAtOnce is storeOverFrom on a GuardedStorer: entry (if any)
// and next stored in one call if the record still holds was. done is
// false where the storage cannot decide.
func (h *Held) storeOverAtOnce(ctx context.Context, gs GuardedStorer, was []byte, entry *KeyValue, next []byte) (done bool, err error) {
	writes := []KeyValue{{h.key, next}}
	if entry != nil {
		writes = []KeyValue{*entry, writes[0]}
	}
	_, err = gs.StoreIf(ctx, "", h.key, was, writes)
	switch {
	case errors.Is(err, ErrUndecidable):
		return false, nil
	case errors.Is(err, ErrKeyGone):
		return true, &lostLease{why: "the key's record is gone from storage"}
	case errors.Is(err, ErrKeyChanged):
		return true, &lostLease{"another instance settled or claimed the key", true}
	}
	return true, err
}
