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
	dependents := run.plan.dependents()
	undone := make([]chan struct{}, len(run.items))
	for _, i := range slices.Backward(run.started) {
		if !run.state[i].applied || run.items[i].undone() {
			continue
		}
		undone[i] = make(chan struct{})
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			defer close(undone[i])
			waitUndone(dependents, undone, i)
			run.undoItem(ctx, i)
		})
	}
	wg.Wait()
}

// waitUndone waits until every item that depends on item i, directly or
// through items with nothing to undo (a read between two writes of one
// item), is undone: a write's undo must not come before a later write's
// to the same item, whatever lies between them.
func waitUndone(dependents [][]int, undone []chan struct{}, i int) {
	seen := map[int]bool{}
	var wait func(i int)
	wait = func(i int) {
		for _, j := range dependents[i] {
			if seen[j] {
				continue
			}
			seen[j] = true
			if undone[j] != nil {
				<-undone[j]
			} else {
				wait(j)
			}
		}
	}
	wait(i)
}

// undoItem undoes one item: it learns what an unknown write did, proves
// the item is as the batch left it, and only then sends the undo.
func (run *batchRun) undoItem(ctx context.Context, i int) {
	ctx, cancel := context.WithTimeout(ctx, compensationBudget(run.state[i].tgt.settings, run.backoff))
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
	if st.resumed && u.Method == http.MethodPost && !st.tgt.settings.IdempotentUpstream {
		// Its own id reads nothing, yet a re-create may have gone out
		// already (from the gateway that ran the saga before, or from
		// the instance that took it over) and made the item under an id
		// the API assigned: a second would make a second copy.
		run.settle(ctx, i, RollbackFailed, "its re-create (restore_deleted post) may have been sent already, its answer never recorded, and made the item under an id the API assigned: another could make a second copy, so none was sent; look for the item, and re-create it if it is not there (idempotent_upstream lets the gateway send it again with its Idempotency-Key)", nil)
		return
	}
	if u.Proof != nil && !st.readProved && !run.proved(ctx, i, u.Proof) {
		return
	}
	c := &Compensation{Method: u.Method, Path: u.Path, Found: run.items[i].Compensation.found()}
	req := st.tgt.undoRequest(run.plan.header, run.plan.key.forItem(run.plan.base()+i, ":undo"), u)
	_ = run.transition(ctx, i, PhaseUndoing, req, func(it *ItemResult, _ *itemState) { it.Compensation = c })
	sp := run.trace.undoSpan(i, run.items[i].ID, st.writeSpan)
	defer sp.end(&run.mu, &run.items[i])
	resp, err := run.retrying(ctx, i, req, c, sp)
	switch {
	case errors.Is(err, errFence) && run.lease.saw(err):
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
	case u.Method == http.MethodDelete && gone(resp.Status) && (u.Proof != nil || st.idNamedByAPI()):
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
	sp := run.trace.span(kindProof, i, id)
	defer sp.end(&run.mu, &run.items[i])
	resp, err := run.retrying(ctx, i, run.state[i].tgt.read(run.plan.header, id), nil, sp)
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
	sp := run.trace.span(kindResend, i, run.items[i].ID)
	defer sp.end(&run.mu, &run.items[i])
	resp, _ := run.retrying(ctx, i, st.sent, nil, sp)
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

// readProof is the proof an undo that a read resolved keeps for later:
// the read proved the item then, and an operator's retry or a recovery
// that sends the undo again must prove it anew. None under
// conditional_writes with a strong ETag: the undo's If-Match is the
// proof, enforced by the upstream.
func (st *itemState) readProof(p *Proof) *Proof {
	if p.ETag != "" && st.tgt.settings.ConditionalWrites {
		return nil
	}
	return p
}

// resolveByRead judges what an unknown write did from a read of its item
// (resp, 2xx or gone), as resolve says. The read is what the item was
// found to be, whatever it shows: it goes into the item's
// compensation.found.
func (run *batchRun) resolveByRead(ctx context.Context, i int, resp *SubResponse) bool {
	st, t, id := &run.state[i], run.state[i].tgt, run.items[i].ID
	run.mu.Lock()
	run.items[i].keepFound(resp)
	run.mu.Unlock()
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
			st.undo.Proof, st.readProved = st.readProof(&Proof{Expect: expect, Subset: true, ETag: st.undo.IfMatch}), true
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
		case gone(resp.Status) && st.idNamedByAPI():
			run.notApplied(ctx, i, "a read after it showed that nothing was created under its id")
			return false
		case gone(resp.Status):
			// Only the element or a redirect named this id: the upstream
			// may have created the item under an id of its own.
			st.noUndo = fmt.Sprintf("nothing is at id %q, which only the element or a redirect named: the upstream may have created the item under an id of its own, so whatever the create made, if anything, is left behind", id)
		case st.createdFrom == "redirect":
			// A redirect may name an item that was there before the
			// batch, equivalent to what the create sent.
			st.noUndo = fmt.Sprintf("the create was answered with a redirect to %q, which may be an item that was there before the batch (an API may point a create at an existing equivalent item), so it was left as it is", id)
		case run.state[i].holds(resp.Body, st.body):
			st.undo = &Undo{Method: http.MethodDelete, Path: run.state[i].tgt.paths.Path(id), IfMatch: strongETag(resp.Header)}
			st.undo.Proof, st.readProved = st.readProof(&Proof{Expect: jsonvalue.WithoutMember(st.body, t.settings.IDField), Subset: true, ETag: st.undo.IfMatch, GoneIsUndone: st.idNamedByAPI()}), true
		default:
			st.noUndo = fmt.Sprintf("an item the batch may not have written is at id %q, so it was left as it is", id)
		}
	}
	return true
}

