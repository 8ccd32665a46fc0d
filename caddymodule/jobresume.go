package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// A job paused because the upstream refused its credentials (docs/jobs.md,
// "Paused jobs") is resumed by its client: POST <jobs>/<id>/resume with
// the job's token and the headers that replace those the job forwards.

// resumeAllow is the method the resume monitor takes, as Allow says it.
const resumeAllow = "POST"

// maxResumeBody bounds a resume's body: a few headers.
const maxResumeBody = 64 << 10

// resumeBody is a resume's body: {"headers": {"Name": "value" or
// ["v1", "v2"]}}; a name given [] is removed from the job's headers. No
// body, or no headers, resumes with the headers the job has.
type resumeBody struct {
	Headers map[string]json.RawMessage `json:"headers"`
}

// serveJobResume resumes the paused job id for the holder of token:
// 202 with its status, the job carried on (carryOnResumed); 404 as every
// monitor without the right token; 409 for a job that is not paused.
func (h *Handler) serveJobResume(w http.ResponseWriter, r *http.Request, id, token string) error {
	ctx := r.Context()
	header, prob := readResumeHeaders(r)
	if prob != nil {
		// Nobody learns from a refused body that a job exists.
		if _, err := h.jobs.store.Status(ctx, id, token); err != nil {
			return h.refuseJob(w, err)
		}
		return prob.Write(w)
	}
	held, err := h.jobs.store.Resume(ctx, id, token, header)
	switch {
	case errors.Is(err, durable.ErrJobNotPaused):
		// One past its job_timeout is ended by a scan's run (an
		// all-or-nothing one undone): now, not at the next interval.
		batchapp.NudgeJobs()
		return problem.New(http.StatusConflict, "job-not-paused",
			"the job is not paused: only a job paused because the upstream refused its credentials is resumed; read its status for its state").Write(w)
	case errors.Is(err, durable.ErrJobHeld):
		w.Header().Set("Retry-After", "1")
		return problem.New(http.StatusConflict, "job-busy",
			"another request is resuming, cancelling or ending the job right now: read its status, and resume it again if it is still paused").Write(w)
	case err != nil:
		return h.refuseJob(w, err)
	}
	h.carryOnResumed(ctx, held)
	status, err := h.jobs.store.Status(ctx, id, token)
	if err != nil {
		return h.refuseJob(w, err)
	}
	return writeStatus(w, http.StatusAccepted, status)
}

// carryOnResumed runs a resumed job on this instance, as a start runs
// one, when a max_jobs slot is free; otherwise it releases the job,
// queued, for the next scan of an instance with room. It is the one
// place that decides where a resumed job runs.
func (h *Handler) carryOnResumed(ctx context.Context, held *durable.HeldJob) {
	if release, ok := h.jobs.acquire(); ok {
		h.jobs.app.RunJob(held, release)
		return
	}
	rec := held.Record()
	// Resume stored its progress queued already: only the lease is left.
	if err := held.Release(context.WithoutCancel(ctx)); err != nil {
		h.logger.Error("releasing a resumed bulk job for another instance; it is taken once its lease lapses", zap.String("job", rec.ID), zap.Error(err))
		return
	}
	h.logger.Info("bulk job resumed and queued: this instance runs as many jobs as max_jobs allows", zap.String("job", rec.ID))
}

// readResumeHeaders reads a resume's body into the headers it gives, as
// a job's requests would carry them; a problem (400) for a body that is
// not a resume's, or a header no sub-request carries.
func readResumeHeaders(r *http.Request) (http.Header, *problem.Details) {
	bad := func(detail string) (http.Header, *problem.Details) {
		p := problem.New(http.StatusBadRequest, "invalid-job-resume", detail+
			`: send {"headers": {"Authorization": "Bearer <new token>"}}, a value a string or an array of strings ([] removes the header)`)
		return nil, &p
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxResumeBody+1))
	switch {
	case err != nil:
		return bad("the body could not be read: " + err.Error())
	case len(b) > maxResumeBody:
		return bad(fmt.Sprintf("the body is over %d bytes", maxResumeBody))
	case len(bytes.TrimSpace(b)) == 0:
		return http.Header{}, nil
	}
	var body resumeBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || dec.More() {
		return bad(fmt.Sprintf("the body is not a resume's JSON object (%v)", err))
	}
	header := make(http.Header, len(body.Headers))
	for name, raw := range body.Headers {
		if !httpguts.ValidHeaderFieldName(name) {
			return bad(fmt.Sprintf("%q is not a header name", name))
		}
		var values []string
		var one string
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return bad(fmt.Sprintf("header %s's value is null", name))
		}
		if err := json.Unmarshal(raw, &one); err == nil {
			values = []string{one}
		} else if err := json.Unmarshal(raw, &values); err != nil || values == nil {
			return bad(fmt.Sprintf("header %s's value is neither a string nor an array of strings", name))
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return bad(fmt.Sprintf("header %s has a value that is not a header value", name))
			}
		}
		header[http.CanonicalHeaderKey(name)] = values
	}
	forwarded, dropped := batch.JobHeader(header)
	if len(dropped) > 0 {
		return bad(fmt.Sprintf("a job's requests never carry %s (hop-by-hop, the batch request's own, or a method override)", strings.Join(dropped, ", ")))
	}
	return forwarded, nil
}
