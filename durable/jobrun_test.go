package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

// widgetsUpstream is the legacy API of the driver's tests: /widgets,
// whose creates take the element's id or assign one, and which, with
// honorKeys, answers a create whose Idempotency-Key it saw as it
// answered it first, creating nothing.
type widgetsUpstream struct {
	honorKeys bool
	// onCreate, if set, runs before the n'th create (from 1) is carried
	// out, outside the lock.
	onCreate func(n int)

	mu      sync.Mutex
	creates int // creates received, resent ones too
	reads   int
	byKey   map[string]*batch.SubResponse
	items   map[string][]byte
	made    map[string]int // how many items each element's name made
	nextID  int
	// unauthorized counts creates without the job's Authorization.
	unauthorized int
	// refuse names the element a create of is answered 422; deleted
	// are the ids deletes named, in order.
	refuse  string
	deleted []string
}

func newWidgetsUpstream(honorKeys bool) *widgetsUpstream {
	return &widgetsUpstream{honorKeys: honorKeys, byKey: map[string]*batch.SubResponse{}, items: map[string][]byte{}, made: map[string]int{}, nextID: 100000}
}

func (u *widgetsUpstream) Send(_ context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
	switch {
	case req.Method == http.MethodPost && req.Path == "/widgets":
		u.mu.Lock()
		u.creates++
		n := u.creates
		if req.Header.Get("Authorization") != "Bearer golden" {
			u.unauthorized++
		}
		u.mu.Unlock()
		if u.onCreate != nil {
			u.onCreate(n)
		}
		return u.create(req), nil
	case req.Method == http.MethodDelete && strings.HasPrefix(req.Path, "/widgets/"):
		u.mu.Lock()
		defer u.mu.Unlock()
		id := strings.TrimPrefix(req.Path, "/widgets/")
		u.deleted = append(u.deleted, id)
		if _, ok := u.items[id]; !ok {
			return &batch.SubResponse{Status: http.StatusNotFound, Header: http.Header{}}, nil
		}
		delete(u.items, id)
		return &batch.SubResponse{Status: http.StatusOK, Header: jsonHeader(), Body: []byte("{}")}, nil
	case req.Method == http.MethodPatch && strings.HasPrefix(req.Path, "/widgets/"):
		u.mu.Lock()
		defer u.mu.Unlock()
		id := strings.TrimPrefix(req.Path, "/widgets/")
		b, ok := u.items[id]
		if !ok {
			return &batch.SubResponse{Status: http.StatusNotFound, Header: http.Header{}}, nil
		}
		if u.refuse != "" && strings.Contains(string(req.Body), u.refuse) {
			return &batch.SubResponse{Status: http.StatusUnprocessableEntity, Header: http.Header{}, Body: []byte("<p>no</p>")}, nil
		}
		var item, patch map[string]any
		_ = json.Unmarshal(b, &item)
		_ = json.Unmarshal(req.Body, &patch)
		for k, v := range patch { // a merge patch: null removes
			if v == nil {
				delete(item, k)
			} else {
				item[k] = v
			}
		}
		b, _ = json.Marshal(item)
		u.items[id] = b
		return &batch.SubResponse{Status: http.StatusOK, Header: jsonHeader(), Body: b}, nil
	case req.Method == http.MethodGet && strings.HasPrefix(req.Path, "/widgets/"):
		u.mu.Lock()
		defer u.mu.Unlock()
		u.reads++
		if b, ok := u.items[strings.TrimPrefix(req.Path, "/widgets/")]; ok {
			return &batch.SubResponse{Status: http.StatusOK, Header: jsonHeader(), Body: b}, nil
		}
		return &batch.SubResponse{Status: http.StatusNotFound, Header: http.Header{}}, nil
	}
	return &batch.SubResponse{Status: http.StatusMethodNotAllowed, Header: http.Header{}}, nil
}

