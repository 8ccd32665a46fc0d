package durable

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
)

// The start's traceparent is kept in the job's record, for the run of
// an instance that takes the job over to link to; and the progress a
// run stored last is what its span's end says.
func TestJobKeepsItsStartTrace(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		st, err := js.Stage(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Chunk(ctx, 0, widgetItems(0, 2)); err != nil {
			t.Fatal(err)
		}
		rec := widgetsJob(2, goldenClient)
		const start = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		rec.StartTrace = start
		hj, _, err := js.Register(ctx, st, rec, http.Header{"Authorization": {"Bearer x"}}, Quota{PerClient: 2, Queued: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := hj.Stored(); ok {
			t.Error("a run that stored no progress has one")
		}
		p := JobProgress{State: JobRunning, Started: now(), Cursor: 1, Done: 1, Succeeded: 1}
		if err := hj.WriteProgress(ctx, p); err != nil {
			t.Fatal(err)
		}
		if got, ok := hj.Stored(); !ok || got.Done != 1 || got.State != JobRunning {
			t.Errorf("Stored = %+v, %v; want the progress just stored", got, ok)
		}
		if err := hj.Release(ctx); err != nil {
			t.Fatal(err)
		}
		next, err := js.ClaimReleased(ctx, rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		keepHeld(t, next)
		if got := next.Record().StartTrace; got != start {
			t.Errorf("the record read back keeps start_trace %q, want %q", got, start)
		}
	})
}
