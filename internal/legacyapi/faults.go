package legacyapi

// Faults a test injects per request (Fault): slow, hanging or dropped
// answers, and writes applied whose answer is lost.

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Fault replaces or disturbs the normal answer of matching requests, to
// simulate the failures a gateway meets in production.
type Fault struct {
	// Method restricts the fault to one method; "" matches any method.
	Method string
	// Path is the escaped request path the fault applies to (exact match).
	Path string
	// Status, when non-zero, is sent instead of the normal answer.
	Status int
	// ContentType of the injected answer; default "text/html; charset=utf-8",
	// because failing proxies and legacy stacks answer with error pages.
	ContentType string
	// Body of the injected answer.
	Body string
	// Header holds more headers of the injected answer (Retry-After,
	// say).
	Header http.Header
	// Delay waits this long before answering; the wait ends early if the
	// client goes away (nothing is sent then) or Close is called.
	Delay time.Duration
	// Until, when non-nil, holds the answer (after any Delay) until the
	// channel is closed, so a test decides exactly how long a request is
	// at the upstream; the hold ends early like Delay's.
	Until <-chan struct{}
	// Hang never answers: the handler blocks until the client gives up or
	// Close is called. On Close the connection is dropped, so the client
	// never sees an answer.
	Hang bool
	// Drop closes the TCP connection without any answer.
	Drop bool
	// AfterApply applies the request to the state first and only then
	// delays, hangs, drops or answers the fault: "it happened but you never
	// heard". Without it the state is left untouched.
	AfterApply bool
	// Times is how many matching requests the fault hits; 0 means every one.
	Times int
}

type armedFault struct {
	Fault
	left int // remaining hits; only meaningful when Times > 0
}

// Inject adds a fault. Faults are matched in injection order and the first
// one that matches and has hits left is used. It panics on a fault that could
// never work, since that is a mistake in the test.
func (a *API) Inject(f Fault) {
	if f.Path == "" || f.Times < 0 || (f.Status != 0 && (f.Status < 200 || f.Status > 999)) {
		panic(fmt.Sprintf("legacyapi: bad fault %+v", f))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults = append(a.faults, &armedFault{Fault: f, left: f.Times})
}

// ClearFaults removes every injected fault, so one API can serve several
// test phases.
func (a *API) ClearFaults() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults = nil
}

// receive logs a request, takes a token of its collection's rate limit
// (the Retry-After to answer when there is none) and, when it got one,
// the fault that hits it.
func (a *API) receive(r *http.Request, path string, body []byte) (f *Fault, cp *capacity, retryAfter string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.recording {
		a.log = append(a.log, Request{Method: r.Method, Path: path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: bytes.Clone(body), At: time.Now()})
	}
	cp = a.capacityFor(path)
	if retryAfter = cp.limit(time.Now()); retryAfter == "" {
		f = a.takeFault(r.Method, path)
	}
	return f, cp, retryAfter
}

// header is the headers of the fault's answer.
func (f *Fault) header(contentType string) http.Header {
	h := f.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", contentType)
	return h
}

// takeFault consumes the first matching fault with hits left. Callers hold mu.
func (a *API) takeFault(method, path string) *Fault {
	for i, af := range a.faults {
		if (af.Method != "" && af.Method != method) || af.Path != path {
			continue
		}
		f := af.Fault
		if af.Times > 0 {
			af.left--
			if af.left == 0 {
				a.faults = slices.Delete(a.faults, i, i+1)
			}
		}
		return &f
	}
	return nil
}

// wait sleeps for d and reports whether the request should still be
// answered: false if the client went away, true if d elapsed or Close cut
// the wait short.
func (a *API) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	return holdUntil(ctx, a.closed, t.C)
}

// holdUntil blocks until released fires or closed is closed (true), or the
// client goes away first (false).
func holdUntil[T any](ctx context.Context, closed <-chan struct{}, released <-chan T) bool {
	select {
	case <-ctx.Done():
		return false
	case <-closed:
	case <-released:
	}
	return true
}

// drop closes the connection without an answer. Hijacking is not possible on
// HTTP/2, where aborting the handler resets the stream instead.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}
