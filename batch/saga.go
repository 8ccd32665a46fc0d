// Package batch is the engine: it parses the four batch operations, fans
// a batch out as single-resource sub-requests through a Sender, collects
// the answers in request order and, for an all-or-nothing write batch
// that fails, undoes what already happened. It knows nothing of Caddy.
//
// An all-or-nothing write batch runs as a saga in five steps, each a
// method of saga below: validate (Parse), preflight, execute, compensate,
// report.
package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Run executes a planned batch through send and returns its result.
// Sub-requests keep ctx's values. A client that goes away (ctx cancelled)
// stops new items from starting but does not cut writes already sent:
// cancelling a sent write would leave its outcome unknown. Compensations
// run detached from ctx's cancellation, with their own timeouts.
func Run(ctx context.Context, p *Plan, send Sender) *Result {
	return newSaga(p, send, compensationBackoff).run(ctx)
}

// compensationBackoff is the wait before a compensation's next attempt.
func compensationBackoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<(attempt-1), 2*time.Second)
}

type saga struct {
	plan     *Plan
	s        policy.Settings
	send     Sender
	backoff  func(attempt int) time.Duration
	items    []ItemResult
	state    []itemState
	started  []int // execution start order, which compensation reverses
	sentUndo int
}

// itemState is what the saga knows of an item beyond what the client is
// told.
type itemState struct {
	preimage json.RawMessage // the item before the batch (update, delete)
	applied  bool            // the item's write took effect, or may have
	settled  bool            // nothing left to send: a declarative delete of a missing item
	failure  bool            // the item's own request failed or went unanswered
}

func newSaga(p *Plan, send Sender, backoff func(int) time.Duration) *saga {
	sg := &saga{
		plan:    p,
		s:       p.Match.Resource.Settings,
		send:    send,
		backoff: backoff,
		items:   make([]ItemResult, len(p.Items)),
		state:   make([]itemState, len(p.Items)),
	}
	for i, it := range p.Items {
		sg.items[i] = ItemResult{Index: i, ID: it.ID, Outcome: NotAttempted}
	}
	return sg
}

func (sg *saga) allOrNothing() bool { return sg.plan.Atomicity == policy.AllOrNothing }

func (sg *saga) run(ctx context.Context) *Result {
	deadline := time.Now().Add(sg.s.BatchTimeout)
	readCtx, cancelReads := context.WithDeadline(ctx, deadline)
	defer cancelReads()
	writeCtx, cancelWrites := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancelWrites()

	op := sg.plan.Op
	if sg.allOrNothing() && (op == policy.OpUpdate || op == policy.OpDelete) {
		if !sg.preflight(readCtx) {
			return sg.report(ctx, readCtx)
		}
	}
	// Writes are not cut by the client's cancellation, only by the
	// deadline; report then asks the context that stopped the batch.
	execCtx := readCtx
	if op.Writes() {
		execCtx = writeCtx
	}
	sg.execute(execCtx, ctx)
	if sg.allOrNothing() && op.Writes() && !sg.allSucceeded() {
		sg.compensate(ctx)
	}
	return sg.report(ctx, execCtx)
}

// fanOut runs work on each index in order, at most Concurrency at once.
// Once stop is closed or ctx is done it starts nothing new, and lets
// what is in flight finish. It returns the indices in start order.
func (sg *saga) fanOut(ctx context.Context, indices []int, stop <-chan struct{}, work func(i int)) []int {
	slots := make(chan struct{}, sg.s.Concurrency)
	var wg sync.WaitGroup
	var started []int
loop:
	for _, i := range indices {
		select {
		case <-stop:
			break loop
		case <-ctx.Done():
			break loop
		case slots <- struct{}{}:
		}
		// A free slot and a stop can be ready together; the stop wins.
		select {
		case <-stop:
			break loop
		case <-ctx.Done():
			break loop
		default:
		}
		started = append(started, i)
		wg.Go(func() {
			defer func() { <-slots }()
			work(i)
		})
	}
	wg.Wait()
	return started
}

// preflight reads every target of an all-or-nothing update or delete
// before anything is written: a missing target fails the batch while
// nothing has changed, and the bodies read are the pre-images an undo
// puts back. It reports whether the batch may go on.
func (sg *saga) preflight(ctx context.Context) bool {
	stop := make(chan struct{})
	halt := sync.OnceFunc(func() { close(stop) })
	sg.fanOut(ctx, sg.pending(), stop, func(i int) {
		if !sg.readPreimage(ctx, i) {
			halt()
		}
	})
	if !sg.anyFailure() && ctx.Err() == nil {
		return true
	}
	for i := range sg.items {
		if !sg.state[i].failure {
			sg.items[i].clearResponse()
			sg.items[i].Outcome = NotAttempted
		}
	}
	return false
}

