package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"reflect"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// guardedMem is a memStorage that checks and stores at once
// (GuardedStorer), as the Redis fast path does, and counts its calls
// (counting; StoreIf as "store if").
type guardedMem struct {
	*counting
	mem *memStorage
	// undecidable makes StoreIf answer ErrUndecidable, as the fast path
	// does for a value another instance compressed.
	undecidable bool
	// replyLost, if set, is asked after each StoreIf that stored: true
	// answers an error all the same (a reply lost).
	replyLost func(key string) bool
}

func newGuardedMem(s *memStorage) *guardedMem {
	return &guardedMem{counting: newCounting(s), mem: s}
}

func (g *guardedMem) StoreIf(_ context.Context, free, key string, want []byte, writes []KeyValue) ([]byte, error) {
	g.add("store if")
	if g.undecidable {
		return nil, ErrUndecidable
	}
	// The lock's table, then the keys: no TryLock comes between.
	m := g.mem
	m.memLocks.mu.Lock()
	defer m.memLocks.mu.Unlock()
	if _, held := m.memLocks.held[free]; held && free != "" {
		return nil, fmt.Errorf("%w (held elsewhere)", itemlock.ErrLocked)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	held, ok := m.keys[key]
	switch {
	case want == nil && ok:
		return held, ErrKeyChanged
	case want != nil && !ok:
		return nil, ErrKeyGone
	case want != nil && !bytes.Equal(held, want):
		return held, ErrKeyChanged
	}
	for _, w := range writes {
		m.stores++
		m.keys[w.Key] = append([]byte(nil), w.Value...)
		m.modified[w.Key] = time.Now()
	}
	if g.replyLost != nil && g.replyLost(key) {
		return nil, errors.New("i/o timeout (the store ran; its reply was lost)")
	}
	return held, nil
}

// TestClaimAtOnce: on a storage that checks and stores at once, a keyed
// batch's claim is one call and its answer one, and nothing else: no
// lock taken, nothing read; and what they store is byte for byte what
// the claim under the lock stores, under the same keys (expiry entry
// and record).
func TestClaimAtOnce(t *testing.T) {
	t.Parallel()
	stores := map[bool]map[string][]byte{}
	for _, fast := range []bool{false, true} {
		bubble(t, func(t *testing.T) {
			mem := newMemStorage()
			g := newGuardedMem(mem)
			var s Storage = mem
			if fast {
				s = g
			}
			keys := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
			ctx := context.Background()
			c := claimOf("fp")
			d := proceeds(t, keys, c)
			claim := g.take()
			if err := d.Held.Answered(ctx, &Answer{Status: 200, Body: []byte(`{}`)}, "succeeded", time.Hour, 1<<10); err != nil {
				t.Fatal(err)
			}
			answer := g.take()
			if fast && (!maps.Equal(claim, map[string]int{"store if": 1}) || !maps.Equal(answer, map[string]int{"store if": 1})) {
				t.Errorf("calls: claim %v, answer %v; want one StoreIf each", claim, answer)
			}
			stores[fast] = maps.Clone(mem.keys)
		})
	}
	generic, fast := stores[false], stores[true]
	if !slices.Equal(slices.Sorted(maps.Keys(generic)), slices.Sorted(maps.Keys(fast))) {
		t.Fatalf("keys: under the lock %v, at once %v", slices.Sorted(maps.Keys(generic)), slices.Sorted(maps.Keys(fast)))
	}
	for k, v := range generic {
		if !bytes.Equal(v, fast[k]) {
			t.Errorf("%s: under the lock %s, at once %s", k, v, fast[k])
		}
	}
}

// TestClaimAtOnceDecides: the claim at once decides as the claim under
// the lock does: a key in flight, reused for another request, or whose
// lock is held (an older build checking it, or a sweep) is not claimed;
// an expired record is claimed over, written only over what was read;
// a client gone while it waits gets an error; a failing storage leaves
// the key unclaimed; where the storage cannot decide, the claim goes
// the generic way.
func TestClaimAtOnceDecides(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		mem := newMemStorage()
		g := newGuardedMem(mem)
		keys := NewKeys(g, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		c := claimOf("fp")
		d := proceeds(t, keys, c)
		if d, _ := keys.Claim(ctx, c); d.Verdict != InFlight {
			t.Errorf("while it runs: %v, want InFlight", d.Verdict)
		}
		if d, _ := keys.Claim(ctx, claimOf("other")); d.Verdict != Mismatch {
			t.Errorf("another request: %v, want Mismatch", d.Verdict)
		}
		d.Held.Release()

		expired := claimOf("fp")
		expired.Record, expired.Lock = IdempotencyRecord("expired", "", "/widgets", "/widgets", "update")
		old := fileRecord(t, mem, path.Base(expired.Record), Record{Version: 1, State: StateDone, Fingerprint: "fp", Created: now().Add(-2 * time.Hour), Expires: now().Add(-time.Hour)}, time.Hour)
		if old != expired.Record {
			t.Fatalf("filed %s, claimed %s", old, expired.Record)
		}
		g.take()
		d = proceeds(t, keys, expired)
		d.Held.Release()
		if calls := g.take(); !maps.Equal(calls, map[string]int{"store if": 2}) {
			t.Errorf("an expired record claimed over in %v, want two calls", calls)
		}

		locked := claimOf("fp")
		locked.Record, locked.Lock = IdempotencyRecord("locked", "", "/widgets", "/widgets", "update")
		unlock, _ := Lock(ctx, mem, locked.Lock, 0, nil)
		if d, _ := keys.Claim(ctx, locked); d.Verdict != InFlight {
			t.Errorf("its lock held: %v, want InFlight", d.Verdict)
		}
		if _, err := mem.Load(ctx, locked.Record); err == nil {
			t.Error("a key whose lock is held was claimed")
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := keys.Claim(cctx, locked); err == nil {
			t.Error("a claim for a client gone while it waits: no error")
		}
		unlock()

		mem.failStores(context.DeadlineExceeded)
		if d, _ := keys.Claim(ctx, locked); d.Verdict != Unavailable || d.Err == nil {
			t.Errorf("a storage that fails: %v, want Unavailable", d.Verdict)
		}
		mem.failStores(nil)

		g.undecidable = true
		d = proceeds(t, keys, locked)
		d.Held.Release()
		if calls := g.take(); calls["lock"] != 1 || calls["load"] != 1 {
			t.Errorf("an undecidable storage: %v, want the claim under the lock", calls)
		}
	})
}

// TestClaimAtOnceFenced: at once too, a claim's renewal and its answer
// write only over the record this process last wrote: a key settled by
// another instance meanwhile stays settled, and the claim is lost.
func TestClaimAtOnceFenced(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		mem := newMemStorage()
		keys := NewKeys(newGuardedMem(mem), NewLeases(30*time.Millisecond), zap.NewNop())
		ctx := context.Background()
		c := claimOf("fp")
		d := proceeds(t, keys, c)
		time.Sleep(40 * time.Millisecond) // renewed once, at once
		if rec := stored(t, mem, c.Record); !rec.LeaseUntil.After(now()) || d.Held.Lost() {
			t.Fatalf("the claim was not renewed: %+v", rec)
		}
		other := NewKeys(mem, NewLeases(time.Minute), zap.NewNop())
		if err := other.SettleRecovered(ctx, c.Record, now(), &Answer{Status: 503}, "rolled_back", time.Hour, 1<<20); err != nil {
			t.Fatal(err)
		}
		time.Sleep(40 * time.Millisecond)
		if !d.Held.Lost() {
			t.Error("the claim is not lost")
		}
		if err := d.Held.Answered(ctx, &Answer{Status: 200}, "succeeded", time.Hour, 1<<20); !errors.Is(err, ErrClaimLost) {
			t.Errorf("answering a lost claim: %v, want ErrClaimLost", err)
		}
		if rec := stored(t, mem, c.Record); rec.Outcome != "rolled_back" {
			t.Errorf("the lost claim's answer was stored: %+v", rec)
		}
		if err := mem.Delete(ctx, c.Record); err != nil {
			t.Fatal(err)
		}
		d = proceeds(t, keys, c)
		_ = mem.Delete(ctx, c.Record)
		if err := d.Held.Answered(ctx, &Answer{Status: 200}, "succeeded", time.Hour, 1<<20); !errors.Is(err, ErrClaimLost) {
			t.Errorf("answering a claim whose record is gone: %v, want ErrClaimLost", err)
		}
		if _, err := mem.Load(ctx, c.Record); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a record gone was written again: %v", err)
		}
	})
}

