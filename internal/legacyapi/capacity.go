package legacyapi

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// capacity is what one declared collection can take, when its
// declaration says (Collection.Workers, Collection.RateLimit): a pool of
// workers with a queue, as a server's thread pool, and a token bucket, as
// a rate limiter in front of it.
type capacity struct {
	workers chan struct{} // a token per busy worker; nil: no bound
	service time.Duration

	mu     sync.Mutex // guards the bucket
	rate   float64    // tokens a second; 0: no limit
	burst  float64
	tokens float64
	last   time.Time
}

// newCapacity returns c's capacity, or nil when it declares none.
func newCapacity(c Collection) *capacity {
	if c.Workers <= 0 && c.ServiceTime <= 0 && c.RateLimit <= 0 {
		return nil
	}
	cp := &capacity{service: c.ServiceTime, rate: c.RateLimit}
	if c.Workers > 0 {
		cp.workers = make(chan struct{}, c.Workers)
	}
	if c.RateLimit > 0 {
		cp.burst = float64(c.Burst)
		if c.Burst <= 0 {
			cp.burst = max(1, math.Floor(c.RateLimit/10))
		}
		cp.tokens = cp.burst
	}
	return cp
}

// capacityFor is the capacity of the declared collection that serves
// path (itself or one of its items), or nil. Callers hold mu.
func (a *API) capacityFor(path string) *capacity {
	if a.capacity == nil {
		return nil
	}
	c, _, _ := a.route(path)
	if c == nil {
		return nil
	}
	if c.pattern != nil {
		c = c.pattern
	}
	return a.capacity[c.Path]
}

// limit takes a token from the bucket; when there is none it returns
// the Retry-After to answer: whole seconds until the next token, at
// least 1. A nil capacity limits nothing.
func (cp *capacity) limit(now time.Time) string {
	if cp == nil || cp.rate <= 0 {
		return ""
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if !cp.last.IsZero() {
		cp.tokens = min(cp.burst, cp.tokens+now.Sub(cp.last).Seconds()*cp.rate)
	}
	cp.last = now
	if cp.tokens >= 1 {
		cp.tokens--
		return ""
	}
	wait := (1 - cp.tokens) / cp.rate
	return strconv.Itoa(max(1, int(math.Ceil(wait))))
}

// admit answers 429 with retryAfter, when limit gave one, or serves
// the request as the workers allow (serve); ok is false when the request
// was answered, or its client went away. A nil capacity admits all.
func (cp *capacity) admit(w http.ResponseWriter, r *http.Request, retryAfter string, closed <-chan struct{}) (release func(), ok bool) {
	switch {
	case cp == nil:
		return func() {}, true
	case retryAfter != "":
		write(w, r, tooMany(retryAfter))
		return nil, false
	}
	return cp.serve(r.Context(), closed)
}

// serve waits for a worker, in turn, and holds it for the service time;
// release frees it. ok is false when the client went away first (closed
// cuts the waits short).
func (cp *capacity) serve(ctx context.Context, closed <-chan struct{}) (release func(), ok bool) {
	release = func() {}
	if cp.workers != nil {
		select {
		case cp.workers <- struct{}{}:
		case <-ctx.Done():
			return nil, false
		case <-closed:
			return release, true
		}
		release = func() { <-cp.workers }
	}
	if cp.service > 0 {
		t := time.NewTimer(cp.service)
		defer t.Stop()
		if !holdUntil(ctx, closed, t.C) {
			release()
			return nil, false
		}
	}
	return release, true
}

// tooMany is the rate limiter's answer.
func tooMany(retryAfter string) response {
	res := htmlPage(http.StatusTooManyRequests, "Too many requests: slow down")
	res.header.Set("Retry-After", retryAfter)
	return res
}
