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
func (sg *saga) compensate(ctx context.Context) {
	slots := make(chan struct{}, sg.batchSettings.Concurrency)
	var wg sync.WaitGroup
	// An envelope's item is undone only once everything that depends on
	// it is: they started after it ended, so they come before it here.
	dependents := sg.dependents()
	undone := make([]chan struct{}, len(sg.items))
	for _, i := range slices.Backward(sg.started) {
		if !sg.state[i].applied || sg.undone(i) {
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
			sg.undoItem(ctx, i)
		})
	}
	wg.Wait()
}

// undone reports whether item i's compensation already ended: a saga
// resumed from its journal (Resume) may have done some of its undos
// before it died, and an item put back must not be proved again (the
// proof would find the pre-image, not the batch's write).
func (sg *saga) undone(i int) bool {
	o := sg.items[i].Outcome
	return o == RolledBack || o == RollbackFailed
}

// budget is the most one item's compensation may take: every attempt its
// compensation_timeout, and the backoffs between them. Reads that prove
// or resolve the undo share it.
func (sg *saga) budget(i int) time.Duration {
	s := sg.settings(i)
	d := time.Duration(s.CompensationRetries+1) * s.CompensationTimeout
	for attempt := 1; attempt <= s.CompensationRetries; attempt++ {
		d += sg.backoff(attempt)
	}
	return d
}

// undoItem undoes one item: it learns what an unknown write did, proves
// the item is as the batch left it, and only then sends the undo.
func (sg *saga) undoItem(ctx context.Context, i int) {
	ctx, cancel := context.WithTimeout(ctx, sg.budget(i))
	defer cancel()
	if until := sg.state[i].inFlightUntil; !until.IsZero() {
		sleep(ctx, time.Until(until))
	}
	if sg.items[i].Outcome == Unknown && !sg.resolve(ctx, i) {
		return
	}
	st := &sg.state[i]
	u := st.undo
	if u == nil {
		sg.settle(ctx, i, RollbackFailed, st.noUndo, nil)
		return
	}
	if st.resumed && sg.alreadyUndone(ctx, i) {
		sg.settle(ctx, i, RolledBack, "", nil)
		return
	}
	if u.Proof != nil && !sg.proved(ctx, i, u.Proof) {
		return
	}
	c := &Compensation{Method: u.Method, Path: u.Path, Found: sg.foundBefore(i)}
	req := sg.undoRequest(i, u)
	_ = sg.transition(ctx, i, PhaseUndoing, req, func(it *ItemResult, _ *itemState) { it.Compensation = c })
	resp, err := sg.retrying(ctx, i, req, c)
	switch {
	case errors.Is(err, errFence) && sg.leaseLost(err):
		// Another instance finishes the saga: this item is its to undo.
		return
	case errors.Is(err, errFence):
		sg.settle(ctx, i, RollbackFailed, "the undo was not sent: the saga's lease in storage could not be proven in time (the storage did not answer)", nil)
	case resp == nil:
		sg.settle(ctx, i, RollbackFailed, "", nil)
	case resp.Status == http.StatusPreconditionFailed && c.Attempts > 1 && sg.alreadyUndone(ctx, i):
		// An earlier attempt took effect though its answer was lost, and
		// the condition now fails on the undo's own result.
		sg.settle(ctx, i, RolledBack, "", nil)
	case resp.Status == http.StatusPreconditionFailed:
		sg.settle(ctx, i, RollbackFailed, "the item changed after the batch wrote it (the undo's precondition failed), so it was left as it is", nil)
	case u.Method == http.MethodDelete && gone(resp.Status) && (u.Proof != nil || st.createdFrom != "element"):
		sg.settle(ctx, i, RolledBack, "", nil)
	case is2xx(resp.Status) && u.WantID != "":
		if id, _ := sg.createdID(i, resp); id != u.WantID {
			sg.mu.Lock()
			c.CreatedID = id
			sg.mu.Unlock()
			sg.settle(ctx, i, RollbackFailed, fmt.Sprintf("the item was re-created under another id (%q), not its own (restore_deleted post on an API that assigns ids)", id), nil)
			return
		}
		sg.settle(ctx, i, RolledBack, "", nil)
	case is2xx(resp.Status):
		sg.settle(ctx, i, RolledBack, "", nil)
	default:
		sg.settle(ctx, i, RollbackFailed, "", nil)
	}
}