func (sg *saga) readPreimage(ctx context.Context, i int) bool {
	it, st := &sg.items[i], &sg.state[i]
	req := sg.request(http.MethodGet, sg.plan.Match.ItemPath(it.ID), "", nil, "")
	resp, err := sg.sendItem(ctx, req)
	switch {
	case resp == nil:
		sg.recordNoAnswer(i, err, false)
		it.Error = "the item could not be read before the write: " + it.Error
		return false
	case resp.Status == http.StatusNotFound && sg.plan.Op == policy.OpDelete && sg.s.DeleteSemantics == policy.Declarative:
		it.Status, it.Outcome, st.settled = http.StatusNoContent, Succeeded, true
		return true
	case !is2xx(resp.Status):
		it.setResponse(resp)
		it.Outcome, st.failure = Failed, true
		it.Error = "the item could not be read before the write (GET " + req.Path + ")"
		return false
	case jsonKind(bytes.TrimSpace(resp.Body)) != "object" || !json.Valid(resp.Body):
		it.setResponse(resp)
		it.Status, it.Outcome, st.failure = http.StatusBadGateway, Failed, true
		it.Error = fmt.Sprintf("GET %s did not answer a JSON object, so the item could not be put back if the batch failed", req.Path)
		return false
	}
	st.preimage = resp.Body
	return true
}

// execute sends every pending item. An all-or-nothing batch starts
// nothing new after its first failure; so does any batch whose client
// went away (clientCtx done) or whose batch_timeout passed (ctx done).
func (sg *saga) execute(ctx, clientCtx context.Context) {
	stop := make(chan struct{})
	halt := sync.OnceFunc(func() { close(stop) })
	defer context.AfterFunc(clientCtx, halt)()
	sg.started = sg.fanOut(ctx, sg.pending(), stop, func(i int) {
		sg.apply(ctx, i)
		if sg.state[i].failure && sg.allOrNothing() {
			halt()
		}
	})
	for i, it := range sg.plan.Items {
		if it.first != i {
			first := sg.items[it.first]
			first.Index = i
			sg.items[i], sg.state[i] = first, sg.state[it.first]
		}
	}
}

// pending lists the items still to send: not settled, and not a repeat of
// an earlier id (a batch GET fetches each id once).
func (sg *saga) pending() []int {
	var out []int
	for i, it := range sg.plan.Items {
		if it.first == i && !sg.state[i].settled {
			out = append(out, i)
		}
	}
	return out
}

// apply sends item i's own request and records the answer.
func (sg *saga) apply(ctx context.Context, i int) {
	p, it, st := sg.plan, &sg.items[i], &sg.state[i]
	var req *SubRequest
	switch p.Op {
	case policy.OpGet:
		req = sg.request(http.MethodGet, p.Match.ItemPath(it.ID), p.query, nil, "")
	case policy.OpCreate:
		req = sg.request(http.MethodPost, p.collectionPath, p.query, p.Items[i].Body, p.key.forItem(i, ""))
	case policy.OpUpdate:
		req = sg.request(http.MethodPatch, p.Match.ItemPath(it.ID), p.query, p.Items[i].Body, p.key.forItem(i, ""))
	case policy.OpDelete:
		req = sg.request(http.MethodDelete, p.Match.ItemPath(it.ID), p.query, nil, p.key.forItem(i, ""))
	}
	resp, err := sg.sendItem(ctx, req)
	if resp == nil {
		sg.recordNoAnswer(i, err, p.Op.Writes())
		return
	}
	it.setResponse(resp)
	if err != nil {
		it.Error, it.cause = "the answer's body was cut short", err
		if errors.Is(err, ErrBodyTooLarge) {
			it.Error = "the answer's body is larger than max_body_size and is left out"
		}
	}
	switch {
	case is2xx(resp.Status):
		it.Outcome, st.applied = Succeeded, p.Op.Writes()
		if p.Op == policy.OpCreate {
			sg.nameCreated(i, resp)
		}
	case resp.Status == http.StatusNotFound && p.Op == policy.OpDelete && sg.s.DeleteSemantics == policy.Declarative:
		// "It must not exist" holds. Nothing was deleted to undo, unless
		// an earlier copy of a resent request deleted it.
		it.clearResponse()
		it.Status, it.Outcome, st.applied = http.StatusNoContent, Succeeded, resp.Resent
	case resp.Resent && p.Op.Writes():
		// The answer is to a second copy (a 404 to a DELETE, a 409 to a
		// create): the first may well have done what was asked.
		it.Outcome, st.applied, st.failure = Unknown, true, true
		it.Error = "the request was sent twice (a connection dropped) and an earlier copy may have taken effect"
	default:
		it.Outcome, st.failure = Failed, true
	}
}

