package durable

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// loadsSeen is a storage that records the keys loaded from it.
type loadsSeen struct {
	*memStorage
	mu     sync.Mutex
	loaded []string
}

func (s *loadsSeen) Load(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	s.loaded = append(s.loaded, key)
	s.mu.Unlock()
	return s.memStorage.Load(ctx, key)
}

// take answers the keys loaded since the last take.
func (s *loadsSeen) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.loaded
	s.loaded = nil
	return out
}

func idsOf(list []*JobStatus) []string {
	ids := make([]string, len(list))
	for i, st := range list {
		ids[i] = st.ID
	}
	return ids
}

// An operator lists every job, newest first, without a token and from
// the index: by state (an ended job of another state is not read), a
// page at a time after a job's id; a job past its job_ttl is not
// listed; no listing reads a job's input or credentials.
func TestOperatorJobList(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := &loadsSeen{memStorage: newMemStorage()}
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		a, tokenA := mustStart(t, js, 2)
		endJob(t, a)
		time.Sleep(time.Second)
		b, tokenB := mustStart(t, js, 3)
		p := JobProgress{State: JobRunning, Started: now().UTC()}
		p.Tally(createdRange(0, 1))
		if err := b.WriteProgress(ctx, p); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		c, tokenC := mustStart(t, js, 4)
		ida, idb, idc := a.Record().ID, b.Record().ID, c.Record().ID
		// An end halfway through renaming its index entry: both there.
		if err := s.Store(ctx, a.Record().indexKey(jobIndexActive), a.Record().entry()); err != nil {
			t.Fatal(err)
		}
		s.take()

		list, err := js.ListJobs(ctx, JobQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if got := idsOf(list); !slices.Equal(got, []string{idc, idb, ida}) {
			t.Fatalf("listed %v, want %v newest first, each once", got, []string{idc, idb, ida})
		}
		if list[0].State != JobQueued || list[1].State != JobRunning || list[1].Done != 1 || list[2].State != JobSucceeded || list[2].Ended == nil {
			t.Errorf("states %s %s %s", list[0].State, list[1].State, list[2].State)
		}
		raw, _ := json.Marshal(list)
		for _, token := range []string{tokenA, tokenB, tokenC} {
			if strings.Contains(string(raw), token) {
				t.Errorf("a listing holds a job's token: %s", raw)
			}
		}
		for _, key := range s.take() {
			if strings.Contains(key, "/"+inputName+"/") || strings.HasSuffix(key, "/"+credentialsName) {
				t.Errorf("a listing loaded %s", key)
			}
		}

		for state, want := range map[string][]string{JobSucceeded: {ida}, JobRunning: {idb}, JobQueued: {idc}, JobFailed: {}, JobCancelling: {}} {
			got, err := js.ListJobs(ctx, JobQuery{State: state})
			if err != nil || !slices.Equal(idsOf(got), want) {
				t.Errorf("state %s: %v, %v; want %v", state, idsOf(got), err, want)
			}
			loaded := s.take()
			if state == JobRunning && slices.Contains(loaded, jobKey(ida, jobName)) {
				t.Errorf("listing the running jobs read the succeeded one: %v", loaded)
			}
		}

		var paged []string
		for after := ""; ; {
			page, err := js.ListJobs(ctx, JobQuery{Limit: 1, After: after})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			if len(page) != 1 {
				t.Fatalf("a page of limit 1 has %d jobs", len(page))
			}
			paged = append(paged, page[0].ID)
			after = page[0].ID
		}
		if !slices.Equal(paged, []string{idc, idb, ida}) {
			t.Errorf("paged %v", paged)
		}
		if _, err := js.ListJobs(ctx, JobQuery{After: strings.Repeat("0", 32)}); !errors.Is(err, ErrJobCursor) {
			t.Errorf("after an unknown job: %v, want ErrJobCursor", err)
		}

		if st, err := js.OperatorStatus(ctx, idb); err != nil || st.ID != idb || st.State != JobRunning {
			t.Errorf("status of b: %+v, %v", st, err)
		}
		for _, id := range []string{strings.Repeat("0", 32), "../../etc", ""} {
			if _, err := js.OperatorStatus(ctx, id); !errors.Is(err, ErrUnknownJob) {
				t.Errorf("status of %q: %v, want ErrUnknownJob", id, err)
			}
		}

		counts, err := js.CountJobs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(counts) != len(JobStates) || counts[JobQueued] != 1 || counts[JobRunning] != 1 || counts[JobSucceeded] != 1 || counts[JobFailed] != 0 {
			t.Errorf("counts %v", counts)
		}

		time.Sleep(25 * time.Hour) // a's job_ttl passed; b and c have not ended
		if got, _ := js.ListJobs(ctx, JobQuery{}); !slices.Equal(idsOf(got), []string{idc, idb}) {
			t.Errorf("past a's ttl: listed %v, want c and b", idsOf(got))
		}
		if _, err := js.OperatorStatus(ctx, ida); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("a past its ttl: %v, want ErrUnknownJob", err)
		}
	})
}

