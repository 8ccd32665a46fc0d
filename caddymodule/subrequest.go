package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/recorder"
)

// routeGroupCtxKey is caddyhttp's own (unexported) key for the route
// groups a request has satisfied; see subrequests.Send.
const routeGroupCtxKey caddy.CtxKey = "route_group"

// subrequests sends a batch's sub-requests through the rest of the
// handler chain (normally reverse_proxy), each as if it were a request of
// its own. Everything Caddy keeps per request is made anew for each, so
// that concurrent sub-requests share nothing they write: vars, replacer,
// log fields, route groups, response writer.
type subrequests struct {
	parent      *http.Request
	next        caddyhttp.Handler
	server      *caddyhttp.Server
	parentRepl  *caddy.Replacer
	vars        map[string]any
	routeGroups map[string]struct{}
	maxBody     int64
	// strip, if set, deletes the tracing headers of a saga's stored
	// header from each sub-request of a recovery or a job's window that
	// makes no spans.
	strip func(http.Header)
}

// newSubrequests captures what every sub-request of r inherits. It runs
// before the fan-out, on the client's goroutine, so reading r's maps here
// races with nothing.
func newSubrequests(r *http.Request, next caddyhttp.Handler, maxBody int64) *subrequests {
	ctx := r.Context()
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		repl = caddy.NewReplacer()
	}
	// The request's UUID is made on first use, by writing to the vars map
	// and log fields; make it now, so that sub-requests only read it.
	repl.Get("http.request.uuid")
	server, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	vars, _ := ctx.Value(caddyhttp.VarsCtxKey).(map[string]any)
	groups, _ := ctx.Value(routeGroupCtxKey).(map[string]struct{})
	return &subrequests{
		parent:      r,
		next:        next,
		server:      server,
		parentRepl:  repl,
		vars:        maps.Clone(vars),
		routeGroups: maps.Clone(groups),
		maxBody:     maxBody,
	}
}

// Send runs one sub-request through the handler chain and returns what
// the chain answered.
func (s *subrequests) Send(ctx context.Context, sr *batch.SubRequest) (resp *batch.SubResponse, err error) {
	// A resent read changes nothing, so only a write's copies are counted.
	var resends *resendTrace
	if sr.Method != http.MethodGet && sr.Method != http.MethodHead {
		resends = new(resendTrace)
		ctx = httptrace.WithClientTrace(ctx, resends.trace())
	}
	rec := recorder.New(s.maxBody)
	req, err := s.prepare(ctx, sr, rec)
	if err != nil {
		return nil, err
	}
	defer func() {
		// The chain runs on a goroutine Caddy did not start, where a panic
		// would end the process; http.ErrAbortHandler is how a handler
		// says the answer was cut off.
		if p := recover(); p != nil {
			resp, err = nil, fmt.Errorf("the handler chain panicked: %v", p)
		}
	}()
	err = s.next.ServeHTTP(rec, req)
	resp, err = answer(req.Context(), rec, err)
	if resp != nil {
		resp.Resent = resends != nil && resends.resent()
	}
	return resp, err
}

// prepare makes sr a request of its own, as Caddy prepares a client's
// request, answered into rec: its own replacer falling back to the batch
// request's, a copy of the batch request's vars and route groups.
func (s *subrequests) prepare(ctx context.Context, sr *batch.SubRequest, rec *recorder.Recorder) (*http.Request, error) {
	path, err := url.PathUnescape(sr.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: bad sub-request path %q: %w", batch.ErrNotSent, sr.Path, err)
	}
	u := *s.parent.URL
	u.Path, u.RawPath, u.RawQuery, u.Fragment, u.RawFragment = path, sr.Path, sr.RawQuery, "", ""
	requestURI := sr.Path // what u.RequestURI() gives, sr.Path being escaped already
	if sr.RawQuery != "" {
		requestURI += "?" + sr.RawQuery
	}
	if s.strip != nil {
		s.strip(sr.Header) // the sub-request's own copy
	}
	// A value, not a pointer: WithContext below copies it to the heap,
	// and PrepareRequest copies that again; only one copy need be made
	// here.
	req := http.Request{
		Method:     sr.Method,
		URL:        &u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     sr.Header,
		Host:       s.parent.Host,
		RemoteAddr: s.parent.RemoteAddr,
		TLS:        s.parent.TLS,
		RequestURI: requestURI,
		Body:       http.NoBody,
	}
	if sr.Body != nil {
		// No GetBody: with it and an Idempotency-Key, Go's transport
		// resends a write whose kept-alive connection died after sending
		// it, to an upstream that may ignore the key and apply it twice.
		// Without it a write with a body is never resent; a DELETE (no
		// body) still can be, which the trace in Send tells the engine.
		req.ContentLength = int64(len(sr.Body))
		req.Body = io.NopCloser(bytes.NewReader(sr.Body))
	}
	repl := caddy.NewReplacer()
	prepared := caddyhttp.PrepareRequest(req.WithContext(ctx), repl, rec, s.server)
	// Placeholders the sub-request cannot answer itself (an authenticated
	// user, say) fall back to the batch request's.
	repl.Map(s.parentRepl.Get)
	subCtx := prepared.Context()
	maps.Copy(subCtx.Value(caddyhttp.VarsCtxKey).(map[string]any), s.vars)
	// Routes in a group with the batch handler's own route must be
	// skipped, as they are for the batch request itself.
	if groups, ok := subCtx.Value(routeGroupCtxKey).(map[string]struct{}); ok {
		maps.Copy(groups, s.routeGroups)
	}
	return prepared, nil
}

