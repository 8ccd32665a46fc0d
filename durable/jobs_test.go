package durable

import (
	"context"
	"encoding/json"
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
)

// goldenClient is the identity hash the tests' jobs are started under.
var goldenClient = HashFields("golden job client")

// widgetsJob is a job of n widget creates, due in 6h and kept a day.
func widgetsJob(n int, client string) *JobRecord {
	return &JobRecord{
		Op: "create", Resource: "/widgets", Path: "/widgets", Query: "tenant=a", Atomicity: "partial",
		Items: n, Key: "golden-job", Deadline: now().Add(6 * time.Hour), TTL: 24 * time.Hour,
		Origin: Origin{Server: "srv0", Method: "POST", URI: "/widgets?tenant=a", Host: "example.com", RemoteAddr: "192.0.2.1:4711"},
		Client: client, JobsPath: "/api/jobs",
	}
}

// widgetItems are n widget elements, from index first.
func widgetItems(first, n int) []batch.ItemSnapshot {
	items := make([]batch.ItemSnapshot, n)
	for i := range items {
		items[i] = batch.ItemSnapshot{Element: json.RawMessage(fmt.Sprintf(`{"name":"w%d"}`, first+i))}
	}
	return items
}

// startJob stages n items in chunks of 2 and registers them as a job of
// client, quota allowing.
func startJob(t *testing.T, js *Jobs, n int, client string, q Quota) (*HeldJob, string, error) {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stage(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for first := 0; first < n; first += 2 {
		if err := st.Chunk(ctx, first, widgetItems(first, min(2, n-first))); err != nil {
			t.Fatal(err)
		}
	}
	hj, token, err := js.Register(ctx, st, widgetsJob(n, client), http.Header{"Authorization": {"Bearer golden"}}, q)
	if err != nil {
		st.Discard(ctx)
		return nil, "", err
	}
	keepHeld(t, hj)
	return hj, token, nil
}

// held are the jobs each test started, whose leases renew until endHeld:
// a lease left renewing keeps a bubble from ending (its Cleanup functions
// run too late for that).
var held = struct {
	sync.Mutex
	by map[*testing.T][]*HeldJob
}{by: map[*testing.T][]*HeldJob{}}

// endHeld stops renewing the leases of the jobs t started.
func endHeld(t *testing.T) {
	held.Lock()
	jobs := held.by[t]
	delete(held.by, t)
	held.Unlock()
	for _, hj := range jobs {
		hj.lease.end("the test ended")
	}
}

// keepHeld has endHeld(t) end hj's lease.
func keepHeld(t *testing.T, hj *HeldJob) {
	held.Lock()
	defer held.Unlock()
	held.by[t] = append(held.by[t], hj)
}

// claimReleased claims job id, whose lease was released, for t.
func claimReleased(t *testing.T, js *Jobs, id string) *HeldJob {
	t.Helper()
	hj, err := js.ClaimReleased(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	keepHeld(t, hj)
	return hj
}

var roomy = Quota{PerClient: 100, Queued: 100}

// mustStart starts a job that must be made.
func mustStart(t *testing.T, js *Jobs, n int) (*HeldJob, string) {
	t.Helper()
	hj, token, err := startJob(t, js, n, goldenClient, roomy)
	if err != nil {
		t.Fatal(err)
	}
	return hj, token
}

// created is an item's result as a create answers it.
func created(i int) batch.ItemResult {
	return batch.ItemResult{Index: i, ID: fmt.Sprint(i + 1), Status: 201, Outcome: batch.Succeeded, Body: json.RawMessage(fmt.Sprintf(`{"id":%d}`, i+1))}
}

func createdRange(first, n int) []batch.ItemResult {
	out := make([]batch.ItemResult, n)
	for i := range out {
		out[i] = created(first + i)
	}
	return out
}

// endJob ends hj succeeded, every item done.
func endJob(t *testing.T, hj *HeldJob) JobProgress {
	t.Helper()
	n := hj.Record().Items
	p := JobProgress{State: JobSucceeded, Outcome: "succeeded", Cursor: n, Done: n, Succeeded: n, Started: now().UTC(), Ended: now().UTC()}
	if err := hj.End(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// A discarded staging leaves nothing in storage: no chunk, no folder, no
// expiry entry.
func TestDiscardedStagingLeavesNothing(t *testing.T) {
	t.Parallel()
	s := newMemStorage()
	ctx := context.Background()
	st, err := NewJobs(s, NewLeases(time.Minute), zap.NewNop()).Stage(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for first := 0; first < 10; first += 5 {
		if err := st.Chunk(ctx, first, widgetItems(first, 5)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.keysUnder("batch/v1")); n != 3 {
		t.Fatalf("%d keys staged, want two chunks and an expiry entry", n)
	}
	st.Discard(ctx)
	if left := s.keysUnder("batch"); len(left) != 0 {
		t.Errorf("a discarded staging left %v", left)
	}
}

// Of two starts of one client racing for its last job, exactly one is
// made and the other refused over quota, with a minute's Retry-After; the
// queue's limit applies only to a start that would wait.
func TestRacingRegistrationsOverQuota(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		mustStart(t, js, 1) // the client's first job
		one := Quota{PerClient: 2, Queued: 16}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { _, _, errs[i] = startJob(t, js, 3, goldenClient, one) })
		}
		wg.Wait()
		var qe *QuotaError
		refused := 0
		for _, err := range errs {
			switch {
			case errors.As(err, &qe):
				refused++
			case err != nil:
				t.Fatal(err)
			}
		}
		if refused != 1 || qe.RetryAfter != time.Minute {
			t.Fatalf("racing starts answered %v, want one refused over quota with a minute's wait", errs)
		}
		if err := js.CheckQuota(context.Background(), goldenClient, one); !errors.As(err, &qe) {
			t.Errorf("the quick check let a third job through: %v", err)
		}
		// Another client has its own quota; the queue, two jobs long,
		// refuses one that would wait behind them only.
		other := HashFields("another client")
		if err := js.CheckQuota(context.Background(), other, Quota{PerClient: 2, Queued: 2}); err != nil {
			t.Errorf("another client's start that runs at once: %v", err)
		}
		err := js.CheckQuota(context.Background(), other, Quota{PerClient: 2, Queued: 2, Waits: true})
		if !errors.As(err, &qe) || qe.RetryAfter != 30*time.Second {
			t.Errorf("a start that would wait behind a full queue: %v", err)
		}
		if n := len(s.keysUnder("batch/v1/jobs")); n == 0 {
			t.Fatal("no job stored")
		}
		if left := s.keysUnder(jobExpiryPrefix); len(left) != 2 {
			t.Errorf("expiry entries %v: want one for each job made, the refused start's discarded", left)
		}
	})
}

// The token opens the job and nothing else does: a wrong one, none, the
// token of another job, or an id that is no job's answer ErrUnknownJob.
// It is stored nowhere, in no form: only its hash is.
func TestJobTokenIsTheOnlyKey(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	s := newMemStorage()
	js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	hj, token := mustStart(t, js, 3)
	other, otherToken := mustStart(t, js, 1)
	if len(token) != 43 || strings.ContainsAny(token, "+/=") {
		t.Errorf("token %q: want 256 bits as base64url without padding", token)
	}
	id := hj.Record().ID
	if st, err := js.Status(ctx, id, token); err != nil || st.ID != id {
		t.Fatalf("the right token: %+v, %v", st, err)
	}
	// Another first character: the last one of 256 bits in base64url
	// carries only 4 of them, so a fixed last character is the token's
	// own one time in sixteen.
	wrong := "A" + token[1:]
	if wrong == token {
		wrong = "B" + token[1:]
	}
	for name, c := range map[string]struct{ id, token string }{
		"wrong":         {id, wrong},
		"none":          {id, ""},
		"another job's": {id, otherToken},
		"no job":        {NewID(), token},
		"a path":        {"../idem", token},
		"upper case":    {strings.ToUpper(id), token},
	} {
		if _, err := js.Status(ctx, c.id, c.token); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("%s token: %v, want ErrUnknownJob", name, err)
		}
		if _, err := js.Cancel(ctx, c.id, c.token, "client"); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("%s token cancelled: %v", name, err)
		}
		if _, err := js.Results(ctx, c.id, c.token, func([]byte) error { return nil }); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("%s token read the results: %v", name, err)
		}
		if err := js.Remove(ctx, c.id, c.token); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("%s token removed: %v", name, err)
		}
	}
	if _, err := js.Status(ctx, other.Record().ID, otherToken); err != nil {
		t.Error(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.keys {
		if strings.Contains(k, token) || strings.Contains(string(v), token) {
			t.Errorf("%s holds the token", k)
		}
	}
	rec, _ := json.Marshal(hj.Record())
	if !strings.Contains(string(rec), `"token_sha256":"`+tokenSum(token)+`"`) {
		t.Errorf("the record %s holds no hash of the token", rec)
	}
}

// statusJSON is a status as its monitor writes it.
func statusJSON(t *testing.T, st *JobStatus) map[string]any {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A job's status through its life: queued, running, cancelling once
// marked, then its end with the times and outcome, and absent once its
// ttl passed. Its members are exactly a job status's, times null until
// known.
func TestJobStatusStates(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, token := mustStart(t, js, 4)
		id := hj.Record().ID
		st, err := js.Status(ctx, id, token)
		if err != nil {
			t.Fatal(err)
		}
		m := statusJSON(t, st)
		members := slices.Sorted(func(yield func(string) bool) {
			for k := range m {
				if !yield(k) {
					return
				}
			}
		})
		want := []string{"atomicity", "created", "done", "ended", "expires", "failed", "id", "items", "op", "outcome", "reason", "resource", "results", "started", "state", "succeeded", "takeovers"}
		if !slices.Equal(members, want) {
			t.Errorf("status members %v, want %v", members, want)
		}
		if m["state"] != JobQueued || m["started"] != nil || m["ended"] != nil || m["expires"] != nil || m["outcome"] != "" ||
			m["results"] != "/api/jobs/"+id+"/results" || m["items"] != 4.0 {
			t.Errorf("a job just made: %v", m)
		}

		time.Sleep(time.Second)
		started := now().UTC()
		p := JobProgress{State: JobRunning, Started: started}
		p.Tally(createdRange(0, 2))
		if err := hj.WriteProgress(ctx, p); err != nil {
			t.Fatal(err)
		}
		if st, _ := js.Status(ctx, id, token); st.State != JobRunning || st.Done != 2 || st.Succeeded != 2 || !st.Started.Equal(started) {
			t.Errorf("running: %+v", st)
		}
		if st, err := js.Cancel(ctx, id, token, "client"); err != nil || st.State != JobCancelling || st.Ended != nil {
			t.Errorf("cancelled while running: %+v, %v", st, err)
		}
		if st, _ := js.Status(ctx, id, token); st.State != JobCancelling {
			t.Errorf("after a cancel: %s, want cancelling until the owner ends it", st.State)
		}

		time.Sleep(time.Minute)
		end := JobProgress{State: JobCancelled, Cursor: 2, Done: 2, Succeeded: 2, Started: started, Ended: now().UTC()}
		if err := hj.End(ctx, end); err != nil {
			t.Fatal(err)
		}
		st, err = js.Status(ctx, id, token)
		if err != nil || st.State != JobCancelled || st.Outcome != "" || !st.Ended.Equal(end.Ended) || !st.Expires.Equal(end.Ended.Add(24*time.Hour)) {
			t.Errorf("ended cancelled: %+v, %v", st, err)
		}
		time.Sleep(24 * time.Hour)
		if _, err := js.Status(ctx, id, token); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("a job past its ttl, not swept yet: %v, want ErrUnknownJob", err)
		}
	})
}

