package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/policy"
)

// A saga whose gateway died is found and taken over by the batch app
// (package batchapp), which sends the batch's request again through the
// server's routes; the handler it reaches finishes it here.

// resume is ServeHTTP for a recovery's request: the handler that serves
// the saga's resource, or its envelope, finishes it through next; any
// other passes it on.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, job *batchapp.Recovery) error {
	sc, ok := h.scopeOf(job.Snap)
	if !ok || job.Reached {
		return next.ServeHTTP(w, r)
	}
	job.Reached = true
	rt := batch.Runtime{
		Send:     newSubrequests(r, next, sc.settings.MaxBodySize),
		Locks:    sc.locks,
		Journal:  job.Journal,
		Slots:    h.slots,
		Observer: h.slots.observer(),
		// Undos wait out the upstream's throttle of the client they
		// undo for, as that client's batches do.
		Throttles: h.slots.throttles,
		Client:    durable.Credentials(job.Snap.Header),
	}
	if job.Retry {
		job.Res, job.Err = batch.Retry(r.Context(), job.Snap, job.Prev, h.policy.Lookup, h.envelope, rt)
	} else {
		job.Res, job.Err = batch.Resume(r.Context(), job.Snap, h.policy.Lookup, h.envelope, rt)
	}
	if job.Err == nil && job.Prev == nil && !job.Res.LeaseLost {
		h.idem.settleRecovered(r.Context(), sc, job.Snap, job.Res)
	}
	return nil
}

// scopeOf is the scope a saga from a journal ran under, if this handler
// serves it: its resource's collection, or the handler's envelope.
func (h *Handler) scopeOf(snap *batch.Snapshot) (scope, bool) {
	if snap.Op == policy.OpEnvelope.String() {
		if h.envelope == nil || h.envelope.Path != snap.Path {
			return scope{}, false
		}
		return h.envelopeScope(), true
	}
	m, ok := h.policy.Lookup(snap.Path)
	if !ok || m.Item {
		return scope{}, false
	}
	return h.collectionScope(m), true
}
