// Package batch is the engine: it parses the four batch operations, fans
// a batch out as single-resource sub-requests through a Sender, collects
// the answers in request order and, for an all-or-nothing write batch
// that fails, undoes what already happened. It knows nothing of Caddy.
//
// Admission (parse.go, operations.go) makes a Plan of a request; a
// batchRun runs it, top to bottom in run.go, one file per step: lock
// (lock.go), preflight (preflight.go), execute (execute.go), compensate
// (compensate.go) and report (report.go). A saga is an all-or-nothing
// write batch; any other batch only executes and reports. Every change of an
// item's state goes through batchRun.transition (run.go), which is where
// a Journal sees it. What one item knows and decides alone (its request,
// its proof, its undo) are methods of its itemState and target; the
// sending of every sub-request is the run's sender (sending.go), and the
// spans of those requests and the batch span's events are the run's
// runTrace and each request's reqSpan (tracing.go).
package batch

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/slots"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Runtime is what a batch runs with besides its plan: where its
// sub-requests go, where its items are locked, and where its transitions
// are recorded.
type Runtime struct {
	Send Sender
	// Locks locks the items an all-or-nothing batch writes; nil takes no
	// locks.
	Locks itemlock.Locker
	// Journal records the transitions of a saga, or of a bulk job's
	// window (ExecuteWindow), and fences their writes; nil records
	// nothing.
	Journal Journal
	// Slots bound the sub-requests in flight across batches
	// (max_in_flight); nil bounds nothing beyond Concurrency.
	Slots Slots
	// Background takes the run's slots below every synchronous batch's,
	// all background runs together at most half of them
	// (slots.FIFO.BackgroundCap): what a bulk job's runs set, so that an
	// interactive batch always finds slots free or freeing. A
	// synchronous batch leaves it false.
	Background bool
	// Observer is told what every sub-request's answer showed, so that
	// slots whose number follows the upstream (max_in_flight auto) move;
	// nil observes nothing.
	Observer Observer
	// Throttles hold a client's sub-requests to a resource while the
	// upstream asked it to wait, across the batches that share them;
	// nil keeps the batch's own.
	Throttles *Throttles
	// Client names whose batch this is, for Throttles: a hash of its
	// credentials.
	Client string
	// Trace makes a span of every request the run sends, beneath the
	// span in its context; nil makes none (docs/operations.md, "Traces").
	Trace *Tracing
}

// Slots bound the sub-requests in flight across all the batches of a
// handler. Every sub-request holds a slot while in flight.
type Slots interface {
	// Acquire waits for a slot until ctx is done, and returns the
	// function that frees it. Waiters are served in the order they came,
	// except that an urgent one (a compensation) goes before every
	// waiter that is not, so that undos are never starved by new
	// batches, and a background one (a bulk job's) after every
	// synchronous one of the same urgency (slots.FIFO).
	Acquire(ctx context.Context, p slots.Priority) (release func(), err error)
}

// Run executes a planned batch and returns its result. Sub-requests keep
// ctx's values. A client that goes away (ctx cancelled) stops new items
// from starting but never cuts a write already sent: its outcome would be
// unknown. Compensations run detached from ctx's cancellation, with their
// own timeouts.
func Run(ctx context.Context, p *Plan, rt Runtime) *Result {
	run := newBatchRun(p, rt, compensationBackoff)
	res := run.do(ctx)
	run.trace.finish(ctx, p, res)
	return res
}

// batchRun is one run of a planned batch or envelope: every item's
// state as it runs, the locks it holds, and what its answer will say.
// The steps are its methods, one file each (the package's comment).
type batchRun struct {
	plan *Plan
	// batchSettings are the batch's own (Plan.settings); each item's
	// requests follow its target's settings.
	batchSettings policy.Settings
	// allOrNothing is the batch's atomicity; saga says it runs as a
	// saga (Plan.Saga).
	allOrNothing, saga bool
	rt                 Runtime // its Journal and Locks; sender sends
	sender             *sender
	trace              *runTrace // nil when nothing is traced
	backoff            func(attempt int) time.Duration

	// mu guards the items' state: items run on their own goroutines.
	mu      sync.Mutex
	items   []ItemResult
	state   []itemState
	started []int // execution start order, which compensation reverses

	// writers are an envelope's operations that write each item, by the
	// item's path: those whose urls name it, and those found as it runs.
	writers map[string][]int

	locks     *heldLocks
	ahead     *aheadRecords // nil until the preflight or execute makes it
	refusal   *refusal      // why the batch did not start, if it did not
	sentUndos int

	answer *answerBudget // the item bodies the answer will carry

	lists *listReads // the reads through the list filter, and what they did

	warning firstWarning

	// lease is what the run learnt of its saga's lease (leaseWatch);
	// selfUndo is set while a saga that lost it undoes its own recent
	// writes, which no fence holds back.
	lease    leaseWatch
	selfUndo atomic.Bool
}

