package batchapp

import (
	"context"
	"testing"

	"github.com/caddy-batch/caddy-batch/batch"
)

// TestRecoveryOffer checks the recovery's side of the call: the first
// Finisher offered runs before Offer returns and its answer is the
// recovery's; a handler reached again from inside it, as by the saga's
// own sub-requests, is refused and runs nothing.
func TestRecoveryOffer(t *testing.T) {
	t.Parallel()
	want := &batch.Result{Outcome: batch.RolledBack}
	var got *batch.Result
	rc := &Recovery{job: Job{Snap: &batch.Snapshot{Path: "/widgets"}}, call: func(finish Finisher) { got, _ = finish() }}
	ctx := context.WithValue(context.Background(), recoveryCtxKey, rc)

	// serve is a batch handler that serves the saga's resource.
	var serve func(ctx context.Context) (offered bool)
	inner := false
	serve = func(ctx context.Context) bool {
		rc, ok := RecoveryOf(ctx)
		if !ok || rc.Job().Snap.Path != "/widgets" {
			t.Fatalf("RecoveryOf = %v, %v; want the saga on /widgets", rc, ok)
		}
		return rc.Offer(func() (*batch.Result, error) {
			inner = serve(ctx) // a sub-request reaching a batch handler
			return want, nil
		})
	}
	if !serve(ctx) {
		t.Fatal("the first offer was refused")
	}
	if inner {
		t.Error("an offer from inside the running Finisher was taken")
	}
	if got != want {
		t.Errorf("the recovery answered %v, want the Finisher's %v", got, want)
	}
	if _, ok := RecoveryOf(context.Background()); ok {
		t.Error("RecoveryOf found a recovery in a client's context")
	}
}
