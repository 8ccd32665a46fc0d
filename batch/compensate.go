package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/internal/slots"
	"github.com/caddy-batch/caddy-batch/policy"
)

// compensate is the saga's fifth step: it undoes every item whose write
// took effect, or may have, in reverse order of start (an envelope's
// dependents before what they depend on), at most
// Concurrency at once, so that a failed batch answers within one
// compensation's budget of its last write however many items it had.
// Every undo is proved first (undoItem), and runs detached from the
// client: once a batch has failed, the client going away must not leave
// it half done.
func (run *batchRun) compensate(ctx context.Context) {
	slots := make(chan struct{}, run.batchSettings.Concurrency)
	var wg sync.WaitGroup
	// An envelope's item is undone only once everything that depends on
	// it is: they started after it ended, so they come before it here.
	dependents := run.dependents()
	undone := make([]chan struct{}, len(run.items))
	for _, i := range slices.Backward(run.started) {
		if !run.state[i].applied || run.undone(i) {
			continue
		}
		undone[i] = make(chan struct{})
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			defer close(undone[i])
			for _, j := range dependents[i] {
				if undone[j] != nil {
					<-undone[j]
				}
			}
			run.undoItem(ctx, i)
		})
	}
	wg.Wait()
}

// undone reports whether item i's compensation already ended: a saga
// resumed from its journal (Resume) may have done some of its undos
// before it died, and an item put back must not be proved again (the
// proof would find the pre-image, not the batch's write).
func (run *batchRun) undone(i int) bool {
	o := run.items[i].Outcome
	return o == RolledBack || o == RollbackFailed
}

// budget is the most one item's compensation may take: every attempt its
// compensation_timeout, and the backoffs between them. Reads that prove
// or resolve the undo share it.
func (run *batchRun) budget(i int) time.Duration {
	s := run.state[i].tgt.settings
	d := time.Duration(s.CompensationRetries+1) * s.CompensationTimeout
	for attempt := 1; attempt <= s.CompensationRetries; attempt++ {
		d += run.backoff(attempt)
	}
	return d
}

// undoItem undoes one item: it learns what an unknown write did, proves
// the item is as the batch left it, and only then sends the undo.
func (run *batchRun) undoItem(ctx context.Context, i int) {
	ctx, cancel := context.WithTimeout(ctx, run.budget(i))
	defer cancel()
	if until := run.state[i].inFlightUntil; !until.IsZero() {
		sleep(ctx, time.Until(until))
	}
	if run.items[i].Outcome == Unknown && !run.resolve(ctx, i) {
		return
	}
	st := &run.state[i]
	u := st.undo
	if u == nil {
		run.settle(ctx, i, RollbackFailed, st.noUndo, nil)
		return
	}
	if st.resumed && run.alreadyUndone(ctx, i) {
		run.settle(ctx, i, RolledBack, "", nil)
		return
	}
	if u.Proof != nil && !run.proved(ctx, i, u.Proof) {
		return
	}
	c := &Compensation{Method: u.Method, Path: u.Path, Found: run.foundBefore(i)}
	req := run.undoRequest(i, u)
	_ = run.transition(ctx, i, PhaseUndoing, req, func(it *ItemResult, _ *itemState) { it.Compensation = c })
	resp, err := run.retrying(ctx, i, req, c)
	switch {
	case errors.Is(err, errFence) && run.leaseLost(err):
		// Another instance finishes the saga: this item is its to undo.
		return
	case errors.Is(err, errFence):
		run.settle(ctx, i, RollbackFailed, "the undo was not sent: the saga's lease in storage could not be proven in time (the storage did not answer)", nil)
	case resp == nil:
		run.settle(ctx, i, RollbackFailed, "", nil)
	case resp.Status == http.StatusPreconditionFailed && c.Attempts > 1 && run.alreadyUndone(ctx, i):
		// An earlier attempt took effect though its answer was lost, and
		// the condition now fails on the undo's own result.
		run.settle(ctx, i, RolledBack, "", nil)
	case resp.Status == http.StatusPreconditionFailed:
		run.settle(ctx, i, RollbackFailed, "the item changed after the batch wrote it (the undo's precondition failed), so it was left as it is", nil)
	case u.Method == http.MethodDelete && gone(resp.Status) && (u.Proof != nil || st.createdFrom != "element"):
		run.settle(ctx, i, RolledBack, "", nil)
	case is2xx(resp.Status) && u.WantID != "":
		if id, _ := run.state[i].tgt.createdID(resp); id != u.WantID {
			run.mu.Lock()
			c.CreatedID = id
			run.mu.Unlock()
			run.settle(ctx, i, RollbackFailed, fmt.Sprintf("the item was re-created under another id (%q), not its own (restore_deleted post on an API that assigns ids)", id), nil)
			return
		}
		run.settle(ctx, i, RolledBack, "", nil)
	case is2xx(resp.Status):
		run.settle(ctx, i, RolledBack, "", nil)
	default:
		run.settle(ctx, i, RollbackFailed, "", nil)
	}
}

