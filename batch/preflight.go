package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/policy"
)

// preflight is the saga's third step: it reads every target of an
// all-or-nothing update or delete, and every id a create's element
// carries, before anything is written. A missing target, or an id a
// create names that already exists, fails the batch while nothing has
// changed. The bodies read are the pre-images an undo puts back, and a
// strong ETag read with one makes the write conditional. It reports
// whether the batch may go on. A write of a job's window carried on
// that is sent again with its key is not read: it may have taken effect
// already, and what it replaced is the pre-image its last owner read.
func (run *batchRun) preflight(ctx context.Context) bool {
	var targets []int
	for _, i := range pending(run.plan, run.state) {
		st := &run.state[i]
		if st.tgt != nil && !st.resentWithKey && !run.plan.Items[i].rewrite && run.items[i].ID != "" && run.preflightRead(i) != nil {
			targets = append(targets, i)
		}
	}
	if aj, ok := run.rt.Journal.(AheadJournal); ok && len(targets) > 0 {
		// The intent, and the first writes' records as their pre-images
		// come, are stored while the reads go (ahead.go).
		aj.RecordAhead(ctx)
		run.ahead = run.recordsAhead(ctx, pending(run.plan, run.state))
	}
	stop := make(chan struct{})
	halt := sync.OnceFunc(func() { close(stop) })
	if !run.plan.envelope() && run.plan.Op != policy.OpCreate {
		if f := run.plan.Match.Resource.List; f != nil && f.Preflight && len(targets) > 0 {
			targets = run.lists.read(ctx, run.state[targets[0]].tgt, targets, idsOf(run.items, targets), stop, listed{
				found: run.listedPreimage,
				throttled: func(ctx context.Context, i int, resp *SubResponse, err error) {
					run.preimageThrottled(ctx, i, resp, err)
					halt()
				},
			})
		}
	}
	fanOut(ctx, run.batchSettings.Concurrency, targets, stop, func(ctx context.Context, i int) {
		if !run.preflightRead(i)(ctx, i) {
			halt()
			return
		}
		run.ahead.read(i)
	})
	if !anyFailure(run.state) && ctx.Err() == nil {
		return true
	}
	for i := range run.items {
		// A job's window carried on keeps what its items that ran did.
		if !run.state[i].failure && !(run.plan.window != nil && run.state[i].settled) {
			_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, _ *itemState) {
				it.clearResponse()
				it.Outcome = NotAttempted
			})
		}
	}
	return false
}

// preflightRead is how item i is read before anything is written: an
// update's or delete's target for its pre-image, a create's own id to
// prove it free (absence from a LIST proves nothing: each id is read
// alone); nil for a read, which needs none.
func (run *batchRun) preflightRead(i int) func(ctx context.Context, i int) bool {
	switch run.state[i].tgt.kind {
	case policy.OpUpdate, policy.OpDelete:
		return run.readPreimage
	case policy.OpCreate:
		return run.checkFree
	}
	return nil
}

func (run *batchRun) readPreimage(ctx context.Context, i int) bool {
	req := run.state[i].tgt.read(run.plan.header, run.items[i].ID)
	sp := run.trace.span(kindPreflight, i, run.items[i].ID)
	defer sp.end(&run.mu, &run.items[i])
	resp, err := run.sender.read(ctx, run.state[i].tgt, req, sp)
	t := run.state[i].tgt
	declarative := t.kind == policy.OpDelete && t.settings.DeleteSemantics == policy.Declarative
	ok := true
	var ans itemAnswer
	if resp != nil {
		ans = answerOf(resp)
	}
	_ = run.transition(ctx, i, PhaseRead, nil, func(it *ItemResult, st *itemState) {
		switch {
		case resp == nil:
			recordNoAnswer(it, st, err, false)
			it.Error = "the item could not be read before the write: " + it.Error
			ok = false
		case resp.Status == http.StatusNotFound && declarative:
			it.Status, it.Outcome, st.settled = http.StatusNoContent, Succeeded, true
		case !is2xx(resp.Status):
			it.setAnswer(ans)
			it.Outcome, st.failure = Failed, true
			it.Error = joinReasons("the item could not be read before the write (GET "+req.Path+")", run.warning.note(run.state[i].tgt.movedHint(req, resp)))
			ok = false
		case jsonvalue.Kind(ans.body) != "object":
			it.setAnswer(ans)
			it.Status, it.Outcome, st.failure = http.StatusBadGateway, Failed, true
			it.Error = fmt.Sprintf("GET %s did not answer a JSON object, so the item could not be put back if the batch failed", req.Path)
			ok = false
		default:
			st.preimage, st.preETag = resp.Body, strongETag(resp.Header)
		}
	})
	return ok
}

// listedPreimage keeps a LIST's element as item i's pre-image: the
// operator's word (preflight) that an element is the whole item. It
// carries no ETag, so the item's write is not conditional, and its undo
// is proved by a read.
func (run *batchRun) listedPreimage(ctx context.Context, i int, elem json.RawMessage) {
	_ = run.transition(ctx, i, PhaseRead, nil, func(_ *ItemResult, st *itemState) {
		st.preimage, st.preETag = elem, ""
	})
}

// preimageThrottled fails item i, whose LIST the upstream throttled
// (err says how), with that answer: its status and Retry-After become
// the batch's, as a throttled GET's would.
func (run *batchRun) preimageThrottled(ctx context.Context, i int, resp *SubResponse, err error) {
	_ = run.transition(ctx, i, PhaseRead, nil, func(it *ItemResult, st *itemState) {
		it.setResponse(resp)
		it.Outcome, st.failure = Failed, true
		it.Error = "the item could not be read before the write: " + err.Error()
	})
}

// checkFree reads the id a create's element carries: the item must not
// exist, so that an undo that deletes that id deletes what the batch
// created and nothing else.
func (run *batchRun) checkFree(ctx context.Context, i int) bool {
	id := run.items[i].ID
	req := run.state[i].tgt.read(run.plan.header, id)
	sp := run.trace.span(kindPreflight, i, id)
	defer sp.end(&run.mu, &run.items[i])
	resp, err := run.sender.read(ctx, run.state[i].tgt, req, sp)
	if resp != nil && gone(resp.Status) {
		return true
	}
	_ = run.transition(ctx, i, PhaseRead, nil, func(it *ItemResult, st *itemState) {
		switch {
		case resp == nil:
			recordNoAnswer(it, st, err, false)
			it.Error = "whether the id is free could not be checked before the create: " + it.Error
		case is2xx(resp.Status):
			it.clearResponse()
			it.Status, it.Outcome, st.failure = http.StatusConflict, Failed, true
			it.Error = fmt.Sprintf("an item with id %q already exists; a batch create may only name ids that are free", id)
		default:
			it.setResponse(resp)
			it.Outcome, st.failure = Failed, true
			it.Error = joinReasons("whether the id is free could not be checked before the create (GET "+req.Path+")", run.warning.note(run.state[i].tgt.movedHint(req, resp)))
		}
	})
	return false
}
