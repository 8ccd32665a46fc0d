package durable

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/batch"
	"go.uber.org/zap"
)

func claimOf(fingerprint string) Claim {
	key, lock := IdempotencyRecord("k", "", "/widgets", "/widgets", "update")
	return Claim{Record: key, Lock: lock, Fingerprint: fingerprint, Resource: "/widgets", Op: "update",
		Wait: 20 * time.Millisecond, TTL: time.Hour, MaxRun: time.Minute}
}

// proceeds claims c's key, which must be new.
func proceeds(t *testing.T, keys *Keys, c Claim) Decision {
	t.Helper()
	d, err := keys.Claim(context.Background(), c)
	if err != nil || d.Verdict != Proceed {
		t.Fatalf("a new key: %v, %v", d.Verdict, err)
	}
	return d
}

func stored(t *testing.T, s Storage, key string) *Record {
	t.Helper()
	rec, err := loadRecord(context.Background(), s, key)
	if err != nil || rec == nil {
		t.Fatalf("record %s: %v", key, err)
	}
	return rec
}

// What a claim decides, in each state of the key's record: the batch
// proceeds (its claim renewed under the lease) and its answer is
// replayed; the same key for another request, while one runs, is told
// so; an answer too large is not kept; a claim whose lease lapsed is
// abandoned; a batch that sent nothing gives its key back.
func TestClaim(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		s := newMemStorage()
		keys := NewKeys(s, NewLeases(30*time.Millisecond), zap.NewNop())
		ctx := context.Background()
		c := claimOf("fp")

		d := proceeds(t, keys, c)
		first := stored(t, s, c.Record).LeaseUntil
		time.Sleep(40 * time.Millisecond)
		if rec := stored(t, s, c.Record); rec.State != StateInFlight || !rec.LeaseUntil.After(first) || rec.Owner != Owner() {
			t.Errorf("the claim was not renewed: %+v", rec)
		}
		if d, _ := keys.Claim(ctx, c); d.Verdict != InFlight {
			t.Errorf("while it runs: %v, want InFlight", d.Verdict)
		}
		if d, _ := keys.Claim(ctx, claimOf("other")); d.Verdict != Mismatch {
			t.Errorf("another request: %v, want Mismatch", d.Verdict)
		}
		// The key's lock held elsewhere: in flight too.
		unlock, _ := Lock(ctx, s, c.Lock, 0, nil)
		if d, _ := keys.Claim(ctx, c); d.Verdict != InFlight {
			t.Errorf("its lock held: %v, want InFlight", d.Verdict)
		}
		unlock()

		answer := &Answer{Status: 200, Body: []byte(`{"outcome":"succeeded"}`)}
		if err := d.Held.Answered(ctx, answer, "succeeded", time.Hour, 1<<10); err != nil {
			t.Fatal(err)
		}
		if d, _ := keys.Claim(ctx, c); d.Verdict != Replay || string(d.Record.Answer.Body) != string(answer.Body) {
			t.Errorf("after the answer: %v %+v, want Replay", d.Verdict, d.Record)
		}

		tooLarge := claimOf("fp")
		tooLarge.Record, tooLarge.Lock = IdempotencyRecord("large", "", "/widgets", "/widgets", "update")
		d, _ = keys.Claim(ctx, tooLarge)
		_ = d.Held.Answered(ctx, answer, "succeeded", time.Hour, 4)
		if d, _ := keys.Claim(ctx, tooLarge); d.Verdict != NotKept || d.Record.AnswerSize != len(answer.Body) || d.Record.Outcome != "succeeded" {
			t.Errorf("a large answer: %v %+v, want NotKept", d.Verdict, d.Record)
		}

		given := claimOf("fp")
		given.Record, given.Lock = IdempotencyRecord("given", "", "/widgets", "/widgets", "update")
		d, _ = keys.Claim(ctx, given)
		if err := d.Held.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
		if d, _ := keys.Claim(ctx, given); d.Verdict != Proceed {
			t.Errorf("a key given back: %v, want Proceed", d.Verdict)
		} else {
			d.Held.Release()
		}

		lapsed := claimOf("fp")
		lapsed.Record, lapsed.Lock = IdempotencyRecord("lapsed", "", "/widgets", "/widgets", "update")
		lapsed.MaxRun = time.Millisecond // renewed no more
		keys.Claim(ctx, lapsed)
		time.Sleep(60 * time.Millisecond)
		if d, _ := keys.Claim(ctx, lapsed); d.Verdict != Abandoned {
			t.Errorf("a claim past its max run: %v, want Abandoned", d.Verdict)
		}

		s.failStores(context.DeadlineExceeded)
		unavailable := claimOf("fp")
		unavailable.Record, unavailable.Lock = IdempotencyRecord("unavailable", "", "/widgets", "/widgets", "update")
		if d, _ := keys.Claim(ctx, unavailable); d.Verdict != Unavailable || d.Err == nil {
			t.Errorf("a storage that fails: %v, want Unavailable", d.Verdict)
		}
		s.failStores(nil)
		unlock, _ = Lock(ctx, s, c.Lock, 0, nil)
		defer unlock()
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := keys.Claim(cctx, c); err == nil {
			t.Error("a claim for a client gone while it waits: no error")
		}
	})
}