// recordNoAnswer records a sub-request that got no answer: a timeout
// (504) or an unreachable upstream (502). A write that left the gateway
// may have been applied, so its outcome is unknown, and the saga treats
// it as applied.
func (sg *saga) recordNoAnswer(i int, err error, write bool) {
	it, st := &sg.items[i], &sg.state[i]
	na := asNoAnswer(err)
	it.clearResponse()
	it.Status, it.Error, it.cause = na.status, na.reason, na.err
	it.Outcome, st.failure = Failed, true
	if write && !errors.Is(err, ErrNotSent) {
		it.Outcome, st.applied = Unknown, true
	}
}

// noAnswer is a sub-request that got no answer. The client is told the
// status and the reason, which name no internal address; the underlying
// error goes only to the log.
type noAnswer struct {
	status int
	reason string
	err    error
}

func (e *noAnswer) Error() string { return e.reason + ": " + e.err.Error() }
func (e *noAnswer) Unwrap() error { return e.err }

func asNoAnswer(err error) *noAnswer {
	var na *noAnswer
	if errors.As(err, &na) {
		return na
	}
	return silent(err)
}

// silent is the plainest no-answer: sent, and nothing came back.
func silent(err error) *noAnswer {
	return &noAnswer{http.StatusBadGateway, "the upstream did not answer", err}
}

// sendItem sends one request of the batch under item_timeout.
func (sg *saga) sendItem(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	return sg.sendWithin(ctx, sg.s.ItemTimeout, "item_timeout", req)
}

// sendWithin sends req, giving up after timeout (the option named
// timeoutOption). A nil response comes with a *noAnswer.
func (sg *saga) sendWithin(parent context.Context, timeout time.Duration, timeoutOption string, req *SubRequest) (*SubResponse, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	resp, err := sg.send.Send(ctx, req)
	if resp != nil && resp.Status != 0 {
		return resp, err
	}
	if err == nil {
		err = errors.New("the handler chain wrote no response")
	}
	na := silent(err)
	switch {
	case errors.Is(parent.Err(), context.DeadlineExceeded):
		na.status, na.reason = http.StatusGatewayTimeout, fmt.Sprintf("no answer within batch_timeout (%s)", sg.s.BatchTimeout)
	case parent.Err() != nil:
		na.reason = "the client went away before the answer came"
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		na.status, na.reason = http.StatusGatewayTimeout, fmt.Sprintf("no answer within %s (%s)", timeoutOption, timeout)
	case errors.Is(err, ErrNotSent):
		na.reason = "the upstream could not be reached"
	}
	return nil, na
}

// nameCreated finds the id of a created item: the last segment of its
// Location, else the body's id field, else the id the element carried.
// An id that could not be safely put in a path is not used: the item then
// cannot be undone, which the report says.
func (sg *saga) nameCreated(i int, resp *SubResponse) {
	it := &sg.items[i]
	id := ""
	if loc := resp.Header.Get("Location"); loc != "" {
		if u, err := url.Parse(loc); err == nil {
			last := strings.TrimRight(u.EscapedPath(), "/")
			last = last[strings.LastIndexByte(last, '/')+1:]
			id, _ = url.PathUnescape(last)
		}
	}
	if id == "" {
		var body map[string]json.RawMessage
		if json.Unmarshal(resp.Body, &body) == nil {
			id, _ = idFromJSON(body[sg.s.IDField])
		}
	}
	if id == "" {
		id = sg.plan.Items[i].ID
	}
	if reason := badID(id); reason != "" {
		if id != "" {
			it.Error = fmt.Sprintf("the upstream named the created item %q, which %s", id, reason)
		}
		id = ""
	}
	it.ID = id
}

// compensate undoes, in reverse order of start, every item whose write
// took effect or may have. Each undo has its own retries and timeout and
// runs detached from the client: once a batch has failed, the client
// going away must not leave it half done.
func (sg *saga) compensate(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for k := len(sg.started) - 1; k >= 0; k-- {
		if i := sg.started[k]; sg.state[i].applied {
			sg.undo(ctx, i)
		}
	}
}

