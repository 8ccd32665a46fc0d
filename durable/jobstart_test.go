package durable

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

func startClaimOf(key string) Claim {
	record, lock := JobStartRecord(key, goldenClient, "/widgets", "/widgets", "create")
	return Claim{Record: record, Lock: lock, Resource: "/widgets", Op: "create",
		Wait: 20 * time.Millisecond, TTL: 30 * time.Hour, MaxRun: time.Minute}
}

// A start's key is claimed before its body is read: a second start
// meanwhile is in flight, whatever its body; once the 202 is kept with
// the body's fingerprint, the same start again is told to replay it, and
// another body with the key is another request. A refused start gives
// its key back.
func TestJobStartKey(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		s := newMemStorage()
		keys := NewKeys(s, NewLeases(30*time.Millisecond), zap.NewNop())
		ctx := context.Background()
		c := startClaimOf("k")

		d, err := keys.ClaimStart(ctx, c)
		if err != nil || d.Verdict != Proceed {
			t.Fatalf("a new key: %v, %v", d.Verdict, err)
		}
		time.Sleep(40 * time.Millisecond) // renewed meanwhile: still in flight
		if again, _ := keys.ClaimStart(ctx, c); again.Verdict != InFlight {
			t.Errorf("while the first start reads its body: %v, want InFlight", again.Verdict)
		}

		answer := &Answer{Status: http.StatusAccepted, Header: http.Header{"Location": {"/api/jobs/j1"}},
			Body: []byte(`{"id":"j1","token":"t1"}`)}
		if err := d.Held.StartAnswered(ctx, "fp", answer, 30*time.Hour); err != nil {
			t.Fatal(err)
		}
		rec := stored(t, s, c.Record)
		if rec.State != StateDone || rec.Fingerprint != "fp" || rec.Answer.Status != http.StatusAccepted ||
			string(rec.Answer.Body) != string(answer.Body) || rec.Expires.Before(now().Add(29*time.Hour)) {
			t.Errorf("the answered start's record: %+v", rec)
		}
		// Any size: a start's answer is a status and a token.
		if rec.AnswerSize != 0 {
			t.Errorf("the answer was not kept whole: %d", rec.AnswerSize)
		}

		replay, err := keys.ClaimStart(ctx, c)
		if err != nil || replay.Verdict != Started || string(replay.Record.Answer.Body) != string(answer.Body) {
			t.Fatalf("after the 202: %v %+v, want Started with the answer", replay.Verdict, replay.Record)
		}
		if v := StartVerdict(replay.Record, "fp"); v != Replay {
			t.Errorf("the same body: %v, want Replay", v)
		}
		for _, other := range []string{"other", ""} {
			if v := StartVerdict(replay.Record, other); v != Mismatch {
				t.Errorf("body %q: %v, want Mismatch", other, v)
			}
		}

		// A start refused gives its key back: the next one proceeds.
		refused := startClaimOf("refused")
		d, _ = keys.ClaimStart(ctx, refused)
		if err := d.Held.GiveBack(ctx); err != nil {
			t.Fatal(err)
		}
		if d, _ := keys.ClaimStart(ctx, refused); d.Verdict != Proceed {
			t.Errorf("after a refused start: %v, want Proceed", d.Verdict)
		}
		d.Held.Release()
	})
}

// A start's key and a synchronous batch's of the same scope are two
// records: neither replays the other.
func TestJobStartRecordApart(t *testing.T) {
	t.Parallel()
	start, _ := JobStartRecord("k", goldenClient, "/widgets", "/widgets", "create")
	batchKey, _ := IdempotencyRecord("k", goldenClient, "/widgets", "/widgets", "create")
	if start == batchKey {
		t.Fatal("a job's start and a batch share a record")
	}
	other, _ := JobStartRecord("k", HashFields("another client"), "/widgets", "/widgets", "create")
	if other == start {
		t.Error("two clients share a start's record")
	}

	// A batch's record found under the start's name (were the names to
	// meet) is no start to replay: a start's fingerprint is never a
	// batch's.
	s := newMemStorage()
	keys := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	c := startClaimOf("k")
	sync := c
	sync.Fingerprint = "batch"
	d, _ := keys.Claim(ctx, sync)
	_ = d.Held.Answered(ctx, &Answer{Status: 200}, "succeeded", time.Hour, 1<<10)
	if d, _ := keys.ClaimStart(ctx, c); d.Verdict != Started || StartVerdict(d.Record, "a start's fingerprint") != Mismatch {
		t.Errorf("a batch's record: %v, want another request's", d.Verdict)
	}
}

