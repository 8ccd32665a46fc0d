package durable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// One store of a window's log that fails (a single blip of one call),
// the lease proven meanwhile: the writes waiting for that store are not
// sent, and are recorded so (Unsent); the window runs again and sends
// them, each once, and the job ends succeeded. They were recorded as
// failed 503, and the run again took them for settled.
func TestJobOneLogStoreFailing(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		a := newJobInstance("A", newMemStorage())
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		failOneLogStore(a, 100)
		if err := hj.Run(context.Background(), a.through(t, up), nil); err != nil {
			t.Fatalf("Run: %v", err)
		}
		st := mustStatus(t, a.js, id, token)
		if st.State != JobSucceeded || st.Done != jobFaultItems || st.Succeeded != jobFaultItems {
			t.Errorf("status %s, done %d, succeeded %d, failed %d; want succeeded, %d, %d", st.State, st.Done, st.Succeeded, st.Failed, jobFaultItems, jobFaultItems)
		}
		indexes, _, lines := readResults(t, a.js, id, token)
		if !slices.Equal(indexes, upTo(jobFaultItems)) {
			t.Errorf("results of %d items, want 0 to %d in order", len(indexes), jobFaultItems-1)
		}
		for _, l := range lines {
			if l.Outcome != "succeeded" {
				t.Errorf("result %d: %s %d %q", l.Index, l.Outcome, l.Status, l.Error)
			}
		}
		sends := map[string]int{}
		for _, c := range a.sentFrom(time.Time{}) {
			sends[c.name]++
		}
		for i := range jobFaultItems {
			if n := sends[fmt.Sprintf("w%d", i)]; n != 1 {
				t.Errorf("element %d sent %d times, want once", i, n)
			}
		}
	})
}

// The same, all-or-nothing: one failed store of a window's log does not
// undo the job (its window ran again and found those writes failed).
func TestAtomicJobOneLogStoreFailing(t *testing.T) {
	t.Parallel()
	for _, op := range []aonOp{aonCreate, aonUpdate} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			t.Parallel()
			bubble(t, func(t *testing.T) {
				defer endHeld(t)
				a := newAONInstance("A", newMemStorage(), &apiLog{})
				hj, token, id, up := op.start(t, a, "")
				failOneLogStore(a.jobInstance, 100)
				if err := hj.Run(context.Background(), a.through(t, up), nil); err != nil {
					t.Fatalf("Run: %v", err)
				}
				st := mustStatus(t, a.js, id, token)
				if st.State != JobSucceeded || st.Succeeded != jobFaultItems {
					t.Errorf("status %s (%q), succeeded %d; want succeeded, %d", st.State, st.Reason, st.Succeeded, jobFaultItems)
				}
			})
		})
	}
}

// An all-or-nothing update job under idempotent_upstream. Owner A sends
// PATCHes whose answers never reach its log (its log's stores hang),
// then loses the job. Owner B carries the window on: each such write
// goes again with its key, unread (it may have landed), but B is handed
// over before all of them leave. Those that waited their turn keep A's
// record, unanswered: were they recorded "not sent", owner C would take
// A's new value for their pre-image, and when the job then fails its
// undo would put the new value back and say rolled_back. C carries on,
// fails at item 590 and undoes the job: every widget is as it was.
func TestAtomicJobResentWithItsKeyAndHandedOver(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		ctx := context.Background()
		s := &faulty{memStorage: newMemStorage()}
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		const n = 600
		up := newWidgetsUpstream(true)
		hj, token := startRenames(t, js, up, n)
		id := hj.Record().ID
		pol := widgetsPolicy(t, func(s *policy.Settings) { s.IdempotentUpstream = true; s.RestoreUpdated = policy.RestorePatch })

		// A: at its 300th PATCH its log stores hang; a moment later its lease
		// goes, then the stores land.
		unblock := make(chan struct{})
		hookA := &patchHook{up: up, at: 300, do: func() {
			s.setHook(func(_ context.Context, op, key string) error {
				if op == "store" && strings.Contains(key, "/"+logName+"/") {
					<-unblock
				}
				return nil
			})
			go func() {
				time.Sleep(300 * time.Millisecond)
				if err := hj.Release(ctx); err != nil {
					t.Error(err)
				}
				close(unblock)
			}()
		}}
		var lost *batch.LeaseLost
		if err := hj.Run(ctx, throughLocked(pol, hookA, &itemlock.Local{}), nil); !errors.As(err, &lost) {
			t.Fatalf("A: Run = %v, want its lease lost", err)
		}
		s.setHook(nil)
		up.mu.Lock()
		nA := 0
		for i := range n {
			if strings.Contains(string(up.items[fmt.Sprintf("e%d", i)]), "new") {
				nA++
			}
		}
		up.mu.Unlock()
		if nA == 0 || len(sendingRecordsUnder(t, s.memStorage, id)) == 0 {
			t.Fatalf("A changed %d widgets, its log holds %d writes being sent: want some of each", nA, len(sendingRecordsUnder(t, s.memStorage, id)))
		}

		// B: handed over as its first resend leaves.
		b := claimReleased(t, js, id)
		stop := make(chan struct{})
		var once sync.Once
		hookB := &patchHook{up: up, at: 1, do: func() { once.Do(func() { close(stop) }) }}
		if err := b.Run(ctx, throughLocked(pol, hookB, &itemlock.Local{}), stop); err != nil {
			t.Fatalf("B: %v", err)
		}

		// C: carries on, fails at item 590, undoes the job.
		up.refuse = "new590"
		c := claimReleased(t, js, id)
		if err := c.Run(ctx, throughLocked(pol, up, &itemlock.Local{}), nil); err != nil {
			t.Fatal(err)
		}
		status := mustStatus(t, js, id, token)
		up.mu.Lock()
		defer up.mu.Unlock()
		var changed []string
		for i := range n {
			k := fmt.Sprintf("e%d", i)
			if !strings.Contains(string(up.items[k]), fmt.Sprintf(`"old%d"`, i)) {
				changed = append(changed, k+"="+string(up.items[k]))
			}
		}
		if status.State != JobRolledBack || len(changed) > 0 {
			t.Errorf("the job ended %s (%s) with %d items still changed: %v; want rolled_back, none", status.State, status.Reason, len(changed), changed)
		}
	})
}

// failOneLogStore fails, as the instance sends its nth write, the next
// store of a window's log it makes, and that one only: a blip of one
// call, the lease proven all along.
func failOneLogStore(in *jobInstance, n int) {
	var failed atomic.Int32
	in.before = func(c int) {
		if c == n {
			in.setFault(func(_ context.Context, op, key string) error {
				if op == "store" && strings.Contains(key, "/"+logName+"/") && failed.Add(1) == 1 {
					return errors.New("connection reset")
				}
				return nil
			})
		}
	}
}