// proved reads item i and tells whether it is as proof asks before its
// undo is sent; where it is not, the item is settled as the read shows.
func (run *batchRun) proved(ctx context.Context, i int, proof *Proof) bool {
	resp, err := run.retrying(ctx, i, run.state[i].tgt.read(run.plan.header, run.items[i].ID), nil)
	if resp == nil {
		run.settle(ctx, i, RollbackFailed, "the item could not be read to prove it is as the batch left it: "+asNoAnswer(err).reason, nil)
		return false
	}
	reason := run.state[i].proves(proof, resp)
	switch {
	case reason == "":
		return true
	case proof.GoneIsUndone && gone(resp.Status):
		run.settle(ctx, i, RolledBack, "the created item was already deleted by someone else", nil)
	case run.state[i].tgt.kind != policy.OpCreate && is2xx(resp.Status) && run.state[i].same(resp.Body, run.state[i].preimage):
		// Put back already: by the instance of a cluster that took the
		// saga over, or by this one before it lost its lease, racing
		// for the same item (docs/durability.md, "A saga never writes
		// after it lost its lease"). Nothing of the batch is left on it.
		run.settle(ctx, i, RolledBack, "the item was already as it was before the batch (put back by another instance finishing the saga, or another writer)", nil)
	default:
		run.settle(ctx, i, RollbackFailed, reason, resp)
	}
	return false
}

// foundBefore is what the read that resolved item i's unknown write
// found, if it found the item: the undo's compensation keeps it.
func (run *batchRun) foundBefore(i int) json.RawMessage {
	run.mu.Lock()
	defer run.mu.Unlock()
	if c := run.items[i].Compensation; c != nil {
		return c.Found
	}
	return nil
}

// alreadyUndone reads an item whose undo a dead saga may have sent, and
// reports whether it is already as the undo would leave it.
func (run *batchRun) alreadyUndone(ctx context.Context, i int) bool {
	resp, _ := run.retrying(ctx, i, run.state[i].tgt.read(run.plan.header, run.items[i].ID), nil)
	if resp == nil {
		return false
	}
	switch run.state[i].tgt.kind {
	case policy.OpCreate:
		return gone(resp.Status)
	default:
		return is2xx(resp.Status) && run.state[i].same(resp.Body, run.state[i].preimage)
	}
}

// undoRequest turns an undo into the request that carries it.
func (run *batchRun) undoRequest(i int, u *Undo) *SubRequest {
	req := newSubRequest(run.plan.header, run.state[i].tgt, u.Method, u.Path, u.Body, run.plan.key.forItem(i, ":undo"))
	if u.IfMatch != "" {
		req.Header.Set("If-Match", u.IfMatch)
	}
	if u.IfNoneMatch != "" {
		req.Header.Set("If-None-Match", u.IfNoneMatch)
	}
	return req
}