// proved reads item i and tells whether it is as proof asks before its
// undo is sent; where it is not, the item is settled as the read shows.
func (run *batchRun) proved(ctx context.Context, i int, proof *Proof) bool {
	sp := run.trace.span(kindProof, i, run.items[i].ID)
	defer sp.end(&run.mu, &run.items[i])
	resp, err := run.retrying(ctx, i, run.state[i].tgt.read(run.plan.header, run.items[i].ID), nil, sp)
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

// alreadyUndone reads an item whose undo a dead saga may have sent, and
// reports whether it is already as the undo would leave it.
func (run *batchRun) alreadyUndone(ctx context.Context, i int) bool {
	sp := run.trace.span(kindProof, i, run.items[i].ID)
	defer sp.end(&run.mu, &run.items[i])
	resp, _ := run.retrying(ctx, i, run.state[i].tgt.read(run.plan.header, run.items[i].ID), nil, sp)
	if resp == nil {
		return false
	}
	switch st := &run.state[i]; st.tgt.kind {
	case policy.OpCreate:
		// Nothing at an id only its element named proves nothing: the
		// API may have made the item under an id of its own.
		return gone(resp.Status) && st.idNamedByAPI()
	default:
		return is2xx(resp.Status) && st.same(resp.Body, st.preimage)
	}
}

// retrying sends a compensation-step request until it is answered with a
// status not worth retrying, at most compensation_retries times more,
// each attempt within compensation_timeout and all within ctx. c, if
// given, counts the attempts and keeps the last one's status or error;
// sp, if given, makes a span of each attempt.
//
// It never sends again sooner than a throttling answer's Retry-After
// asks (a wait past the budget ends the tries), nor a POST not under
// idempotent_upstream after an answer other than 429 (section 17's rule
// for any POST): a POST answered 5xx, or not at all, may have been
// carried out, and again could make twice what it restores.
func (run *batchRun) retrying(ctx context.Context, i int, req *SubRequest, c *Compensation, sp *reqSpan) (*SubResponse, error) {
	s := run.state[i].tgt.settings
	budget := limit{"the compensation's budget", compensationBudget(s, run.backoff)}
	began := time.Now()
	for attempt := 1; ; attempt++ {
		resp, err := run.send(i, req, sendOpts{wait: ctx, ctx: ctx, urgent: true, timeout: limit{"compensation_timeout", s.CompensationTimeout}, parent: budget, span: sp})
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
		if req.Method == http.MethodPost && !s.IdempotentUpstream && (resp == nil || resp.Status != http.StatusTooManyRequests) {
			return resp, err
		}
		wait := run.backoff(attempt)
		if d, ok := askedWait(resp); ok {
			if time.Since(began)+d > budget.d {
				return resp, err
			}
			wait = max(wait, d)
		}
		select {
		case <-ctx.Done():
			return resp, err
		case <-time.After(wait):
		}
	}
}

// askedWait is the wait a throttling answer's Retry-After asks for, if
// it names one.
func askedWait(resp *SubResponse) (time.Duration, bool) {
	if resp == nil || resp.Header.Get("Retry-After") == "" {
		return 0, false
	}
	return throttled(resp, time.Now())
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

// undoOwnSince undoes, with every proof, the writes answered after
// proven (or never answered): the instance that took the saga over read
// its journal before they may have landed. Each is locked afresh first
// (a storage lock may have lapsed with the lease). The journal keeps
// these undos in memory only: it is the new owner's now.
func (run *batchRun) undoOwnSince(ctx context.Context, proven time.Time) {
	var own []int
	for _, i := range run.started {
		st := &run.state[i]
		if !st.applied || run.items[i].undone() || !st.answeredAt.IsZero() && !st.answeredAt.After(proven) {
			continue
		}
		st.resumed = true // the new owner may have undone it already
		own = append(own, i)
	}
	run.selfUndo.Store(true)
	for _, i := range own {
		if key := writeKey(run.state[i].tgt, run.items[i].ID); key != "" && run.rt.Locks != nil {
			run.locks.drop(key)
			lockCtx, cancel := context.WithTimeout(ctx, compensationBudget(run.state[i].tgt.settings, run.backoff))
			unlock, err := run.rt.Locks.Lock(lockCtx, key)
			cancel()
			if err != nil {
				run.settle(ctx, i, RollbackFailed, "the saga's lease was lost, and the item's lock could not be taken again to undo the write it sent since ("+err.Error()+")", nil)
				continue
			}
			run.locks.add(key, unlock)
		}
		run.undoItem(ctx, i)
	}
	for _, i := range run.started {
		if st := &run.state[i]; st.applied && !run.items[i].undone() && run.items[i].Outcome != Failed {
			run.mu.Lock()
			run.items[i].Outcome = Unknown
			run.items[i].Error = joinReasons(run.items[i].Error, "the saga's lease was lost: the instance that took it over decides this item")
			run.mu.Unlock()
		}
	}
}

// reopen makes item i, if it was left behind, one to undo again: its
// undo computed under the current settings, or, where none could be
// computed because what its write did was never learned, its outcome
// unknown again, to be learned by a new read. An item still to undo
// gets its undo under the current settings, unless it may have been
// sent already (PhaseUndoing: the recorded one is what is proved).
func (run *batchRun) reopen(i int) {
	it, st := &run.items[i], &run.state[i]
	if !st.applied {
		return
	}
	if !run.items[i].undone() && st.undo != nil && st.phase != PhaseUndoing {
		st.undo = st.undoAgain(it.ID)
		return
	}
	if it.Outcome != RollbackFailed {
		return
	}
	if c := it.Compensation; c != nil && (c.CreatedID != "" || c.Method == http.MethodPost && c.Attempts > 0 && !st.tgt.settings.IdempotentUpstream) {
		// A re-create by POST that went out may have made the item
		// under an id its answer did not name: another would make a
		// second (it is left to an operator, as one that named
		// another id is).
		return
	}
	switch {
	case st.undo != nil:
		st.undo = st.undoAgain(it.ID)
		it.Outcome = Succeeded
	case it.ID != "":
		st.noUndo = ""
		it.Outcome = Unknown
	default:
		return // nothing names what the write made: nothing to try
	}
	it.Compensation, st.resumed = nil, false
}

// undone reports whether the item's compensation already ended: a saga
// resumed from its journal (Resume) may have done some of its undos
// before it died, and an item put back must not be proved again (the
// proof would find the pre-image, not the batch's write).
func (it *ItemResult) undone() bool {
	return it.Outcome == RolledBack || it.Outcome == RollbackFailed
}

// found is what the read that resolved an unknown write found, if it
// found the item (nil for no compensation yet): the undo's compensation
// keeps it. Only the goroutine that undoes the item writes it.
func (c *Compensation) found() json.RawMessage {
	if c == nil {
		return nil
	}
	return c.Found
}

// undoRequest turns an undo of an item of t into the request that
// carries it, with key as its Idempotency-Key.
func (t *target) undoRequest(header http.Header, key string, u *Undo) *SubRequest {
	req := newSubRequest(header, t, u.Method, u.Path, u.Body, key)
	if u.IfMatch != "" {
		req.Header.Set("If-Match", u.IfMatch)
	}
	if u.IfNoneMatch != "" {
		req.Header.Set("If-None-Match", u.IfNoneMatch)
	}
	return req
}

// neither leads the reason an unknown write's item is left: the read
// that was to tell what the write did shows neither outcome.
const neither = "the item is neither as it was before the batch nor as the batch's write would leave it"

// keepFound keeps what the read that resolved the item's unknown write
// found (a 2xx's object), in its compensation, whatever comes of it.
func (it *ItemResult) keepFound(resp *SubResponse) {
	if !is2xx(resp.Status) || !jsonvalue.IsObject(resp.Body) {
		return
	}
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
