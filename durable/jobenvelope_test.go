package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// widgetsEnvelope is the envelope /batch over the /widgets resource,
// whose updates an undo puts back by PATCH.
func widgetsEnvelope(t *testing.T, atomicity policy.Atomicity, mod func(*policy.Settings)) (*policy.Policy, *batch.Envelope) {
	pol := widgetsPolicy(t, func(s *policy.Settings) {
		s.RestoreUpdated = policy.RestorePatch
		if mod != nil {
			mod(s)
		}
	})
	m, _ := pol.Lookup("/widgets")
	s := m.Resource.Settings
	return pol, &batch.Envelope{Path: "/batch", Settings: s, Atomicity: atomicity, Lookup: pol.Lookup}
}

// throughEnvelope is throughLocked with the envelope.
func throughEnvelope(pol *policy.Policy, env *batch.Envelope, up batch.Sender, locks itemlock.Locker) Through {
	return func(_ context.Context, _ *JobRecord, _ http.Header, work func(batch.Site) error) error {
		return work(batch.Site{Runtime: batch.Runtime{Send: up, Locks: locks}, Lookup: pol.Lookup, Envelope: env})
	}
}

// creatingThenPatching is an envelope job of n creates, c0 to c<n-1>,
// then n patches, each of the widget a create made by a reference
// ($c<i>) and naming it by a member of that create's answer: the
// patches of the second and third windows reference creates of the
// windows before theirs.
func creatingThenPatching(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id":"c%d","method":"POST","url":"/widgets","body":{"name":"w%d"}}`+"\n", i, i)
	}
	for i := range n {
		fmt.Fprintf(&b, `{"id":"p%d","method":"PATCH","url":"/widgets/$c%d","body":{"color":"blue","was":"$c%d#/name"}}`+"\n", i, i, i)
	}
	return b.String()
}

// startEnvelopeJob admits body as an envelope job on env, its input
// staged as the start stages it, and registers it.
func startEnvelopeJob(t *testing.T, js *Jobs, env *batch.Envelope, body string) (*HeldJob, string) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stage(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/batch", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/x-ndjson")
	lim := batch.JobLimits{MaxItems: 100000, MaxAtomic: 5000, MaxBody: 64 << 20, MaxElement: 1 << 20}
	plan, prob, err := batch.AdmitEnvelopeJob(r, env, lim, func(first int, items []batch.ItemSnapshot) error {
		return st.Chunk(ctx, first, items)
	})
	if err != nil || prob != nil {
		t.Fatalf("admitting the envelope job: %v %+v", err, prob)
	}
	rec := widgetsJob(plan.Items, goldenClient)
	rec.Op, rec.Path, rec.Resource, rec.Query, rec.Atomicity = "envelope", "/batch", "/batch", plan.Spec.Query, plan.Atomicity.String()
	hj, token, err := js.Register(ctx, st, rec, http.Header{"Authorization": {"Bearer golden"}}, roomy)
	if err != nil {
		t.Fatal(err)
	}
	keepHeld(t, hj)
	return hj, token
}

// A partial envelope job's operations fill their references from
// operations windows before theirs: every widget created once (the
// first, by the start, before the rest), then patched with what its
// create answered.
func TestEnvelopeJobReferencesAcrossWindows(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	pol, env := widgetsEnvelope(t, policy.Partial, nil)
	hj, token := startEnvelopeJob(t, js, env, creatingThenPatching(300))
	up := newWidgetsUpstream(false)
	through := throughEnvelope(pol, env, up, &itemlock.Local{})
	if _, err := hj.RunFirst(context.Background(), through); err != nil {
		t.Fatal(err)
	}
	if err := hj.Run(context.Background(), through, nil); err != nil {
		t.Fatal(err)
	}
	up.checkMadeOnce(t, 300)
	st := mustStatus(t, js, hj.Record().ID, token)
	if st.State != JobSucceeded || st.Succeeded != 600 {
		t.Fatalf("status %s, succeeded %d, reason %q; want succeeded, 600", st.State, st.Succeeded, st.Reason)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for id, b := range up.items {
		var w map[string]any
		_ = json.Unmarshal(b, &w)
		if w["color"] != "blue" || w["was"] != w["name"] {
			t.Fatalf("widget %s reads %s, want it patched blue with its own name", id, b)
		}
	}
	if len(up.items) != 300 {
		t.Errorf("%d widgets, want 300", len(up.items))
	}
	_, _, lines := readResults(t, js, hj.Record().ID, token)
	if l := lines[599]; l.OperationID != "p299" || l.Method != "PATCH" || !strings.HasPrefix(l.URL, "/widgets/") {
		t.Errorf("the last result %+v, want p299's PATCH with its filled url", l)
	}
}

// An all-or-nothing envelope job whose operation fails in its last
// window is undone whole, across windows: nothing it created or
// changed is left.
func TestEnvelopeJobAllOrNothingUndone(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	pol, env := widgetsEnvelope(t, policy.AllOrNothing, nil)
	hj, token := startEnvelopeJob(t, js, env, creatingThenPatching(300))
	up := newWidgetsUpstream(false)
	up.refuse = `"was":"w250"` // p250, in the third window
	if err := hj.Run(context.Background(), throughEnvelope(pol, env, up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	st := mustStatus(t, js, hj.Record().ID, token)
	if st.State != JobRolledBack || !strings.Contains(st.Reason, "item 550") {
		t.Errorf("status %s, reason %q; want rolled_back, naming item 550 (p250)", st.State, st.Reason)
	}
	up.checkNothingLeft(t)
}

// An envelope job carried on by another owner mid-window keeps what
// the window's operations did, and fills the rest from the operations
// before it: each widget made once.
func TestEnvelopeJobCarriedOn(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	pol, env := widgetsEnvelope(t, policy.Partial, func(s *policy.Settings) { s.IdempotentUpstream = true })
	hj, token := startEnvelopeJob(t, js, env, creatingThenPatching(300))
	id := hj.Record().ID
	up := newWidgetsUpstream(true)
	up.onCreate = func(n int) {
		if n == 280 { // mid second window
			if err := hj.Release(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	var lost *batch.LeaseLost
	if err := hj.Run(ctx, throughEnvelope(pol, env, up, &itemlock.Local{}), nil); !errors.As(err, &lost) {
		t.Fatalf("Run = %v, want its lease lost", err)
	}
	up.onCreate = nil
	next := claimReleased(t, js, id)
	if err := next.Run(ctx, throughEnvelope(pol, env, up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Succeeded != 600 {
		t.Errorf("status %s, succeeded %d, reason %q; want succeeded, 600", st.State, st.Succeeded, st.Reason)
	}
	up.checkMadeOnce(t, 300)
}
