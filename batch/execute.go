package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/slots"
	"github.com/caddy-batch/caddy-batch/policy"
)

// execute is the saga's fourth step, and all of a batch that is not a
// saga: it sends every pending item, at most Concurrency at once. No new
// item starts once the client went away (clientCtx), the batch's deadline
// passed (batchCtx), or, in an all-or-nothing batch, an item failed. A
// write already sent is never cut by either: its outcome would be
// unknown. It runs to its own item_timeout.
func (run *batchRun) execute(clientCtx, batchCtx context.Context) {
	stop := make(chan struct{})
	halt := sync.OnceFunc(func() { close(stop) })
	defer context.AfterFunc(clientCtx, halt)()
	if run.plan.envelope() {
		run.executeGraph(clientCtx, batchCtx)
		return
	}
	pending := pending(run.plan, run.state)
	if run.plan.Op == policy.OpGet && run.plan.Match.Resource.List != nil && len(pending) > 0 {
		answer := func(ctx context.Context, i int, resp *SubResponse, err error) {
			if !run.answered(ctx, i, nil, resp, err) && run.allOrNothing {
				halt() // a throttled LIST, or an answer too large to keep
			}
		}
		pending = run.lists.read(batchCtx, run.state[pending[0]].tgt, pending, idsOf(run.items, pending), stop, listed{
			found: func(ctx context.Context, i int, elem json.RawMessage) {
				answer(ctx, i, &SubResponse{Status: http.StatusOK, Body: elem}, nil)
			},
			throttled: answer,
		})
	}
	ahead := run.ahead
	if ahead == nil {
		ahead = run.recordsAhead(clientCtx, pending)
	}
	ahead.start()
	if run.plan.window != nil {
		run.plan.window.places = newPlaces(run.batchSettings.Concurrency, pending, stop, run.plan.window.stop)
		defer halt()
	}
	run.started = fanOut(batchCtx, run.plan.width(run.batchSettings.Concurrency), pending, stop, func(batchCtx context.Context, i int) {
		if run.plan.window.stopped() {
			halt() // the item stays not_attempted
			return
		}
		ahead.next(i)
		defer run.plan.window.done(i)
		if !run.executeItem(clientCtx, batchCtx, i) && (run.allOrNothing || run.refusedInWindow(i)) {
			halt()
		}
	})
	ahead.settleUnsent(clientCtx)
	for i, it := range run.plan.Items {
		if it.firstWithID != i {
			first := run.items[it.firstWithID]
			first.Index = run.plan.base() + i
			run.items[i], run.state[i] = first, run.state[it.firstWithID]
		}
	}
}

// executeGraph is execute for an envelope: every operation starts as soon
// as everything it depends on has succeeded, in the order of the
// envelope, at most Concurrency at once. As in a batch, nothing new
// starts once the client went away, the batch's deadline passed, or, when
// all-or-nothing, an operation failed. In partial mode an operation whose
// dependency did not succeed is not attempted, with 424 (Failed
// Dependency).
func (run *batchRun) executeGraph(clientCtx, batchCtx context.Context) {
	writeCtx := context.WithoutCancel(clientCtx)
	n := len(run.items)
	started, ended, succeeded := make([]bool, n), make([]bool, n), make([]bool, n)
	finished := make(chan int)
	results := make([]bool, n)
	for i := range n {
		if run.plan.window != nil && run.state[i].settled {
			// A job's window carried on: what its log says it did stands.
			started[i], ended[i], succeeded[i] = true, true, run.items[i].Outcome == Succeeded
		}
	}
	running, halted := 0, false
	for {
		// A job's window stops as a batch's client going away stops it.
		halted = halted || clientCtx.Err() != nil || batchCtx.Err() != nil || run.plan.window.stopped()
		for i := 0; i < n && !halted && running < run.batchSettings.Concurrency; i++ {
			if started[i] {
				continue
			}
			ready, failedDep, blocked := run.plan.dependencies(i, ended, succeeded)
			switch {
			case blocked:
				started[i], ended[i] = true, true
				run.notAttempted(writeCtx, i, failedDep)
			case ready:
				started[i] = true
				running++
				run.started = append(run.started, i)
				go func() {
					results[i] = run.executeOperation(clientCtx, batchCtx, i)
					finished <- i
				}()
			}
		}
		if running == 0 {
			return
		}
		i := <-finished
		running--
		ended[i], succeeded[i] = true, results[i]
		if !results[i] && (run.allOrNothing || run.refusedInWindow(i)) {
			halted = true
		}
	}
}