// done counts every item that reached an outcome other than
// not_attempted; failed, those that failed or went unanswered.
func TestJobProgressTally(t *testing.T) {
	t.Parallel()
	var p JobProgress
	p.Tally([]batch.ItemResult{
		{Outcome: batch.Succeeded}, {Outcome: batch.Succeeded}, {Outcome: batch.Failed}, {Outcome: batch.Unknown},
		{Outcome: batch.RolledBack}, {Outcome: batch.RollbackFailed}, {Outcome: batch.NotAttempted}, {},
	})
	if p.Done != 6 || p.Succeeded != 2 || p.Failed != 2 {
		t.Errorf("tally %+v: want 6 done, 2 succeeded, 2 failed", p)
	}
}

// A cancel of a queued job nothing was written for ends it at once, and
// frees the client's quota; of a running job, marks it cancelling until
// its owner ends it (a second cancel changes nothing); of an ended job,
// changes nothing.
func TestJobCancel(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		one := Quota{PerClient: 1, Queued: 16}

		queued, token, err := startJob(t, js, 3, goldenClient, one)
		if err != nil {
			t.Fatal(err)
		}
		id := queued.Record().ID
		// Being started, its lease held: left to its owner.
		if st, err := js.Cancel(ctx, id, token, "client"); err != nil || st.State != JobCancelling {
			t.Fatalf("cancelled while being started: %+v, %v; want it left to its owner", st, err)
		}
		if err := queued.Release(ctx); err != nil { // put in the queue
			t.Fatal(err)
		}
		st, err := js.Cancel(ctx, id, token, "client")
		if err != nil || st.State != JobCancelled || st.Ended == nil || st.Outcome != "" {
			t.Fatalf("cancelled while queued: %+v, %v; want it cancelled at once", st, err)
		}
		for _, key := range []string{jobKey(id, credentialsName), jobKey(id, inputName+"/00000000"), queued.Record().activeKey(), queued.Record().clientKey(), queued.Record().indexKey(jobIndexActive)} {
			if _, err := s.Load(ctx, key); err == nil {
				t.Errorf("%s is still there after the job ended", key)
			}
		}
		if _, err := s.Load(ctx, queued.Record().indexKey(JobCancelled)); err != nil {
			t.Errorf("the job is not indexed as cancelled: %v", err)
		}
		if _, err := s.Load(ctx, progressKey(id, 1)); err != nil {
			t.Errorf("the end is not written at the epoch a claim would take: %v", err)
		}

		running, token, err := startJob(t, js, 3, goldenClient, one)
		if err != nil {
			t.Fatalf("a start after the cancelled job ended: %v", err)
		}
		id = running.Record().ID
		p := JobProgress{State: JobRunning, Started: now().UTC()}
		p.Tally(createdRange(0, 1))
		if err := running.WriteProgress(ctx, p); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if st, err := js.Cancel(ctx, id, token, "client"); err != nil || st.State != JobCancelling {
				t.Errorf("cancelled while running: %+v, %v", st, err)
			}
		}
		var mark cancelMark
		if found, err := loadJSON(ctx, s, jobKey(id, cancelName), &mark); !found || err != nil || mark.By != "client" || mark.Version != 1 {
			t.Errorf("cancel mark %+v (%v, %v)", mark, found, err)
		}
		// The owner sees it at its next renewal: within a third of the
		// lease.
		if running.CancelAsked() {
			t.Error("the owner saw the cancel before its next renewal")
		}
		time.Sleep(time.Minute/3 + time.Second)
		if !running.CancelAsked() {
			t.Error("the owner did not see the cancel at its next renewal")
		}

		ended, token := mustStart(t, js, 1)
		endJob(t, ended)
		if st, err := js.Cancel(ctx, ended.Record().ID, token, "admin"); err != nil || st.State != JobSucceeded {
			t.Errorf("cancelled once ended: %+v, %v; want it as it ended", st, err)
		}
		if _, err := s.Load(ctx, jobKey(ended.Record().ID, cancelName)); err == nil {
			t.Error("an ended job was marked cancelled")
		}
	})
}

