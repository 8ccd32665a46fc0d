package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/recorder"
)

// answer turns what the chain did with a sub-request into its answer: an
// error a handler returned before anything was written is either an
// answer of the chain (a 4xx, a 503 with no upstream), a request that was
// never sent (a dial error), or no answer at all.
func TestAnswer(t *testing.T) {
	written := func(status int, body string) *recorder.Recorder {
		rec := recorder.New(1 << 10)
		rec.Header().Set("Content-Type", "application/json")
		if status != 0 {
			rec.WriteHeader(status)
		}
		if body != "" {
			_, _ = rec.Write([]byte(body))
		}
		return rec
	}
	challenged := recorder.New(1 << 10)
	challenged.Header().Set("WWW-Authenticate", `Basic realm="r"`)
	tests := []struct {
		name    string
		rec     *recorder.Recorder
		err     error
		status  int // 0: no answer
		notSent bool
		body    string
		header  string // WWW-Authenticate
	}{
		{name: "an upstream answer", rec: written(201, `{"id":1}`), status: 201, body: `{"id":1}`},
		{name: "a handler that wrote a body and no status", rec: written(0, `{}`), status: 200, body: `{}`},
		{name: "a handler that wrote nothing", rec: written(0, ""), status: 200},
		{name: "basic_auth's 401, its challenge kept", rec: challenged,
			err: caddyhttp.Error(http.StatusUnauthorized, errors.New("no credentials")), status: 401, header: `Basic realm="r"`},
		{name: "no upstream available", rec: recorder.New(1 << 10),
			err: caddyhttp.Error(http.StatusServiceUnavailable, errors.New("no upstreams available")), status: 503},
		{name: "a dial that failed: never sent", rec: recorder.New(1 << 10),
			err: caddyhttp.Error(http.StatusBadGateway, reverseproxy.NewDialError(errors.New("connection refused"))), notSent: true},
		{name: "a 502 after sending: no answer", rec: recorder.New(1 << 10),
			err: caddyhttp.Error(http.StatusBadGateway, errors.New("EOF"))},
		// Caddy's 499 is a client that went away: no answer, whatever
		// the context says (the log line counted it as answered once).
		{name: "499: no answer", rec: recorder.New(1 << 10),
			err: caddyhttp.Error(499, errors.New("context canceled"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := answer(context.Background(), tt.rec, tt.err)
			if tt.status == 0 {
				if resp != nil || err == nil {
					t.Fatalf("answer = %+v, %v; want no answer", resp, err)
				}
				if got := errors.Is(err, batch.ErrNotSent); got != tt.notSent {
					t.Errorf("ErrNotSent = %v, want %v (%v)", got, tt.notSent, err)
				}
				return
			}
			if resp == nil || err != nil {
				t.Fatalf("answer = %+v, %v; want status %d", resp, err, tt.status)
			}
			if resp.Status != tt.status || string(resp.Body) != tt.body || resp.Header.Get("WWW-Authenticate") != tt.header {
				t.Errorf("answer %d %q (WWW-Authenticate %q), want %d %q (%q)",
					resp.Status, resp.Body, resp.Header.Get("WWW-Authenticate"), tt.status, tt.body, tt.header)
			}
		})
	}
	t.Run("a body past the limit is left out, its status stands", func(t *testing.T) {
		rec := recorder.New(4)
		rec.WriteHeader(200)
		n, err := rec.Write([]byte("0123456789"))
		if n != 10 || err != nil {
			t.Fatalf("Write = %d, %v: the handler must finish normally", n, err)
		}
		resp, err := answer(context.Background(), rec, nil)
		if resp == nil || resp.Status != 200 || resp.Body != nil || !errors.Is(err, batch.ErrBodyTooLarge) {
			t.Errorf("answer = %+v, %v", resp, err)
		}
	})
}

// classify is the one reading of what the chain did, for the answer and
// for the log line alike: each row is what a sub-request gets, and
// whether it tells that the upstream was reached.
func TestClassify(t *testing.T) {
	cut, cancel := context.WithCancel(context.Background())
	cancel()
	wrote := recorder.New(1 << 10)
	wrote.WriteHeader(404)
	for _, tt := range []struct {
		name string
		ctx  context.Context
		rec  *recorder.Recorder
		err  error
		want chainResult
	}{
		{"an answer", context.Background(), wrote, nil, chainWrote},
		{"an answer, then an error", context.Background(), wrote, errors.New("late"), chainWrote},
		{"basic_auth's 401", context.Background(), recorder.New(1), caddyhttp.Error(401, errors.New("no")), chainRefused},
		{"a rate limit's 429", context.Background(), recorder.New(1), caddyhttp.Error(429, errors.New("slow down")), chainRefused},
		{"no upstream available", context.Background(), recorder.New(1), caddyhttp.Error(503, errors.New("no upstreams available")), chainNoUpstream},
		{"a refused dial", context.Background(), recorder.New(1), caddyhttp.Error(502, reverseproxy.NewDialError(errors.New("refused"))), chainNotSent},
		{"a broken connection", context.Background(), recorder.New(1), caddyhttp.Error(502, errors.New("EOF")), chainLost},
		{"an error that is no handler error", context.Background(), recorder.New(1), errors.New("boom"), chainLost},
		{"Caddy's 499", context.Background(), recorder.New(1), caddyhttp.Error(499, errors.New("canceled")), chainCut},
		{"a 401 after the context ended", cut, recorder.New(1), caddyhttp.Error(401, errors.New("no")), chainCut},
		{"a writer that is not the recorder", context.Background(), nil, caddyhttp.Error(403, errors.New("no")), chainRefused},
	} {
		if got := classify(tt.ctx, tt.rec, tt.err); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// A request is resent only when the transport wrote it again before any
// answer began; forward_auth's request, answered before the upstream's is
// written, is not a resend.
func TestResendTrace(t *testing.T) {
	tests := []struct {
		name   string
		events string // w: a request written, a: an answer began
		resent bool
	}{
		{"one request", "wa", false},
		{"forward_auth, then the upstream", "wawa", false},
		{"written twice before an answer", "wwa", true},
		{"forward_auth, then a resent write", "wawwa", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r resendTrace
			trace := r.trace()
			for _, e := range tt.events {
				if e == 'w' {
					trace.WroteRequest(httptrace.WroteRequestInfo{})
				} else {
					trace.GotFirstResponseByte()
				}
			}
			if r.resent() != tt.resent {
				t.Errorf("resent = %v, want %v", r.resent(), tt.resent)
			}
		})
	}
}