// executeOperation runs one operation of an envelope: it fills in its
// references, and, where its url named its item only once filled, locks
// and preflights that item as the saga's first steps do for the others;
// then it sends it as a batch's item. It reports whether it succeeded.
func (run *batchRun) executeOperation(clientCtx, batchCtx context.Context, i int) bool {
	planned, ctx := &run.plan.Items[i], context.WithoutCancel(clientCtx)
	late := planned.tgt == nil || planned.tgt.kind == policy.OpCreate && planned.ID == "" || planned.rewrite
	if planned.tgt == nil || planned.operation.body != nil {
		if !run.fill(ctx, i) {
			return false
		}
	}
	if late && !planned.rewrite && !run.claimWrite(ctx, i) {
		return false
	}
	if late && run.saga && run.state[i].tgt.kind.Writes() && run.items[i].ID != "" {
		if !run.lockLate(clientCtx, batchCtx, i) {
			return false
		}
		read := run.preflightRead(i)
		if read != nil && !read(batchCtx, i) {
			return false
		}
	}
	return run.executeItem(clientCtx, batchCtx, i)
}

// fill makes of operation i what the operations it references did: ids
// and members in its url and body, which give its target, its item's id
// and the body it sends. They go into the run's state (itemState, the
// item's ItemResult), never into the plan. It settles the item as failed
// (400, nothing sent) when a reference cannot be filled, and reports
// whether it could. Everything it references has succeeded: it runs only
// then, on the operation's own goroutine.
func (run *batchRun) fill(ctx context.Context, i int) bool {
	planned := &run.plan.Items[i]
	eo := planned.operation
	t, id, body := planned.tgt, planned.ID, planned.Body
	f := filling{plan: run.plan, ended: run.result}
	var err error
	if len(eo.refs) > 0 {
		t, id, err = f.url(eo)
	}
	if err == nil && eo.body != nil {
		var v any
		if v, err = f.body(eo.body); err == nil {
			body, _ = json.Marshal(v) // decoded JSON always encodes
		}
	}
	if err == nil {
		id, err = elementID(t, body, id)
	}
	if err != nil {
		run.fail(ctx, i, http.StatusBadRequest, fmt.Sprintf("operation %q could not be filled in: %v", eo.id, err), nil)
		return false
	}
	run.mu.Lock()
	st := &run.state[i]
	st.tgt, st.body = t, body
	if t.kind == policy.OpCreate {
		st.elementID = id
	}
	run.items[i].ID, run.items[i].URL = id, eo.sentURL(t, id)
	run.mu.Unlock()
	return true
}

// claimWrite checks an operation whose item became known as the envelope
// ran against the other operations that write the same item: one of each
// two must wait for the other, as orderWrites asks of those known up
// front. It settles the operation as failed (400, nothing sent) when it
// would race one of them.
func (run *batchRun) claimWrite(ctx context.Context, i int) bool {
	key := writeKey(run.state[i].tgt, run.items[i].ID)
	if key == "" {
		return true
	}
	run.mu.Lock()
	race := -1
	for _, w := range run.writers[key] {
		if w != i && !run.plan.dependsOn(i, w) && !run.plan.dependsOn(w, i) {
			race = w
		}
	}
	if race < 0 {
		run.writers[key] = append(run.writers[key], i)
	}
	run.mu.Unlock()
	if race >= 0 {
		d := sameItem(run.plan.Items[i].operation.id, run.plan.Items[race].operation.id, key)
		run.fail(ctx, i, http.StatusBadRequest, d.Detail, nil)
	}
	return race < 0
}

// notAttempted settles an operation of a partial envelope that cannot run
// because an operation it depends on did not succeed.
func (run *batchRun) notAttempted(ctx context.Context, i, dep int) {
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.clearResponse()
		it.Status, it.Outcome, st.settled = http.StatusFailedDependency, NotAttempted, true
		it.Error = fmt.Sprintf("operation %q, which it depends on, did not succeed", run.result(dep).OperationID)
	})
}

