package redisfast_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/caddy-batch/caddy-batch/durable"
)

// TestDeleteAllIf: a journal's removal on the fast path deletes its keys
// at once, as the module's Delete of each would, only while the saga's
// lease is the caller's: the lease key holds what the caller last
// stored (or, never stored, is not there; or is not checked), and the
// folder lists no lease key of a higher epoch nor another of the same
// epoch. Otherwise it deletes nothing and says why.
func TestDeleteAllIf(t *testing.T) {
	const dir = "batch/v1/journal/s"
	seg0, seg1, lease := dir+"/seg.00000000", dir+"/seg.00000001", dir+"/lease"
	mine1, other1, other2 := dir+"/lease.00000001.aaaaaaaaaaaa", dir+"/lease.00000001.bbbbbbbbbbbb", dir+"/lease.00000002.bbbbbbbbbbbb"
	journal := map[string]string{seg0: "intent", seg1: "records"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(journal)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		stored map[string]string
		guard  durable.LeaseGuard
		want   error
	}{
		{"renewed, as stored", with(lease, "mine"), durable.LeaseGuard{Key: lease, Holds: []byte("mine")}, nil},
		{"never renewed, absent", journal, durable.LeaseGuard{Key: lease, Absent: true}, nil},
		{"renewal unknown", with(lease, "whatever"), durable.LeaseGuard{Key: lease}, nil},
		{"epoch 1, under epoch 0", with(lease, "old", mine1, "mine"), durable.LeaseGuard{Key: mine1, Epoch: 1, Holds: []byte("mine")}, nil},
		{"lease written by another", with(lease, "theirs"), durable.LeaseGuard{Key: lease, Holds: []byte("mine")}, durable.ErrKeyChanged},
		{"lease written where none was", with(lease, "theirs"), durable.LeaseGuard{Key: lease, Absent: true}, durable.ErrKeyChanged},
		{"lease gone", journal, durable.LeaseGuard{Key: lease, Holds: []byte("mine")}, durable.ErrKeyGone},
		{"a higher epoch", with(other1, "theirs"), durable.LeaseGuard{Key: lease, Absent: true}, durable.ErrOutranked},
		{"a higher epoch, renewed", with(lease, "mine", other2, "theirs"), durable.LeaseGuard{Key: lease, Holds: []byte("mine")}, durable.ErrOutranked},
		{"another of the same epoch", with(mine1, "mine", other1, "theirs"), durable.LeaseGuard{Key: mine1, Epoch: 1, Holds: []byte("mine")}, durable.ErrOutranked},
	} {
		t.Run(tc.name, func(t *testing.T) { deleteAllIf(t, tc.stored, tc.guard, tc.want) })
	}
}

func deleteAllIf(t *testing.T, stored map[string]string, g durable.LeaseGuard, want error) {
	ctx := context.Background()
	byModule, byFast := miniredis.RunT(t), miniredis.RunT(t)
	m, f := module(t, byModule, "caddy", nil), fast(t, module(t, byFast, "caddy", nil))
	keys := slices.Sorted(maps.Keys(stored))
	for _, k := range append(keys, "batch/v1/other") {
		v := stored[k]
		if err := errors.Join(m.Store(ctx, k, []byte(v)), f.Store(ctx, k, []byte(v))); err != nil {
			t.Fatal(err)
		}
	}
	before := fmt.Sprint(dump(t, byFast))
	err := f.DeleteAllIf(ctx, g, keys)
	if !errors.Is(err, want) || (want == nil) != (err == nil) {
		t.Fatalf("DeleteAllIf: %v, want %v", err, want)
	}
	if want != nil {
		if after := fmt.Sprint(dump(t, byFast)); after != before {
			t.Errorf("refused, yet Redis went from\n%s\nto\n%s", before, after)
		}
		return
	}
	for _, k := range keys {
		if err := m.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := dump(t, byModule), dump(t, byFast); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("after the removal:\nmodule    %v\nfast path %v", a, b)
	}
}