func (sg *saga) undo(ctx context.Context, i int) {
	it := &sg.items[i]
	req, impossible := sg.undoRequest(i)
	if req == nil {
		if it.Outcome != Unknown {
			it.Outcome = RollbackFailed
		}
		it.Error = strings.TrimPrefix(it.Error+"; ", "; ") + impossible
		return
	}
	if it.Outcome == Unknown && req.Method == http.MethodPost {
		// A delete that went unanswered may not have happened; re-creating
		// an item that still exists would fail, so look first.
		if resp, _ := sg.attemptUndo(ctx, sg.request(http.MethodGet, sg.plan.Match.ItemPath(it.ID), "", nil, "")); resp != nil && is2xx(resp.Status) {
			it.Outcome = RolledBack
			return
		}
	}
	c := &Compensation{Method: req.Method, Path: req.Path}
	it.Compensation = c
	for {
		c.Attempts++
		resp, err := sg.attemptUndo(ctx, req.clone())
		if resp != nil {
			c.Status, c.Error = resp.Status, ""
			if undone(req.Method, resp.Status) {
				it.Outcome = RolledBack
				return
			}
			c.Error = fmt.Sprintf("answered %d", resp.Status)
			if !retryable(resp.Status) {
				break
			}
		} else {
			na := asNoAnswer(err)
			c.Status, c.Error, c.cause = 0, na.reason, na.err
		}
		if c.Attempts > sg.s.CompensationRetries {
			break
		}
		time.Sleep(sg.backoff(c.Attempts))
	}
	it.Outcome = RollbackFailed
}

func (sg *saga) attemptUndo(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	sg.sentUndo++
	return sg.sendWithin(ctx, sg.s.CompensationTimeout, "compensation_timeout", req)
}

// undoRequest builds the request that undoes item i, or says why there
// is none.
func (sg *saga) undoRequest(i int) (*SubRequest, string) {
	p, it, st := sg.plan, &sg.items[i], &sg.state[i]
	key := p.key.forItem(i, ":undo")
	switch p.Op {
	case policy.OpCreate:
		if it.ID == "" {
			return nil, fmt.Sprintf("the created item cannot be deleted: the upstream named no id (no Location header, no %q in the body)", sg.s.IDField)
		}
		return sg.request(http.MethodDelete, p.Match.ItemPath(it.ID), "", nil, key), ""
	case policy.OpUpdate:
		if sg.s.RestoreUpdated == policy.RestorePatch {
			return sg.request(http.MethodPatch, p.Match.ItemPath(it.ID), "", restorePatch(st.preimage, p.Items[i].fields), key), ""
		}
		return sg.request(http.MethodPut, p.Match.ItemPath(it.ID), "", st.preimage, key), ""
	case policy.OpDelete:
		if sg.s.RestoreDeleted == policy.RestorePost {
			return sg.request(http.MethodPost, p.collectionPath, "", st.preimage, key), ""
		}
		return sg.request(http.MethodPut, p.Match.ItemPath(it.ID), "", st.preimage, key), ""
	}
	return nil, "a read needs no undo"
}

// restorePatch is the merge patch that puts back the fields an update
// changed: each field's old value, or null where the field did not exist.
func restorePatch(preimage json.RawMessage, fields []string) []byte {
	var before map[string]json.RawMessage
	_ = json.Unmarshal(preimage, &before) // the preflight checked it is an object
	patch := make(map[string]json.RawMessage, len(fields))
	for _, f := range fields {
		if v, ok := before[f]; ok {
			patch[f] = v
		} else {
			patch[f] = json.RawMessage("null")
		}
	}
	b, _ := json.Marshal(patch)
	return b
}

// undone reports whether an undo answered with status holds: for a
// DELETE, a missing item is as good as a deleted one.
func undone(method string, status int) bool {
	return is2xx(status) || method == http.MethodDelete && (status == http.StatusNotFound || status == http.StatusGone)
}