// executeItem sends item i's own request and records the answer. It
// reports whether the item succeeded. Waiting (for a lock or a slot)
// counts against the batch (batchCtx); once sent, a write runs to its
// own item_timeout, whether or not its client (clientCtx) stays.
func (run *batchRun) executeItem(clientCtx, batchCtx context.Context, i int) bool {
	t, id := run.state[i].tgt, run.items[i].ID
	ctx := context.WithoutCancel(clientCtx)
	if !t.kind.Writes() {
		ctx = batchCtx // a read is cut by the batch's deadline and its client
	}
	run.mu.Lock()
	req := run.request(i)
	run.mu.Unlock()
	if t.kind.Writes() && !run.saga {
		// A partial batch's write locks its item only while in flight,
		// as a single write through the gateway does (a job's, also
		// while it waits for its turn in its window).
		unlock, ok := run.lockOne(clientCtx, batchCtx, i, id)
		if !ok {
			return false
		}
		defer unlock()
	}
	sp := run.trace.span(kindItem, i, id)
	defer sp.end(&run.mu, &run.items[i])
	o := sendOpts{wait: batchCtx, ctx: ctx, timeout: limit{"item_timeout", t.settings.ItemTimeout}, parent: run.sender.batchTimeout, span: sp}
	if t.kind.Writes() {
		// A write is recorded before it waits for its turn, a slot or a
		// throttle hold, never holding a slot through its record's store:
		// slots are few (max_in_flight auto starts at 4, and a job holds
		// at most half), and a store then takes the records of the
		// writes waiting, not only of those holding a slot
		// (docs/durability.md, "Round trips per batch"). req stays as it
		// was sent, for a resend.
		err := run.transition(ctx, i, PhaseSending, req, func(_ *ItemResult, st *itemState) { st.sent = req })
		if err != nil {
			run.failByGateway(ctx, i, "the "+run.journalOf()+"'s journal could not record the write, so it was not sent", errors.Join(errJournal, err))
			return false
		}
	}
	if !run.plan.window.enter(batchCtx, i) {
		// The window halted, or its deadline passed, before the item's
		// turn.
		return run.notSent(ctx, i)
	}
	resp, err := run.send(i, req, o)
	// Read by the item's undo, which runs once the item's goroutine ended.
	run.state[i].writeSpan = sp.spanID()
	switch {
	case errors.Is(err, errFence):
		run.fenced(ctx, i, err)
		return false
	case resp == nil && (errors.Is(err, slots.ErrNoSlot) || errors.Is(err, ErrThrottleWait)):
		return run.notSent(ctx, i) // the batch ran out of time before the item could start
	}
	return run.answered(ctx, i, req, resp, err)
}

// notSent leaves item i not attempted: its request never left. A
// write's record, which said it was about to, says so now (settled, with
// nothing sent), so that neither a recovery nor a job's carry-on takes
// it for a write whose answer was lost.
func (run *batchRun) notSent(ctx context.Context, i int) bool {
	// A write its job's last owner may have applied keeps that owner's
	// record, unanswered: failByGateway says why.
	if run.state[i].tgt.kind.Writes() && !run.state[i].resentWithKey {
		_ = run.transition(ctx, i, PhaseSettled, nil, func(_ *ItemResult, st *itemState) { st.sent = nil })
	}
	return false
}

// request is item i's own request, made the first time it is asked
// for. run.mu is held.
func (run *batchRun) request(i int) *SubRequest {
	st := &run.state[i]
	if st.request != nil {
		return st.request
	}
	key := "" // a read carries no Idempotency-Key
	if st.tgt.kind.Writes() {
		key = run.plan.key.forItem(run.plan.base()+i, "")
	}
	st.request = st.tgt.itemRequest(run.plan.header, run.items[i].ID, st.body, key)
	if st.preETag != "" {
		// Whoever changed the item since the preflight read it, the write
		// must not land on their change: 412 is this item's failure.
		st.request.Header.Set("If-Match", st.preETag)
	}
	return st.request
}

// errJournal wraps the error of a write's record in the journal, which
// sends nothing.
var errJournal = errors.New("the saga's journal could not record the write")

// send sends item i's req through the run's sender, with the saga's last
// look at its lease after every wait (docs/durability.md, "Clusters"): no
// write leaves for a saga another instance may be finishing. Every write
// of a saga waits for its lease to be proven, but the undos of a saga
// that lost its lease (endLost).
func (run *batchRun) send(i int, req *SubRequest, o sendOpts) (*SubResponse, error) {
	fence := func() error {
		// A run that journals nothing may still stand on a lease: a
		// keyed batch's claim on its Idempotency-Key.
		if req.Method == http.MethodGet || req.Method == http.MethodHead || run.selfUndo.Load() {
			return nil
		}
		if err := run.rt.Journal.Fence(o.wait); err != nil {
			return errors.Join(errFence, err)
		}
		return nil
	}
	return run.sender.send(run.state[i].tgt, req, o, fence)
}