// An operator's cancel is the token holder's: a queued job ends
// cancelled at once (and the Ended hook hears of it once), a running
// one is marked for its owner, by "admin"; an ended one is left, with
// ErrJobEnded.
func TestOperatorCancel(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		var ended []*JobStatus
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop()).WithHooks(JobHooks{Ended: func(st *JobStatus) { ended = append(ended, st) }})
		ctx := context.Background()

		queued, _ := mustStart(t, js, 3)
		if err := queued.Release(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := js.OperatorCancel(ctx, queued.Record().ID)
		if err != nil || st.State != JobCancelled || st.Ended == nil {
			t.Fatalf("a queued job cancelled: %+v, %v", st, err)
		}
		if len(ended) != 1 || ended[0].ID != queued.Record().ID || ended[0].State != JobCancelled {
			t.Errorf("the Ended hook heard %+v, want the cancelled job once", ended)
		}

		running, _ := mustStart(t, js, 3)
		id := running.Record().ID
		if err := running.WriteProgress(ctx, JobProgress{State: JobRunning, Started: now().UTC()}); err != nil {
			t.Fatal(err)
		}
		if st, err := js.OperatorCancel(ctx, id); err != nil || st.State != JobCancelling {
			t.Errorf("a running job cancelled: %+v, %v", st, err)
		}
		var mark cancelMark
		if found, err := loadJSON(ctx, s, jobKey(id, cancelName), &mark); !found || err != nil || mark.By != "admin" {
			t.Errorf("cancel mark %+v (%v, %v), want by admin", mark, found, err)
		}

		done, _ := mustStart(t, js, 1)
		endJob(t, done)
		if st, err := js.OperatorCancel(ctx, done.Record().ID); !errors.Is(err, ErrJobEnded) || st == nil || st.State != JobSucceeded {
			t.Errorf("an ended job cancelled: %+v, %v; want its status and ErrJobEnded", st, err)
		}
		if _, err := js.OperatorCancel(ctx, strings.Repeat("0", 32)); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("an unknown job cancelled: %v", err)
		}
	})
}

// The hooks hear of every item a run finished, by outcome, and of the
// job's end once, with the status End stored (FinalStatus).
func TestJobHooksHearARun(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	var mu sync.Mutex
	outcomes := map[batch.Outcome]int{}
	var ended []*JobStatus
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop()).WithHooks(JobHooks{
		Finished: func(items []batch.ItemResult) {
			mu.Lock()
			defer mu.Unlock()
			for _, it := range items {
				outcomes[it.Outcome]++
			}
		},
		Ended: func(st *JobStatus) {
			mu.Lock()
			defer mu.Unlock()
			ended = append(ended, st)
		},
	})
	hj, _ := startWidgets(t, js, 600, false)
	if hj.FinalStatus() != nil {
		t.Error("a final status before the job ended")
	}
	if err := hj.Run(context.Background(), throughTo(widgetsPolicy(t, nil), newWidgetsUpstream(false)), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 1 || outcomes[batch.Succeeded] != 600 {
		t.Errorf("the Finished hook heard %v, want 600 succeeded", outcomes)
	}
	if len(ended) != 1 || ended[0].State != JobSucceeded || ended[0].Done != 600 || ended[0].Ended == nil {
		t.Fatalf("the Ended hook heard %+v, want the succeeded job once", ended)
	}
	if final := hj.FinalStatus(); final == nil || final.ID != hj.Record().ID || final.State != JobSucceeded || final.Succeeded != 600 {
		t.Errorf("FinalStatus %+v", final)
	}
}

// A job whose end was stored but whose index entry was not renamed (its
// owner died in between) is listed and counted as its progress says:
// the entries of jobs not ended are read for their state.
func TestOperatorSeesAnEndNotIndexed(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, _ := mustStart(t, js, 2)
		endJob(t, hj)
		rec := hj.Record()
		if err := s.Delete(ctx, rec.indexKey(JobSucceeded)); err != nil {
			t.Fatal(err)
		}
		if err := s.Store(ctx, rec.indexKey(jobIndexActive), rec.entry()); err != nil {
			t.Fatal(err)
		}
		if got, err := js.ListJobs(ctx, JobQuery{State: JobSucceeded}); err != nil || !slices.Equal(idsOf(got), []string{rec.ID}) {
			t.Errorf("succeeded jobs %v, %v; want the job", idsOf(got), err)
		}
		if counts, err := js.CountJobs(ctx); err != nil || counts[JobSucceeded] != 1 || counts[JobQueued] != 0 {
			t.Errorf("counts %v, %v", counts, err)
		}
	})
}