// resolve learns what a write whose outcome is unknown did: with
// idempotent_upstream it is sent again with the same key, and the
// upstream's answer tells; otherwise (or if that goes unanswered) the
// item is read, and that read is the undo's proof (with its strong ETag,
// if any, as the undo's condition). It settles the item and returns false when nothing is
// left to undo; otherwise it leaves the item's undo (or why there is
// none) for undoItem.
func (run *batchRun) resolve(ctx context.Context, i int) bool {
	if resolved, undo := run.resend(ctx, i); resolved {
		return undo
	}
	st := &run.state[i]
	id := run.items[i].ID
	if id == "" {
		st.noUndo = "the create went unanswered and the id of what it may have created cannot be learned, so that item, if any, is left behind"
		return true
	}
	resp, err := run.retrying(ctx, i, run.state[i].tgt.read(run.plan.header, id), nil)
	if resp == nil || !is2xx(resp.Status) && !gone(resp.Status) {
		why := fmt.Sprintf("answered %d", statusOf(resp))
		if resp == nil {
			why = asNoAnswer(err).reason
		}
		st.noUndo = "the item could not be read to learn whether the write took effect (" + why + ")"
		return true
	}
	return run.resolveByRead(ctx, i, resp)
}

// resend sends an unknown write again with the same Idempotency-Key,
// under idempotent_upstream, and reports whether its answer told what
// the first copy did (resolved), and if so whether there is an undo to
// prove and send.
func (run *batchRun) resend(ctx context.Context, i int) (resolved, undo bool) {
	st := &run.state[i]
	if !run.state[i].tgt.settings.IdempotentUpstream || st.sent == nil {
		return false, false
	}
	_ = run.transition(ctx, i, PhaseUndoing, st.sent, nil)
	resp, _ := run.retrying(ctx, i, st.sent, nil)
	if resp == nil || resp.Resent || resp.Status >= 300 && resp.Status < 400 || provesNothing(resp.Status) {
		return false, false
	}
	if !is2xx(resp.Status) {
		run.notApplied(ctx, i, fmt.Sprintf("sent again with the same Idempotency-Key, it was answered %d: it did not take effect", resp.Status))
		return true, false
	}
	create := run.state[i].tgt.kind == policy.OpCreate
	_ = run.transition(ctx, i, PhaseAnswered, nil, func(it *ItemResult, st *itemState) {
		if create {
			var named ItemResult
			st.nameCreated(&named, resp)
			if named.ID != "" {
				it.ID = named.ID
			}
		}
		st.undo, st.noUndo = st.undoOf(it, resp)
	})
	if create && run.items[i].ID != "" {
		run.lockCreated(ctx, i, run.items[i].ID)
	}
	return true, true
}

// resolveByRead judges what an unknown write did from a read of its item
// (resp, 2xx or gone), as resolve says. The read is what the item was
// found to be, whatever it shows: it goes into the item's
// compensation.found.
func (run *batchRun) resolveByRead(ctx context.Context, i int, resp *SubResponse) bool {
	st, t, id := &run.state[i], run.state[i].tgt, run.items[i].ID
	run.found(i, resp)
	switch t.kind {
	case policy.OpUpdate:
		expect := st.updated()
		switch {
		case gone(resp.Status):
			st.noUndo = "the item is gone: someone deleted it, so there is nothing to put back"
		case run.state[i].same(resp.Body, st.preimage):
			run.notApplied(ctx, i, "a read after it showed that it did not take effect")
			return false
		case run.state[i].holds(resp.Body, expect):
			st.undo = st.restore(run.items[i].ID)
			st.undo.IfMatch = strongETag(resp.Header)
		default:
			st.noUndo = run.state[i].changedReason(resp.Body, expect, true, neither)
		}
	case policy.OpDelete:
		switch {
		case gone(resp.Status):
			st.undo = st.recreate(id)
			st.undo.Proof = nil
		case run.state[i].same(resp.Body, st.preimage):
			run.notApplied(ctx, i, "a read after it showed that it did not take effect")
			return false
		default:
			// A delete sends no member: whatever changed it, the batch
			// did not.
			st.noUndo = neither + ": another writer changed it, so it was left as it is"
		}
	case policy.OpCreate:
		switch {
		case gone(resp.Status) && st.createdFrom == "location":
			run.notApplied(ctx, i, "a read after it showed that nothing was created under its id")
			return false
		case gone(resp.Status):
			// Only the element named this id: the upstream may have
			// ignored it and created the item under an id of its own.
			st.noUndo = fmt.Sprintf("nothing is at id %q, which only the element named: the upstream may have created the item under an id of its own, so whatever the create made, if anything, is left behind", id)
		case run.state[i].holds(resp.Body, st.body):
			st.undo = &Undo{Method: http.MethodDelete, Path: run.state[i].tgt.paths.Path(id), IfMatch: strongETag(resp.Header)}
		default:
			st.noUndo = fmt.Sprintf("an item the batch may not have written is at id %q, so it was left as it is", id)
		}
	}
	return true
}

