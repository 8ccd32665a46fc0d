package batch

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// A job carries on (docs/durability.md, "Bulk jobs in storage"): its client polls for the outcome, so a
// write that a dead or stopped owner recorded as being sent, with no
// answer recorded, is resolved going forward, not undone: found to have
// taken effect, it succeeded; found not to, it is sent again.

// resolveAll resolves forward every item of a carried-on window whose
// write's outcome is unknown (recorded as being sent with no answer, or
// answered with none), once the writes the last owner
// may still have in flight are over (inFlightUntil), and before any
// item of the window starts. Items are resolved one at a time: a window
// has at most its concurrency of them.
func (run *batchRun) resolveAll(ctx context.Context) {
	var until time.Time
	var unknown []int
	for i := range run.state {
		if run.items[i].Outcome == Unknown && !run.state[i].settled {
			unknown = append(unknown, i)
			until = later(until, run.state[i].inFlightUntil)
		}
	}
	if len(unknown) == 0 {
		return
	}
	sleep(ctx, time.Until(until))
	for _, i := range unknown {
		if ctx.Err() != nil {
			// No time left to learn: each stays unknown, and is not sent.
			run.settleUnknown(context.WithoutCancel(ctx), i, "the job stopped before it could learn whether the write took effect")
			continue
		}
		run.resolveForward(ctx, i)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// resolveForward learns what item i's write, recorded as being sent with
// no answer, did. Under idempotent_upstream it is sent again with the
// same Idempotency-Key, which the upstream answers as it answered the
// first copy: it goes back to pending (applied and settled false). Else
// its item is read: a delete took effect if the item is gone, a create if
// the id its element named reads 2xx, an update if every member it sent
// reads back the same (stamped_fields and the id aside). Having taken
// effect, it succeeded (settled); not, it is pending again. A create
// whose element named no id cannot be read: it stays unknown, with its
// reason, and is never sent again (settled, not applied), as is an item
// whose read got no useful answer.
func (run *batchRun) resolveForward(ctx context.Context, i int) (applied, settled bool) {
	st := &run.state[i]
	if st.tgt.settings.IdempotentUpstream && st.sent != nil {
		run.pendingAgain(i)
		run.mu.Lock()
		st.resentWithKey = true
		run.mu.Unlock()
		return false, false
	}
	id := run.items[i].ID
	if id == "" {
		run.settleUnknown(ctx, i, "the create was sent and its answer was lost, and its element names no id to read it by, so it was not sent again (idempotent_upstream would resend it with its key)")
		return false, true
	}
	sp := run.trace.span(kindProof, i, id)
	resp, err := run.retrying(ctx, i, st.tgt.read(run.plan.header, id), nil, sp)
	sp.end(&run.mu, &run.items[i])
	if resp == nil || !is2xx(resp.Status) && !gone(resp.Status) {
		why := fmt.Sprintf("answered %d", statusOf(resp))
		if resp == nil {
			why = asNoAnswer(err).reason
		}
		run.settleUnknown(ctx, i, "the item could not be read to learn whether the write took effect ("+why+"), so it was not sent again")
		return false, true
	}
	var took bool
	switch st.tgt.kind {
	case policy.OpDelete:
		took = gone(resp.Status)
	case policy.OpCreate:
		took = is2xx(resp.Status)
	case policy.OpUpdate:
		took = is2xx(resp.Status) && st.holds(resp.Body, st.body)
	}
	if !took {
		run.pendingAgain(i)
		return false, false
	}
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.clearResponse()
		it.Outcome, st.applied, st.failure, st.settled = Succeeded, true, false, true
		if st.tgt.kind == policy.OpCreate && st.createdFrom == "" {
			st.createdFrom = "element"
		}
		if run.saga {
			// An all-or-nothing job's: what the item reads now is what
			// an undo proves against.
			st.undo, st.noUndo = st.undoOf(it, resp)
		}
		if st.tgt.kind == policy.OpDelete {
			it.Status = http.StatusNoContent
			return
		}
		// What the item reads now stands for the answer that was lost.
		it.setResponse(resp)
		run.plan.window.keep(it)
	})
	return true, true
}

// pendingAgain makes item i, whose write is known not to have taken
// effect (or whose resend is safe), one to send: its request is made
// again with the same key.
func (run *batchRun) pendingAgain(i int) {
	run.mu.Lock()
	defer run.mu.Unlock()
	it, st := &run.items[i], &run.state[i]
	it.clearResponse()
	it.Outcome = NotAttempted
	st.applied, st.failure, st.sent, st.request, st.inFlightUntil = false, false, nil, nil, time.Time{}
}

// settleUnknown leaves item i unknown for good, with why: nothing tells
// what its write did, and sending it again could do it twice.
func (run *batchRun) settleUnknown(ctx context.Context, i int, why string) {
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.Outcome, it.Error, st.settled, st.failure = Unknown, why, true, true
	})
}
