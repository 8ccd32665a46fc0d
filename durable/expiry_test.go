package durable

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
)

// fileRecord stores a record as the gateway does, filed under its
// expiry, named name.
func fileRecord(t testing.TB, s Storage, name string, rec Record, ttl time.Duration) string {
	t.Helper()
	key := path.Join(IdempotencyPrefix, name)
	if err := storeIndexed(context.Background(), s, key, &rec, ttl); err != nil {
		t.Fatal(err)
	}
	return key
}

// storeUnindexed stores a record as the build before the expiry index
// did: the record alone, in today's format.
func storeUnindexed(t testing.TB, s Storage, name string, rec Record) string {
	t.Helper()
	key := path.Join(IdempotencyPrefix, name)
	if err := storeRecord(context.Background(), s, key, &rec); err != nil {
		t.Fatal(err)
	}
	return key
}

// A sweep with 20,000 records kept and 10 expired reads the 10 and the
// buckets, not the 20,000, and deletes the 10 with their index entries;
// a sweep at a time when nothing passed lists the index once.
func TestSweepReadsOnlyWhatExpired(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		const kept, expired = 20000, 10
		mem := newMemStorage()
		s := newCounting(mem)
		start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
		for i := range kept {
			fileRecord(t, s, fmt.Sprintf("kept%05d", i), Record{Version: 1, State: StateDone, Expires: start.Add(24 * time.Hour)}, 24*time.Hour)
		}
		for i := range expired {
			fileRecord(t, s, fmt.Sprintf("gone%02d", i), Record{Version: 1, State: StateDone, Expires: start.Add(time.Duration(i) * time.Minute)}, time.Hour)
		}
		sw := NewSweeper(s, zap.NewNop())
		sw.unindexedNext = start.Add(48 * time.Hour) // nothing here predates the index
		s.take()
		swept, err := sw.Sweep(context.Background(), start.Add(time.Hour))
		if err != nil || swept.Deleted != expired || swept.Kept != 0 {
			t.Fatalf("swept %+v (%v), want %d deleted", swept, err, expired)
		}
		counts := s.take()
		// The buckets of a 1h ttl are a minute wide: 10 of them passed.
		if counts["load"] != expired || counts["list"] != 1+swept.Buckets || swept.Buckets != expired {
			t.Errorf("the sweep made %v over %d buckets: want %d loads and a list per passed bucket", counts, swept.Buckets, expired)
		}
		if counts["delete"] != 2*expired || counts["store"] != 0 {
			t.Errorf("the sweep made %v: want a record and its entry deleted for each expired one, nothing stored", counts)
		}
		if n := len(mem.keysUnder(IdempotencyPrefix)); n != kept {
			t.Errorf("%d records left, want the %d kept", n, kept)
		}
		if n := len(mem.keysUnder(expiryPrefix)); n != kept {
			t.Errorf("%d index entries left, want the kept records' %d", n, kept)
		}
		if swept, _ := sw.Sweep(context.Background(), start.Add(2*time.Hour)); swept.Buckets != 0 {
			t.Errorf("a second sweep found %+v", swept)
		}
		if counts := s.take(); counts["list"] != 1 || counts["load"] != 0 {
			t.Errorf("a sweep with nothing passed made %v, want one list", counts)
		}
	})
}

// What a sweep does with each record a passed entry names: an expired one
// goes with its entry; one claimed anew, or still running under its lease,
// is kept and filed again under a later bucket; one this build cannot read
// (garbled, or a newer build's) is left with its entry; an entry whose
// record is gone goes.
func TestSweepKeepsWhatItMustNotDelete(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		s := newMemStorage()
		ctx := context.Background()
		at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
		past := at.Add(-time.Hour)
		fileRecord(t, s, "done", Record{Version: 1, State: StateDone, Expires: past}, time.Hour)
		fileRecord(t, s, "dead", Record{Version: 1, State: StateInFlight, LeaseUntil: past, Expires: past}, time.Hour)
		// Still running past its expiry: its lease renewed (the record
		// written again, as a renewal does, not filed again).
		running := fileRecord(t, s, "running", Record{Version: 1, State: StateInFlight, LeaseUntil: past, Expires: past}, time.Hour)
		if err := storeRecord(ctx, s, running, &Record{Version: 1, State: StateInFlight, LeaseUntil: at.Add(time.Minute), Expires: past}); err != nil {
			t.Fatal(err)
		}
		// Claimed anew after it expired: its old entry names the new record.
		renewed := fileRecord(t, s, "renewed", Record{Version: 1, State: StateDone, Expires: past}, time.Hour)
		if err := storeRecord(ctx, s, renewed, &Record{Version: 1, State: StateDone, Expires: at.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		newer := fileRecord(t, s, "newer", Record{Version: 1, State: StateDone, Expires: past}, time.Hour)
		if err := s.Store(ctx, newer, []byte(`{"v":2,"state":"done"}`)); err != nil {
			t.Fatal(err)
		}
		garbled := fileRecord(t, s, "garbled", Record{Version: 1, State: StateDone, Expires: past}, time.Hour)
		if err := s.Store(ctx, garbled, []byte("{not json")); err != nil {
			t.Fatal(err)
		}
		gone := fileRecord(t, s, "gone", Record{Version: 1, State: StateDone, Expires: past}, time.Hour)
		if err := s.Delete(ctx, gone); err != nil {
			t.Fatal(err)
		}

		sw := NewSweeper(s, zap.NewNop())
		swept, err := sw.Sweep(ctx, at)
		if err != nil || swept.Deleted != 2 || swept.Kept != 4 {
			t.Errorf("swept %+v (%v): want done and dead deleted; running, renewed, newer and garbled kept", swept, err)
		}
		want := []string{garbled, newer, renewed, running}
		if left := s.keysUnder(IdempotencyPrefix); !slices.Equal(left, want) {
			t.Errorf("records left %v, want %v", left, want)
		}
		entries := s.keysUnder(expiryPrefix)
		if len(entries) != 4 {
			t.Errorf("index entries left %v: want running and renewed filed again, newer's and garbled's kept", entries)
		}
		// Once running's lease lapses, the next sweep past its bucket deletes it.
		swept, err = sw.Sweep(ctx, at.Add(maxBucket*3))
		if err != nil || swept.Deleted != 1 {
			t.Errorf("a later sweep %+v (%v), want running deleted", swept, err)
		}
		// One instance sweeps at a time.
		unlock, _ := Lock(ctx, s, sweepLock, 0, nil)
		if swept, err := sw.Sweep(ctx, at.Add(48*time.Hour)); !swept.Elsewhere || err != nil || swept.Deleted != 0 {
			t.Errorf("a sweep while another instance sweeps: %+v (%v)", swept, err)
		}
		unlock()
	})
}

