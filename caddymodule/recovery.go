package caddymodule

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/policy"
)

// A saga whose gateway died is found and taken over by the batch app
// (package batchapp), which sends the batch's request again through the
// server's routes; the handler it reaches offers it the Finisher that
// runs the saga through the handler chain after it, and the app calls
// it.

// offer is ServeHTTP for a recovery's request: the handler that serves
// the saga's resource, or its envelope, offers the recovery its
// Finisher, which the recovery calls before Offer returns, while next is
// still this handler's to call; any other handler, or this one reached
// again by the saga's own sub-requests, passes the request on.
func (h *Handler) offer(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, rc *batchapp.Recovery) error {
	job := rc.Job()
	sc, ok := h.scopeOf(job.Snap)
	if !ok || !rc.Offer(func() (*batch.Result, error) { return h.finish(r, next, sc, job) }) {
		return next.ServeHTTP(w, r)
	}
	return nil
}

// finish runs a taken-over saga to its end under sc, its sub-requests
// sent through next as r's own would be, and answers what became of it.
func (h *Handler) finish(r *http.Request, next caddyhttp.Handler, sc scope, job batchapp.Job) (*batch.Result, error) {
	ctx := r.Context()
	h.linkFinish(ctx, job, sagaOf(job.Journal))
	rt := h.runtime(ctx, h.sendStored(r, next, sc), sc.locks, job.Journal, job.Snap.Header, sc)
	var (
		res *batch.Result
		err error
	)
	if job.Retry {
		res, err = batch.Retry(ctx, job.Snap, job.Prev, h.policy.Lookup, h.envelope, rt)
	} else {
		res, err = batch.Resume(ctx, job.Snap, h.policy.Lookup, h.envelope, rt)
	}
	if err == nil && job.Prev == nil && !res.LeaseLost {
		var began time.Time
		if dj, ok := job.Journal.(*durable.Journal); ok {
			began = dj.Began()
		}
		h.idem.settleRecovered(ctx, sc, job.Snap, began, res)
	}
	return res, err
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
