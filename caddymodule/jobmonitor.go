package caddymodule

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// isJobMonitor reports whether a request path is under the jobs path.
func (h *Handler) isJobMonitor(escapedPath string) bool {
	return h.jobs != nil && (escapedPath == h.jobsPath || strings.HasPrefix(escapedPath, h.jobsPath+"/"))
}

// The methods each monitor takes, as Allow says them.
const (
	jobAllow     = "DELETE, GET"
	resultsAllow = "GET"
)

// serveJobMonitor answers a request under the jobs path: GET <jobs>/<id>
// (the status), GET <jobs>/<id>/results (the results as JSON Lines),
// DELETE <jobs>/<id> (cancel, or remove an ended job) and POST
// <jobs>/<id>/resume (a paused job carried on, through next), each for
// the holder of the job's token. Any other path is 404, as a job without its
// token is: nobody learns a job exists without it.
func (h *Handler) serveJobMonitor(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.EscapedPath(), h.jobsPath), "/")
	id, sub, _ := strings.Cut(rest, "/")
	allow := ""
	switch {
	case id == "":
	case sub == "":
		allow = jobAllow
	case sub == "results":
		allow = resultsAllow
	case sub == "resume":
		allow = resumeAllow
	}
	if allow == "" {
		return h.refuseJob(w, durable.ErrUnknownJob)
	}
	if !slices.Contains(strings.Split(allow, ", "), r.Method) {
		w.Header().Set("Allow", allow)
		return problem.New(http.StatusMethodNotAllowed, "method-not-allowed", "a job's monitor takes "+allow).Write(w)
	}
	token := bearer(r.Header.Get("Authorization"))
	switch {
	case sub == "results":
		return h.serveJobResults(w, r, id, token)
	case sub == "resume":
		return h.serveJobResume(w, r, id, token)
	case r.Method == http.MethodDelete:
		return h.serveJobDelete(w, r, id, token)
	}
	status, err := h.jobs.store.Status(r.Context(), id, token)
	if err != nil {
		return h.refuseJob(w, err)
	}
	return writeStatus(w, http.StatusOK, status)
}

// serveJobDelete cancels a job that has not ended (202, with its status),
// or removes an ended one, its status and results (204).
func (h *Handler) serveJobDelete(w http.ResponseWriter, r *http.Request, id, token string) error {
	ctx := r.Context()
	status, err := h.jobs.store.Cancel(ctx, id, token, "client")
	if err != nil {
		return h.refuseJob(w, err)
	}
	if status.Ended == nil {
		batchapp.NudgeJobs() // a job nobody runs is ended by a scan's run
		return writeStatus(w, http.StatusAccepted, status)
	}
	err = h.jobs.store.Remove(ctx, id, token)
	switch {
	case errors.Is(err, durable.ErrJobNotEnded):
		// A cancel ended it between the two reads: it ended, so this
		// does not happen; answer as the cancel did.
		return writeStatus(w, http.StatusAccepted, status)
	case err != nil:
		return h.refuseJob(w, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// serveJobResults streams the job's results as JSON Lines, a stored page
// at a time: the longest finished prefix while it runs, all of them once
// it ended; or, for a client that accepts application/json rather, the
// whole answer (serveWholeResults).
func (h *Handler) serveJobResults(w http.ResponseWriter, r *http.Request, id, token string) error {
	w.Header().Add("Vary", "Accept")
	if wantsWholeResults(r.Header.Values("Accept")) {
		return h.serveWholeResults(w, r, id, token)
	}
	wrote := false
	begin := func() {
		if !wrote {
			w.Header().Set("Content-Type", resultsLines)
			w.WriteHeader(http.StatusOK)
			wrote = true
		}
	}
	_, err := h.jobs.store.Results(r.Context(), id, token, func(page []byte) error {
		begin()
		_, err := w.Write(page)
		return err
	})
	switch {
	case err != nil && !wrote:
		return h.refuseJob(w, err)
	case err != nil:
		// Cut short after the status went out: the client sees a body
		// that ends early, and reads again.
		return err
	}
	begin()
	return nil
}

// writeStatus answers a job's status, with Retry-After while it runs.
func writeStatus(w http.ResponseWriter, code int, status *durable.JobStatus) error {
	if status.Ended == nil {
		w.Header().Set("Retry-After", jobRetryAfter)
	}
	return writeJSON(w, code, status)
}

// bearer is the token of an Authorization: Bearer header ("Bearer" in
// any case), or "".
func bearer(authorization string) string {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}