// Records written by the build before the expiry index are still found
// by a claim, and still expire: the first sweep files them under their
// expiry, once, reading only those no entry names.
func TestUnindexedRecordsStillExpire(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		mem := newMemStorage()
		s := newCounting(mem)
		ctx := context.Background()
		keys := NewKeys(s, NewLeases(time.Minute), nil)
		c := claimOf("fp")
		at := time.Now()
		old := Record{Version: 1, State: StateDone, Fingerprint: "fp", Expires: at.Add(time.Hour), Answer: &Answer{Status: 200}}
		b, _ := json.Marshal(old)
		if err := s.Store(ctx, c.Record, b); err != nil {
			t.Fatal(err)
		}
		storeUnindexed(t, s, "other", Record{Version: 1, State: StateDone, Expires: at.Add(2 * time.Hour)})
		fileRecord(t, s, "indexed", Record{Version: 1, State: StateDone, Expires: at.Add(3 * time.Hour)}, time.Hour)
		storeUnindexed(t, s, "newer", Record{Version: 1, State: StateDone, Expires: at.Add(time.Hour)})
		if err := s.Store(ctx, path.Join(IdempotencyPrefix, "newer"), []byte(`{"v":2}`)); err != nil {
			t.Fatal(err)
		}
		if d, err := keys.Claim(ctx, c); err != nil || d.Verdict != Replay {
			t.Fatalf("a record of the build before: %v, %v; want it replayed", d.Verdict, err)
		}
		sw := NewSweeper(s, zap.NewNop())
		s.take()
		swept, err := sw.Sweep(ctx, at)
		if err != nil || swept.Indexed != 2 || swept.Deleted != 0 {
			t.Errorf("the first sweep %+v (%v): want the two readable unindexed records filed", swept, err)
		}
		if counts := s.take(); counts["load"] != 3+1 {
			t.Errorf("the first sweep made %v: want a load of each unindexed record, and of the note of the last look", counts)
		}
		if swept, _ := sw.Sweep(ctx, at); swept.Indexed != 0 {
			t.Errorf("a second sweep indexed again: %+v", swept)
		}
		// Another instance, or the next config, reads that the cluster
		// looked today, and lists nothing but the index's buckets.
		storeUnindexed(t, s, "later", Record{Version: 1, State: StateDone, Expires: at.Add(time.Hour)})
		s.take()
		if swept, _ := NewSweeper(s, zap.NewNop()).Sweep(ctx, at.Add(time.Minute)); swept.Indexed != 0 {
			t.Errorf("another instance's sweep the same day indexed: %+v", swept)
		}
		if counts := s.take(); counts["list"] != 1 || counts["load"] != 1 {
			t.Errorf("another instance's sweep the same day made %v: want the note read and the index listed", counts)
		}
		swept, err = sw.Sweep(ctx, at.Add(4*time.Hour))
		if err != nil || swept.Deleted != 3 {
			t.Errorf("a sweep after they expired %+v (%v), want the three readable records deleted", swept, err)
		}
		// A day later, what an older instance wrote meanwhile is indexed, and
		// goes, expired.
		swept, err = sw.Sweep(ctx, at.Add(25*time.Hour))
		if err != nil || swept.Indexed != 1 || swept.Deleted != 1 {
			t.Errorf("a sweep a day later %+v (%v), want the later record indexed and deleted", swept, err)
		}
		if left := mem.keysUnder(IdempotencyPrefix); !slices.Equal(left, []string{path.Join(IdempotencyPrefix, "newer")}) {
			t.Errorf("records left %v, want only the one this build cannot read", left)
		}
	})
}
