package durable

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// A job queued after its first item ran at its start, and cancelled
// while it waits, is not ended by the cancel (its first write is to be
// undone, or shown): the instance that claims it must see the mark
// before it sends anything more, though the lease's first renewal, which
// lists the mark for a running job, comes a third of a lease later.
func TestQueuedJobCancelledIsSeenAtItsClaim(t *testing.T) {
	for _, tc := range []struct{ atomicity, want string }{
		{"all_or_nothing", JobRolledBack},
		{"partial", JobCancelled},
	} {
		t.Run(tc.atomicity, func(t *testing.T) {
			t.Parallel()
			defer endHeld(t)
			ctx := context.Background()
			js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
			hj, token := startWidgetsAs(t, js, 300, true, tc.atomicity)
			id := hj.Record().ID
			pol := widgetsPolicy(t, nil)
			up := newWidgetsUpstream(false)
			locks := &itemlock.Local{}
			if refused, err := hj.RunFirst(ctx, throughLocked(pol, up, locks)); err != nil || refused != nil {
				t.Fatalf("RunFirst: %v, refused %v", err, refused)
			}
			if err := hj.Queue(ctx); err != nil {
				t.Fatal(err)
			}
			if st, err := js.Cancel(ctx, id, token, "client"); err != nil || st.State != JobCancelling {
				t.Fatalf("cancel of the queued job: %+v, %v; want cancelling, its first item to be dealt with by a run", st, err)
			}
			next := claimReleased(t, js, id)
			if err := next.Run(ctx, throughLocked(pol, up, locks), nil); err != nil {
				t.Fatal(err)
			}
			st := mustStatus(t, js, id, token)
			up.mu.Lock()
			made := len(up.items)
			up.mu.Unlock()
			if st.State != tc.want || made > 1 {
				t.Errorf("the cancelled job ended %s with %d items done, %d standing at the upstream; want %s, nothing sent after the cancel",
					st.State, st.Done, made, tc.want)
			}
			if tc.want == JobRolledBack && made != 0 {
				t.Errorf("%d items stand after the rollback, want none", made)
			}
		})
	}
}