// A start refused after its registration (its first request answered
// 401) leaves nothing.
func TestAbandonedJobLeavesNothing(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		hj, token := mustStart(t, js, 5)
		if err := hj.Abandon(context.Background()); err != nil {
			t.Fatal(err)
		}
		if left := s.keysUnder("batch"); len(left) != 0 {
			t.Errorf("an abandoned job left %v", left)
		}
		if _, err := js.Status(context.Background(), hj.Record().ID, token); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("an abandoned job's status: %v", err)
		}
		time.Sleep(time.Hour) // no renewal writes its lease again
		if left := s.keysUnder("batch"); len(left) != 0 {
			t.Errorf("an abandoned job's lease came back: %v", left)
		}
	})
}

// Remove refuses a job not ended; an ended one goes whole, with its
// index and expiry entries, and is unknown after.
func TestJobRemove(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		hj, token := mustStart(t, js, 4)
		id := hj.Record().ID
		if err := js.Remove(ctx, id, token); !errors.Is(err, ErrJobNotEnded) {
			t.Errorf("removing a queued job: %v", err)
		}
		if err := hj.AppendResults(ctx, 0, createdRange(0, 4)); err != nil {
			t.Fatal(err)
		}
		p := JobProgress{State: JobRunning, Started: now().UTC()}
		p.Tally(createdRange(0, 4))
		if err := hj.WriteProgress(ctx, p); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Cancel(ctx, id, token, "client"); err != nil {
			t.Fatal(err)
		}
		endJob(t, hj)
		if err := js.Remove(ctx, id, token); err != nil {
			t.Fatal(err)
		}
		if left := s.keysUnder("batch"); len(left) != 0 {
			t.Errorf("a removed job left %v", left)
		}
		if _, err := js.Status(ctx, id, token); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("a removed job's status: %v", err)
		}
	})
}