// TestStoredV1IdempotencyRecordsDecideAtOnce: the records an older
// instance stored are decided by the claim at once as by the claim
// under the lock (whose verdicts TestStoredV1IdempotencyRecordsStillDecide
// pins), with the same record.
func TestStoredV1IdempotencyRecordsDecideAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	locked := NewKeys(storedV1(t), NewLeases(time.Minute), zap.NewNop())
	atOnce := NewKeys(newGuardedMem(storedV1(t)), NewLeases(time.Minute), zap.NewNop())
	for _, c := range [][2]string{{"replay", "fp-replay"}, {"replay", "fp-other"}, {"not-kept", "fp-not-kept"},
		{"abandoned", "fp-abandoned"}, {"in-flight", "fp-in-flight"}, {"expired", "fp-expired"}} {
		want, errL := locked.Claim(ctx, goldenClaim(c[0], c[1]))
		got, errF := atOnce.Claim(ctx, goldenClaim(c[0], c[1]))
		if errL != nil || errF != nil || got.Verdict != want.Verdict || !reflect.DeepEqual(got.Record, want.Record) {
			t.Errorf("%s with %s: at once %v %+v (%v), under the lock %v %+v (%v)", c[0], c[1], got.Verdict, got.Record, errF, want.Verdict, want.Record, errL)
		}
		for _, d := range []Decision{want, got} {
			if d.Held != nil {
				d.Held.Release()
			}
		}
	}
}

