package durable

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// throughLocked is throughTo with item locks: the handler's, shared by
// every window and by the test's other writers.
func throughLocked(pol *policy.Policy, up batch.Sender, locks itemlock.Locker) Through {
	return func(_ context.Context, _ *JobRecord, _ http.Header, work func(batch.Site) error) error {
		return work(batch.Site{Runtime: batch.Runtime{Send: up, Locks: locks}, Lookup: pol.Lookup})
	}
}

// checkNothingLeft fails unless the upstream holds no item.
func (u *widgetsUpstream) checkNothingLeft(t *testing.T) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.items) != 0 {
		t.Errorf("the upstream holds %d items after the undo, want none", len(u.items))
	}
}

// An all-or-nothing job whose item fails in its fourth window is undone
// whole: every item it created is deleted, the last window's first,
// and it ends rolled_back, its results saying what became of each item.
func TestAtomicJobFailingIsUndoneWhole(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 1000, true, "all_or_nothing")
	up := newWidgetsUpstream(false)
	up.refuse = "w800" // in the window from 768
	if err := hj.Run(context.Background(), throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	up.checkNothingLeft(t)
	id := hj.Record().ID
	st := mustStatus(t, js, id, token)
	if st.State != JobRolledBack || st.Outcome != JobRolledBack || !strings.Contains(st.Reason, "item 800 failed") {
		t.Errorf("status %s (%s), reason %q; want rolled_back, naming item 800", st.State, st.Outcome, st.Reason)
	}
	_, _, lines := readResults(t, js, id, token)
	outcomes := map[batch.Outcome]int{}
	for _, l := range lines {
		outcomes[l.Outcome]++
	}
	if outcomes[batch.Failed] != 1 || outcomes[batch.RolledBack] < 800 || outcomes[batch.Succeeded] != 0 || outcomes[batch.RollbackFailed] != 0 {
		t.Errorf("results %v; want one failed, every item created before it rolled_back, none succeeded or left", outcomes)
	}
	// The last window is undone first: the deletes of 768's window come
	// before those of 0's.
	up.mu.Lock()
	deleted := slices.Clone(up.deleted)
	up.mu.Unlock()
	if len(deleted) < 800 || slices.Index(deleted, "e770") > slices.Index(deleted, "e10") {
		t.Errorf("%d deletes, e770 at %d and e10 at %d; want every create undone, the later window first",
			len(deleted), slices.Index(deleted, "e770"), slices.Index(deleted, "e10"))
	}
	if keys, _ := js.storage.List(context.Background(), logDir(id, 0), true); len(keys) != 0 {
		t.Errorf("the windows' logs are kept after a rollback that left nothing: %v", keys[:min(3, len(keys))])
	}
}

// An all-or-nothing job whose every item succeeds ends succeeded, and
// keeps its items locked from the window that wrote them to its end:
// a single write of an item of its first window waits while the job
// runs its later ones.
func TestAtomicJobHoldsItsLocksToItsEnd(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 600, true, "all_or_nothing")
	pol := widgetsPolicy(t, nil)
	locks := &itemlock.Local{}
	key := lockKey(t, pol, "e5")
	up := newWidgetsUpstream(false)
	var heldMidJob error
	up.onCreate = func(n int) {
		if n == 550 {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			unlock, err := locks.Lock(ctx, key)
			if err == nil {
				unlock()
			}
			heldMidJob = err
		}
	}
	if err := hj.Run(context.Background(), throughLocked(pol, up, locks), nil); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(heldMidJob, itemlock.ErrLocked) {
		t.Errorf("locking item e5 (first window) while the job ran its third: %v, want it locked", heldMidJob)
	}
	if st := mustStatus(t, js, hj.Record().ID, token); st.State != JobSucceeded || st.Succeeded != 600 {
		t.Errorf("status %s, succeeded %d; want succeeded, 600", st.State, st.Succeeded)
	}
	unlock, err := locks.Lock(context.Background(), key)
	if err != nil {
		t.Fatalf("item e5 after the job ended: %v, want its lock free", err)
	}
	unlock()
	up.checkMadeOnce(t, 600)
}

// lockKey is the lock key of widget id.
func lockKey(t *testing.T, pol *policy.Policy, id string) string {
	t.Helper()
	keys, err := batch.WindowKeys(&batch.Snapshot{Version: batch.SnapshotVersion, Op: "create", Path: "/widgets", Items: []batch.ItemSnapshot{{ID: id}}}, pol.Lookup)
	if err != nil || len(keys) != 1 {
		t.Fatalf("the lock key of %s: %v %v", id, keys, err)
	}
	return keys[0]
}

