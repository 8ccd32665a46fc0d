package durable

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap"
)

// A record of a version this build does not read (a newer build's
// claim, its batch running on an instance already upgraded) is not
// claimed over, on the storage that claims under a lock and on the one
// that claims at once: the key is unavailable here (503) until every
// instance is upgraded. It was claimed over, and the batch ran twice.
func TestNewerRecordIsNotClaimedOver(t *testing.T) {
	t.Parallel()
	for name, guarded := range map[string]bool{"under the lock": false, "at once": true} {
		t.Run(name, func(t *testing.T) { newerRecordNotClaimedOver(t, guarded) })
	}
}

func newerRecordNotClaimedOver(t *testing.T, guarded bool) {
	s := newMemStorage()
	var st Storage = s
	if guarded {
		st = newGuardedMem(s)
	}
	keys := NewKeys(st, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	c := claimOf("fp")
	at := time.Now()
	newer, _ := json.Marshal(map[string]any{
		"v": 2, "state": "in_flight", "fingerprint": "fp", "owner": "newer-instance",
		"lease_until": at.Add(time.Minute), "created": at, "expires": at.Add(time.Hour),
	})
	if err := s.Store(ctx, c.Record, newer); err != nil {
		t.Fatal(err)
	}
	d, err := keys.Claim(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != Unavailable {
		if d.Held != nil {
			d.Held.Release()
		}
		t.Errorf("a newer build's in-flight record: verdict %v, want Unavailable (it ran the batch a second time)", d.Verdict)
	}
	if b, _ := s.Load(ctx, c.Record); string(b) != string(newer) {
		t.Errorf("the newer record was overwritten: %s", b)
	}
}