// proved reads item i and tells whether it is as proof asks before its
// undo is sent; where it is not, the item is settled as the read shows.
func (sg *saga) proved(ctx context.Context, i int, proof *Proof) bool {
	resp, err := sg.retrying(ctx, i, sg.read(i, sg.items[i].ID), nil)
	if resp == nil {
		sg.settle(ctx, i, RollbackFailed, "the item could not be read to prove it is as the batch left it: "+asNoAnswer(err).reason, nil)
		return false
	}
	reason := sg.proves(i, proof, resp)
	switch {
	case reason == "":
		return true
	case proof.GoneIsUndone && gone(resp.Status):
		sg.settle(ctx, i, RolledBack, "the created item was already deleted by someone else", nil)
	case sg.tgt(i).kind != policy.OpCreate && is2xx(resp.Status) && sg.same(i, resp.Body, sg.state[i].preimage):
		// Put back already: by the instance of a cluster that took the
		// saga over, or by this one before it lost its lease, racing
		// for the same item (docs/durability.md, "A saga never writes
		// after it lost its lease"). Nothing of the batch is left on it.
		sg.settle(ctx, i, RolledBack, "the item was already as it was before the batch (put back by another instance finishing the saga, or another writer)", nil)
	default:
		sg.settle(ctx, i, RollbackFailed, reason, resp)
	}
	return false
}

// foundBefore is what the read that resolved item i's unknown write
// found, if it found the item: the undo's compensation keeps it.
func (sg *saga) foundBefore(i int) json.RawMessage {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	if c := sg.items[i].Compensation; c != nil {
		return c.Found
	}
	return nil
}

// alreadyUndone reads an item whose undo a dead saga may have sent, and
// reports whether it is already as the undo would leave it.
func (sg *saga) alreadyUndone(ctx context.Context, i int) bool {
	resp, _ := sg.retrying(ctx, i, sg.read(i, sg.items[i].ID), nil)
	if resp == nil {
		return false
	}
	switch sg.tgt(i).kind {
	case policy.OpCreate:
		return gone(resp.Status)
	default:
		return is2xx(resp.Status) && sg.same(i, resp.Body, sg.state[i].preimage)
	}
}

