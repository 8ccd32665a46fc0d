package redisfast_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	storageredis "github.com/pberkel/caddy-storage-redis"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// TestStoreIfIsTheModules: StoreIf's writes are byte for byte the
// module's Store of each in turn, under the same keys and folder
// entries, with any prefix.
func TestStoreIfIsTheModules(t *testing.T) {
	ctx := context.Background()
	for _, prefix := range []string{"caddy", "one/two", ""} {
		t.Run(fmt.Sprintf("prefix %q", prefix), func(t *testing.T) {
			byModule, byFast := miniredis.RunT(t), miniredis.RunT(t)
			m, f := module(t, byModule, prefix, nil), fast(t, module(t, byFast, prefix, nil))
			record := "batch/v1/idem/abc"
			writes := []durable.KeyValue{
				{Key: "batch/v1/idem-expiry/20261128T190000Z/abc", Value: []byte(`{"v":1}`)},
				{Key: record, Value: []byte(`{"v":1,"state":"in_flight"}`)},
			}
			for _, w := range writes {
				if err := m.Store(ctx, w.Key, w.Value); err != nil {
					t.Fatal(err)
				}
			}
			if held, err := f.StoreIf(ctx, "batch_idem_abc", record, nil, writes); err != nil || held != nil {
				t.Fatalf("a new record: %q, %v", held, err)
			}
			if a, b := dump(t, byModule), dump(t, byFast); fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatalf("module    %v\nfast path %v", a, b)
			}
			// Over the record, with another entry: as the module's two
			// Stores again.
			again := []durable.KeyValue{{Key: "batch/v1/idem-expiry/20261128T200000Z/abc", Value: []byte(`{"v":1}`)}, {Key: record, Value: []byte(`{"v":1,"state":"done"}`)}}
			for _, w := range again {
				if err := m.Store(ctx, w.Key, w.Value); err != nil {
					t.Fatal(err)
				}
			}
			if held, err := f.StoreIf(ctx, "", record, writes[1].Value, again); err != nil || string(held) != string(writes[1].Value) {
				t.Fatalf("over the record: %q, %v", held, err)
			}
			if a, b := dump(t, byModule), dump(t, byFast); fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatalf("module    %v\nfast path %v", a, b)
			}
		})
	}
}

// TestStoreIfChecks: StoreIf writes nothing where the record's lock is
// held by the module's Lock (an older build's claim, or a sweep), where
// the record is there and none was expected, holds another value or is
// gone, and answers what the record held; a value the module
// compressed is not compared.
func TestStoreIfChecks(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	m, f := module(t, mr, "caddy", nil), fast(t, module(t, mr, "caddy", nil))
	record, lock := "batch/v1/idem/abc", "batch_idem_abc"
	v1, v2 := []byte(`{"v":1}`), []byte(`{"v":2}`)
	write := func(v []byte) []durable.KeyValue { return []durable.KeyValue{{Key: record, Value: v}} }
	if err := m.Lock(ctx, lock); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StoreIf(ctx, lock, record, nil, write(v1)); !errors.Is(err, itemlock.ErrLocked) {
		t.Fatalf("the module's lock held: %v, want ErrLocked", err)
	}
	if err := m.Unlock(ctx, lock); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StoreIf(ctx, lock, record, v1, write(v2)); !errors.Is(err, durable.ErrKeyGone) {
		t.Fatalf("no record: %v, want ErrKeyGone", err)
	}
	if _, err := f.StoreIf(ctx, lock, record, nil, write(v1)); err != nil {
		t.Fatal(err)
	}
	if held, err := f.StoreIf(ctx, lock, record, nil, write(v2)); !errors.Is(err, durable.ErrKeyChanged) || string(held) != string(v1) {
		t.Fatalf("a record there: %q, %v, want ErrKeyChanged and v1", held, err)
	}
	if held, err := f.StoreIf(ctx, "", record, v2, write(v2)); !errors.Is(err, durable.ErrKeyChanged) || string(held) != string(v1) {
		t.Fatalf("another value: %q, %v, want ErrKeyChanged and v1", held, err)
	}
	if got, err := m.Load(ctx, record); err != nil || string(got) != string(v1) {
		t.Fatalf("the module reads %q, %v", got, err)
	}
	// An empty value, as the module stores nil: held as empty, and
	// written over when that is what was read.
	if err := m.Store(ctx, record, nil); err != nil {
		t.Fatal(err)
	}
	held, err := f.StoreIf(ctx, lock, record, nil, write(v1))
	if !errors.Is(err, durable.ErrKeyChanged) || held == nil || len(held) != 0 {
		t.Fatalf("an empty value: %q, %v, want ErrKeyChanged and empty", held, err)
	}
	if _, err := f.StoreIf(ctx, lock, record, held, write(v1)); err != nil {
		t.Fatalf("over an empty value: %v", err)
	}
	compressing := module(t, mr, "caddy", func(rs *storageredis.RedisStorage) { rs.Compression = storageredis.CompressionFlate })
	if err := compressing.Store(ctx, record, []byte(strings.Repeat(`{"v":1}`, 20))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StoreIf(ctx, lock, record, nil, write(v1)); !errors.Is(err, durable.ErrUndecidable) {
		t.Errorf("a compressed value: %v, want ErrUndecidable", err)
	}
}

// TestClaimOnTheFastPath: an Idempotency-Key claimed and answered on
// the fast path, each in one round trip, is read by the module as a
// record, and replayed.
func TestClaimOnTheFastPath(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	f, relay := fastThroughRelay(t, mr)
	var sent atomic.Int64 // requests: a client waits for each answer
	relay.Observe(func([]byte) { sent.Add(1) })
	keys := durable.NewKeys(f, durable.NewLeases(time.Minute), zap.NewNop())
	claimAnswer := func(name string) (claim, answer int64) {
		record, lock := durable.IdempotencyRecord(name, "", "/widgets", "/widgets", "update")
		c := durable.Claim{Record: record, Lock: lock, Fingerprint: "fp", Resource: "/widgets", Op: "update", Wait: time.Second, TTL: time.Hour, MaxRun: time.Minute}
		before := sent.Load()
		d, err := keys.Claim(ctx, c)
		if err != nil || d.Verdict != durable.Proceed {
			t.Fatalf("a new key: %v, %v", d.Verdict, err)
		}
		claimed := sent.Load()
		if err := d.Held.Answered(ctx, &durable.Answer{Status: 200, Body: []byte(`{}`)}, "succeeded", time.Hour, 1<<10); err != nil {
			t.Fatal(err)
		}
		if d, err := keys.Claim(ctx, c); err != nil || d.Verdict != durable.Replay || string(d.Record.Answer.Body) != `{}` {
			t.Errorf("the key again: %v, %v, want Replay", d.Verdict, err)
		}
		if _, err := module(t, mr, "caddy", nil).Load(ctx, record); err != nil {
			t.Errorf("the module reads no record: %v", err)
		}
		return claimed - before, sent.Load() - claimed
	}
	claimAnswer("warm") // the connection made, the script loaded
	if claim, answer := claimAnswer("k"); claim != 1 || answer != 2 {
		t.Errorf("%d round trips to claim, %d to answer and replay, want 1 and 1+1", claim, answer)
	}
}