// refusingUpstream answers every request with status (401 unless set)
// and a challenge, as an authentication after the batch handler would.
type refusingUpstream struct {
	status int
	sent   int
}

func (u *refusingUpstream) Send(context.Context, *batch.SubRequest) (*batch.SubResponse, error) {
	u.sent++
	return &batch.SubResponse{Status: cmp.Or(u.status, http.StatusUnauthorized),
		Header: http.Header{"Www-Authenticate": {`Basic realm="widgets"`}, "Content-Type": {"text/plain"}},
		Body:   []byte("who are you?")}, nil
}

// Which answers of the first item refuse the start: an authentication's
// (401, 403, 407); any other failure is the job's first result.
func TestJobRunFirstRefusals(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	for status, refuses := range map[int]bool{401: true, 403: true, 407: true, 404: false, 409: false, 422: false, 500: false, 503: false} {
		hj, token := startWidgets(t, js, 3, false)
		refused, err := hj.RunFirst(context.Background(), throughTo(widgetsPolicy(t, nil), &refusingUpstream{status: status}))
		if err != nil {
			t.Fatal(err)
		}
		if got := refused != nil; got != refuses {
			t.Errorf("a first item answered %d refuses the start: %v, want %v", status, got, refuses)
			continue
		}
		if !refuses {
			if st := mustStatus(t, js, hj.Record().ID, token); st.Done != 1 || st.Failed != 1 {
				t.Errorf("a first item answered %d: done %d, failed %d; want its result kept, 1 and 1", status, st.Done, st.Failed)
			}
		}
	}
}

// The first item of a job refused 401 is the start's answer, challenge
// and body as written, and the job abandoned leaves nothing.
func TestJobRunFirstRefused(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	s := newMemStorage()
	js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
	hj, _ := startWidgets(t, js, 10, false)
	up := &refusingUpstream{}
	refused, err := hj.RunFirst(context.Background(), throughTo(widgetsPolicy(t, nil), up))
	if err != nil {
		t.Fatal(err)
	}
	if refused == nil || refused.Status != http.StatusUnauthorized || refused.Header.Get("WWW-Authenticate") != `Basic realm="widgets"` ||
		string(refused.Body) != "who are you?" {
		t.Fatalf("refused %+v, want the 401 as the upstream wrote it", refused)
	}
	if up.sent != 1 {
		t.Errorf("%d requests sent, want the first item's only", up.sent)
	}
	if err := hj.Abandon(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := s.keysUnder("batch"); len(left) != 0 {
		t.Errorf("a job refused at its first item left %v", left)
	}
}

// A first item let through is the job's first result: the status says
// it is done, and Run carries on from the second, each item sent once.
func TestJobRunFirstThenRun(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	const n = 600 // past a window: the first window is begun by RunFirst
	hj, token := startWidgets(t, js, n, false)
	up := newWidgetsUpstream(false)
	through := throughTo(widgetsPolicy(t, nil), up)
	refused, err := hj.RunFirst(context.Background(), through)
	if err != nil || refused != nil {
		t.Fatalf("RunFirst: %+v, %v; want no refusal", refused, err)
	}
	id := hj.Record().ID
	if st := mustStatus(t, js, id, token); st.State != JobRunning || st.Done != 1 || st.Succeeded != 1 {
		t.Errorf("after the first item: %s, done %d, succeeded %d; want running, 1, 1", st.State, st.Done, st.Succeeded)
	}
	if up.creates != 1 {
		t.Errorf("%d creates after the first item, want 1", up.creates)
	}
	if err := hj.Run(context.Background(), through, nil); err != nil {
		t.Fatal(err)
	}
	st := mustStatus(t, js, id, token)
	if st.State != JobSucceeded || st.Done != n || st.Succeeded != n || st.Takeovers != 0 {
		t.Errorf("status %+v, want succeeded, %d done, no takeover", st, n)
	}
	indexes, _, _ := readResults(t, js, id, token)
	if !slices.Equal(indexes, upTo(n)) {
		t.Errorf("results name %d items, want 0 to %d in order", len(indexes), n-1)
	}
	up.checkMadeOnce(t, n)
	if up.creates != n {
		t.Errorf("%d creates, want %d", up.creates, n)
	}
}