// A recovered saga's answer settles its in-flight record, and only that.
func TestSettleRecovered(t *testing.T) {
	t.Parallel()
	s := newMemStorage()
	keys := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	c := claimOf("fp")
	d, _ := keys.Claim(ctx, c)
	d.Held.Release()
	answer := &Answer{Status: 200, Body: []byte(`{"outcome":"rolled_back"}`)}
	if err := keys.SettleRecovered(ctx, c.Record, now(), answer, "rolled_back", time.Hour, 1<<10); err != nil {
		t.Fatal(err)
	}
	if rec := stored(t, s, c.Record); rec.State != StateDone || rec.Outcome != "rolled_back" || rec.Owner != "" {
		t.Errorf("settled %+v", rec)
	}
	if err := keys.SettleRecovered(ctx, "batch/v1/idem/none", now(), answer, "rolled_back", time.Hour, 1<<10); err != nil {
		t.Errorf("no record: %v", err)
	}
	if _, err := s.Load(ctx, "batch/v1/idem/none"); err == nil {
		t.Error("a record was made for a key never claimed")
	}
}

// A claim's renewal writes only over the record this process last wrote:
// a key that another instance settled meanwhile (a recovery that ended
// the saga) stays settled, the claim is lost (a batch that is no saga,
// fenced by its claim alone, sends no write then), and its answer is not
// written over the settled one. An answer the storage refused is stored
// once it is back, and replayed.
func TestClaimFenced(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		s := newMemStorage()
		keys := NewKeys(s, NewLeases(30*time.Millisecond), zap.NewNop())
		ctx := context.Background()
		c := claimOf("fp")
		d := proceeds(t, keys, c)
		// The writes of a batch that is no saga stand on its claim.
		fenced := FencedByClaim(nil, d.Held) // a partial batch has no journal
		if err := fenced.Fence(ctx); err != nil {
			t.Fatalf("a claim just made fences its writes: %v", err)
		}
		other := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
		if err := other.SettleRecovered(ctx, c.Record, now(), &Answer{Status: 503}, "rolled_back", time.Hour, 1<<20); err != nil {
			t.Fatal(err)
		}
		time.Sleep(40 * time.Millisecond) // a renewal finds the record settled
		if rec := stored(t, s, c.Record); rec.State != StateDone || rec.Outcome != "rolled_back" {
			t.Errorf("a renewal wrote over the settled record: %+v", rec)
		}
		if !d.Held.Lost() {
			t.Error("the claim is not lost")
		}
		if err := fenced.Fence(ctx); !errors.As(err, new(*batch.LeaseLost)) {
			t.Errorf("a write of a batch whose claim is lost: Fence %v, want the claim's loss", err)
		}
		if err := d.Held.Answered(ctx, &Answer{Status: 200}, "succeeded", time.Hour, 1<<20); !errors.Is(err, ErrClaimLost) {
			t.Errorf("answering a lost claim: %v, want ErrClaimLost", err)
		}
		if rec := stored(t, s, c.Record); rec.Outcome != "rolled_back" {
			t.Errorf("the lost claim's answer was stored: %+v", rec)
		}

		c2 := claimOf("fp2")
		c2.Record, c2.Lock = IdempotencyRecord("k2", "", "/widgets", "/widgets", "update")
		d2, _ := keys.Claim(ctx, c2)
		s.failStores(errors.New("READONLY"))
		if err := d2.Held.Answered(ctx, &Answer{Status: 200}, "succeeded", time.Hour, 1<<20); err == nil {
			t.Fatal("an answer stored with the storage refusing stores")
		}
		d2.Held.AnsweredLater(&Answer{Status: 200}, "succeeded", time.Hour, 1<<20)
		s.failStores(nil)
		time.Sleep(2 * time.Second)
		if d, _ := keys.Claim(ctx, c2); d.Verdict != Replay {
			t.Errorf("the answer stored later: %v, want Replay", d.Verdict)
		}
	})
}

// A recovery that settles its saga's key after the key expired and
// another batch claimed it anew leaves that batch's claim alone: the
// answer is the old saga's, not the new batch's (it was stored over the
// live claim, and a retry of the new batch was replayed it).
func TestSettleRecoveredLeavesANewerClaim(t *testing.T) {
	t.Parallel()
	s := newMemStorage()
	keys := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	began := now().Add(-time.Hour) // the old saga, long before
	c := claimOf("new request")
	d := proceeds(t, keys, c)
	defer d.Held.Release()
	old := &Answer{Status: 200, Body: []byte(`{"outcome":"rolled_back"}`)}
	if err := keys.SettleRecovered(ctx, c.Record, began, old, "rolled_back", time.Hour, 1<<10); err != nil {
		t.Fatal(err)
	}
	if rec := stored(t, s, c.Record); rec.State != StateInFlight {
		t.Errorf("the new batch's live claim was settled with the old saga's answer: %+v", rec.Outcome)
	}
}

// A claim given back deletes only its own record: one a recovery
// settled meanwhile (its saga's end, which a retry must be replayed)
// stays, and so does a key whose claim lapsed by this process's clock,
// which another instance may hold for a retry it runs.
func TestGiveBackLeavesAnotherInstancesRecord(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		s := newMemStorage()
		keys := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		c := claimOf("fp")
		d := proceeds(t, keys, c)
		other := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
		if err := other.SettleRecovered(ctx, c.Record, now(), &Answer{Status: 503}, "rolled_back", time.Hour, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := d.Held.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
		if d, _ := keys.Claim(ctx, c); d.Verdict != Replay {
			t.Errorf("a key a recovery settled, given back: %v, want Replay of the saga's end", d.Verdict)
		}

		lapsed := claimOf("fp")
		lapsed.Record, lapsed.Lock = IdempotencyRecord("lapsed", "", "/widgets", "/widgets", "update")
		lapsed.MaxRun = time.Millisecond // renewed no more
		d = proceeds(t, keys, lapsed)
		time.Sleep(2 * time.Minute)
		if err := d.Held.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
		if rec := stored(t, s, lapsed.Record); rec.State == StateDone {
			t.Errorf("the lapsed claim's record: %+v", rec)
		}
	})
}
