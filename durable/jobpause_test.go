package durable

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// expiringUpstream is the widgets API behind a check of the credentials:
// a create that refused says is answered 401 and carries nothing out.
// It notes the Authorization of every create by the element's number.
type expiringUpstream struct {
	*widgetsUpstream
	refused func(element int, authorization string) bool
	// slow, if set, delays the answer to the create of that element.
	slow func(element int) time.Duration

	mu   sync.Mutex
	sent map[int][]string
}

func newExpiringUpstream(refused func(element int, authorization string) bool) *expiringUpstream {
	return &expiringUpstream{widgetsUpstream: newWidgetsUpstream(false), refused: refused, sent: map[int][]string{}}
}

func (u *expiringUpstream) Send(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
	if req.Method != http.MethodPost {
		return u.widgetsUpstream.Send(ctx, req)
	}
	var w struct{ Name string }
	_ = json.Unmarshal(req.Body, &w)
	n, _ := strconv.Atoi(strings.TrimPrefix(w.Name, "w"))
	auth := req.Header.Get("Authorization")
	u.mu.Lock()
	u.sent[n] = append(u.sent[n], auth)
	u.mu.Unlock()
	if u.slow != nil {
		time.Sleep(u.slow(n))
	}
	if u.refused(n, auth) {
		return &batch.SubResponse{Status: http.StatusUnauthorized, Header: http.Header{"Www-Authenticate": {`Bearer error="invalid_token"`}},
			Body: []byte(`{"error":"the token expired"}`)}, nil
	}
	return u.create(req), nil
}

// sentWith is the Authorization of each create of element n, in order.
func (u *expiringUpstream) sentWith(n int) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.sent[n])
}

// leaseReleased reports whether job id's lease is released, for a claim.
func leaseReleased(t *testing.T, js *Jobs, id string) bool {
	t.Helper()
	v, err := readFolderLease(context.Background(), js.storage, jobLeases(id))
	if err != nil {
		t.Fatal(err)
	}
	return v.released()
}

// A job whose token expires from item 300 on pauses: the items before
// it stand, the refused ones are not among the results, the lease is
// released and the progress says paused. A resume with a new
// Authorization sends the rest with it, each refused item sent again
// exactly once, and the job ends as if nothing had happened.
func TestJobPausesOnRefusedCredentialsAndResumes(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 600, false)
	id := hj.Record().ID
	pol := widgetsPolicy(t, nil)
	up := newExpiringUpstream(func(n int, auth string) bool { return n >= 300 && auth != "Bearer fresh" })
	if err := hj.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	st := mustStatus(t, js, id, token)
	if st.State != JobPaused || st.Done != 300 || st.Succeeded != 300 || st.Ended != nil ||
		!strings.Contains(st.Reason, "item 300 401") || strings.Contains(st.Reason, "expired") || strings.Contains(st.Reason, "golden") {
		t.Errorf("status %s, done %d, succeeded %d, reason %q; want paused, the 300 before the refusal done, the reason naming item 300 and 401, no body, no token",
			st.State, st.Done, st.Succeeded, st.Reason)
	}
	if indexes, _, _ := readResults(t, js, id, token); !slices.Equal(indexes, upTo(300)) {
		t.Errorf("results of %d items, want 0 to 299: the refused item is not processed", len(indexes))
	}
	if !leaseReleased(t, js, id) {
		t.Error("the paused job's lease is not released")
	}
	if paused, past, err := js.JobPaused(ctx, id); err != nil || !paused || past {
		t.Errorf("JobPaused = %v, %v, %v; want paused, not past its deadline", paused, past, err)
	}
	// It still counts among its client's jobs.
	var qe *QuotaError
	if err := js.CheckQuota(ctx, goldenClient, Quota{PerClient: 1, Queued: 100}); !errors.As(err, &qe) {
		t.Errorf("a second job of a client with one paused job, max_jobs_per_client 1: %v, want refused", err)
	}

	if _, err := js.Resume(ctx, id, "not-the-token", http.Header{"Authorization": {"Bearer fresh"}}); !errors.Is(err, ErrUnknownJob) {
		t.Errorf("resume with a wrong token: %v, want ErrUnknownJob", err)
	}
	next, err := js.Resume(ctx, id, token, http.Header{"Authorization": {"Bearer fresh"}})
	if err != nil {
		t.Fatal(err)
	}
	keepHeld(t, next)
	if st := mustStatus(t, js, id, token); st.State != JobQueued || st.Reason != "" {
		t.Errorf("after the resume: %s, reason %q; want queued, no reason", st.State, st.Reason)
	}
	if _, err := js.Resume(ctx, id, token, nil); !errors.Is(err, ErrJobNotPaused) {
		t.Errorf("a second resume: %v, want ErrJobNotPaused", err)
	}
	if err := next.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	st = mustStatus(t, js, id, token)
	if st.State != JobSucceeded || st.Done != 600 || st.Succeeded != 600 || st.Takeovers != 0 {
		t.Errorf("status %s, done %d, succeeded %d, takeovers %d; want succeeded, 600, 600, 0", st.State, st.Done, st.Succeeded, st.Takeovers)
	}
	if indexes, _, _ := readResults(t, js, id, token); !slices.Equal(indexes, upTo(600)) {
		t.Errorf("results of %d items, want 0 to 599 in order", len(indexes))
	}
	up.checkMadeOnce(t, 600)
	for n := range 600 {
		sent := up.sentWith(n)
		switch fresh := slices.Index(sent, "Bearer fresh"); {
		case n < 300 && fresh >= 0:
			t.Fatalf("element %d, done before the pause, was sent again with the new token: %q", n, sent)
		case n == 300 && !slices.Equal(sent, []string{"Bearer golden", "Bearer fresh"}):
			t.Fatalf("element 300 sent with %q, want refused once, then sent again exactly once with the new token", sent)
		case n > 300 && (fresh < 0 || fresh != len(sent)-1):
			t.Fatalf("element %d sent with %q, want the new token exactly once, last", n, sent)
		}
	}
}