// neither leads the reason an unknown write's item is left: the read
// that was to tell what the write did shows neither outcome.
const neither = "the item is neither as it was before the batch nor as the batch's write would leave it"

// found keeps what the read that resolved item i's unknown write found
// (a 2xx's object), in the item's compensation, whatever comes of it.
func (run *batchRun) found(i int, resp *SubResponse) {
	if !is2xx(resp.Status) || !jsonvalue.IsObject(resp.Body) {
		return
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	it := &run.items[i]
	if it.Compensation == nil {
		it.Compensation = &Compensation{}
	}
	it.Compensation.Found = resp.Body
}

// provesNothing reports whether an answer to a write sent again with the
// same Idempotency-Key says nothing of what the first copy did: 409 is
// the draft's "the first is still being served" (it may yet be
// applied), and a 5xx may come from a proxy in front of the upstream, or
// be the upstream's stored answer to a first copy that failed half way.
func provesNothing(status int) bool {
	return status == http.StatusConflict || status >= 500
}

// notApplied settles an unknown write that turned out not to have taken
// effect: the item failed, and there is nothing to undo.
func (run *batchRun) notApplied(ctx context.Context, i int, how string) {
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.Outcome, st.applied = Failed, false
		it.Error = joinReasons(it.Error, how)
	})
}

// settle gives item i its final outcome. reason says why an undo failed
// or was not sent; found is what a proof read showed instead.
func (run *batchRun) settle(ctx context.Context, i int, outcome Outcome, reason string, found *SubResponse) {
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, _ *itemState) {
		it.Outcome = outcome
		if reason == "" {
			return
		}
		if it.Compensation == nil {
			it.Compensation = &Compensation{}
		}
		it.Compensation.Error = reason
		if found != nil {
			it.Compensation.Status = found.Status
			if jsonvalue.IsObject(found.Body) {
				it.Compensation.Found = found.Body
			}
		}
	})
}

// retrying sends a compensation-step request until it is answered with a
// status not worth retrying, at most compensation_retries times more,
// each attempt within compensation_timeout and all within ctx. c, if
// given, counts the attempts and keeps the last one's status or error.
func (run *batchRun) retrying(ctx context.Context, i int, req *SubRequest, c *Compensation) (*SubResponse, error) {
	s := run.state[i].tgt.settings
	budget := limit{"the compensation's budget", run.budget(i)}
	for attempt := 1; ; attempt++ {
		resp, err := run.send(i, req, sendOpts{wait: ctx, ctx: ctx, urgent: true, timeout: limit{"compensation_timeout", s.CompensationTimeout}, parent: budget})
		if resp == nil && (errors.Is(err, slots.ErrNoSlot) || errors.Is(err, ErrThrottleWait)) {
			err = &noAnswer{http.StatusGatewayTimeout, "no slot of max_in_flight came free, or the upstream's throttle did not lift, within " + budget.String(), err}
		}
		if c != nil {
			run.mu.Lock()
			run.sentUndos++
			c.Attempts++
			if resp != nil {
				c.Status, c.Error, c.cause = resp.Status, "", nil
				if !is2xx(resp.Status) {
					c.Error = fmt.Sprintf("answered %d", resp.Status)
				}
			} else {
				na := asNoAnswer(err)
				c.Status, c.Error, c.cause = 0, na.reason, na.err
			}
			run.mu.Unlock()
		}
		if resp != nil && !retryable(resp.Status) || attempt > s.CompensationRetries || errors.Is(err, errFence) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return resp, err
		case <-time.After(run.backoff(attempt)):
		}
	}
}
