package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/slots"
)

// sender sends a run's sub-requests, each as every one is sent: it waits
// while the upstream holds this client off the request's resource, then
// for a slot of max_in_flight, and sends within the request's timeouts.
// An answer that throttles (429, or 503 with Retry-After) was not
// processed: the request gives up its slot, waits as long as the
// upstream asked, and is sent again, as long as the wait is within
// max_throttle_wait and the caller's deadline (docs/security.md,
// "Throttling"). Adaptive slots are told what each attempt showed.
//
// It knows nothing of items or journals: what a saga must do just
// before a request leaves comes in as sendOpts' hooks.
type sender struct {
	upstream Sender
	slots    Slots // nil bounds nothing beyond Concurrency
	// background takes every slot in a background lane
	// (Runtime.Background).
	background bool
	throttles  *Throttles
	client     string   // whose holds apply (Runtime.Client)
	observer   Observer // nil observes nothing
	// batchTimeout is the batch's deadline, which a read's wait counts
	// against, named for the client.
	batchTimeout limit
	// tr is told how long the upstream's throttle held requests back;
	// nil when nothing is traced.
	tr *runTrace
}

// newSender is the sender of a run under rt, within batchTimeout, traced
// by tr.
func newSender(rt Runtime, batchTimeout time.Duration, tr *runTrace) *sender {
	s := &sender{
		upstream: rt.Send, slots: rt.Slots, background: rt.Background, throttles: rt.Throttles, client: rt.Client,
		observer: rt.Observer, batchTimeout: limit{"batch_timeout", batchTimeout}, tr: tr,
	}
	if s.throttles == nil {
		s.throttles = NewThrottles(nil)
	}
	return s
}

// sendOpts say how one sub-request is sent.
type sendOpts struct {
	// wait is what waiting counts against — for a slot, and for the
	// upstream's throttle: the batch's deadline, or an undo's budget.
	wait context.Context
	// ctx is what the request is sent under: a write already sent runs
	// on past the batch's deadline, to its own timeout.
	ctx context.Context
	// urgent is an undo's or a recovery's request: it goes before new
	// batches for a slot.
	urgent bool
	// timeout bounds one attempt (item_timeout, compensation_timeout);
	// parent names wait's deadline for the client.
	timeout, parent limit
	// span makes a span of each attempt and writes its context into the
	// attempt's header; nil when nothing is traced.
	span *reqSpan
}

// send sends req to to's resource as the comment on sender says. The
// caller sees one request and its last answer. beforeSend, if set, runs
// before every attempt, after every wait and holding the slot, as the
// last thing before the request leaves (a saga's look at its lease); its
// error sends nothing. It is a parameter, not a field of o, so that the
// closure stays on the caller's stack: o's contexts outlive the call.
//
// A request not sent at all returns a nil answer and slots.ErrNoSlot,
// ErrThrottleWait or a hook's error; one the upstream's throttle holds
// past the deadline returns the answer that throttled it and a *HeldBack.
func (s *sender) send(to *target, req *SubRequest, o sendOpts, beforeSend func() error) (*SubResponse, error) {
	resource := to.match.Resource.Collection.Plain()
	client := s.clientOf(to, req)
	var last *SubResponse // the last throttling answer, which a resend that cannot go stands on
	for attempt := 0; ; attempt++ {
		release, err := s.acquire(o.wait, client, resource, o.urgent)
		var held *HeldBack
		switch {
		case errors.As(err, &held):
			return held.response(), err
		case err != nil && last != nil:
			return last, nil // not sent again: the throttling answer stands
		case err != nil:
			return nil, err
		}
		if err := leaving(beforeSend); err != nil {
			release()
			return nil, err
		}
		sub, ctx := req.clone(), o.ctx
		if o.span != nil {
			// Only the attempt's copy carries its span: what the journal
			// keeps, and a resend repeats, is the request as planned.
			ctx = o.span.start(ctx, to, sub)
		}
		start := time.Now()
		resp, err := s.within(ctx, o.timeout, o.parent, sub)
		s.observe(time.Since(start), resp, err)
		o.span.answered(resp, err)
		delay, ok := throttledWithin(to.settings.MaxThrottleWait, resp)
		if !ok {
			release()
			return resp, err
		}
		// The API asked this client for a pause: every request of the
		// client's to the resource honours it, this one whether or not
		// it goes again. A 429 that names no moment holds only itself.
		// The hold is recorded before the slot goes, so that a request
		// waiting for the slot finds it (acquire).
		now := time.Now()
		h := throttleHold{until: now.Add(delay), delay: delay, status: resp.Status, retryAfter: resp.Header.Get("Retry-After")}
		if h.retryAfter != "" {
			s.throttles.hold(client, resource, h, now)
		}
		release()
		if !mayResend(to.settings.IdempotentUpstream, req, resp, now.Add(delay), o.wait) {
			return resp, err
		}
		if s.throttles.waited != nil {
			s.throttles.waited(resource)
		}
		if h.retryAfter == "" {
			slept := s.tr.now()
			sleep(o.wait, time.Until(h.until.Add(jitter(delay))))
			s.tr.throttleHeld(time.Since(slept))
		}
		last = resp
	}
}

// leaving runs beforeSend, if set, just before an attempt leaves.
func leaving(beforeSend func() error) error {
	if beforeSend == nil {
		return nil
	}
	return beforeSend()
}