// itemState is what the run knows of an item beyond what the client is
// told. The Plan stays as it was admitted: what a run learns lives here
// and in the item's ItemResult, each item's written by the goroutine that
// runs it (under mu) and read by another only once that one ended, as an
// envelope's graph orders them.
type itemState struct {
	// tgt is where the item's requests go, and body what its write sends:
	// the plan's, or for an envelope's operation what filling in its
	// references made of them (fill). tgt is nil until they are filled.
	tgt  *target
	body []byte
	// fields are an update's member names (Item.fields), whose old
	// values a PATCH restore puts back.
	fields []string
	// elementID is the id a create's element names (the plan's, or its
	// filled-in body's), which names the created item when the answer
	// does not.
	elementID string

	preimage json.RawMessage // the item before the batch (update, delete)
	preETag  string          // its strong ETag, if the preflight read one
	applied  bool            // the item's write took effect, or may have
	settled  bool            // nothing left to send: a declarative delete of a missing item
	failure  bool            // the item's own request failed or went unanswered
	sent     *SubRequest     // the item's write as sent, which a resend repeats
	// request is the item's own request, made once: the record that it
	// is about to be sent may go ahead of it (ahead.go).
	request *SubRequest
	// createdFrom says where a created item's id came from: "location",
	// "body", "redirect" or "element" (idNamedByAPI).
	createdFrom string
	undo        *Undo  // how to undo the write, computed when it was answered
	noUndo      string // why the write cannot be undone, when undo is nil
	phase       Phase  // the last transition
	// resumed marks an undo that a dead saga may already have sent: a
	// read first tells whether it took effect.
	resumed bool
	// answeredAt is when the item's own request came back, answered or
	// not (a saga that lost its lease undoes what came back after its
	// lease was last proven); byGateway marks a failure that was the
	// gateway's own (its storage), not the upstream's.
	answeredAt time.Time
	byGateway  bool
	// inFlightUntil is when a write that a dead saga recorded as being
	// sent, with no answer, is over for sure: it is resolved after.
	inFlightUntil time.Time
	// readProved marks an undo whose proof the read that resolved the
	// item's unknown write was, a moment ago (resolveByRead): it is sent
	// without reading again. Its Proof stays for a later send (an
	// operator's retry, a recovery), which reads anew.
	readProved bool
	// resentWithKey marks a write a job's last owner sent with no answer
	// recorded, which goes again with the same Idempotency-Key
	// (resolveForward): it may have taken effect, so its pre-image is
	// the one recorded before it was first sent, and no preflight reads
	// it again.
	resentWithKey bool
	// writeSpan is the span of the item's own request, which its undo's
	// span names (batch.compensation.of); invalid when nothing was
	// traced, or the write was another process's.
	writeSpan trace.SpanID
}

// idNamedByAPI reports whether a create's id is the one the upstream
// gave the item it made: its 2xx answer's Location or body. An
// element's own id can be wrong about where the upstream put the item,
// and a redirect's Location may name an item that was there before (a
// 303 may point at an existing equivalent one, RFC 9110 §9.3.3): an
// undo never deletes by those on a read's word alone, and nothing at
// them proves nothing was made.
func (st *itemState) idNamedByAPI() bool {
	return st.createdFrom == "location" || st.createdFrom == "body"
}

func newBatchRun(p *Plan, rt Runtime, backoff func(int) time.Duration) *batchRun {
	if rt.Journal == nil {
		rt.Journal = NoJournal{}
	}
	tr := newRunTrace(rt)
	run := &batchRun{
		plan:          p,
		batchSettings: p.settings,
		rt:            rt,
		trace:         tr,
		sender:        newSender(rt, p.settings.BatchTimeout, tr),
		backoff:       backoff,
		allOrNothing:  p.Atomicity == policy.AllOrNothing,
		saga:          p.Saga(),
		answer:        &answerBudget{max: p.settings.MaxResponseSize},
		items:         make([]ItemResult, len(p.Items)),
		state:         make([]itemState, len(p.Items)),
	}
	run.lists = &listReads{sender: run.sender, concurrency: p.settings.Concurrency, header: p.header, trace: tr}
	if p.envelope() {
		run.writers = map[string][]int{}
	}
	for i, it := range p.Items {
		run.items[i] = ItemResult{Index: p.base() + i, ID: it.ID, Outcome: NotAttempted}
		run.state[i] = admittedState(it)
		if eo := it.operation; eo != nil {
			run.items[i].OperationID, run.items[i].Method, run.items[i].URL = eo.id, eo.method, eo.sentURL(it.tgt, it.ID)
		}
		if key := writeKey(it.tgt, it.ID); key != "" && it.operation != nil {
			run.writers[key] = append(run.writers[key], i)
		}
	}
	return run
}