// A cancel undoes an all-or-nothing job: it ends rolled_back, nothing
// it created left.
func TestAtomicJobCancelledIsUndone(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		js := NewJobs(newMemStorage(), NewLeases(30*time.Second), zap.NewNop())
		hj, token := startWidgetsAs(t, js, 1000, true, "all_or_nothing")
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		up.onCreate = func(n int) {
			if n == 300 {
				if _, err := js.Cancel(context.Background(), id, token, "client"); err != nil {
					t.Error(err)
				}
			}
			time.Sleep(time.Second)
		}
		if err := hj.Run(context.Background(), throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{}), nil); err != nil {
			t.Fatal(err)
		}
		st := mustStatus(t, js, id, token)
		if st.State != JobRolledBack || !strings.Contains(st.Reason, "cancelled") || st.Succeeded != 0 {
			t.Errorf("status %s, reason %q, succeeded %d; want rolled_back for the cancel, nothing standing", st.State, st.Reason, st.Succeeded)
		}
		up.checkNothingLeft(t)
	})
}

// An owner that loses the job while it undoes it writes nothing more;
// the instance that claims it goes on with the undo where the progress
// says, its locks taken again first, and the job ends rolled_back with
// nothing left: no window is undone twice, and none is carried forward.
func TestAtomicJobUndoTakenOver(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 1000, true, "all_or_nothing")
	id := hj.Record().ID
	pol, locks := widgetsPolicy(t, nil), &itemlock.Local{}
	up := newWidgetsUpstream(false)
	up.refuse = "w900"
	lose := &deleteHook{up: up, at: 400, do: func() {
		if err := hj.Release(ctx); err != nil {
			t.Error(err)
		}
	}}
	var lost *batch.LeaseLost
	if err := hj.Run(ctx, throughLocked(pol, lose, locks), nil); !errors.As(err, &lost) {
		t.Fatalf("the owner that lost the job mid-undo: Run = %v, want its lease lost", err)
	}
	p, err := loadProgress(t, js, id)
	if err != nil || !p.Undoing || p.UndoNext < 0 || p.UndoNext >= 768 {
		t.Fatalf("progress after the loss: %+v, %v; want undoing, a window before the failing one next", p, err)
	}
	next := claimReleased(t, js, id)
	creates := up.creates
	// The claimant's process, a lock table of its own: as it undoes
	// its first window, the items of the windows its undo has not
	// reached are locked already, so that no single write through the
	// gateway slips in before their undo.
	claimant := &itemlock.Local{}
	var heldMidUndo error
	first := &deleteHook{up: up, at: 1, do: func() {
		lctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		unlock, err := claimant.Lock(lctx, lockKey(t, pol, "e5"))
		if err == nil {
			unlock()
			err = fmt.Errorf("free")
		}
		heldMidUndo = err
	}}
	if err := next.Run(ctx, throughLocked(pol, first, claimant), nil); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(heldMidUndo, itemlock.ErrLocked) {
		t.Errorf("item e5, in the job's first window, as the claimant undid a later one: %v, want it locked", heldMidUndo)
	}
	if up.creates != creates {
		t.Errorf("the claimant sent %d creates, want none: the job was being undone", up.creates-creates)
	}
	up.checkNothingLeft(t)
	st := mustStatus(t, js, id, token)
	if st.State != JobRolledBack || st.Takeovers != 1 {
		t.Errorf("status %s, takeovers %d; want rolled_back, taken over once", st.State, st.Takeovers)
	}
	_, _, lines := readResults(t, js, id, token)
	for _, l := range lines {
		if l.Outcome == batch.Succeeded || l.Outcome == batch.RollbackFailed {
			t.Fatalf("result %+v after the undo, want none standing or left", l)
		}
	}
}

// deleteHook is an upstream that runs do before its at'th DELETE.
type deleteHook struct {
	up *widgetsUpstream
	at int
	n  int
	do func()
}

func (h *deleteHook) Send(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
	if req.Method == http.MethodDelete {
		h.up.mu.Lock()
		h.n++
		n := h.n
		h.up.mu.Unlock()
		if n == h.at {
			h.do()
		}
	}
	return h.up.Send(ctx, req)
}