// The items in flight when an item is refused finish and are kept: a
// resume sends only the refused item again.
func TestJobPauseKeepsTheItemsInFlight(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 100, false)
	id := hj.Record().ID
	pol := widgetsPolicy(t, nil)
	up := pausingAtFive()
	if err := hj.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobPaused || st.Done != 5 {
		t.Errorf("status %s, done %d; want paused, the 5 before the refused item", st.State, st.Done)
	}
	inFlight := len(up.byKey) - 5
	if inFlight < 1 {
		t.Fatalf("no item after the refused one went out while it was answered: the test proves nothing")
	}
	next, err := js.Resume(ctx, id, token, http.Header{"Authorization": {"Bearer fresh"}})
	if err != nil {
		t.Fatal(err)
	}
	keepHeld(t, next)
	if err := next.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobSucceeded || st.Done != 100 {
		t.Errorf("status %s, done %d; want succeeded, 100", st.State, st.Done)
	}
	up.checkMadeOnce(t, 100)
	for n := range 100 {
		sent := up.sentWith(n)
		if n == 5 && !slices.Equal(sent, []string{"Bearer golden", "Bearer fresh"}) || n != 5 && len(sent) != 1 {
			t.Fatalf("element %d sent with %q: want only element 5 sent again, once", n, sent)
		}
	}
}

// pausingAtFive refuses element 5 while the job's first token lasts,
// answering it late, so that the items after it are in flight, and
// answered, before the refusal comes.
func pausingAtFive() *expiringUpstream {
	up := newExpiringUpstream(func(n int, auth string) bool { return n == 5 && auth != "Bearer fresh" })
	up.slow = func(n int) time.Duration {
		if n == 5 {
			return 100 * time.Millisecond
		}
		return 0
	}
	return up
}

// A job paused past its job_timeout ends as the deadline ends one:
// partial with what was done (the items that were in flight at the
// pause among them, the refused one not_attempted), or failed when
// nothing succeeded, the reason naming job_timeout and the pause.
func TestJobPausedPastItsDeadlineEnds(t *testing.T) {
	for _, c := range []struct {
		name      string
		up        func() *expiringUpstream
		state     string
		succeeded bool
	}{
		{name: "some done", up: pausingAtFive, state: JobPartial, succeeded: true},
		{name: "none done", up: func() *expiringUpstream {
			return newExpiringUpstream(func(int, string) bool { return true })
		}, state: JobFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				defer endHeld(t)
				ctx := context.Background()
				js := NewJobs(newMemStorage(), NewLeases(30*time.Second), zap.NewNop())
				hj, token := startWidgets(t, js, 100, false)
				id := hj.Record().ID
				up := c.up()
				if err := hj.Run(ctx, throughTo(widgetsPolicy(t, nil), up), nil); err != nil {
					t.Fatal(err)
				}
				if ended, err := js.EndPausedPastDeadline(ctx, id); ended || err != nil {
					t.Fatalf("ending a paused job before its deadline: %v, %v; want it left paused", ended, err)
				}
				time.Sleep(7 * time.Hour) // past the 6h job_timeout
				if paused, past, err := js.JobPaused(ctx, id); !paused || !past || err != nil {
					t.Errorf("JobPaused = %v, %v, %v; want paused, past its deadline", paused, past, err)
				}
				if ended, err := js.EndPausedPastDeadline(ctx, id); !ended || err != nil {
					t.Fatalf("EndPausedPastDeadline = %v, %v; want the job ended", ended, err)
				}
				st := mustStatus(t, js, id, token)
				if st.State != c.state || st.Outcome != c.state || st.Ended == nil ||
					!strings.Contains(st.Reason, "job_timeout") || !strings.Contains(st.Reason, "paused") {
					t.Errorf("status %s (%s), ended %v, reason %q; want %s, ended, the reason naming job_timeout and the pause", st.State, st.Outcome, st.Ended, st.Reason, c.state)
				}
				_, _, lines := readResults(t, js, id, token)
				made := len(up.byKey)
				if c.succeeded && (st.Succeeded != made || st.Succeeded <= 5 || len(lines) < 6 || lines[5].Outcome != batch.NotAttempted) {
					t.Errorf("succeeded %d, the upstream made %d, results %d lines, the refused item's %+v; want every item made counted, the refused one not_attempted",
						st.Succeeded, made, len(lines), lines[min(5, len(lines)-1)])
				}
				if !c.succeeded && (st.Succeeded != 0 || made != 0) {
					t.Errorf("succeeded %d, made %d; want nothing", st.Succeeded, made)
				}
				if ended, err := js.EndPausedPastDeadline(ctx, id); ended || err != nil {
					t.Errorf("ending it again: %v, %v; want nothing done", ended, err)
				}
			})
		})
	}
}

