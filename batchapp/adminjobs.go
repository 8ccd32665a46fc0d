package batchapp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// The bulk jobs on Caddy's admin endpoint (docs/jobs.md, "Operations"),
// beside the sagas and under the same module, from the shared storage:
//
//	GET  /batch/jobs[?state=S][&limit=N][&after=ID]
//	GET  /batch/jobs/<id>
//	POST /batch/jobs/<id>/cancel
//
// Every answer is a job's status as its monitor shows it, never its
// token: the operator needs none.

func serveJobs(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		return adminProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "GET lists the bulk jobs")
	}
	a := operated.Load()
	if a == nil {
		return noBatchApp(w)
	}
	q, prob := jobQuery(r)
	if prob != nil {
		return prob.Write(w)
	}
	list, err := a.jobs.ListJobs(r.Context(), q)
	switch {
	case errors.Is(err, durable.ErrJobCursor):
		return adminProblem(w, http.StatusBadRequest, "invalid-job-query", err.Error())
	case err != nil:
		return adminProblem(w, http.StatusServiceUnavailable, "storage-unavailable", "listing the bulk jobs in storage: "+err.Error())
	}
	return writeJSON(w, http.StatusOK, list)
}

// jobQuery reads a listing's query: state, limit (default 100, as the
// sagas') and after.
func jobQuery(r *http.Request) (durable.JobQuery, *problem.Details) {
	v := r.URL.Query()
	q := durable.JobQuery{State: v.Get("state"), After: v.Get("after"), Limit: defaultSagaLimit}
	bad := func(detail string) (durable.JobQuery, *problem.Details) {
		p := problem.New(http.StatusBadRequest, "invalid-job-query", detail)
		return q, &p
	}
	if q.State != "" && !slices.Contains(durable.JobStates, q.State) {
		return bad(fmt.Sprintf("state %q is none of %s", q.State, strings.Join(durable.JobStates, ", ")))
	}
	if q.After != "" && !sagaID.MatchString(q.After) {
		return bad(fmt.Sprintf("after %q is not a job's id: give the id of the last job of the page before", q.After))
	}
	var err error
	if q.Limit, err = listLimit(v); err != nil {
		return bad(err.Error())
	}
	return q, nil
}

func serveJob(w http.ResponseWriter, r *http.Request) error {
	id, action, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/batch/jobs/"), "/")
	// A job's id looks like a saga's: 32 lowercase hex digits.
	if !sagaID.MatchString(id) {
		return adminProblem(w, http.StatusNotFound, "unknown-job", fmt.Sprintf("%q is not a job's id: list them with GET /batch/jobs", id))
	}
	want := http.MethodPost
	switch action {
	case "":
		want = http.MethodGet
	case "cancel":
	default:
		return adminProblem(w, http.StatusNotFound, "unknown-job", "a job takes GET, and POST .../cancel")
	}
	if r.Method != want {
		w.Header().Set("Allow", want)
		return adminProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", want+" is this route's method")
	}
	a := operated.Load()
	if a == nil {
		return noBatchApp(w)
	}
	if action == "cancel" {
		return a.serveJobCancel(w, r, id)
	}
	st, err := a.jobs.OperatorStatus(r.Context(), id)
	if err != nil {
		return jobError(w, err)
	}
	return writeJSON(w, http.StatusOK, st)
}

// serveJobCancel cancels a job as its token's holder would (202, the
// status cancelling, or cancelled for a queued job), and logs who asked.
func (a *App) serveJobCancel(w http.ResponseWriter, r *http.Request, id string) error {
	st, err := a.jobs.OperatorCancel(r.Context(), id)
	if errors.Is(err, durable.ErrJobEnded) {
		return adminProblem(w, http.StatusConflict, "job-ended",
			fmt.Sprintf("job %s has ended %s: there is nothing to cancel (its monitor's DELETE removes it)", id, st.State))
	}
	if err != nil {
		return jobError(w, err)
	}
	a.logger.Info("bulk job cancelled by an operator", zap.String("job", id), zap.String("caller", r.RemoteAddr), zap.String("state", st.State))
	if st.Ended == nil {
		NudgeJobs() // a job nobody runs is ended by a scan's run
	}
	return writeJSON(w, http.StatusAccepted, st)
}

// jobError answers what durable could not read or do.
func jobError(w http.ResponseWriter, err error) error {
	if errors.Is(err, durable.ErrUnknownJob) {
		return adminProblem(w, http.StatusNotFound, "unknown-job", "no job with this id is kept (never made, removed, or past its job_ttl): list them with GET /batch/jobs")
	}
	return adminProblem(w, http.StatusServiceUnavailable, "storage-unavailable", "reading the job in storage: "+err.Error())
}
