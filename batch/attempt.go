package batch

import (
	"context"
	"errors"
	"net/http"
	"time"
)

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
	// sending, if set, runs once, holding the first slot, just before
	// the request first leaves (the journal's record of a write); its
	// error sends nothing.
	sending func() error
}

// errJournal wraps the error of sendOpts.sending.
var errJournal = errors.New("the saga's journal could not record the write")

// send sends req for item i as every sub-request of a saga is sent: it
// waits while the upstream holds this client off the item's resource,
// then for a slot of max_in_flight, and sends. An answer that throttles
// (429, or 503 with Retry-After) was not processed: the request gives up
// its slot, waits as long as the upstream asked, and is sent again, as
// long as the wait is within max_throttle_wait and wait's deadline
// (docs/security.md, "Throttling"). The journal and the saga see one request and
// its last answer.
//
// A request not sent at all returns a nil answer and slots.ErrNoSlot,
// ErrThrottleWait or errJournal; one the upstream's throttle holds past
// the deadline returns the answer that throttled it and a *HeldBack.
func (sg *saga) send(i int, req *SubRequest, o sendOpts) (*SubResponse, error) {
	resource := sg.tgt(i).match.Resource.Collection.Plain()
	var last *SubResponse // the last throttling answer, which a resend that cannot go stands on
	for attempt := 0; ; attempt++ {
		release, err := sg.acquire(o.wait, resource, o.urgent)
		var held *HeldBack
		switch {
		case errors.As(err, &held):
			return held.response(), err
		case err != nil && last != nil:
			return last, nil // not sent again: the throttling answer stands
		case err != nil:
			return nil, err
		}
		if attempt == 0 && o.sending != nil {
			if err := o.sending(); err != nil {
				release()
				return nil, errors.Join(errJournal, err)
			}
		}
		// The last look at the lease, after every wait
		// (docs/durability.md, "Clusters"): no write leaves for a saga another instance may
		// be finishing.
		if sg.fences(req) {
			if err := sg.rt.Journal.Fence(o.wait); err != nil {
				release()
				return nil, errors.Join(errFence, err)
			}
		}
		start := time.Now()
		resp, err := sg.sendWithin(o.ctx, o.timeout.d, o.timeout.name, o.parent, req.clone())
		sg.observe(time.Since(start), resp, err)
		delay, ok := sg.throttledFor(i, resp)
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
			sg.rt.Throttles.hold(sg.rt.Client, resource, h, now)
		}
		release()
		if !mayResend(sg.settings(i).IdempotentUpstream, req, resp, now.Add(delay), o.wait) {
			return resp, err
		}
		if sg.rt.Throttles.waited != nil {
			sg.rt.Throttles.waited(resource)
		}
		if h.retryAfter == "" {
			sleep(o.wait, time.Until(h.until.Add(jitter(delay))))
		}
		last = resp
	}
}

// fences reports whether req waits for the saga's lease to be proven
// before it goes: every write of a saga, but the undos of a saga that
// lost its lease (lost.go).
func (sg *saga) fences(req *SubRequest) bool {
	return sg.isSaga() && req.Method != http.MethodGet && req.Method != http.MethodHead && !sg.selfUndo.Load()
}

// acquire waits while the upstream holds this client off resource, then
// for a slot, and again for a hold that came while it waited.
func (sg *saga) acquire(ctx context.Context, resource string, urgent bool) (func(), error) {
	for {
		if err := sg.rt.Throttles.wait(ctx, sg.rt.Client, resource); err != nil {
			return nil, err
		}
		release, err := sg.slot(ctx, urgent)
		if err != nil {
			return nil, err
		}
		// A hold recorded while this request waited for its slot holds
		// it too: it gives the slot back and waits the hold out.
		if _, held := sg.rt.Throttles.current(sg.rt.Client, resource, time.Now()); !held {
			return release, nil
		}
		release()
	}
}

// throttledFor says whether resp throttles a request of item i within
// its max_throttle_wait, and for how long.
func (sg *saga) throttledFor(i int, resp *SubResponse) (time.Duration, bool) {
	maxWait := sg.settings(i).MaxThrottleWait
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

// Observer is what Slots whose number follows the upstream implement:
// each sub-request's answer is told to it — how long it took, and
// whether the upstream pushed back (throttled it, or did not answer in
// time).
type Observer interface {
	Observe(latency time.Duration, overloaded bool)
}

// observe tells adaptive slots what one attempt showed.
func (sg *saga) observe(latency time.Duration, resp *SubResponse, err error) {
	o, ok := sg.rt.Slots.(Observer)
	if !ok {
		return
	}
	_, throttledAnswer := throttled(resp, time.Now())
	var na *noAnswer
	timedOut := resp == nil && errors.As(err, &na) && na.status == http.StatusGatewayTimeout
	o.Observe(latency, throttledAnswer || timedOut)
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