func (u *widgetsUpstream) create(req *batch.SubRequest) *batch.SubResponse {
	u.mu.Lock()
	defer u.mu.Unlock()
	key := req.Header.Get("Idempotency-Key")
	if seen, ok := u.byKey[key]; ok && u.honorKeys {
		return seen
	}
	var w map[string]any
	_ = json.Unmarshal(req.Body, &w)
	if u.refuse != "" && w["name"] == u.refuse {
		return &batch.SubResponse{Status: http.StatusUnprocessableEntity, Header: http.Header{"Content-Type": {"text/html"}}, Body: []byte("<p>name taken</p>")}
	}
	id, _ := w["id"].(string)
	if id == "" {
		u.nextID++
		id = strconv.Itoa(u.nextID)
	}
	if _, ok := u.items[id]; ok {
		return &batch.SubResponse{Status: http.StatusConflict, Header: http.Header{}}
	}
	w["id"] = id
	b, _ := json.Marshal(w)
	u.items[id] = b
	u.made[fmt.Sprint(w["name"])]++
	h := jsonHeader()
	h.Set("Location", "/widgets/"+id)
	resp := &batch.SubResponse{Status: http.StatusCreated, Header: h, Body: b}
	u.byKey[key] = resp
	return resp
}

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

// checkMadeOnce fails unless each of n elements made exactly one item.
func (u *widgetsUpstream) checkMadeOnce(t *testing.T, n int) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := range n {
		if got := u.made[fmt.Sprintf("w%d", i)]; got != 1 {
			t.Errorf("element %d made %d items, want exactly 1", i, got)
		}
	}
}

// widgetsPolicy is the /widgets resource, partial, with settings changed
// by mod.
func widgetsPolicy(t *testing.T, mod func(*policy.Settings)) *policy.Policy {
	t.Helper()
	spec := policy.ResourceSpec{
		Path: "/widgets", CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"}, ItemMethods: []string{"GET", "PUT", "PATCH", "DELETE"},
		Settings: policy.Defaults(), Gateway: policy.GatewayDefaults(),
	}
	spec.Settings.SetAtomicity(policy.Partial)
	// A carry-on waits out a write the last owner may still have in
	// flight: a short item_timeout keeps the tests quick.
	spec.Settings.ItemTimeout = 200 * time.Millisecond
	if mod != nil {
		mod(&spec.Settings)
	}
	pol, err := policy.New([]policy.ResourceSpec{spec})
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// throughTo is the Caddy glue's Through as the tests need it: every
// window straight to up.
func throughTo(pol *policy.Policy, up batch.Sender) Through {
	return func(_ context.Context, _ *JobRecord, _ http.Header, work func(batch.Site) error) error {
		return work(batch.Site{Runtime: batch.Runtime{Send: up}, Lookup: pol.Lookup})
	}
}

// startWidgets starts a job of n widget creates, staged in chunks of
// 1,000 as AdmitJob hands them over; withIDs gives each element its id.
func startWidgets(t *testing.T, js *Jobs, n int, withIDs bool) (*HeldJob, string) {
	t.Helper()
	return startWidgetsAs(t, js, n, withIDs, "partial")
}

// startWidgetsAs is startWidgets of a job of the atomicity given.
func startWidgetsAs(t *testing.T, js *Jobs, n int, withIDs bool, atomicity string) (*HeldJob, string) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stage(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for first := 0; first < n; first += 1000 {
		items := widgetItems(first, min(1000, n-first))
		if withIDs {
			for i := range items {
				id := fmt.Sprintf("e%d", first+i)
				items[i].ID, items[i].Element = id, json.RawMessage(fmt.Sprintf(`{"id":%q,"name":"w%d"}`, id, first+i))
			}
		}
		if err := st.Chunk(ctx, first, items); err != nil {
			t.Fatal(err)
		}
	}
	rec := widgetsJob(n, goldenClient)
	rec.Atomicity = atomicity
	hj, token, err := js.Register(ctx, st, rec, http.Header{"Authorization": {"Bearer golden"}}, roomy)
	if err != nil {
		t.Fatal(err)
	}
	keepHeld(t, hj)
	return hj, token
}

func mustStatus(t *testing.T, js *Jobs, id, token string) *JobStatus {
	t.Helper()
	st, err := js.Status(context.Background(), id, token)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestJobRunCreatesEveryItemInOrder(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 1000, false)
	up := newWidgetsUpstream(false)
	if err := hj.Run(context.Background(), throughTo(widgetsPolicy(t, nil), up), nil); err != nil {
		t.Fatal(err)
	}
	if up.unauthorized != 0 {
		t.Errorf("%d creates went without the job's forwarded Authorization", up.unauthorized)
	}
	id := hj.Record().ID
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Done != 1000 || st.Succeeded != 1000 {
		t.Errorf("status %s, done %d, succeeded %d; want succeeded, 1000, 1000", st.State, st.Done, st.Succeeded)
	}
	indexes, _, lines := readResults(t, js, id, token)
	if !slices.Equal(indexes, upTo(1000)) {
		t.Errorf("results name items %v..., want 0 to 999 in order", indexes[:min(10, len(indexes))])
	}
	for _, l := range lines {
		if l.Outcome != batch.Succeeded || l.Status != http.StatusCreated {
			t.Fatalf("result %+v, want a created item", l)
		}
	}
	up.checkMadeOnce(t, 1000)
}

// A cancel is seen at a renewal of the lease, and the job then starts
// nothing new: it ends cancelled, what it did standing in its results.
func TestJobRunCancelledMidRun(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		js := NewJobs(newMemStorage(), NewLeases(30*time.Second), zap.NewNop())
		hj, token := startWidgets(t, js, 1000, false)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		up.onCreate = func(n int) {
			if n == 300 {
				if _, err := js.Cancel(context.Background(), id, token, "client"); err != nil {
					t.Error(err)
				}
			}
			time.Sleep(time.Second) // the bubble's time: renewals come meanwhile
		}
		if err := hj.Run(context.Background(), throughTo(widgetsPolicy(t, nil), up), nil); err != nil {
			t.Fatal(err)
		}
		st := mustStatus(t, js, id, token)
		if st.State != JobCancelled || st.Done < 300 || st.Done >= 1000 || st.Succeeded != st.Done {
			t.Errorf("status %s, done %d, succeeded %d; want cancelled with what was done (300 or more, not all) succeeded", st.State, st.Done, st.Succeeded)
		}
		// An item taken as the cancel came is not sent, while one taken
		// after it a moment before may have been: the items a window's
		// workers hold (four times its concurrency, recorded together)
		// stay not_attempted among the results, as the deadline's do.
		indexes, _, lines := readResults(t, js, id, token)
		done := 0
		for _, l := range lines {
			if l.Outcome != batch.NotAttempted {
				done++
			}
		}
		if !slices.Equal(indexes, upTo(len(indexes))) || done != st.Done || len(indexes) > st.Done+4*8 {
			t.Errorf("results of %d items (in order: %v), %d of them done; want a prefix holding the %d done, at most four waves' not_attempted among them",
				len(indexes), slices.Equal(indexes, upTo(len(indexes))), done, st.Done)
		}
		up.mu.Lock()
		made := len(up.items)
		up.mu.Unlock()
		if made != st.Done {
			t.Errorf("the upstream made %d items, the job says %d were done", made, st.Done)
		}
	})
}

