package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/options"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// envelopeLocks lock each item of an envelope as its resource's
// item_locks says: a lock's key is the item's path.
type envelopeLocks struct{ h *Handler }

func (l envelopeLocks) Lock(ctx context.Context, key string) (func(), error) {
	if m, ok := l.h.policy.Lookup(key); ok {
		return l.h.lockerFor(m).Lock(ctx, key)
	}
	return l.h.locks.Lock(ctx, key)
}

// envelopeOf builds the handler's envelope over its policy and its own
// settings, or refuses one that cannot work; nil when the handler has
// none.
func (h *Handler) envelopeOf(p *policy.Policy, handler options.Level) (*batch.Envelope, error) {
	path := h.Envelope
	if path == "" {
		return nil, nil
	}
	refuse := func(format string, args ...any) (*batch.Envelope, error) {
		return nil, policy.OptionError("envelope", fmt.Errorf(format, args...))
	}
	switch {
	case !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?#{}"):
		return refuse("envelope %q must be a plain path, such as envelope /api/batch", path)
	case path != "/":
		path = strings.TrimSuffix(path, "/")
	}
	if m, ok := p.Lookup(path); ok {
		return refuse("envelope %s is a path of the resource %s: give the envelope a path of its own, such as %s",
			path, m.Resource.Collection, strings.TrimSuffix(path, "/")+"/batch")
	}
	return &batch.Envelope{Path: path, Settings: handler.Settings, Atomicity: handler.GeneralAtomicity, Lookup: p.Lookup}, nil
}

// isEnvelope reports whether a request path is the envelope's, with or
// without one trailing slash.
func (h *Handler) isEnvelope(escapedPath string) bool {
	e := h.envelope
	return e != nil && (escapedPath == e.Path || escapedPath == e.Path+"/")
}

// envelopeAllow is what the envelope's path allows.
const envelopeAllow = "OPTIONS, POST"

// admitEnvelope admits a POST to the envelope's path
// (batch.AdmitEnvelope).
func (h *Handler) admitEnvelope(r *http.Request) admission {
	plan, prob := batch.AdmitEnvelope(r, h.envelope)
	return admission{scope: h.envelopeScope(), op: policy.OpEnvelope, plan: plan, refusal: prob}
}

// serveEnvelope answers a request to the envelope's path: a POST is an
// envelope of operations, OPTIONS is answered, and any other method is
// refused.
func (h *Handler) serveEnvelope(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	path := h.envelope.Path
	if o, ok, err := policy.FindMethodOverride(r); err != nil || ok && o.Method != http.MethodPost {
		// The envelope's path takes POST alone, whatever a client names.
		return refuse(w, problem.New(http.StatusMethodNotAllowed, "method-not-allowed",
			fmt.Sprintf("the envelope %s takes POST alone; it honours no method override", path)), envelopeAllow)
	}
	switch r.Method {
	case http.MethodPost:
		if h.jobs != nil && batch.IsAsync(r.Header) {
			return h.serveJobStart(w, r, h.envelopeScope(), policy.OpEnvelope, h.envelopeJob)
		}
		return h.serveBatch(w, r, h.admitEnvelope(r), next)
	case http.MethodOptions:
		return answerOptions(w, r, next, envelopeAllow, false)
	}
	return refuse(w, problem.New(http.StatusMethodNotAllowed, "method-not-allowed",
		fmt.Sprintf("%s is not allowed on the envelope %s; send its operations with POST", r.Method, path)), envelopeAllow)
}
