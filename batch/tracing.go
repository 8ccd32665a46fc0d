package batch

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is how a run makes the spans of its sub-requests
// (docs/operations.md, "Traces"): a CLIENT span per request sent, each
// attempt of it, a child of the span in the run's context, whose context
// the request carries upstream. A nil *Tracing (Runtime.Trace) makes no
// span and writes no header: the sub-requests carry what the client sent.
//
// No body, pre-image, header value or query goes into a span: the
// attributes are the item's index and id, the request's method and
// escaped path, the answer's status and what became of the item.
type Tracing struct {
	// Tracer starts the spans: the provider of the batch's own span,
	// which is not the global one.
	Tracer trace.Tracer
	// Inject writes ctx's span context into h with the propagators of the
	// server the batch came in on, deleting first every header they
	// write, so that none is left as copied from the client.
	Inject func(ctx context.Context, h http.Header)
	// Notable, set for a bulk job's windows, keeps the spans of the
	// requests that made a difference only: an item's or preflight's
	// first attempt gets a span once it failed its item, or was sent
	// again; until then its request carries the context of the span it
	// would go under (the window's), so that a job of 100,000 items does
	// not overflow an exporter's queue. Re-sends and undos are always
	// spans of their own.
	Notable bool
}

// The attributes of the spans (docs/operations.md, "Traces").
const (
	attrOp           = attribute.Key("batch.op")
	attrResource     = attribute.Key("batch.resource")
	attrIndex        = attribute.Key("batch.item.index")
	attrID           = attribute.Key("batch.item.id")
	attrItems        = attribute.Key("batch.items")
	attrOutcome      = attribute.Key("batch.item.outcome")
	attrAttempt      = attribute.Key("batch.attempt")
	attrCompensation = attribute.Key("batch.compensation.of")
	attrKind         = attribute.Key("batch.request.kind")
	attrMethod       = attribute.Key("http.request.method")
	attrPath         = attribute.Key("url.path")
	attrStatus       = attribute.Key("http.response.status_code")
	attrErrorType    = attribute.Key("error.type")
)

// requestKind is why a run sends a request, which names its span.
type requestKind uint8

const (
	kindItem      requestKind = iota // the item's own request
	kindPreflight                    // the read before a write (pre-image, a free id)
	kindList                         // a LIST of the list filter
	kindUndo                         // a compensation
	kindProof                        // a read that proves or resolves an undo
	kindResend                       // an unknown write sent again (idempotent_upstream)
)

var kindNames = [...]string{"item", "preflight", "list", "undo", "proof", "resend"}

func (k requestKind) String() string { return kindNames[k] }

// runTrace is a run's tracing, and what it timed for the batch's span:
// its lock waits, its journal's stores and the upstream's throttle holds.
// A nil *runTrace traces nothing, and each of its methods does nothing:
// call sites need no condition.
type runTrace struct {
	t *Tracing
	// journaled is false for a run without a journal (NoJournal), whose
	// stores are no stores.
	journaled bool

	locks, journal, throttle stat
}

// newRunTrace is rt's tracing, nil when it makes no span.
func newRunTrace(rt Runtime) *runTrace {
	if rt.Trace == nil || rt.Trace.Tracer == nil {
		return nil
	}
	_, none := rt.Journal.(NoJournal)
	return &runTrace{t: rt.Trace, journaled: rt.Journal != nil && !none}
}

// stat sums a kind of wait: how many, how many failed, how long in all
// and at most.
type stat struct {
	mu       sync.Mutex
	n, fails int
	total    time.Duration
	longest  time.Duration
}

func (s *stat) add(d time.Duration, failed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	if failed {
		s.fails++
	}
	s.total += d
	s.longest = max(s.longest, d)
}

// now is when a timed wait starts: the zero time when nothing is traced,
// which costs no clock read.
func (tr *runTrace) now() time.Time {
	if tr == nil {
		return time.Time{}
	}
	return time.Now()
}

// lockWaited counts a lock taken (or refused: a conflict) since start.
func (tr *runTrace) lockWaited(start time.Time, err error) {
	if tr != nil {
		tr.locks.add(time.Since(start), err != nil)
	}
}

// journalStored counts one store of the saga's journal since start.
func (tr *runTrace) journalStored(start time.Time, err error) {
	if tr != nil && tr.journaled {
		tr.journal.add(time.Since(start), err != nil)
	}
}

// throttleHeld counts a wait of d that the upstream's throttle imposed.
func (tr *runTrace) throttleHeld(d time.Duration) {
	if tr != nil && d > 0 {
		tr.throttle.add(d, false)
	}
}

// span is the span of the requests sent for item i (every attempt of
// them), or nil when nothing is traced. id is the item's id as known now.
func (tr *runTrace) span(kind requestKind, i int, id string) *reqSpan {
	if tr == nil {
		return nil
	}
	return &reqSpan{tr: tr, kind: kind, index: i, id: id}
}

