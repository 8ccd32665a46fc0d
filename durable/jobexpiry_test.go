package durable

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// A sweep with 300 jobs kept and 5 expired reads the 5 and the buckets,
// not the 300, and deletes each expired job whole, with its index
// entries; a sweep when nothing passed lists the index once.
func TestJobSweepReadsOnlyWhatExpired(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		const kept, expired = 300, 5
		mem := newMemStorage()
		s := newCounting(mem)
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		for range expired {
			hj, _ := mustStart(t, js, 3)
			if err := hj.AppendResults(ctx, 0, createdRange(0, 3)); err != nil {
				t.Fatal(err)
			}
			endJob(t, hj)
		}
		time.Sleep(time.Hour)
		for range kept {
			endJob(t, func() *HeldJob { hj, _ := mustStart(t, js, 1); return hj }())
		}
		sw := NewJobSweeper(s, zap.NewNop())
		s.take()
		swept, err := sw.Sweep(ctx, now().Add(24*time.Hour-time.Minute))
		if err != nil || swept.Deleted != expired || swept.Kept != 0 {
			t.Fatalf("swept %+v (%v), want the %d expired jobs deleted", swept, err, expired)
		}
		counts := s.take()
		// Each expired job: its record and progress read; its folder
		// listed to find the progress and to delete it, and its results
		// folder listed (the input went at its end); four index entries,
		// a results page, the progress, the record and the expiry entry
		// deleted.
		if counts["load"] != 2*expired || counts["list"] != 1+swept.Buckets+3*expired || counts["store"] != 0 || counts["delete"] != 8*expired {
			t.Errorf("the sweep made %v over %d buckets: want a job 2 loads, 3 lists and 8 deletes, a list a bucket, nothing stored", counts, swept.Buckets)
		}
		if n := len(mem.keysUnder(jobExpiryPrefix)); n != kept {
			t.Errorf("%d expiry entries left, want the kept jobs' %d", n, kept)
		}
		if n := len(mem.keysUnder(jobIndexPrefix)); n != kept {
			t.Errorf("%d job-index entries left, want the kept jobs' %d", n, kept)
		}
		if n := len(mem.keysUnder(jobClientsPrefix)) + len(mem.keysUnder(jobActivePrefix)); n != 0 {
			t.Errorf("%d job-clients and job-active entries left of ended jobs", n)
		}
		if swept, _ := sw.Sweep(ctx, now().Add(24*time.Hour-time.Minute)); swept.Buckets != 0 {
			t.Errorf("a second sweep found %+v", swept)
		}
		if counts := s.take(); counts["list"] != 1 || counts["load"] != 0 {
			t.Errorf("a sweep with nothing passed made %v, want one list", counts)
		}
	})
}

// What a job sweep does with each entry of a passed bucket: a staging
// never registered goes whole; a job still running is filed again for
// its deadline; one that never ended goes once its deadline + ttl passed;
// one this build cannot read is left with its entry. The jobs' sweep
// takes the Idempotency-Key sweep's lock, and leaves the records' index
// alone.
func TestJobSweepKeepsWhatItMustNotDelete(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		staged, err := js.Stage(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := staged.Chunk(ctx, 0, widgetItems(0, 2)); err != nil {
			t.Fatal(err)
		}
		running, _ := mustStart(t, js, 2)
		newer, _ := mustStart(t, js, 1)
		if err := s.Store(ctx, jobKey(newer.Record().ID, jobName), []byte(`{"v":2}`)); err != nil {
			t.Fatal(err)
		}
		record := fileRecord(t, s, "idem", Record{Version: 1, State: StateDone, Expires: now()}, time.Hour)
		sw := NewJobSweeper(s, zap.NewNop())

		swept, err := sw.Sweep(ctx, now().Add(time.Hour))
		if err != nil || swept.Deleted != 1 || swept.Kept != 0 {
			t.Errorf("a sweep past the staging's time: %+v (%v), want the staging deleted", swept, err)
		}
		if left := s.keysUnder(jobDir(staged.ID())); len(left) != 0 {
			t.Errorf("the staging left %v", left)
		}
		if _, err := s.Load(ctx, record); err != nil {
			t.Errorf("the jobs' sweep touched an Idempotency-Key record: %v", err)
		}

		// Past the jobs' ttl, not their deadline + ttl: the entries are of
		// deadline + ttl (30h), nothing passed.
		if swept, _ := sw.Sweep(ctx, now().Add(25*time.Hour)); swept.Buckets != 0 {
			t.Errorf("a sweep before any deadline + ttl: %+v", swept)
		}
		swept, err = sw.Sweep(ctx, now().Add(31*time.Hour))
		if err != nil || swept.Deleted != 1 || swept.Kept != 1 {
			t.Errorf("a sweep past the deadline + ttl: %+v (%v), want the job that never ended deleted, the newer build's kept", swept, err)
		}
		if left := s.keysUnder(jobDir(running.Record().ID)); len(left) != 0 {
			t.Errorf("a job that never ended, past its deadline + ttl, left %v", left)
		}
		if _, err := s.Load(ctx, jobKey(newer.Record().ID, jobName)); err != nil {
			t.Errorf("a job this build cannot read was deleted: %v", err)
		}

		unlock, _ := Lock(ctx, s, sweepLock, 0, nil)
		if swept, err := sw.Sweep(ctx, now().Add(48*time.Hour)); !swept.Elsewhere || err != nil {
			t.Errorf("a jobs' sweep while the records' sweep runs: %+v (%v)", swept, err)
		}
		unlock()
	})
}

// A job still running when its staging's entry passes is not deleted:
// its entry moved to its deadline + ttl when it was registered, and a
// stale entry naming it is filed again there.
func TestJobSweepFilesARunningJobAgain(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, token := mustStart(t, js, 2)
		id := hj.Record().ID
		stale := time.Now().Add(time.Minute)
		if err := fileJobExpiry(ctx, s, id, stale, time.Hour); err != nil {
			t.Fatal(err)
		}
		swept, err := NewJobSweeper(s, zap.NewNop()).Sweep(ctx, now().Add(2*time.Hour))
		if err != nil || swept.Kept != 1 || swept.Deleted != 0 {
			t.Errorf("swept %+v (%v), want the running job kept", swept, err)
		}
		if _, err := js.Status(ctx, id, token); err != nil {
			t.Errorf("the running job after a sweep: %v", err)
		}
		want := jobExpiryKey(id, hj.Record().lapses(), hj.Record().TTL)
		if left := s.keysUnder(jobExpiryPrefix); len(left) != 1 || left[0] != want {
			t.Errorf("expiry entries %v, want only %s", left, want)
		}
	})
}