// admittedState is an item's state before it runs: its requests as the
// plan has them.
func admittedState(it Item) itemState {
	st := itemState{tgt: it.tgt, body: it.Body, fields: it.fields}
	if it.tgt != nil && it.tgt.kind == policy.OpCreate {
		st.elementID = it.ID
	}
	return st
}

// do is the run, top to bottom. The batch's deadline stops new starts
// (preflight reads and items); writes already sent run to their own
// item_timeout, and compensations have theirs.
func (run *batchRun) do(ctx context.Context) *Result {
	batchCtx, cancel := context.WithTimeout(ctx, run.batchSettings.BatchTimeout)
	defer cancel()
	if !run.saga {
		run.execute(ctx, batchCtx)
		return run.report(ctx, batchCtx)
	}
	if !run.lock(ctx, batchCtx) {
		return run.report(ctx, batchCtx)
	}
	defer run.locks.release()
	start := run.trace.now()
	err := run.rt.Journal.Begin(ctx, run.plan)
	run.trace.journalStored(start, err)
	if err != nil {
		// Nothing was written, and nothing may be.
		run.refusal = &refusal{status: http.StatusServiceUnavailable, cause: err, retryAfter: gatewayRetryAfter,
			detail: "the saga's journal could not be written, so the batch was not started; nothing was changed"}
		return run.report(ctx, batchCtx)
	}
	ran := run.preflight(batchCtx)
	if ran {
		run.execute(ctx, batchCtx)
	}
	return run.end(ctx, batchCtx, ran && !allSucceeded(run.items))
}

// end is how a saga ends, run or resumed: it undoes what took effect if it
// must, reports, and ends its journal.
//
// A saga whose lease is lost, or found lost once it is over, ends as
// endLost says: its client hears only what it saw happen.
func (run *batchRun) end(ctx, batchCtx context.Context, undo bool) *Result {
	if undo && run.lease.loss() == nil {
		run.compensate(context.WithoutCancel(ctx))
	}
	run.checkLease(ctx)
	var res *Result
	if lost := run.lease.loss(); lost != nil {
		res = run.endLost(ctx, batchCtx, lost)
	} else {
		res = run.report(ctx, batchCtx)
	}
	run.endJournal(ctx, res)
	if lost := lostAtEnd(run.rt.Journal); lost != nil && run.lease.loss() == nil {
		// Its journal's end found the saga another instance's (a
		// takeover between the last check and the removal): the answer,
		// not yet written, is what endLost says, never the outcome that
		// instance is about to undo.
		run.lease.saw(lost)
		res = run.endLost(ctx, batchCtx, lost)
	}
	return res
}

// endJournal ends the saga's journal and lets its item locks go at
// once: each is a storage round trip the answer waits for, and neither
// needs the other. A process that dies between them has answered
// nothing: its saga is finished by recovery, under the proofs, as any
// saga cut short is.
func (run *batchRun) endJournal(ctx context.Context, res *Result) {
	var released sync.WaitGroup
	released.Go(run.locks.release)
	start := run.trace.now()
	run.rt.Journal.End(context.WithoutCancel(ctx), res)
	run.trace.journalStored(start, nil)
	released.Wait()
}

// checkLease is the last look at the lease before a saga that did not
// lose it answers: an answer says what happened only while no other
// instance may be acting on the saga. It waits at most the batch's
// timeout for a lease that is unproven.
func (run *batchRun) checkLease(ctx context.Context) {
	if !run.saga || run.lease.loss() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), run.batchSettings.BatchTimeout)
	defer cancel()
	if err := run.rt.Journal.Fence(ctx); err != nil && !run.lease.saw(err) {
		run.lease.saw(&LeaseLost{Why: err.Error()})
	}
}