// lossyRecordStores is a storage whose one store of a key's record
// lands and answers an error all the same, as a store whose reply was
// lost does.
type lossyRecordStores struct {
	*memStorage
	record string
	lose   atomic.Bool
}

func (s *lossyRecordStores) Store(ctx context.Context, key string, value []byte) error {
	err := s.memStorage.Store(ctx, key, value)
	if key == s.record && err == nil && s.lose.CompareAndSwap(true, false) {
		return errors.New("i/o timeout (the store ran; its reply was lost)")
	}
	return err
}

// A renewal of an Idempotency-Key's claim whose reply was lost (it
// landed) is a blip: the claim's next renewal and its answer take what
// it wrote for this process's own, on the storage that compares in one
// call and on one that reads first. They took it for another instance's
// settling the key: the claim lost, and the answer never recorded.
func TestClaimRenewalWhoseReplyIsLost(t *testing.T) {
	t.Parallel()
	for name, guarded := range map[string]bool{"read first": false, "at once": true} {
		t.Run(name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				ctx := context.Background()
				c := claimOf("fp")
				lossy := &lossyRecordStores{memStorage: newMemStorage(), record: c.Record}
				var s Storage = lossy
				if guarded {
					gm := newGuardedMem(lossy.memStorage)
					gm.replyLost = func(key string) bool { return key == c.Record && lossy.lose.CompareAndSwap(true, false) }
					s = gm
				}
				keys := NewKeys(s, NewLeases(30*time.Millisecond), zap.NewNop())
				d := proceeds(t, keys, c)
				lossy.lose.Store(true)
				time.Sleep(40 * time.Millisecond) // renewed at once, and again
				if d.Held.Lost() {
					t.Fatal("the claim is lost after a renewal whose reply was lost")
				}
				if err := d.Held.Answered(ctx, &Answer{Status: 200}, "succeeded", time.Hour, 1<<20); err != nil {
					t.Fatalf("answering: %v", err)
				}
				if rec := stored(t, lossy.memStorage, c.Record); rec.Outcome != "succeeded" {
					t.Errorf("the record after the answer: %+v", rec)
				}
			})
		})
	}
}
