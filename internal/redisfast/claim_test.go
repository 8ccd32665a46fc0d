package redisfast_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/caddy-batch/caddy-batch/durable"
)

// TestClaimLease: a takeover's claim on the fast path stores its lease
// key, as the module's Store would, only while the old owner's lease
// record is as the takeover watched it (its key holds the value seen,
// or, where none was seen, no "lease" is listed) and no other lease key
// of the claim's epoch or a higher one is listed. Otherwise it writes
// nothing and says why; an old value it cannot compare goes the generic
// way.
func TestClaimLease(t *testing.T) {
	const dir = "batch/v1/journal/s"
	seg0, lease := dir+"/seg.00000000", dir+"/lease"
	other1, other2 := dir+"/lease.00000001.bbbbbbbbbbbb", dir+"/lease.00000002.bbbbbbbbbbbb"
	compressed := `{"value":"eA==","modified":"2026-01-01T00:00:00Z","size":1,"compression":1,"encryption":0}`
	for _, tc := range []struct {
		name    string
		stored  []string // key, value, ...
		raw     string   // stored as is under lease, if set
		unset   bool     // lease listed with no value, as a Store cut short leaves it
		seenKey string
		seen    string // "" with seenKey: listed with no value when watched
		want    error
	}{
		{"as watched", []string{lease, "old"}, "", false, lease, "old", nil},
		{"none watched, none there", nil, "", false, "", "", nil},
		{"renewed since", []string{lease, "renewed"}, "", false, lease, "old", durable.ErrKeyChanged},
		{"gone since", nil, "", false, lease, "old", durable.ErrKeyGone},
		{"first renewal since", []string{lease, "first"}, "", false, "", "", durable.ErrKeyChanged},
		{"claimed by another", []string{lease, "old", other1, "theirs"}, "", false, lease, "old", durable.ErrOutranked},
		{"a higher epoch", []string{lease, "old", other2, "theirs"}, "", false, lease, "old", durable.ErrOutranked},
		{"compressed", nil, compressed, false, lease, "x", durable.ErrUndecidable},
		{"listed, never set", nil, "", true, lease, "", nil},
		{"listed, set since", []string{lease, "late"}, "", false, lease, "", durable.ErrKeyChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []byte // nil: none watched, or seenKey watched with no value
			if tc.seen != "" {
				seen = []byte(tc.seen)
			}
			claimLease(t, append([]string{seg0, "intent"}, tc.stored...), tc.raw, tc.unset, tc.seenKey, seen, tc.want)
		})
	}
}

// claimLease stores stored (key, value, ...) and raw as is under the
// old lease key, if set, and claims epoch 1 over seenKey seen as seen.
func claimLease(t *testing.T, stored []string, raw string, unset bool, seenKey string, seen []byte, want error) {
	const lease, mine1 = "batch/v1/journal/s/lease", "batch/v1/journal/s/lease.00000001.aaaaaaaaaaaa"
	ctx := context.Background()
	byModule, byFast := miniredis.RunT(t), miniredis.RunT(t)
	m, f := module(t, byModule, "caddy", nil), fast(t, module(t, byFast, "caddy", nil))
	for i := 0; i < len(stored); i += 2 {
		if err := errors.Join(m.Store(ctx, stored[i], []byte(stored[i+1])), f.Store(ctx, stored[i], []byte(stored[i+1]))); err != nil {
			t.Fatal(err)
		}
	}
	if raw != "" {
		if err := errors.Join(m.Store(ctx, lease, nil), f.Store(ctx, lease, nil)); err != nil {
			t.Fatal(err)
		}
		byFast.Set("caddy/"+lease, raw)
	}
	if unset {
		if err := errors.Join(m.Store(ctx, lease, []byte("cut short")), f.Store(ctx, lease, []byte("cut short"))); err != nil {
			t.Fatal(err)
		}
		byModule.Del("caddy/" + lease)
		byFast.Del("caddy/" + lease)
	}
	before := fmt.Sprint(dump(t, byFast))
	err := f.ClaimLease(ctx, mine1, 1, seenKey, seen, []byte("claim"))
	if !errors.Is(err, want) || (want == nil) != (err == nil) {
		t.Fatalf("ClaimLease: %v, want %v", err, want)
	}
	if want != nil {
		if after := fmt.Sprint(dump(t, byFast)); after != before {
			t.Errorf("refused, yet Redis went from\n%s\nto\n%s", before, after)
		}
		return
	}
	if err := m.Store(ctx, mine1, []byte("claim")); err != nil {
		t.Fatal(err)
	}
	if a, b := dump(t, byModule), dump(t, byFast); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("after the claim:\nmodule    %v\nfast path %v", a, b)
	}
}
