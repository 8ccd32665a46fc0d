package batch

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/internal/stop"
	"github.com/caddy-batch/caddy-batch/policy"
)

// A bulk job runs in windows: contiguous ranges of its items, each run by
// a batchRun of its own, with what the job knows kept in storage between
// them, so that memory does not grow with the job (docs/durability.md, "Bulk jobs in storage").

// Site is where a job's window runs: the runtime its sub-requests go
// through, and how its resource is found again.
type Site struct {
	Runtime Runtime
	// Lookup finds the resource of a snapshot's path, as for Resume.
	Lookup func(escapedPath string) (policy.Match, bool)
	// Parent, when valid and Runtime.Trace is set, is the span the
	// window gets a span of its own under (its job's run's span), its
	// requests' spans going under the window's. Invalid, no window span
	// is made.
	Parent trace.SpanContext
	// Envelope is the handler's envelope, which an envelope job's
	// windows run as; nil where it has none.
	Envelope *Envelope
}

// WindowOpts are how a window runs.
type WindowOpts struct {
	// Stop, once closed, starts no new item: a cancel, or a hand-over.
	// Writes already sent run to their item_timeout.
	Stop <-chan struct{}
	// Deadline, if set, is when no new item may start (job_timeout).
	Deadline time.Time
	// KeepBody is the most bytes of an answer's body each item keeps; a
	// longer one is cut into body_text (ItemResult.BodyCut). Zero keeps
	// bodies whole.
	KeepBody int
	// Done are the results of the operations before the window that an
	// envelope job's operations in it depend on, by job index: what
	// their references are filled from, and whether they may start.
	Done map[int]ItemResult
	// AllOrNothing runs the window as a part of an all-or-nothing job's
	// saga: its items locked (through Runtime.Locks, which for a job
	// keeps them to its end: itemlock.Held) and preflighted before any
	// is sent, no new item started once one failed, and every write's
	// undo recorded with it, for UndoWindow.
	AllOrNothing bool
}

// WindowResult is what a window did.
type WindowResult struct {
	// Items are the window's items in order, each Index its place in the
	// job. An item that did not start is not_attempted.
	Items []ItemResult
	// Stopped is set when Stop closed, the deadline passed or an item
	// was refused (Refused) before every item started.
	Stopped bool
	// Refused are the job indexes of the items the upstream answered
	// with a refusal of the job's credentials (CredentialsRefused), in
	// order: once one is, the window starts no new item, since every
	// later one would be refused alike; those in flight run to their
	// end.
	Refused []int
	// Unsent are the job indexes of the items failed by the gateway's
	// own storage, in order: their write's record could not be stored,
	// or the job's lease not proven in time, so nothing was sent. A
	// job runs them again once its storage answers (a blip), where a
	// synchronous batch answers them 503.
	Unsent []int
	// Refusal, for an all-or-nothing window, says why it sent nothing:
	// its items' locks could not be had. Empty otherwise.
	Refusal string
}

// CredentialsRefused reports whether a sub-request's status refuses the
// credentials it carried (401, 403, 407): a job's credentials that
// expired, which no item of it gets past until they are replaced.
func CredentialsRefused(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired:
		return true
	}
	return false
}

