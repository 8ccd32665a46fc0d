package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Throttles are the moments until which the legacy API asked a client
// to wait before it sends again to a resource: a throttling answer (429,
// or 503 with Retry-After) to one of the client's sub-requests holds the
// client's other new sub-requests to that resource, across every batch
// of a handler, instead of letting each one find the same answer. A
// client is the hash of its credentials, so one client's throttle never
// stalls another's batches (docs/security.md, "Throttling").
//
// The zero value is not usable; use NewThrottles.
type Throttles struct {
	// waited, if set, is told of every throttling answer that is waited
	// out, by the resource's template: the metric's hook.
	waited func(resource string)

	mu    sync.Mutex
	holds map[throttleKey]throttleHold
}

type throttleKey struct{ client, resource string }

// throttleHold is one throttling answer: until when the client is held
// off the resource, and the answer's status and Retry-After as sent,
// which a sub-request that cannot wait that long fails with.
type throttleHold struct {
	until      time.Time
	delay      time.Duration
	status     int
	retryAfter string
}

// NewThrottles returns an empty table. waited, if not nil, is called
// with the resource's template each time a throttling answer is waited
// out.
func NewThrottles(waited func(resource string)) *Throttles {
	return &Throttles{waited: waited, holds: map[throttleKey]throttleHold{}}
}

// hold records that client is held off resource until h.until; a later
// moment already recorded stands. Holds that have passed are dropped, so
// the table holds only the clients being throttled now.
func (t *Throttles) hold(client, resource string, h throttleHold, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, old := range t.holds {
		if !old.until.After(now) {
			delete(t.holds, k)
		}
	}
	k := throttleKey{client, resource}
	if old, ok := t.holds[k]; !ok || h.until.After(old.until) {
		t.holds[k] = h
	}
}

// current returns the hold on client and resource that has not passed.
func (t *Throttles) current(client, resource string, now time.Time) (throttleHold, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.holds[throttleKey{client, resource}]
	return h, ok && h.until.After(now)
}

// wait returns once no hold keeps client off resource, a little after
// the hold's moment (jitter, so that the requests it held do not all go
// at once, and never sooner). A hold that lasts past ctx's deadline
// returns a *HeldBack at once: the request cannot be sent in time, and
// the API has already said what it would answer. A ctx that ends while
// waiting returns ErrThrottleWait. It returns how long it waited.
func (t *Throttles) wait(ctx context.Context, client, resource string) (time.Duration, error) {
	var began time.Time
	for {
		now := time.Now()
		h, ok := t.current(client, resource, now)
		if !ok {
			return waitedSince(began, now), nil
		}
		if began.IsZero() {
			began = now
		}
		at := h.until.Add(jitter(h.delay))
		if deadline, ok := ctx.Deadline(); ok {
			if h.until.After(deadline) {
				return waitedSince(began, now), &HeldBack{Status: h.status, RetryAfter: h.retryAfter, Until: h.until}
			}
			// The jitter spreads the held requests; it must not make one
			// miss a deadline the moment itself meets.
			if latest := h.until.Add(deadline.Sub(h.until) / 2); at.After(latest) {
				at = latest
			}
		}
		timer := time.NewTimer(at.Sub(now))
		select {
		case <-ctx.Done():
			timer.Stop()
			return waitedSince(began, time.Now()), fmt.Errorf("%w: %w", ErrThrottleWait, context.Cause(ctx))
		case <-timer.C:
		}
	}
}

// waitedSince is how long a wait that began at began (zero: it never
// waited) lasted until now.
func waitedSince(began, now time.Time) time.Duration {
	if began.IsZero() {
		return 0
	}
	return now.Sub(began)
}

// jitter is how much later than its moment a held request goes: up to
// a quarter of the delay the API asked for, at most a second.
func jitter(delay time.Duration) time.Duration {
	span := min(delay/4, time.Second)
	if span <= 0 {
		return 0
	}
	return rand.N(span)
}

// ErrThrottleWait is the error of a sub-request whose batch ran out of
// time, or whose client went away, while the legacy API held it off.
var ErrThrottleWait = errors.New("the batch's time ran out while the upstream held its client off this resource")

// HeldBack is the error of a sub-request that was not sent because the
// legacy API throttled its client's requests to the resource until a
// moment past the batch's deadline; the item fails with the status and
// Retry-After of the answer that throttled it.
type HeldBack struct {
	Status     int
	RetryAfter string
	Until      time.Time
}

func (h *HeldBack) Error() string {
	return fmt.Sprintf("not sent: the upstream answered %d to another request of this client to this resource and asked it to wait until %s, past the deadline",
		h.Status, h.Until.UTC().Format(time.RFC3339))
}

// response is the answer a held-back request stands for: the one the
// API gave the request that throttled it.
func (h *HeldBack) response() *SubResponse {
	header := http.Header{}
	if h.RetryAfter != "" {
		header.Set("Retry-After", h.RetryAfter)
	}
	return &SubResponse{Status: h.Status, Header: header}
}

// defaultThrottleDelay is how long a 429 without Retry-After is waited
// out: it asked to slow down, but not for how long.
const defaultThrottleDelay = time.Second

// throttled reports whether resp is a throttling answer, one that says
// the request was not processed and may be sent again later, and after
// how long: a 429, or a 503 with Retry-After (seconds, or an HTTP date).
func throttled(resp *SubResponse, now time.Time) (time.Duration, bool) {
	if resp == nil || resp.Status != http.StatusTooManyRequests && resp.Status != http.StatusServiceUnavailable {
		return 0, false
	}
	v := resp.Header.Get("Retry-After")
	d, ok := parseRetryAfter(v, now)
	switch {
	case ok:
		return d, true
	case resp.Status == http.StatusTooManyRequests:
		return defaultThrottleDelay, true
	}
	return 0, false // a 503 that names no moment may be an outage, not a throttle
}

// parseRetryAfter reads a Retry-After value: delay-seconds, or an
// HTTP date (a date already passed is no delay).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
