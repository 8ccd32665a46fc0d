package durable

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

// scanRoom is a JobRoom for the tests: room for max jobs at once (none
// when max is 0), each claimed job run to its end before the scan goes
// on, through pol to up.
type scanRoom struct {
	t       *testing.T
	through Through
	max     int

	mu      sync.Mutex
	asked   []string // the jobs room was asked for
	running int
	ran     []error
}

func (r *scanRoom) room(rec *JobRecord) (func(*HeldJob), func(), bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, rec.ID)
	if r.running >= r.max {
		return nil, nil, false
	}
	r.running++
	free := func() {
		r.mu.Lock()
		r.running--
		r.mu.Unlock()
	}
	run := func(hj *HeldJob) {
		held.Lock()
		held.by[r.t] = append(held.by[r.t], hj)
		held.Unlock()
		err := hj.Run(context.Background(), r.through, nil)
		r.mu.Lock()
		r.ran = append(r.ran, err)
		r.mu.Unlock()
		free()
	}
	return run, free, true
}

func scanOnce(t *testing.T, js *Jobs, r *scanRoom) {
	t.Helper()
	err := js.Scan(context.Background(), r.room, func(id, doing string, err error) {
		t.Errorf("scan: job %s, %s: %v", id, doing, err)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A queued job (its lease released at its start) is claimed by the next
// scan of an instance with room, at once, and run to its end; without
// room it waits, released, for a scan that has some.
func TestJobScanRunsAQueuedJob(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 600, false)
	id := hj.Record().ID
	if err := hj.Release(ctx); err != nil {
		t.Fatal(err)
	}
	up := newWidgetsUpstream(false)
	full := &scanRoom{t: t, through: throughTo(widgetsPolicy(t, nil), up)}
	scanOnce(t, js, full)
	if !slices.Equal(full.asked, []string{id}) || up.creates != 0 {
		t.Fatalf("a scan without room asked for %v and sent %d creates; want it asked for the queued job, and nothing sent", full.asked, up.creates)
	}
	if st := mustStatus(t, js, id, token); st.State != JobQueued {
		t.Fatalf("after a scan without room: %s, want queued", st.State)
	}
	roomy := &scanRoom{t: t, through: full.through, max: 1}
	scanOnce(t, js, roomy)
	if len(roomy.ran) != 1 || roomy.ran[0] != nil {
		t.Fatalf("the scan with room ran %v, want the job once, to its end", roomy.ran)
	}
	st := mustStatus(t, js, id, token)
	if st.State != JobSucceeded || st.Done != 600 || st.Takeovers != 0 {
		t.Errorf("status %s, done %d, takeovers %d; want succeeded, 600, 0 (a queued job's first run is no takeover)", st.State, st.Done, st.Takeovers)
	}
	up.checkMadeOnce(t, 600)
	// An ended job is no longer active: the next scan asks for nothing.
	scanOnce(t, js, roomy)
	if len(roomy.asked) != 1 {
		t.Errorf("the scan after the end asked for %v, want nothing more", roomy.asked)
	}
}

// A job whose owner dies half-way (its renewals stop, it writes nothing
// more) is taken over by a scan once its lease record stood unchanged
// for a whole lease on the scanning process's clock, never before, and
// carried on from its log: each element made once, the items the dead
// owner had in flight resolved by their keys.
func TestJobScanTakesOverADeadOwner(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		const lease = 30 * time.Second
		js := NewJobs(newMemStorage(), NewLeases(lease), zap.NewNop())
		hj, token := startWidgets(t, js, 1000, false)
		id := hj.Record().ID
		// An upstream that honours Idempotency-Key: the creates the dead
		// owner had in flight are sent again with their keys.
		up := newWidgetsUpstream(true)
		pol := widgetsPolicy(t, func(s *policy.Settings) { s.IdempotentUpstream = true })
		up.onCreate = func(n int) {
			if n == 400 {
				hj.lease.end("the test killed its owner")
			}
		}
		_ = hj.Run(context.Background(), throughTo(pol, up), nil) // the lease lost: it stops, writing nothing
		up.onCreate = nil
		if st := mustStatus(t, js, id, token); st.State != JobRunning || st.Done >= 1000 {
			t.Fatalf("the dead owner left %s, done %d; want running, not done", st.State, st.Done)
		}
		r := &scanRoom{t: t, through: throughTo(pol, up), max: 1}
		scanOnce(t, js, r) // sees the lease record
		time.Sleep(lease / 2)
		scanOnce(t, js, r)
		if len(r.asked) != 0 {
			t.Fatalf("asked for room for %v within a lease of the owner's last renewal, want nothing", r.asked)
		}
		time.Sleep(lease/2 + time.Second)
		scanOnce(t, js, r)
		if len(r.ran) != 1 || r.ran[0] != nil {
			t.Fatalf("the scan a lease later ran %v, want the job once, to its end", r.ran)
		}
		st := mustStatus(t, js, id, token)
		if st.State != JobSucceeded || st.Done != 1000 || st.Succeeded != 1000 || st.Takeovers != 1 {
			t.Errorf("status %s, done %d, succeeded %d, takeovers %d; want succeeded, 1000, 1000, 1", st.State, st.Done, st.Succeeded, st.Takeovers)
		}
		indexes, _, lines := readResults(t, js, id, token)
		if !slices.Equal(indexes, upTo(1000)) {
			t.Errorf("results of %d items, want 0 to 999 in order", len(indexes))
		}
		for _, l := range lines {
			if l.Outcome != batch.Succeeded {
				t.Errorf("item %d: %s %d %s %s", l.Index, l.Outcome, l.Status, l.Error, l.Body)
			}
		}
		up.checkMadeOnce(t, 1000)
	})
}

// An owner that renews keeps its job however long it runs, and a paused
// job waits for its client's resume until its job_timeout, then a scan
// ends it as the deadline ends a job, sending nothing.
func TestJobScanLeavesWhatIsNotWaiting(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		ctx := context.Background()
		const lease = 30 * time.Second
		js := NewJobs(newMemStorage(), NewLeases(lease), zap.NewNop())
		up := newWidgetsUpstream(false)
		r := &scanRoom{t: t, through: throughTo(widgetsPolicy(t, nil), up), max: 10}
		running, _ := startWidgets(t, js, 10, false)
		paused, token := startWidgets(t, js, 10, false)
		if err := paused.WriteProgress(ctx, JobProgress{State: JobPaused, Reason: "the test paused it", Started: now().UTC()}); err != nil {
			t.Fatal(err)
		}
		if err := paused.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for range 12 {
			scanOnce(t, js, r)
			time.Sleep(lease / 4)
		}
		if len(r.asked) != 0 || up.creates != 0 {
			t.Fatalf("over 3 leases, asked for room for %v and sent %d creates; want nothing: one job renews, one is paused", r.asked, up.creates)
		}
		time.Sleep(time.Until(paused.Record().Deadline) + time.Second)
		scanOnce(t, js, r)
		if len(r.asked) != 0 {
			t.Fatalf("past the paused job's deadline, asked for room for %v; want nothing: it ends, nothing sent (the running one is %s)", r.asked, running.Record().ID)
		}
		if st := mustStatus(t, js, paused.Record().ID, token); st.State != JobFailed || st.Done != 0 || up.creates != 0 {
			t.Errorf("the paused job past its deadline: %s, done %d, %d creates sent; want failed, nothing sent", st.State, st.Done, up.creates)
		}
	})
}