func loadProgress(t *testing.T, js *Jobs, id string) (JobProgress, error) {
	t.Helper()
	rec, err := readJob(context.Background(), js.storage, id)
	if err != nil {
		return JobProgress{}, err
	}
	v, err := viewJob(context.Background(), js.storage, rec)
	if err != nil {
		return JobProgress{}, err
	}
	return v.progress, nil
}

// An owner lost going forward: the claimant locks again every item the
// job wrote before it carries the job on, so that a writer through the
// gateway waits for the job's end there too; the job succeeds, each
// element made once.
func TestAtomicJobCarriedOnLocksAgain(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 1000, true, "all_or_nothing")
	id := hj.Record().ID
	pol := widgetsPolicy(t, nil)
	up := newWidgetsUpstream(false)
	up.onCreate = func(n int) {
		if n == 400 {
			if err := hj.Release(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	var lost *batch.LeaseLost
	if err := hj.Run(ctx, throughLocked(pol, up, &itemlock.Local{}), nil); !errors.As(err, &lost) {
		t.Fatalf("Run = %v, want its lease lost", err)
	}
	// The claimant's process: a table of its own (the old owner's
	// process died, its locks with it).
	locks := &itemlock.Local{}
	key := lockKey(t, pol, "e5")
	var heldMidJob error
	var once sync.Once
	up.onCreate = func(n int) {
		if n == 700 {
			once.Do(func() {
				lctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				unlock, err := locks.Lock(lctx, key)
				if err == nil {
					unlock()
					err = fmt.Errorf("free")
				}
				heldMidJob = err
			})
		}
	}
	next := claimReleased(t, js, id)
	if err := next.Run(ctx, throughLocked(pol, up, locks), nil); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(heldMidJob, itemlock.ErrLocked) {
		t.Errorf("item e5, written by the first owner, while the claimant ran: %v, want it locked", heldMidJob)
	}
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Succeeded != 1000 {
		t.Errorf("status %s, succeeded %d; want succeeded, 1000", st.State, st.Succeeded)
	}
	up.checkMadeOnce(t, 1000)
}

// An item another writer changed after the job created it is not
// deleted by the undo: the job ends rollback_failed, that item's result
// says why, the rest are undone, and the windows' logs (with what an
// operator needs to repair it) stay with the job.
func TestAtomicJobUndoLeavesAnotherWritersItem(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 300, true, "all_or_nothing")
	up := newWidgetsUpstream(false)
	up.refuse = "w290"
	up.onCreate = func(n int) {
		if n == 200 {
			up.mu.Lock()
			up.items["e3"] = []byte(`{"id":"e3","name":"changed by another"}`)
			up.mu.Unlock()
		}
	}
	if err := hj.Run(context.Background(), throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	id := hj.Record().ID
	st := mustStatus(t, js, id, token)
	if st.State != JobRollbackFailed || !strings.Contains(st.Reason, "1 of its items could not be undone") {
		t.Errorf("status %s, reason %q; want rollback_failed, one item left", st.State, st.Reason)
	}
	up.mu.Lock()
	left := len(up.items)
	_, kept := up.items["e3"]
	up.mu.Unlock()
	if left != 1 || !kept {
		t.Errorf("the upstream holds %d items (e3 among them: %v), want only the one another writer changed", left, kept)
	}
	_, _, lines := readResults(t, js, id, token)
	if l := lines[3]; l.Outcome != batch.RollbackFailed || l.Compensation == nil {
		t.Errorf("item 3's result %+v, want rollback_failed with why", l)
	}
	if keys, _ := js.storage.List(context.Background(), logDir(id, 0), true); len(keys) == 0 {
		t.Error("the windows' logs are gone, want them kept with the job that left an item")
	}
}

// A paused all-or-nothing job has writes to undo, which only a run
// sends: a cancel marks it and leaves it paused, and the next scan
// claims it and undoes it; so does one past its job_timeout, resumed
// too late or not.
func TestAtomicJobPausedIsUndoneByAScan(t *testing.T) {
	for _, c := range []struct {
		name   string
		end    func(t *testing.T, js *Jobs, hj *HeldJob, token string)
		reason string
	}{
		{name: "cancelled", reason: "cancelled", end: func(t *testing.T, js *Jobs, hj *HeldJob, token string) {
			st, err := js.Cancel(context.Background(), hj.Record().ID, token, "client")
			if err != nil || st.Ended != nil {
				t.Fatalf("cancel of the paused job: %+v, %v; want it marked, not ended", st, err)
			}
		}},
		{name: "past its job_timeout", reason: "job_timeout passed", end: func(t *testing.T, js *Jobs, hj *HeldJob, token string) {
			time.Sleep(time.Until(hj.Record().Deadline) + time.Second)
		}},
		// Its client's resume comes too late: it leaves the job to the
		// scan, whose run has the routes its undo takes (ending it in
		// place once dereferenced routes it had not).
		{name: "resumed past its job_timeout", reason: "job_timeout passed", end: func(t *testing.T, js *Jobs, hj *HeldJob, token string) {
			time.Sleep(time.Until(hj.Record().Deadline) + time.Second)
			if _, err := js.Resume(context.Background(), hj.Record().ID, token, nil); !errors.Is(err, ErrJobNotPaused) {
				t.Fatalf("Resume past the deadline: %v, want ErrJobNotPaused", err)
			}
			if st := mustStatus(t, js, hj.Record().ID, token); st.State != JobPaused {
				t.Fatalf("after the resume past the deadline: %s, want paused, for a scan to undo", st.State)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				defer endHeld(t)
				ctx := context.Background()
				js := NewJobs(newMemStorage(), NewLeases(30*time.Second), zap.NewNop())
				hj, token := startWidgetsAs(t, js, 300, true, "all_or_nothing")
				id := hj.Record().ID
				up := newExpiringUpstream(func(n int, auth string) bool { return n == 280 })
				through := throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{})
				if err := hj.Run(ctx, through, nil); err != nil {
					t.Fatal(err)
				}
				if st := mustStatus(t, js, id, token); st.State != JobPaused {
					t.Fatalf("after the refusal: %s, want paused", st.State)
				}
				c.end(t, js, hj, token)
				scanOnce(t, js, &scanRoom{t: t, through: through, max: 1})
				st := mustStatus(t, js, id, token)
				if st.State != JobRolledBack || !strings.Contains(st.Reason, c.reason) {
					t.Errorf("after the scan: %s, reason %q; want rolled_back for %s", st.State, st.Reason, c.reason)
				}
				up.checkNothingLeft(t)
			})
		})
	}
}

