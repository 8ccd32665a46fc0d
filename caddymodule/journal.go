package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/policy"
)

// The saga journal (docs/durability.md) is durable's, in Caddy's
// storage; what the gateway adds is where a batch came from, so that a
// recovery sends the saga's requests through the same server and route.

// journalFor is the journal of a batch, or nil if it keeps none: only an
// all-or-nothing write batch is a saga.
func (h *Handler) journalFor(r *http.Request, sc scope, p *batch.Plan) batch.Journal {
	if h.journals == nil || !sc.gateway.Journal || p.Atomicity != policy.AllOrNothing || !p.Writes() {
		return nil
	}
	return h.journals.New(originOf(r))
}

// originOf is the client's request as it reached the server, before any
// rewrite, and the server's name.
func originOf(r *http.Request) durable.Origin {
	o := durable.Origin{
		Method:     r.Method,
		URI:        r.RequestURI,
		Host:       r.Host,
		RemoteAddr: r.RemoteAddr,
		TLS:        r.TLS != nil,
	}
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		o.Method, o.URI = orig.Method, orig.RequestURI
		if o.URI == "" && orig.URL != nil {
			o.URI = orig.URL.RequestURI()
		}
	}
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		o.Server = srv.Name()
	}
	return o
}