// refusedInWindow reports whether item i, which ran, is one of a job's
// window that the upstream refused for its credentials: never a batch's
// (plan.window nil), whose client sees the refusal in its answer.
func (run *batchRun) refusedInWindow(i int) bool {
	if run.plan.window == nil {
		return false
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	return credentialsRefused(run.items[i])
}

// windowing is what makes a Plan a job's window.
type windowing struct {
	// base is the job index of the window's first item: an item's
	// Idempotency-Key and its answer's index come from it, so that an
	// item carries the same key on every instance and every try.
	base     int
	keepBody int
	// stop is WindowOpts.Stop: seen before each item starts.
	stop <-chan struct{}
	// places admit the window's items to be sent, in the order they
	// were taken, at most the job's concurrency at once (executeItem).
	places *places
	// before are WindowOpts.Done: an envelope's operations before the
	// window, by job index, which its plan's dependencies name by
	// outside (a negative index).
	before map[int]ItemResult
}

// outside is how an envelope window's plan names operation j of the job,
// before the window (at base): by a negative index, which no item of
// the plan has.
func outside(j int) int { return -1 - j }

// result is the result of the operation dep names: an item of the run,
// or, negative, one before the window (outside).
func (run *batchRun) result(dep int) *ItemResult {
	if dep < 0 {
		r := run.plan.window.before[-1-dep]
		return &r
	}
	return &run.items[dep]
}

// recordsAhead is how many times its concurrency a window has items
// recorded as about to be sent: on the file system each store is a
// synced file, one at a time, and the items a store finds waiting are
// what it takes; with only the items in flight waiting, a job's writes
// wait for a store each round (docs/durability.md, "Bulk jobs in
// storage").
const recordsAhead = 4

// width is how many workers run a plan's items: its concurrency, and
// a window's recordsAhead times as many.
func (p *Plan) width(concurrency int) int {
	if p.window == nil {
		return concurrency
	}
	return concurrency * recordsAhead
}

// stopped reports whether the window was told to stop: never for a
// batch (w nil).
func (w *windowing) stopped() bool {
	return w != nil && stop.Asked(w.stop)
}

// base is the job index of the plan's first item: zero for a batch.
func (p *Plan) base() int {
	if p.window == nil {
		return 0
	}
	return p.window.base
}

// keep trims an answer's body to keepBody, as the window keeps it.
func (w *windowing) keep(it *ItemResult) {
	if w.keepBody <= 0 {
		return
	}
	switch {
	case len(it.Body) > w.keepBody:
		it.BodyText, it.Body, it.cut = cutText(it.Body, w.keepBody), nil, true
	case len(it.BodyText) > w.keepBody:
		it.BodyText, it.cut = cutText([]byte(it.BodyText), w.keepBody), true
	}
}

// ExecuteWindow runs w, a contiguous range of a job's items (a batch's,
// or an envelope's operations) beginning at job index w.Base, through
// site: every write recorded in site.Runtime.Journal before it is sent,
// and fenced by it, as a saga's. Items w records as answered or settled
// (a window carried on) keep their outcome; an item recorded as being
// sent with no answer is resolved forward first (resolveForward); the
// rest are sent, all-or-nothing or partial as o says. The error is for
// a window that cannot run here at all.
func ExecuteWindow(ctx context.Context, w *Snapshot, site Site, o WindowOpts) (*WindowResult, error) {
	p, err := planWindow(w, site, o, o.AllOrNothing, true)
	if err != nil {
		return nil, err
	}
	p.window.stop = o.Stop
	run := newBatchRun(p, site.Runtime, compensationBackoff)
	defer func() { run.locks.release() }() // the locks lockCreated takes are waited for
	ctx, span := run.trace.windowSpan(ctx, site.Parent, w.Base, len(w.Items))
	for i, it := range w.Items {
		run.carriedOn(i, it)
	}
	startCtx := ctx
	if !o.Deadline.IsZero() {
		var cancel context.CancelFunc
		startCtx, cancel = context.WithDeadline(ctx, o.Deadline)
		defer cancel()
	}
	run.resolveAll(startCtx)
	res := &WindowResult{}
	if run.saga && !run.lock(ctx, startCtx) {
		res.Refusal = run.refusal.detail
	} else if !slices.ContainsFunc(run.items, credentialsRefused) && (!run.saga || !anyFailure(run.state) && run.preflight(startCtx)) {
		run.execute(ctx, startCtx)
	}
	res.Items = run.items
	for _, it := range run.items {
		if it.Outcome == NotAttempted {
			res.Stopped = true
		}
		if credentialsRefused(it) {
			res.Refused = append(res.Refused, it.Index)
		}
	}
	run.mu.Lock()
	for i := range run.state {
		if run.state[i].byGateway {
			res.Unsent = append(res.Unsent, run.items[i].Index)
		}
	}
	run.mu.Unlock()
	endWindow(span, res)
	return res, nil
}

// credentialsRefused reports whether it is an answer refusing the job's
// credentials: an item a resolve forward or a send had refused.
func credentialsRefused(it ItemResult) bool {
	return it.Outcome == Failed && CredentialsRefused(it.Status)
}

// planWindow is the plan of a job's window, an envelope job's or a
// batch job's; parse is false for an envelope window that is only
// undone, whose operations that never started are not parsed again.
func planWindow(w *Snapshot, site Site, o WindowOpts, allOrNothing, parse bool) (*Plan, error) {
	if w.Op == policy.OpEnvelope.String() {
		return envelopeWindowPlan(w, site.Envelope, o, allOrNothing, parse)
	}
	return windowPlan(w, site.Lookup, o.KeepBody, allOrNothing)
}

// windowPlan is the plan of a batch job's window, all-or-nothing or partial.
func windowPlan(w *Snapshot, lookup func(string) (policy.Match, bool), keepBody int, allOrNothing bool) (*Plan, error) {
	if w.Version != SnapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, this gateway knows %d", ErrNotResumable, w.Version, SnapshotVersion)
	}
	op, err := policy.ParseOp(w.Op)
	if err != nil || op == policy.OpEnvelope {
		return nil, fmt.Errorf("%w: a job window of operation %q", ErrNotResumable, w.Op)
	}
	m, ok := lookup(w.Path)
	if !ok || m.Item {
		return nil, fmt.Errorf("%w: no resource is configured for %s", ErrNotResumable, w.Path)
	}
	p := &Plan{
		Op: op, Match: m, Atomicity: policy.Partial, settings: m.Resource.Settings,
		Items:  make([]Item, len(w.Items)),
		header: w.Header,
		key:    idempotencyKey{base: w.Key, quoted: w.KeyQuoted},
		window: &windowing{base: w.Base, keepBody: keepBody},
	}
	if allOrNothing {
		p.Atomicity = policy.AllOrNothing
	}
	if p.header == nil {
		p.header = http.Header{}
	}
	t := newTarget(op, batchMethods[op], m, w.Query)
	for i, it := range w.Items {
		// Each item is sent on its own: a job's repeated GET ids are
		// fetched each time, as they may be a window apart.
		p.Items[i] = Item{ID: it.ID, Body: it.Element, fields: it.Fields, firstWithID: i, tgt: t}
	}
	return p, nil
}

// carriedOn gives item i of a window carried on what its journal
// recorded (it): an answered or settled item keeps its outcome and is
// not sent again, but for one answered unknown (no answer came); that
// one, and one recorded as being sent, are unknown until resolveForward
// learns what they did.
func (run *batchRun) carriedOn(i int, it ItemSnapshot) {
	switch {
	case it.Phase == PhaseSending, it.Phase == PhaseAnswered && it.Outcome == Unknown:
		run.items[i], run.state[i] = resumedItem(i, it, run.state[i])
		run.items[i].Index = run.plan.base() + i
	case it.Phase >= PhaseAnswered:
		run.items[i], run.state[i] = resumedItem(i, it, run.state[i])
		run.items[i].Index = run.plan.base() + i
		run.state[i].settled = true
	}
}