// undoSpan is the span of item i's undo, of the write whose span is of
// (invalid when that write was not traced here: a recovery's).
func (tr *runTrace) undoSpan(i int, id string, of trace.SpanID) *reqSpan {
	if tr == nil {
		return nil
	}
	return &reqSpan{tr: tr, kind: kindUndo, index: i, id: id, undoes: of}
}

// listSpan is the span of a LIST that reads ids ids.
func (tr *runTrace) listSpan(ids int) *reqSpan {
	if tr == nil {
		return nil
	}
	return &reqSpan{tr: tr, kind: kindList, index: -1, ids: ids}
}

// reqSpan is one request of a run, and the span of each of its attempts:
// the upstream's throttle (a 429 re-sent) and a compensation's retries
// are attempts of one request. An attempt's span is ended by the next
// attempt's start or by the caller's end, once the answer has been
// judged, at the moment the answer came: a journal store after it does
// not stretch the span. Only the goroutine that sends the request uses
// it.
type reqSpan struct {
	tr     *runTrace
	kind   requestKind
	index  int // -1 for a LIST
	id     string
	ids    int          // a LIST's
	undoes trace.SpanID // an undo's: the span of the write it undoes

	attempt int
	cur     trace.Span
	status  int // the current attempt's answer, 0 for none
	endAt   time.Time

	// held is set while an attempt's span is held back (Notable): it is
	// made, begun at heldAt under heldCtx with heldAttrs, only if it
	// turns out notable.
	held      bool
	heldAt    time.Time
	heldCtx   context.Context
	heldAttrs []attribute.KeyValue
	heldName  string
	heldErr   string // error.type of a held attempt that got no answer
}

// start starts an attempt's span beneath ctx and writes its context into
// sub's header (sub is the attempt's own copy); the request is sent
// under the context it returns.
func (p *reqSpan) start(ctx context.Context, to *target, sub *SubRequest) context.Context {
	p.endAttempt()
	p.attempt++
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		attrKind.String(p.kind.String()),
		attrOp.String(to.kind.String()),
		attrResource.String(to.match.Resource.Collection.Plain()),
		attrMethod.String(sub.Method),
		attrPath.String(sub.Path),
		attrAttempt.Int(p.attempt))
	if p.kind == kindList {
		attrs = append(attrs, attrItems.Int(p.ids))
	} else {
		attrs = append(attrs, attrIndex.Int(p.index))
		if p.id != "" {
			attrs = append(attrs, attrID.String(p.id))
		}
	}
	if p.undoes.IsValid() {
		attrs = append(attrs, attrCompensation.String(p.undoes.String()))
	}
	p.status, p.endAt = 0, time.Time{}
	if p.tr.t.Notable && p.attempt == 1 && (p.kind == kindItem || p.kind == kindPreflight || p.kind == kindList) {
		p.held, p.heldAt, p.heldCtx, p.heldAttrs = true, time.Now(), ctx, attrs
		p.heldName = "batch " + p.kind.String() + " " + sub.Method
		p.tr.t.Inject(ctx, sub.Header)
		return ctx
	}
	ctx, p.cur = p.tr.t.Tracer.Start(ctx, "batch "+p.kind.String()+" "+sub.Method,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	p.tr.t.Inject(ctx, sub.Header)
	return ctx
}

// drop forgets an attempt held back, which makes no span.
func (p *reqSpan) drop() {
	p.held, p.heldCtx, p.heldAttrs = false, nil, nil
}

// unhold makes the span of an attempt held back, now that it is
// notable, as it would have been: begun when its request was, with what
// its answer said.
func (p *reqSpan) unhold() {
	if !p.held {
		return
	}
	_, p.cur = p.tr.t.Tracer.Start(p.heldCtx, p.heldName, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(p.heldAt), trace.WithAttributes(p.heldAttrs...))
	p.drop()
	if p.status != 0 {
		p.cur.SetAttributes(attrStatus.Int(p.status))
	} else if p.heldErr != "" {
		p.cur.SetAttributes(attrErrorType.String(p.heldErr))
	}
}

// answered records an attempt's answer, or why none came; it does not
// end the span.
func (p *reqSpan) answered(resp *SubResponse, err error) {
	if p == nil || (p.cur == nil && !p.held) {
		return
	}
	p.endAt = time.Now()
	if resp != nil {
		p.status = resp.Status
		if p.cur != nil {
			p.cur.SetAttributes(attrStatus.Int(resp.Status))
		}
		return
	}
	// Never the error's text: it can name internal addresses.
	kind := "no_answer"
	if na := asNoAnswer(err); na.status == http.StatusGatewayTimeout {
		kind = "timeout"
	} else if errors.Is(err, ErrNotSent) {
		kind = "unreachable"
	}
	if p.cur == nil {
		p.heldErr = kind
		return
	}
	p.cur.SetAttributes(attrErrorType.String(kind))
}