// An owner lost mid-window (its lease released under it, as a process
// that dies would lose it) writes nothing more; the instance that claims
// the job carries it on from its results and log, and every element is
// created exactly once: through an API that honours Idempotency-Key
// (idempotent_upstream), or from elements that carry their ids.
func TestJobRunCarriedOnCreatesEachOnce(t *testing.T) {
	for _, c := range []struct {
		name       string
		honorKeys  bool
		withIDs    bool
		idempotent bool
	}{
		{name: "keys honoured", honorKeys: true, idempotent: true},
		{name: "elements with ids", withIDs: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			defer endHeld(t)
			ctx := context.Background()
			js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
			hj, token := startWidgets(t, js, 1000, c.withIDs)
			id := hj.Record().ID
			pol := widgetsPolicy(t, func(s *policy.Settings) { s.IdempotentUpstream = c.idempotent })
			up := newWidgetsUpstream(c.honorKeys)
			up.onCreate = func(n int) {
				if n == 400 { // mid-window: the second window began at 256
					if err := hj.Release(ctx); err != nil {
						t.Error(err)
					}
				}
			}
			var lost *batch.LeaseLost
			if err := hj.Run(ctx, throughTo(pol, up), nil); !errors.As(err, &lost) {
				t.Fatalf("the owner that lost the job: Run = %v, want its lease lost", err)
			}
			if st := mustStatus(t, js, id, token); st.Done != 256 || st.State != JobRunning {
				t.Errorf("after the loss: %s, done %d; want running, the first window's 256", st.State, st.Done)
			}
			up.onCreate = nil
			next := claimReleased(t, js, id)
			if err := next.Run(ctx, throughTo(pol, up), nil); err != nil {
				t.Fatal(err)
			}
			st := mustStatus(t, js, id, token)
			if st.State != JobSucceeded || st.Done != 1000 || st.Takeovers != 1 {
				t.Errorf("status %s, done %d, takeovers %d; want succeeded, 1000, 1", st.State, st.Done, st.Takeovers)
			}
			if indexes, _, _ := readResults(t, js, id, token); !slices.Equal(indexes, upTo(1000)) {
				t.Errorf("results of %d items, want 0 to 999 in order", len(indexes))
			}
			up.checkMadeOnce(t, 1000)
			resultsSize(t, js, id, token)
			// The writes in flight at the loss were resolved: resent
			// with their keys, or read back.
			if up.mu.Lock(); c.idempotent && up.creates <= 1000 || !c.idempotent && up.reads == 0 {
				t.Errorf("%d creates received and %d reads: the carry-on resolved no write left in flight", up.creates, up.reads)
			}
			up.mu.Unlock()
		})
	}
}