// endLost ends a saga that lost its lease, as the comment above says. A
// saga whose journal the storage forgot, and that no other instance
// took over (orphaned), is this saga's alone to finish: it keeps what it
// may have changed first, as a journal would, undoes all of it, and
// keeps what is left (or forgets the kept copy, if nothing is).
func (run *batchRun) endLost(ctx, batchCtx context.Context, lost *LeaseLost) *Result {
	detached := context.WithoutCancel(ctx)
	lk, _ := run.rt.Journal.(LostKeeper)
	var end lostEnd
	since := lost.Proven
	if lk != nil {
		look, cancel := context.WithCancel(ctx)
		cancel() // one look, now
		_, _, _, end.orphaned = lk.AwaitEnd(look)
	}
	if end.orphaned {
		since = time.Time{}
		end.kept = keepLost(detached, lk, "", run.snapshot(), written(run.items, run.state), orphanedResult(run.plan, run.items))
	}
	run.undoOwnSince(detached, since)
	res := run.report(ctx, batchCtx)
	res.LeaseLost, res.Orphaned = true, end.orphaned
	if lk == nil {
		answerLost(res, lost, end)
		return res
	}
	res.Saga = lk.Saga()
	if !end.orphaned {
		waitCtx, cancel := context.WithCancel(batchCtx)
		defer cancel()
		end.ended, end.outcome, end.left, end.orphaned = lk.AwaitEnd(waitCtx)
	}
	end.own = ownLeftBehind(run.items, end.orphaned)
	if len(end.own) > 0 || end.kept != "" {
		end.kept = keepLost(detached, lk, end.kept, run.snapshot(), end.own, res)
	}
	res.Kept, res.Orphaned = end.kept, end.orphaned
	answerLost(res, lost, end)
	return res
}

// transition is the one place where an item's state changes: change
// (which may be nil) runs under the saga's lock, and a saga's journal
// then records the result. The error is the journal's: for PhaseSending
// it means the write must not be sent.
func (run *batchRun) transition(ctx context.Context, i int, phase Phase, req *SubRequest, change func(it *ItemResult, st *itemState)) error {
	run.mu.Lock()
	it, st := &run.items[i], &run.state[i]
	if change != nil {
		change(it, st)
	}
	if !run.journaled() {
		run.mu.Unlock()
		return nil
	}
	st.phase = phase
	t := Transition{Index: i, Phase: phase, Request: req, Item: snapshotItem(it, st, &run.plan.Items[i])}
	if run.plan.window != nil {
		t.Item.Answer = it.Body
	}
	run.mu.Unlock()
	// Outside the lock, so that a journal can store the records of
	// several items in one write; an item's own transitions come from
	// one goroutine, in order.
	start := run.trace.now()
	err := run.rt.Journal.Record(ctx, t)
	run.trace.journalStored(start, err)
	return err
}

// journaled reports whether the run's transitions are recorded, and its
// writes fenced: a saga's, and every window of a bulk job that writes,
// whose writes a crash must not send twice either.
func (run *batchRun) journaled() bool {
	return run.saga || run.plan.window != nil && run.plan.Op.Writes()
}

// journalOf names what the run's journal and lease are of, for reasons:
// a saga, or a bulk job.
func (run *batchRun) journalOf() string {
	if run.plan.window != nil {
		return "job"
	}
	return "saga"
}

// snapshot is the saga as it stands, for a journal to keep.
func (run *batchRun) snapshot() *Snapshot {
	snap := run.plan.Snapshot()
	run.mu.Lock()
	defer run.mu.Unlock()
	for i := range snap.Items {
		snap.Items[i] = snapshotItem(&run.items[i], &run.state[i], &run.plan.Items[i])
	}
	return snap
}

// compensationBackoff is the wait before a compensation's next attempt.
func compensationBackoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<(attempt-1), 2*time.Second)
}

// CompensationBudget is the most one item's compensation may take under
// s: every attempt its compensation_timeout, and the backoffs between
// them.
func CompensationBudget(s policy.Settings) time.Duration {
	return compensationBudget(&s, compensationBackoff)
}

// compensationBudget is CompensationBudget with backoff between the
// attempts. Reads that prove or resolve an undo share it.
func compensationBudget(s *policy.Settings, backoff func(attempt int) time.Duration) time.Duration {
	d := time.Duration(s.CompensationRetries+1) * s.CompensationTimeout
	for attempt := 1; attempt <= s.CompensationRetries; attempt++ {
		d += backoff(attempt)
	}
	return d
}

// Saga reports whether the plan runs as a saga: it writes (Writes), and
// what it did is undone if it fails. Only a saga takes item locks for
// its writes and keeps a journal.
func (p *Plan) Saga() bool { return p.Atomicity == policy.AllOrNothing && p.Writes() }

// envelope reports whether the plan is an envelope's.
func (p *Plan) envelope() bool { return p.Envelope != "" }

// Writes reports whether the batch changes anything upstream: a batch by
// its operation, an envelope by its operations. Only a batch that writes
// is a saga, is journaled, and is recorded under its Idempotency-Key.
func (p *Plan) Writes() bool {
	if !p.envelope() {
		return p.Op.Writes()
	}
	for _, it := range p.Items {
		if it.operation != nil && it.operation.kind.Writes() {
			return true
		}
	}
	return false
}

func anyFailure(state []itemState) bool {
	for _, st := range state {
		if st.failure {
			return true
		}
	}
	return false
}

func allSucceeded(items []ItemResult) bool {
	for _, it := range items {
		if it.Outcome != Succeeded {
			return false
		}
	}
	return true
}
