package batch

import (
	"context"
	"net/http"
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