// An all-or-nothing job whose first item, run by its start, fails is to
// be undone whoever runs it, and ends rolled_back: queued, then
// cancelled, it is not ended at once as a queued job that did nothing
// is (its counts start again at nothing as its undo begins), but by
// the scan that claims it.
func TestAtomicJobFailingAtItsStartIsUndoneFromTheQueue(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 300, true, "all_or_nothing")
	id := hj.Record().ID
	up := newWidgetsUpstream(false)
	up.refuse = "w0"
	through := throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{})
	if _, err := hj.RunFirst(ctx, through); err != nil {
		t.Fatal(err)
	}
	if err := hj.Queue(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := js.Cancel(ctx, id, token, "client")
	if err != nil || st.Ended != nil {
		t.Fatalf("cancel of the queued job being undone: %+v, %v; want it left to a run", st, err)
	}
	scanOnce(t, js, &scanRoom{t: t, through: through, max: 1})
	st = mustStatus(t, js, id, token)
	if st.State != JobRolledBack || !strings.Contains(st.Reason, "item 0 failed") {
		t.Errorf("status %s, reason %q; want rolled_back for item 0", st.State, st.Reason)
	}
	if up.creates != 1 {
		t.Errorf("%d creates sent, want the first item's alone", up.creates)
	}
}

// The Finished hook hears each window an undo ends, its items as the
// undo left them: the items metric counts what was rolled back.
func TestAtomicJobHooksHearTheUndo(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	var mu sync.Mutex
	outcomes := map[batch.Outcome]int{}
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop()).WithHooks(JobHooks{
		Finished: func(items []batch.ItemResult) {
			mu.Lock()
			defer mu.Unlock()
			for _, it := range items {
				outcomes[it.Outcome]++
			}
		},
	})
	hj, _ := startWidgetsAs(t, js, 300, true, "all_or_nothing")
	up := newWidgetsUpstream(false)
	up.refuse = "w280"
	if err := hj.Run(context.Background(), throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if outcomes[batch.Succeeded] != 256 || outcomes[batch.RolledBack] < 280 || outcomes[batch.Failed] != 1 {
		t.Errorf("the Finished hook heard %v; want the first window's 256 succeeded, then every item made rolled_back, the one that failed", outcomes)
	}
}

