package batch

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// An undo sent by POST (restore_deleted post) that the upstream carried
// out but answered 503 is not sent again without idempotent_upstream, as
// no POST is: a second one found the item restored (409) or made it
// twice.
func TestPostUndoNotSentAgainAfter503(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake().seed("1", "2")
		f.on("DELETE", "/widgets/2", reply(400, `{"error":"no"}`))
		f.on("POST", "/widgets", answer{effectThenStatus: http.StatusServiceUnavailable}, answer{})
		p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), restoreByPost, concurrency(1))
		w := write(t, newBatchRun(p, Runtime{Send: f}, compensationBackoff).do(context.Background()))
		if posts := f.sentWith("POST"); len(posts) != 1 || w.Outcome != "rollback_failed" {
			t.Errorf("the undo POST was sent %d times after a 503, without idempotent_upstream, the batch %s; want once, rollback_failed (what it did is not known)", len(posts), w.Outcome)
		}
	})
}

// An undo answered 429 with a Retry-After beyond max_throttle_wait is
// sent again no sooner than the upstream asked: it went again after its
// backoff, 100 ms.
func TestUndoNotSentAgainSoonerThanRetryAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		times := newSendTimes()
		f := newFake().seed("1", "2")
		f.on("PATCH", "/widgets/2", reply(400, `{}`))
		f.on("PUT", "/widgets/1", times.stamp(reply(429, `{}`, "Retry-After", "30")), times.stamp(answer{}))
		p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","name":"x"},{"id":"2","name":"y"}]`), concurrency(1))
		w := write(t, newBatchRun(p, Runtime{Send: f}, compensationBackoff).do(context.Background()))
		at := times.of("PUT /widgets/1")
		if w.Outcome != "rolled_back" || len(at) != 2 || at[1].Sub(at[0]) < 30*time.Second {
			t.Errorf("batch %s, the undo sent at %v: want rolled_back, sent again 30s after the 429 that asked for it", w.Outcome, at)
		}
	})
}

// A saga that died with its restore_deleted post re-create in flight
// (journaled as being undone, no answer) is resumed: the re-create may
// have made the item under an id the API assigned, which a read of the
// item's own id cannot find. It is not sent again (a second copy), but
// left to an operator, rollback_failed saying why.
func TestResumedRestoreByPostIsNotSentAgain(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	f.on("DELETE", "/widgets/2", reply(500, `{}`))
	dead, undoing := make(chan struct{}), make(chan struct{})
	var once sync.Once
	posts := 0
	var mu sync.Mutex
	f.on("POST", "/widgets", answer{hook: func(_ context.Context, req *SubRequest) {
		mu.Lock()
		posts++
		n := posts
		mu.Unlock()
		// The API assigns ids of its own.
		f.put(widget("new"+string(rune('0'+n))), map[string]any{"id": "new", "name": "widget 1"})
		if n == 1 {
			once.Do(func() { close(undoing) })
			<-dead // the gateway dies with the POST in flight
		}
	}, status: http.StatusNoContent})
	j := &memJournal{}
	p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), concurrency(1), restoreByPost, compensationRetries(0))
	go newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	<-undoing
	snap := j.stored(t)
	equal(t, "item 0's phase", snap.Items[0].Phase, PhaseUndoing)
	res, err := Resume(context.Background(), snap, widgets(t, restoreByPost, compensationRetries(0)).Lookup, nil, Runtime{Send: f, Journal: &memJournal{snap: snap}})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "item 0", res.Items[0].Outcome, RollbackFailed)
	mu.Lock()
	n := posts
	mu.Unlock()
	if n > 1 {
		t.Errorf("the restore POST was sent %d times: the resumed saga made a second copy of the deleted item (%v)", n, f.state())
	}
	close(dead)
}