// resendTrace tells a request that Go's transport wrote again (its first
// copy went unanswered on a kept-alive connection that died) from the
// other requests the handler chain makes for the same sub-request, such
// as forward_auth's to its auth service: each of those is answered before
// the next is written, while a resent copy follows a copy that never was.
type resendTrace struct {
	mu       sync.Mutex
	awaiting bool // a request was written and no answer has begun
	again    bool
}

func (t *resendTrace) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.again = t.again || t.awaiting
			t.awaiting = true
		},
		GotFirstResponseByte: func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.awaiting = false
		},
	}
}

func (t *resendTrace) resent() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.again
}

// chainResult is what the handler chain did with one sub-request: the
// one reading of what it wrote and returned, which both the sub-request's
// answer (answer) and the batch's log line (watchedChain) go by.
type chainResult uint8

const (
	// chainWrote: an answer was written, the upstream's or a handler's.
	chainWrote chainResult = iota
	// chainRefused: a handler after batch refused the request with a
	// client error and wrote nothing (basic_auth's 401, a rate limit's
	// 429): the chain's answer, as it would be a single request's.
	chainRefused
	// chainNoUpstream: reverse_proxy had no upstream to send it to (503):
	// the chain's answer, and the upstream was not reached.
	chainNoUpstream
	// chainNotSent: the upstream could not be dialled.
	chainNotSent
	// chainCut: the sub-request's context ended first (its timeout, the
	// client leaving; Caddy's 499): neither an answer nor a sign that the
	// upstream is down.
	chainCut
	// chainLost: sent, and no answer came (a connection that broke).
	chainLost
)

// classify reads what the chain did with a sub-request whose context is
// ctx: it wrote to rec (nil if the writer was not the recorder) and
// returned err.
func classify(ctx context.Context, rec *recorder.Recorder, err error) chainResult {
	switch {
	case err == nil, rec != nil && rec.Status() != 0:
		return chainWrote
	case ctx.Err() != nil:
		return chainCut
	}
	return classifyError(err)
}

// classifyError reads the error of a sub-request that wrote nothing, apart
// from classify: the targets errors.As needs go to the heap, and the
// sub-requests that were answered must not pay for them.
func classifyError(err error) chainResult {
	var dial reverseproxy.DialError
	if errors.As(err, &dial) {
		return chainNotSent
	}
	var herr caddyhttp.HandlerError
	switch {
	case !errors.As(err, &herr):
		return chainLost
	case herr.StatusCode == 499:
		return chainCut
	case herr.StatusCode >= 400 && herr.StatusCode < 500:
		return chainRefused
	case herr.StatusCode == http.StatusServiceUnavailable:
		return chainNoUpstream
	}
	return chainLost
}

// answer turns what the chain did into the sub-request's answer. A
// refusal by a handler, or reverse_proxy's 503 with no upstream, is an
// answer of the chain that never reached the upstream; a request that
// could not be dialled was not sent; anything else that wrote nothing got
// no answer.
func answer(ctx context.Context, rec *recorder.Recorder, err error) (*batch.SubResponse, error) {
	switch classify(ctx, rec, err) {
	case chainRefused, chainNoUpstream:
		// The handler may have set headers the status needs before
		// returning its error: basic_auth's WWW-Authenticate.
		var herr caddyhttp.HandlerError
		errors.As(err, &herr)
		return &batch.SubResponse{Status: herr.StatusCode, Header: rec.Header()}, nil
	case chainNotSent:
		return nil, fmt.Errorf("%w: %w", batch.ErrNotSent, err)
	case chainCut, chainLost:
		return nil, err
	}
	resp := &batch.SubResponse{Status: rec.Status(), Header: rec.Header()}
	if resp.Status == 0 {
		resp.Status = http.StatusOK // as net/http answers a handler that wrote nothing
	}
	if rec.Overflowed() {
		return resp, fmt.Errorf("%w (%d bytes)", batch.ErrBodyTooLarge, rec.Limit())
	}
	resp.Body = rec.Bytes()
	return resp, err
}