// A paused job runs nowhere: its cancel ends it cancelled at once, the
// items done (those in flight at the pause too) standing.
func TestJobPausedCancelledAtOnce(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 100, false)
	id := hj.Record().ID
	up := pausingAtFive()
	if err := hj.Run(ctx, throughTo(widgetsPolicy(t, nil), up), nil); err != nil {
		t.Fatal(err)
	}
	st, err := js.Cancel(ctx, id, token, "client")
	if err != nil {
		t.Fatal(err)
	}
	made := len(up.byKey)
	if st.State != JobCancelled || st.Ended == nil || st.Succeeded != made || st.Reason != "" {
		t.Errorf("status %s, ended %v, succeeded %d of %d made, reason %q; want cancelled at once, what was made counted", st.State, st.Ended, st.Succeeded, made, st.Reason)
	}
	if _, err := js.Resume(ctx, id, token, nil); !errors.Is(err, ErrJobNotPaused) {
		t.Errorf("resuming a cancelled job: %v, want ErrJobNotPaused", err)
	}
}

// A cancel asked while the job still ran, that its owner had not seen
// yet when the job paused, ends the job once its lease is released: no
// owner is left to see it.
func TestJobCancelledAsItPauses(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 100, false)
	id := hj.Record().ID
	up := pausingAtFive()
	up.slow = func(n int) time.Duration {
		if n == 5 {
			if st, err := js.Cancel(ctx, id, token, "client"); err != nil || st.State != JobCancelling {
				t.Errorf("cancel of the running job: %v, %v; want it cancelling", st, err)
			}
		}
		return 0
	}
	if err := hj.Run(ctx, throughTo(widgetsPolicy(t, nil), up), nil); err != nil {
		t.Fatal(err)
	}
	if st := mustStatus(t, js, id, token); st.State != JobCancelled || st.Ended == nil {
		t.Errorf("status %s, ended %v; want cancelled", st.State, st.Ended)
	}
}

// A resume that comes past the job's job_timeout carries nothing on:
// the job ends as its deadline ends it.
func TestJobResumedPastItsDeadlineEnds(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		ctx := context.Background()
		js := NewJobs(newMemStorage(), NewLeases(30*time.Second), zap.NewNop())
		hj, token := startWidgets(t, js, 100, false)
		id := hj.Record().ID
		up := pausingAtFive()
		if err := hj.Run(ctx, throughTo(widgetsPolicy(t, nil), up), nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(7 * time.Hour)
		if held, err := js.Resume(ctx, id, token, http.Header{"Authorization": {"Bearer fresh"}}); held != nil || !errors.Is(err, ErrJobNotPaused) {
			t.Errorf("resume past the deadline: %v, %v; want ErrJobNotPaused", held, err)
		}
		if st := mustStatus(t, js, id, token); st.State != JobPartial || !strings.Contains(st.Reason, "job_timeout") {
			t.Errorf("status %s, reason %q; want partial, past job_timeout", st.State, st.Reason)
		}
		if sent := up.sentWith(5); len(sent) != 1 {
			t.Errorf("element 5 sent with %q: want only its refused try", sent)
		}
	})
}

// A paused job that an instance claims and runs without a resume (a
// scan that did not look at its state) sends nothing and stays paused.
func TestJobPausedRunWithoutResumeStaysPaused(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	ctx := context.Background()
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := startWidgets(t, js, 100, false)
	id := hj.Record().ID
	pol := widgetsPolicy(t, nil)
	up := pausingAtFive()
	if err := hj.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	before := mustStatus(t, js, id, token)
	sent := len(up.sentWith(5))
	next := claimReleased(t, js, id)
	if err := next.Run(ctx, throughTo(pol, up), nil); err != nil {
		t.Fatal(err)
	}
	st := mustStatus(t, js, id, token)
	if st.State != JobPaused || st.Done != before.Done || st.Reason != before.Reason || st.Takeovers != 0 || len(up.sentWith(5)) != sent {
		t.Errorf("status %s, done %d, takeovers %d, element 5 sent %d times; want still paused as before, nothing sent", st.State, st.Done, st.Takeovers, len(up.sentWith(5)))
	}
	if !leaseReleased(t, js, id) {
		t.Error("the job's lease is not released again")
	}
}