// undoRequest turns an undo into the request that carries it.
func (sg *saga) undoRequest(i int, u *Undo) *SubRequest {
	req := sg.request(i, u.Method, u.Path, u.Body, sg.plan.key.forItem(i, ":undo"))
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
func (sg *saga) resolve(ctx context.Context, i int) bool {
	if resolved, undo := sg.resend(ctx, i); resolved {
		return undo
	}
	st := &sg.state[i]
	id := sg.items[i].ID
	if id == "" {
		st.noUndo = "the create went unanswered and the id of what it may have created cannot be learned, so that item, if any, is left behind"
		return true
	}
	resp, err := sg.retrying(ctx, i, sg.read(i, id), nil)
	if resp == nil || !is2xx(resp.Status) && !gone(resp.Status) {
		why := fmt.Sprintf("answered %d", statusOf(resp))
		if resp == nil {
			why = asNoAnswer(err).reason
		}
		st.noUndo = "the item could not be read to learn whether the write took effect (" + why + ")"
		return true
	}
	return sg.resolveByRead(ctx, i, resp)
}

// resend sends an unknown write again with the same Idempotency-Key,
// under idempotent_upstream, and reports whether its answer told what
// the first copy did (resolved), and if so whether there is an undo to
// prove and send.
func (sg *saga) resend(ctx context.Context, i int) (resolved, undo bool) {
	st := &sg.state[i]
	if !sg.settings(i).IdempotentUpstream || st.sent == nil {
		return false, false
	}
	_ = sg.transition(ctx, i, PhaseUndoing, st.sent, nil)
	resp, _ := sg.retrying(ctx, i, st.sent, nil)
	if resp == nil || resp.Resent || resp.Status >= 300 && resp.Status < 400 || provesNothing(resp.Status) {
		return false, false
	}
	if !is2xx(resp.Status) {
		sg.notApplied(ctx, i, fmt.Sprintf("sent again with the same Idempotency-Key, it was answered %d: it did not take effect", resp.Status))
		return true, false
	}
	create := sg.tgt(i).kind == policy.OpCreate
	_ = sg.transition(ctx, i, PhaseAnswered, nil, func(it *ItemResult, st *itemState) {
		if create {
			var named ItemResult
			sg.nameCreated(&named, i, resp)
			if named.ID != "" {
				it.ID = named.ID
			}
		}
		st.undo, st.noUndo = sg.undoAnswered(it, st, i, resp)
	})
	if create && sg.items[i].ID != "" {
		sg.lockCreated(ctx, i, sg.items[i].ID)
	}
	return true, true
}

// resolveByRead judges what an unknown write did from a read of its item
// (resp, 2xx or gone), as resolve says. The read is what the item was
// found to be, whatever it shows: it goes into the item's
// compensation.found.
func (sg *saga) resolveByRead(ctx context.Context, i int, resp *SubResponse) bool {
	st, t, id := &sg.state[i], sg.tgt(i), sg.items[i].ID
	sg.found(i, resp)
	switch t.kind {
	case policy.OpUpdate:
		expect := sg.updated(i, st)
		switch {
		case gone(resp.Status):
			st.noUndo = "the item is gone: someone deleted it, so there is nothing to put back"
		case sg.same(i, resp.Body, st.preimage):
			sg.notApplied(ctx, i, "a read after it showed that it did not take effect")
			return false
		case sg.holds(i, resp.Body, expect):
			st.undo = sg.restore(i, st)
			st.undo.IfMatch = strongETag(resp.Header)
		default:
			st.noUndo = sg.changedReason(i, resp.Body, expect, true, neither)
		}
	case policy.OpDelete:
		switch {
		case gone(resp.Status):
			st.undo = sg.recreate(i, id, st)
			st.undo.Proof = nil
		case sg.same(i, resp.Body, st.preimage):
			sg.notApplied(ctx, i, "a read after it showed that it did not take effect")
			return false
		default:
			// A delete sends no member: whatever changed it, the batch
			// did not.
			st.noUndo = neither + ": another writer changed it, so it was left as it is"
		}
	case policy.OpCreate:
		switch {
		case gone(resp.Status) && st.createdFrom == "location":
			sg.notApplied(ctx, i, "a read after it showed that nothing was created under its id")
			return false
		case gone(resp.Status):
			// Only the element named this id: the upstream may have
			// ignored it and created the item under an id of its own.
			st.noUndo = fmt.Sprintf("nothing is at id %q, which only the element named: the upstream may have created the item under an id of its own, so whatever the create made, if anything, is left behind", id)
		case sg.holds(i, resp.Body, st.body):
			st.undo = &Undo{Method: http.MethodDelete, Path: sg.itemPath(i, id), IfMatch: strongETag(resp.Header)}
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
func (sg *saga) found(i int, resp *SubResponse) {
	if !is2xx(resp.Status) || !jsonvalue.IsObject(resp.Body) {
		return
	}
	sg.mu.Lock()
	defer sg.mu.Unlock()
	it := &sg.items[i]
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
func (sg *saga) notApplied(ctx context.Context, i int, how string) {
	_ = sg.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.Outcome, st.applied = Failed, false
		it.Error = joinReasons(it.Error, how)
	})
}

// settle gives item i its final outcome. reason says why an undo failed
// or was not sent; found is what a proof read showed instead.
func (sg *saga) settle(ctx context.Context, i int, outcome Outcome, reason string, found *SubResponse) {
	_ = sg.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, _ *itemState) {
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
func (sg *saga) retrying(ctx context.Context, i int, req *SubRequest, c *Compensation) (*SubResponse, error) {
	s := sg.settings(i)
	budget := limit{"the compensation's budget", sg.budget(i)}
	for attempt := 1; ; attempt++ {
		resp, err := sg.send(i, req, sendOpts{wait: ctx, ctx: ctx, urgent: true, timeout: limit{"compensation_timeout", s.CompensationTimeout}, parent: budget})
		if resp == nil && (errors.Is(err, slots.ErrNoSlot) || errors.Is(err, ErrThrottleWait)) {
			err = &noAnswer{http.StatusGatewayTimeout, "no slot of max_in_flight came free, or the upstream's throttle did not lift, within " + budget.String(), err}
		}
		if c != nil {
			sg.mu.Lock()
			sg.sentUndos++
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
			sg.mu.Unlock()
		}
		if resp != nil && !retryable(resp.Status) || attempt > s.CompensationRetries || errors.Is(err, errFence) {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return resp, err
		case <-time.After(sg.backoff(attempt)):
		}
	}
}