// endAttempt ends an attempt that another follows: an error when it got
// no answer or a 5xx (a 429 is the upstream asking to wait, no error).
func (p *reqSpan) endAttempt() {
	p.unhold() // sent again: notable
	if p.cur == nil {
		return
	}
	switch {
	case p.status == 0:
		p.cur.SetStatus(codes.Error, "no answer")
	case p.status >= 500:
		p.cur.SetStatus(codes.Error, "answered "+http.StatusText(p.status))
	}
	p.finishAt()
}

// finishAt ends the current attempt's span when its answer came (now, if
// none did).
func (p *reqSpan) finishAt() {
	if p.endAt.IsZero() {
		p.cur.End()
	} else {
		p.cur.End(trace.WithTimestamp(p.endAt))
	}
	p.cur = nil
}

// end ends the last attempt once its answer has been judged: it carries
// the item's outcome (it, read under mu, whose id a create may just have
// learnt), and an error status when the request failed its step.
func (p *reqSpan) end(mu *sync.Mutex, it *ItemResult) {
	if p == nil || (p.cur == nil && !p.held) {
		return
	}
	mu.Lock()
	outcome, id := it.Outcome, it.ID
	mu.Unlock()
	if p.held {
		if !p.failedStep(outcome) {
			p.drop() // not notable: no span
			return
		}
		p.unhold()
	}
	p.cur.SetAttributes(attrOutcome.String(string(outcome)))
	if id != "" && id != p.id {
		p.cur.SetAttributes(attrID.String(id))
	}
	if p.failedStep(outcome) {
		p.cur.SetStatus(codes.Error, string(outcome))
	}
	p.finishAt()
}

// failedStep says whether a request left its item with outcome failed
// what it was sent for: an item's own request or its preflight read that
// failed it, or a compensation's request that left it behind.
func (p *reqSpan) failedStep(outcome Outcome) bool {
	switch p.kind {
	case kindItem, kindPreflight:
		return outcome == Failed || outcome == Unknown
	}
	return outcome == RollbackFailed
}

// endList ends a LIST's span: an error when its answer could not be used
// (f, whose reason is a fixed word).
func (p *reqSpan) endList(f *ListFailure) {
	if p == nil || (p.cur == nil && !p.held) {
		return
	}
	if p.held {
		if f == nil {
			p.drop()
			return
		}
		p.unhold()
	}
	if f != nil {
		p.cur.SetStatus(codes.Error, "list "+f.Reason)
	}
	p.finishAt()
}

// spanID is the span of the request's last attempt, which an undo names
// (batch.compensation.of); invalid when nothing was traced.
func (p *reqSpan) spanID() trace.SpanID {
	if p == nil || p.cur == nil {
		return trace.SpanID{}
	}
	return p.cur.SpanContext().SpanID()
}

// The batch span's events (docs/operations.md, "Traces"), each added
// once, when the run ends, with what it sums: one event per lock or
// journal store would pass the SDK's limit of events per span in a batch
// of a few dozen items.
const (
	eventLockWait     = "batch.lock_wait"
	eventJournalStore = "batch.journal_store"
	eventThrottleHold = "batch.throttle_hold"
	eventOutcome      = "batch.outcome"

	attrCount       = attribute.Key("batch.count")
	attrDuration    = attribute.Key("batch.duration")
	attrMaxDuration = attribute.Key("batch.max_duration")
	attrBatchOut    = attribute.Key("batch.outcome")
)

// finish gives the batch's span (the one in ctx, if it records) what the
// run did: its operation, resource, items and outcome, and an event for
// each kind of wait that happened, and for the outcome.
func (tr *runTrace) finish(ctx context.Context, p *Plan, res *Result) {
	if tr == nil || res == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	resource := p.Envelope
	if !p.envelope() {
		resource = p.Match.Resource.Collection.Plain()
	}
	span.SetAttributes(attrOp.String(p.Op.String()), attrResource.String(resource),
		attrItems.Int(len(p.Items)), attrBatchOut.String(string(res.Outcome)))
	tr.locks.event(span, eventLockWait, "batch.conflicts")
	tr.journal.event(span, eventJournalStore, "batch.failures")
	tr.throttle.event(span, eventThrottleHold, "")
	span.AddEvent(eventOutcome, trace.WithAttributes(
		attrBatchOut.String(string(res.Outcome)),
		attrStatus.Int(res.Status),
		attribute.Int("batch.items.succeeded", res.Succeeded),
		attribute.Int("batch.items.failed", res.Failed),
		attribute.Int("batch.compensations", res.Compensations),
		attribute.Int("batch.left_behind", len(res.LeftBehind))))
}

// event adds s to span as the event name, if anything was counted;
// fails, if named, is how many failed.
func (s *stat) event(span trace.Span, name string, fails attribute.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return
	}
	attrs := []attribute.KeyValue{attrCount.Int(s.n), attrDuration.Float64(s.total.Seconds()), attrMaxDuration.Float64(s.longest.Seconds())}
	if fails != "" {
		attrs = append(attrs, fails.Int(s.fails))
	}
	span.AddEvent(name, trace.WithAttributes(attrs...))
}