// losableLocks is a lock table whose locks may be lost while held, as
// storage locks are (leases): lose marks one so.
type losableLocks struct {
	itemlock.Local
	mu   sync.Mutex
	lost map[string]bool
}

func (l *losableLocks) lose(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost == nil {
		l.lost = map[string]bool{}
	}
	l.lost[key] = true
}

func (l *losableLocks) Lost(keys func() []string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys() {
		if l.lost[k] {
			return fmt.Errorf("%s: its refresh failed", k)
		}
	}
	return nil
}

// An item lock an all-or-nothing job holds in storage is a lease too:
// one lost (its refresh failed), whichever window took it, is the job's
// lease lost. The owner sends no write after the ones already past
// their fence, and the job is carried on by the instance whose scan
// takes it over once its lease lapsed, which takes the locks again: it
// succeeds, each element made once.
func TestAtomicJobLostItemLockIsALostLease(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		const lease = 30 * time.Second
		js := NewJobs(newMemStorage(), NewLeases(lease), zap.NewNop())
		hj, token := startWidgetsAs(t, js, 1000, true, "all_or_nothing")
		id := hj.Record().ID
		pol := widgetsPolicy(t, nil)
		up := newWidgetsUpstream(false)
		locks := &losableLocks{}
		up.onCreate = func(n int) {
			if n == 400 {
				locks.lose(lockKey(t, pol, "e5")) // taken by the job's first window
			}
		}
		var lost *batch.LeaseLost
		if err := hj.Run(context.Background(), throughLocked(pol, up, locks), nil); !errors.As(err, &lost) || !strings.Contains(lost.Why, "item lock") {
			t.Fatalf("Run = %v, want the lease lost for the item lock", err)
		}
		up.onCreate = nil
		if up.creates > 400+16 {
			t.Errorf("%d creates sent, the lock lost at the 400th: the owner went on writing", up.creates)
		}
		r := &scanRoom{t: t, through: throughLocked(pol, up, &itemlock.Local{}), max: 1}
		scanOnce(t, js, r) // sees the lease record
		time.Sleep(lease + time.Second)
		scanOnce(t, js, r)
		if len(r.ran) != 1 || r.ran[0] != nil {
			t.Fatalf("the scan a lease later ran %v, want the job once, to its end", r.ran)
		}
		if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Succeeded != 1000 || st.Takeovers != 1 {
			t.Errorf("status %s, succeeded %d, takeovers %d; want succeeded, 1000, 1", st.State, st.Succeeded, st.Takeovers)
		}
		up.checkMadeOnce(t, 1000)
	})
}

// A queued all-or-nothing job whose start's first write landed but
// whose results could not be stored (the storage refused them for a
// whole lease) counts nothing done, and still has that write to undo:
// its cancel leaves it to a run, which undoes it and ends it
// rolled_back, not cancelled with the write standing.
func TestAtomicJobQueuedWithAnUncountedWriteIsUndoneOnCancel(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		ctx := context.Background()
		s := newFaulty()
		js := NewJobs(s, NewLeases(30*time.Second), zap.NewNop())
		hj, token := startWidgetsAs(t, js, 300, true, "all_or_nothing")
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		through := throughLocked(widgetsPolicy(t, nil), up, &itemlock.Local{})
		s.setHook(func(_ context.Context, op, key string) error {
			if op == "store" && strings.Contains(key, "/"+resultsName+"/") {
				return errors.New("READONLY")
			}
			return nil
		})
		if _, err := hj.RunFirst(ctx, through); err == nil {
			t.Fatal("RunFirst with its results refused: no error")
		}
		s.setHook(nil)
		if up.creates != 1 {
			t.Fatalf("%d creates sent by the start, want its first item's", up.creates)
		}
		if err := hj.Queue(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := js.Cancel(ctx, id, token, "client")
		if err != nil || st.Ended != nil || st.Done != 0 {
			t.Fatalf("cancel of the queued job: %+v, %v; want it left to a run, nothing counted done", st, err)
		}
		scanOnce(t, js, &scanRoom{t: t, through: through, max: 1})
		if st := mustStatus(t, js, id, token); st.State != JobRolledBack {
			t.Errorf("after the scan: %s (%s), want rolled_back", st.State, st.Reason)
		}
		up.checkNothingLeft(t)
	})
}