// retryable reports whether a failed undo may succeed if sent again.
func retryable(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

func is2xx(status int) bool { return status >= 200 && status < 300 }

func (sg *saga) anyFailure() bool {
	for _, st := range sg.state {
		if st.failure {
			return true
		}
	}
	return false
}

func (sg *saga) allSucceeded() bool {
	for _, it := range sg.items {
		if it.Outcome != Succeeded {
			return false
		}
	}
	return true
}

// request builds a sub-request with the client's forwarded headers, a
// JSON body if any, and an Idempotency-Key for a write.
func (sg *saga) request(method, path, query string, body []byte, key string) *SubRequest {
	h := sg.plan.header.Clone()
	if body != nil {
		h.Set("Content-Type", "application/json")
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &SubRequest{Method: method, Path: path, RawQuery: query, Header: h, Body: body}
}

func (r *SubRequest) clone() *SubRequest {
	c := *r
	c.Header = r.Header.Clone()
	return &c
}

// report settles the batch's outcome and status (SPEC section 5).
func (sg *saga) report(clientCtx, batchCtx context.Context) *Result {
	p := sg.plan
	r := &Result{
		Op:                p.Op,
		Atomicity:         p.Atomicity,
		Items:             sg.items,
		Compensations:     sg.sentUndo,
		PreferenceApplied: p.PreferenceApplied,
		RetryAfter:        retryAfter(sg.items, time.Now()),
	}
	firstFailure := -1
	rolledBack := 0
	for i, it := range sg.items {
		switch it.Outcome {
		case Succeeded:
			r.Succeeded++
		case RolledBack:
			rolledBack++
		case RollbackFailed, Unknown:
			if sg.allOrNothing() {
				r.LeftBehind = append(r.LeftBehind, it.describe())
			}
		}
		if it.cause != nil {
			r.Errors = append(r.Errors, fmt.Sprintf("%s: %v", it.describe(), it.cause))
		}
		if c := it.Compensation; c != nil && c.cause != nil {
			r.Errors = append(r.Errors, fmt.Sprintf("undoing %s: %v", it.describe(), c.cause))
		}
		if sg.state[i].failure {
			r.Failed++
			if firstFailure < 0 {
				firstFailure = i
			}
		}
	}
	cause := sg.cause(firstFailure, clientCtx, batchCtx)
	switch {
	case r.Succeeded == len(sg.items):
		r.Outcome, r.Status = Succeeded, http.StatusOK
		if p.Op == policy.OpCreate {
			r.Status = http.StatusCreated
		}
	case !sg.allOrNothing():
		r.Outcome, r.Status = Partial, http.StatusMultiStatus
		if r.Succeeded == 0 {
			r.Outcome = Failed
		}
	case len(r.LeftBehind) > 0:
		r.Outcome, r.Status = RollbackFailed, http.StatusInternalServerError
		r.Detail = fmt.Sprintf("%s, and the rollback left %s as the batch made them: %s",
			cause, plural(len(r.LeftBehind), "item"), strings.Join(r.LeftBehind, ", "))
	case rolledBack > 0:
		r.Outcome, r.Status = RolledBack, sg.failureStatus(firstFailure, batchCtx)
		r.Detail = fmt.Sprintf("%s; the %s that had taken effect %s undone", cause, plural(rolledBack, "item"), wasWere(rolledBack))
	default:
		r.Outcome, r.Status = Failed, sg.failureStatus(firstFailure, batchCtx)
		r.Detail = cause
		if p.Op.Writes() {
			r.Detail += "; nothing was changed"
		}
	}
	return r
}

// cause says in a clause why the batch failed.
func (sg *saga) cause(firstFailure int, clientCtx, batchCtx context.Context) string {
	switch {
	case firstFailure >= 0:
		it := &sg.items[firstFailure]
		if it.Error != "" {
			return fmt.Sprintf("%s failed with %d (%s)", it.describe(), it.Status, it.Error)
		}
		return fmt.Sprintf("%s failed with %d", it.describe(), it.Status)
	case clientCtx.Err() != nil:
		return "the client went away before every item was sent"
	case batchCtx.Err() != nil:
		return fmt.Sprintf("the batch did not finish within batch_timeout (%s)", sg.s.BatchTimeout)
	}
	return "the batch did not finish"
}

// failureStatus is the status of a failed all-or-nothing batch: the first
// failing item's, mapped; 504 if the batch ran out of time first, and
// 499 (Caddy's code for a client that closed the request) if the client
// left first.
func (sg *saga) failureStatus(firstFailure int, batchCtx context.Context) int {
	switch {
	case firstFailure >= 0:
		return batchStatus(sg.items[firstFailure].Status)
	case errors.Is(batchCtx.Err(), context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return 499
}

func wasWere(n int) string {
	if n == 1 {
		return "was"
	}
	return "were"
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
