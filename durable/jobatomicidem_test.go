package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// An all-or-nothing create job under idempotent_upstream whose owner
// lets the job go while creates are in flight: they take effect, their
// answers never recorded. The next owner sends each again with its key,
// and does not read its id first as a create's preflight does (the id
// exists: its own write made it): the job ends succeeded, each widget
// made once.
func TestAtomicJobCarriedOnUnderIdempotentUpstream(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgetsAs(t, js, 600, true, "all_or_nothing")
	id := hj.Record().ID
	pol := widgetsPolicy(t, func(s *policy.Settings) { s.IdempotentUpstream = true })
	up := newWidgetsUpstream(true)
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
	up.onCreate = nil
	next := claimReleased(t, js, id)
	if err := next.Run(ctx, throughLocked(pol, up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded {
		t.Fatalf("the job ended %s (%s), want succeeded", st.State, st.Reason)
	}
	up.checkMadeOnce(t, 600)
}

// patchHook runs do before the at'th PATCH.
type patchHook struct {
	up *widgetsUpstream
	at int
	n  int
	do func()
}

func (h *patchHook) Send(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
	if req.Method == "PATCH" {
		h.up.mu.Lock()
		h.n++
		n := h.n
		h.up.mu.Unlock()
		if n == h.at && h.do != nil {
			h.do()
		}
	}
	return h.up.Send(ctx, req)
}

// An all-or-nothing update job under idempotent_upstream, carried on
// after its owner let it go with PATCHes in flight, then failing in a
// later window: the writes sent again with their keys keep the
// pre-images their first owner read (a preflight now would read the
// item as the write left it, and the undo would put that back), so the
// undo puts every widget back as it was, and rolled_back is true.
func TestAtomicJobCarriedOnUnderIdempotentUpstreamThenUndone(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	const n = 600
	up := newWidgetsUpstream(true)
	hj, token := startRenames(t, js, up, n)
	id := hj.Record().ID
	pol := widgetsPolicy(t, func(s *policy.Settings) { s.IdempotentUpstream = true; s.RestoreUpdated = policy.RestorePatch })
	hook := &patchHook{up: up, at: 300, do: func() {
		if err := hj.Release(ctx); err != nil {
			t.Error(err)
		}
	}}
	var lost *batch.LeaseLost
	if err := hj.Run(ctx, throughLocked(pol, hook, &itemlock.Local{}), nil); !errors.As(err, &lost) {
		t.Fatalf("Run = %v, want its lease lost", err)
	}
	hook.do = nil
	up.refuse = "new590" // the job fails later, and is undone
	next := claimReleased(t, js, id)
	if err := next.Run(ctx, throughLocked(pol, up, &itemlock.Local{}), nil); err != nil {
		t.Fatal(err)
	}
	if status := mustStatus(t, js, id, token); status.State != JobRolledBack {
		t.Fatalf("the job ended %s (%s), want rolled_back", status.State, status.Reason)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	var changed []string
	for i := range n {
		k := fmt.Sprintf("e%d", i)
		if !strings.Contains(string(up.items[k]), fmt.Sprintf(`"old%d"`, i)) {
			changed = append(changed, k+"="+string(up.items[k]))
		}
	}
	if len(changed) > 0 {
		t.Errorf("the job says rolled_back but %d items are still changed: %v", len(changed), changed)
	}
}

// startRenames seeds up with the widgets e0 to e<n-1>, each named
// old<i>, and starts an all-or-nothing job renaming each new<i>.
func startRenames(t *testing.T, js *Jobs, up *widgetsUpstream, n int) (*HeldJob, string) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stage(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	items := make([]batch.ItemSnapshot, n)
	for i := range items {
		id := fmt.Sprintf("e%d", i)
		up.items[id] = []byte(fmt.Sprintf(`{"id":%q,"name":"old%d"}`, id, i))
		items[i] = batch.ItemSnapshot{ID: id, Element: json.RawMessage(fmt.Sprintf(`{"id":%q,"name":"new%d"}`, id, i)), Fields: []string{"name"}}
	}
	if err := st.Chunk(ctx, 0, items); err != nil {
		t.Fatal(err)
	}
	rec := widgetsJob(n, goldenClient)
	rec.Op, rec.Atomicity = "update", "all_or_nothing"
	hj, token, err := js.Register(ctx, st, rec, http.Header{"Authorization": {"Bearer golden"}}, roomy)
	if err != nil {
		t.Fatal(err)
	}
	keepHeld(t, hj)
	return hj, token
}