// answered records the answer to item i's own request (req), and for a
// write that took effect, how to undo it. It reports whether the item
// succeeded.
func (run *batchRun) answered(ctx context.Context, i int, req *SubRequest, resp *SubResponse, err error) bool {
	t := run.state[i].tgt
	write := t.kind.Writes()
	var succeeded bool
	var ans itemAnswer
	if resp != nil {
		ans = answerOf(resp)
	}
	hint := run.warning.note(run.state[i].tgt.movedHint(req, resp))
	_ = run.transition(ctx, i, PhaseAnswered, nil, func(it *ItemResult, st *itemState) {
		st.answeredAt = time.Now()
		if resp == nil {
			recordNoAnswer(it, st, err, write)
			return
		}
		it.setAnswer(ans)
		if err != nil {
			it.Error, it.cause = answerError(err), err
		}
		switch {
		case is2xx(resp.Status):
			it.Outcome, succeeded = Succeeded, true
			if write {
				st.tookEffect(it, resp, run.saga)
			}
		case resp.Status == http.StatusNotFound && t.kind == policy.OpDelete && t.settings.DeleteSemantics == policy.Declarative:
			st.goneAsDeclared(it, resp, run.saga)
			succeeded = true
		case write && resp.Resent:
			// The answer is to a second copy (a 404 to a DELETE, a 409 to a
			// create): the first may well have done what was asked.
			mayHaveTakenEffect(it, st, "the request was sent twice (a connection dropped) and an earlier copy may have taken effect")
		case notCarriedOut(resp.Status):
			it.Outcome, st.failure = Failed, true
			it.Error = joinReasons(fmt.Sprintf("the upstream answered %d: the request was not carried out at this URL", resp.Status), hint)
		case write && resp.Status >= 300 && resp.Status < 400:
			mayHaveTakenEffect(it, st, fmt.Sprintf("the upstream answered the write with a redirect (%d): it may have taken effect", resp.Status))
			if t.kind == policy.OpCreate {
				st.nameRedirected(it, resp)
			}
		case write && (resp.Status == http.StatusBadGateway || resp.Status == http.StatusGatewayTimeout):
			// What a proxy in front of the upstream answers when the
			// upstream's own answer did not reach it (RFC 9110, 15.6.3
			// and 15.6.5): the write may have been applied all the same.
			mayHaveTakenEffect(it, st, fmt.Sprintf("the write was answered %d, which a proxy in front of the upstream sends when the upstream's answer did not reach it: it may have taken effect", resp.Status))
		case resp.Status == http.StatusPreconditionFailed && st.preETag != "":
			it.Outcome, st.failure = Failed, true
			it.Error = "the item changed after the batch read it (If-Match failed), so the write was not applied"
		default:
			it.Outcome, st.failure = Failed, true
		}
		if w := run.plan.window; w != nil {
			w.keep(it)
		} else if !run.answer.keep(it, st, run.plan.copies(i), run.allOrNothing) {
			succeeded = false
		}
	})
	if id := run.items[i].ID; t.kind == policy.OpCreate && run.saga && id != "" && run.state[i].applied {
		run.lockCreated(ctx, i, id)
	}
	return succeeded
}

// fail settles item i as failed by the gateway, with nothing sent.
func (run *batchRun) fail(ctx context.Context, i, status int, reason string, cause error) {
	_ = run.transition(ctx, i, PhaseSettled, nil, failed(status, reason, cause))
}

// failed is the change that makes an item failed by the gateway, with
// nothing sent.
func failed(status int, reason string, cause error) func(*ItemResult, *itemState) {
	return func(it *ItemResult, st *itemState) {
		it.clearResponse()
		it.Status, it.Error, it.cause = status, reason, cause
		it.Outcome, st.failure = Failed, true
	}
}

// failByGateway settles item i as failed by the gateway's own storage
// (its journal, its lease), with nothing sent: 503, which the batch
// answers as it is, never as the upstream's 502 (failureStatus).
//
// Its record says so (ItemSnapshot.Unsent), for a job whose window runs
// again to send it; but not for a write its job's last owner may have
// applied (resentWithKey): the log's record of that owner's copy, still
// unanswered, is what keeps it unknown, with its first pre-image, for
// whoever runs the window next.
func (run *batchRun) failByGateway(ctx context.Context, i int, reason string, cause error) {
	settle := func(it *ItemResult, st *itemState) {
		failed(http.StatusServiceUnavailable, reason, cause)(it, st)
		st.byGateway = true
	}
	if run.state[i].resentWithKey {
		run.mu.Lock()
		settle(&run.items[i], &run.state[i])
		run.mu.Unlock()
		return
	}
	_ = run.transition(ctx, i, PhaseSettled, nil, settle)
}