// read sends a read of the batch under item_timeout, within the batch's
// deadline (ctx), its wait for a slot included, traced by sp. A read
// that could not start in time got no answer. No read waits for a saga's lease: only
// writes are fenced.
func (s *sender) read(ctx context.Context, to *target, req *SubRequest, sp *reqSpan) (*SubResponse, error) {
	resp, err := s.send(to, req, sendOpts{wait: ctx, ctx: ctx, timeout: limit{"item_timeout", to.settings.ItemTimeout}, parent: s.batchTimeout, span: sp}, nil)
	if resp == nil && (errors.Is(err, slots.ErrNoSlot) || errors.Is(err, ErrThrottleWait)) {
		reason := "no slot of max_in_flight came free within " + s.batchTimeout.String()
		if errors.Is(err, ErrThrottleWait) {
			reason = "the upstream held this client off the resource (it throttled it) past " + s.batchTimeout.String()
		}
		return nil, &noAnswer{http.StatusGatewayTimeout, reason, err}
	}
	return resp, err
}

// clientOf is who req is sent for, as the upstream's throttles see it:
// the run's client (its credentials), and the values req carries of
// the query parameters that scope its resource (scope_query: an API
// keyed by ?api_key=), wherever the client wrote them, in the batch's
// URI or in an envelope operation's url.
func (s *sender) clientOf(to *target, req *SubRequest) string {
	if len(to.settings.ScopeQuery) == 0 {
		return s.client
	}
	q, _ := url.ParseQuery(req.RawQuery)
	key := s.client
	for _, name := range slices.Sorted(slices.Values(to.settings.ScopeQuery)) {
		key += "\x00" + url.Values{name: q[name]}.Encode()
	}
	return key
}

// acquire waits while the upstream holds this client off resource, then
// for a slot, and again for a hold that came while it waited.
func (s *sender) acquire(ctx context.Context, client, resource string, urgent bool) (func(), error) {
	for {
		waited, err := s.throttles.wait(ctx, client, resource)
		s.tr.throttleHeld(waited)
		if err != nil {
			return nil, err
		}
		release, err := s.slot(ctx, urgent)
		if err != nil {
			return nil, err
		}
		// A hold recorded while this request waited for its slot holds
		// it too: it gives the slot back and waits the hold out.
		if _, held := s.throttles.current(client, resource, time.Now()); !held {
			return release, nil
		}
		release()
	}
}

// slot waits for a slot of max_in_flight, if the runtime bounds them,
// in the lane of the request's urgency and the run's class.
func (s *sender) slot(ctx context.Context, urgent bool) (func(), error) {
	if s.slots == nil {
		return func() {}, nil
	}
	return s.slots.Acquire(ctx, slots.Priority{Urgent: urgent, Background: s.background})
}

// within sends req, giving up after timeout or at parent's deadline
// (named by parentLimit). A nil response comes with a *noAnswer.
func (s *sender) within(parent context.Context, timeout, parentLimit limit, req *SubRequest) (*SubResponse, error) {
	ctx, cancel := context.WithTimeout(parent, timeout.d)
	defer cancel()
	resp, err := s.upstream.Send(ctx, req)
	if resp != nil && resp.Status != 0 {
		return resp, err
	}
	if err == nil {
		err = errors.New("the handler chain wrote no response")
	}
	na := silent(err)
	switch {
	case errors.Is(parent.Err(), context.DeadlineExceeded):
		na.status, na.reason = http.StatusGatewayTimeout, "no answer within "+parentLimit.String()
	case parent.Err() != nil:
		na.reason = "the client went away before the answer came"
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		na.status, na.reason = http.StatusGatewayTimeout, "no answer within "+timeout.String()
	case errors.Is(err, ErrNotSent):
		na.reason = "the upstream could not be reached"
	}
	return nil, na
}

// Observer is told each sub-request's answer (Runtime.Observer): how
// long it took, and whether the upstream pushed back (throttled it, or
// did not answer in time). Slots whose number follows the upstream are
// one.
type Observer interface {
	Observe(latency time.Duration, overloaded bool)
}

// observe tells the run's observer what one attempt showed. A refusal
// of the request's credentials (401, 403, 407) tells nothing of the
// legacy API's pace: it is most often an authenticating handler's after
// batch, in microseconds, and a batch of them read as the API's unloaded
// latency would hold every client's limit at its least.
func (s *sender) observe(latency time.Duration, resp *SubResponse, err error) {
	if s.observer == nil || resp != nil && CredentialsRefused(resp.Status) {
		return
	}
	_, throttledAnswer := throttled(resp, time.Now())
	var na *noAnswer
	timedOut := resp == nil && errors.As(err, &na) && na.status == http.StatusGatewayTimeout
	s.observer.Observe(latency, throttledAnswer || timedOut)
}

// throttledWithin says whether resp throttles a request within maxWait
// (max_throttle_wait), and for how long.
func throttledWithin(maxWait time.Duration, resp *SubResponse) (time.Duration, bool) {
	if maxWait <= 0 {
		return 0, false
	}
	delay, ok := throttled(resp, time.Now())
	return delay, ok && delay <= maxWait
}

// mayResend says whether a request whose answer throttled it until
// moment goes again: the moment comes before wait's deadline, and a
// POST answered 503 (which may have been processed half way) goes again
// only to an upstream that honours Idempotency-Key; a 429 was not
// processed at all.
func mayResend(idempotentUpstream bool, req *SubRequest, resp *SubResponse, moment time.Time, wait context.Context) bool {
	if resp.Status == http.StatusServiceUnavailable && req.Method == http.MethodPost && !idempotentUpstream {
		return false
	}
	if deadline, ok := wait.Deadline(); ok && moment.After(deadline) {
		return false
	}
	return wait.Err() == nil
}

// limit is a deadline a request is sent under, named for the client: it
// is spelled out only when a request runs into it.
type limit struct {
	name string
	d    time.Duration
}

func (l limit) String() string { return fmt.Sprintf("%s (%s)", l.name, l.d) }

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

// sleep waits for d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
