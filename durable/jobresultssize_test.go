package durable

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// resultsSize checks that ResultsIf tells the size of a job's results
// before reading them, and reads no page when its reader says not to.
func resultsSize(t *testing.T, js *Jobs, id, token string) {
	t.Helper()
	ctx := context.Background()
	view, err := js.ResultsIf(ctx, id, token, func(ResultsView) bool { return false }, func([]byte) error {
		t.Error("a page was read for a reader that refused the results")
		return nil
	})
	if err != nil || view.Status == nil || view.Path == "" {
		t.Fatalf("ResultsIf = %+v, %v; want the status and the batch's path", view, err)
	}
	var read int64
	again, err := js.ResultsIf(ctx, id, token, func(ResultsView) bool { return true }, func(page []byte) error {
		read += int64(len(page))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if view.Bytes != read || again.Bytes != read {
		t.Errorf("the results were said to be %d bytes, and %d read", view.Bytes, read)
	}
}

// A job's stored progress knows its results' size, so a reader may
// refuse an answer too large before reading any of it.
func TestJobResultsSizeKnownBeforeReading(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 600, false)
	if err := hj.Run(context.Background(), throughTo(widgetsPolicy(t, nil), newWidgetsUpstream(false)), nil); err != nil {
		t.Fatal(err)
	}
	resultsSize(t, js, hj.Record().ID, token)
}

// Results stored before the progress that counts them (an owner lost
// between the two) are counted in the size by the owner that carries
// the job on.
func TestJobResultsSizeCarriedOn(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 300, false)
	id := hj.Record().ID
	if err := hj.AppendResults(ctx, 0, createdRange(0, 10)); err != nil {
		t.Fatal(err)
	}
	if err := hj.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := claimReleased(t, js, id)
	if err := next.Run(ctx, throughTo(widgetsPolicy(t, nil), newWidgetsUpstream(false)), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Done != 300 {
		t.Fatalf("status %s, done %d; want succeeded, 300", st.State, st.Done)
	}
	resultsSize(t, js, id, token)
}