// fenced fails item i, whose write the lease did not let go: nothing
// was sent.
func (run *batchRun) fenced(ctx context.Context, i int, err error) {
	of := run.journalOf()
	reason := "the " + of + "'s lease in storage could not be proven in time (the storage did not answer), so the write was not sent"
	switch {
	case !run.journaled() && run.lease.saw(err):
		reason = "the batch's claim on its Idempotency-Key was lost (" + run.lease.loss().Why + "): a retry of it may be running, so the write was not sent"
	case !run.journaled():
		reason = "the batch's claim on its Idempotency-Key could not be proven in time (the storage did not answer), so the write was not sent"
	case run.lease.saw(err):
		reason = "the " + of + "'s lease was lost (" + run.lease.loss().Why + "): another instance finishes the " + of + ", so the write was not sent"
	}
	run.failByGateway(ctx, i, reason, err)
}

// fanOut runs work on each index in order, at most concurrency at once.
// Once stop is closed or ctx is done it starts nothing new, and lets
// what is in flight finish. It returns the indices in start order.
//
// work gets ctx through a context of its worker's own: contexts made
// under one shared parent (an item's deadline, for each sub-request)
// would all take that parent's lock, and Concurrency workers contend for
// one lock where each could have its own.
func fanOut(ctx context.Context, concurrency int, indices []int, stop <-chan struct{}, work func(ctx context.Context, i int)) []int {
	var mu sync.Mutex
	var started []int
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-stop:
			return 0, false
		case <-ctx.Done():
			return 0, false
		default:
		}
		if len(started) == len(indices) {
			return 0, false
		}
		i := indices[len(started)]
		started = append(started, i)
		return i, true
	}
	var wg sync.WaitGroup
	for range min(concurrency, len(indices)) {
		wg.Go(func() {
			workerCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			for i, ok := take(); ok; i, ok = take() {
				work(workerCtx, i)
			}
		})
	}
	wg.Wait()
	return started
}

// pending lists the items still to send: not settled, and not a repeat of
// an earlier id (a batch GET fetches each id once).
func pending(p *Plan, state []itemState) []int {
	var out []int
	for i, it := range p.Items {
		if it.firstWithID == i && !state[i].settled {
			out = append(out, i)
		}
	}
	return out
}

// goneAsDeclared records a DELETE answered 404 under declarative delete
// semantics: "it must not exist" holds, so it succeeded. Nothing was
// deleted to undo, unless an earlier copy of a resent request deleted it.
func (st *itemState) goneAsDeclared(it *ItemResult, resp *SubResponse, saga bool) {
	it.clearResponse()
	it.Status, it.Outcome = http.StatusNoContent, Succeeded
	if resp.Resent && saga {
		st.applied, st.undo = true, st.recreate(it.ID)
	}
}

// tookEffect records a write answered 2xx: applied, the item it created
// named, and, in a saga, how it is undone.
func (st *itemState) tookEffect(it *ItemResult, resp *SubResponse, saga bool) {
	st.applied = true
	if st.tgt.kind == policy.OpCreate {
		st.nameCreated(it, resp)
	}
	if saga {
		st.undo, st.noUndo = st.undoOf(it, resp)
	}
}

// nameRedirected names the item a create answered with a redirect may
// have made, from a Location that names an item of its resource.
func (st *itemState) nameRedirected(it *ItemResult, resp *SubResponse) {
	if id, ok := st.tgt.match.IDFromLocation(resp.Header.Get("Location")); ok && badID(id) == "" {
		it.ID, st.createdFrom = id, "redirect"
	}
}

// mayHaveTakenEffect marks a write whose answer does not say what it did:
// unknown, so that the saga finds out, and a failure of the batch.
func mayHaveTakenEffect(it *ItemResult, st *itemState, why string) {
	it.Outcome, st.applied, st.failure = Unknown, true, true
	it.Error = why
}

// answerError says what is wrong with an answer that came with an
// error: its body, or that it stands for a request never sent.
func answerError(err error) string {
	var list *listThrottled
	var held *HeldBack
	switch {
	case errors.As(err, &list):
		return list.Error()
	case errors.As(err, &held):
		return held.Error()
	case errors.Is(err, ErrBodyTooLarge):
		return "the answer's body is larger than max_body_size and is left out"
	}
	return "the answer's body was cut short"
}

// recordNoAnswer records a request that got no answer: a timeout (504)
// or an unreachable upstream (502). A write that left the gateway may
// have been applied, so its outcome is unknown, and the saga treats it as
// applied until it learns otherwise.
func recordNoAnswer(it *ItemResult, st *itemState, err error, write bool) {
	na := asNoAnswer(err)
	it.clearResponse()
	it.Status, it.Error, it.cause = na.status, na.reason, na.err
	it.Outcome, st.failure = Failed, true
	if write && !errors.Is(err, ErrNotSent) {
		it.Outcome, st.applied = Unknown, true
	}
}