// A hand-over (the process stopping) finishes the writes in flight,
// stores where the job is and releases its lease: another instance
// claims it at once and finishes it, nothing sent twice.
func TestJobRunHandedOver(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 1000, false)
	id := hj.Record().ID
	pol := widgetsPolicy(t, nil)
	up := newWidgetsUpstream(false)
	stop := make(chan struct{})
	up.onCreate = func(n int) {
		if n == 400 {
			close(stop)
		}
	}
	if err := hj.Run(ctx, throughTo(pol, up), stop); err != nil {
		t.Fatal(err)
	}
	st := mustStatus(t, js, id, token)
	// The stop is seen before the next item starts, or, as it reaches
	// the window through a goroutine, a little later: by the next window
	// at the latest.
	if st.State != JobRunning || st.Done < 400 || st.Done > 512 {
		t.Errorf("handed over: %s, done %d; want running, done what started before the stop was seen", st.State, st.Done)
	}
	up.onCreate = nil
	next, err := js.ClaimReleased(ctx, id)
	if err != nil {
		t.Fatalf("claiming the handed-over job at once: %v", err)
	}
	keepHeld(t, next)
	if err := next.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Done != 1000 {
		t.Errorf("status %s, done %d; want succeeded, 1000", st.State, st.Done)
	}
	if indexes, _, _ := readResults(t, js, id, token); !slices.Equal(indexes, upTo(1000)) {
		t.Errorf("results of %d items, want 0 to 999 in order", len(indexes))
	}
	up.checkMadeOnce(t, 1000)
	if up.mu.Lock(); up.creates != 1000 {
		t.Errorf("%d creates sent, want 1000: nothing sent twice", up.creates)
	}
	up.mu.Unlock()
}

// Past job_timeout no item starts: the job ends partial, with what was
// done standing and the reason.
func TestJobRunPastItsDeadline(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		js := NewJobs(newMemStorage(), NewLeases(30*time.Second), zap.NewNop())
		hj, token := startWidgets(t, js, 1000, false)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		// 8 at a time, 5 minutes each: the 6 hours run out at about 576.
		up.onCreate = func(int) { time.Sleep(5 * time.Minute) }
		pol := widgetsPolicy(t, func(s *policy.Settings) { s.ItemTimeout = 10 * time.Minute })
		if err := hj.Run(context.Background(), throughTo(pol, up), nil); err != nil {
			t.Fatal(err)
		}
		st := mustStatus(t, js, id, token)
		if st.State != JobPartial || st.Outcome != "partial" || st.Done < 500 || st.Done >= 1000 || st.Succeeded != st.Done || !strings.Contains(st.Reason, "job_timeout") {
			t.Errorf("status %s (%s), done %d, succeeded %d, reason %q; want partial, what was done standing, the reason naming job_timeout",
				st.State, st.Outcome, st.Done, st.Succeeded, st.Reason)
		}
		// The deadline may hold back an item while later ones went out: it
		// stays not_attempted among them.
		indexes, _, lines := readResults(t, js, id, token)
		done := 0
		for _, l := range lines {
			if l.Outcome != batch.NotAttempted {
				done++
			}
		}
		if !slices.Equal(indexes, upTo(len(indexes))) || done != st.Done {
			t.Errorf("results of %d items in order %v, %d of them done; want a prefix holding the %d done", len(indexes), slices.Equal(indexes, upTo(len(indexes))), done, st.Done)
		}
	})
}
