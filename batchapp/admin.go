package batchapp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
)

func init() {
	caddy.RegisterModule(adminSagas{})
}

// adminSagas serves the sagas on Caddy's admin endpoint (docs/operations.md,
// "Sagas left behind"), from the shared storage, so that any instance of a
// cluster sees and acts on every saga:
//
//	GET  /batch/sagas[?state=S][&limit=N][&after=ID]
//	GET  /batch/sagas/<id>
//	POST /batch/sagas/<id>/retry    {"headers": {"Name": "value"}}
//	POST /batch/sagas/<id>/resolve  {"reason": "..."}
//
// and the bulk jobs likewise (adminjobs.go):
//
//	GET  /batch/jobs[?state=S][&limit=N][&after=ID]
//	GET  /batch/jobs/<id>
//	POST /batch/jobs/<id>/cancel
//
// Caddy's origin checks and remote-admin access control apply, as to
// every admin route.
type adminSagas struct{}

// CaddyModule returns the Caddy module information.
func (adminSagas) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.batch",
		New: func() caddy.Module { return new(adminSagas) },
	}
}

// Routes returns the routes of the sagas and the jobs.
func (adminSagas) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/batch/sagas", Handler: caddy.AdminHandlerFunc(serveSagas)},
		{Pattern: "/batch/sagas/", Handler: caddy.AdminHandlerFunc(serveSaga)},
		{Pattern: "/batch/jobs", Handler: caddy.AdminHandlerFunc(serveJobs)},
		{Pattern: "/batch/jobs/", Handler: caddy.AdminHandlerFunc(serveJob)},
	}
}

// defaultSagaLimit is how many sagas a listing gives without limit.
const defaultSagaLimit = 100

// sagaID is what a saga's id looks like: no other name reaches the
// storage.
var sagaID = regexp.MustCompile(`^[0-9a-f]{32}$`)

func serveSagas(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return adminProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "GET lists the sagas")
	}
	a := operated.Load()
	if a == nil {
		return noBatchApp(w)
	}
	q, prob := sagaQuery(r)
	if prob != nil {
		return prob.Write(w)
	}
	list, err := a.journals.ListSagas(r.Context(), q)
	if err != nil {
		return adminProblem(w, http.StatusServiceUnavailable, "storage-unavailable", "listing the sagas in storage: "+err.Error())
	}
	return writeJSON(w, http.StatusOK, list)
}

// sagaQuery reads a listing's query: state, limit (default 100) and
// after.
func sagaQuery(r *http.Request) (durable.SagaQuery, *problem.Details) {
	v := r.URL.Query()
	q := durable.SagaQuery{State: v.Get("state"), After: v.Get("after"), Limit: defaultSagaLimit}
	switch q.State {
	case "", durable.StateRunning, durable.StateOrphaned, durable.StateStuck, durable.StateLeftBehind:
	default:
		p := problem.New(http.StatusBadRequest, "invalid-saga-query", fmt.Sprintf("state %q is none of running, orphaned, stuck, left_behind", q.State))
		return q, &p
	}
	var err error
	if q.Limit, err = listLimit(v); err != nil {
		p := problem.New(http.StatusBadRequest, "invalid-saga-query", err.Error())
		return q, &p
	}
	return q, nil
}

// listLimit reads a listing's limit, defaultSagaLimit when not given.
func listLimit(v url.Values) (int, error) {
	s := v.Get("limit")
	if s == "" {
		return defaultSagaLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("limit %q is not a positive number, e.g. limit=100", s)
	}
	return n, nil
}

func serveSaga(w http.ResponseWriter, r *http.Request) error {
	id, action, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/batch/sagas/"), "/")
	if !sagaID.MatchString(id) {
		return adminProblem(w, http.StatusNotFound, "unknown-saga", fmt.Sprintf("%q is not a saga's id: list them with GET /batch/sagas", id))
	}
	want := http.MethodPost
	if action == "" {
		want = http.MethodGet
	} else if action != "retry" && action != "resolve" {
		return adminProblem(w, http.StatusNotFound, "unknown-saga", "a saga takes GET, POST .../retry and POST .../resolve")
	}
	if r.Method != want {
		w.Header().Set("Allow", want)
		return adminProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", want+" is this route's method")
	}
	a := operated.Load()
	if a == nil {
		return noBatchApp(w)
	}
	switch action {
	case "retry":
		return serveRetry(w, r, a, id)
	case "resolve":
		return serveResolve(w, r, a, id)
	}
	v, err := a.journals.Saga(r.Context(), id)
	if err != nil {
		return sagaError(w, err)
	}
	return writeJSON(w, http.StatusOK, v)
}

// retryBody is a retry's optional body: headers to send with the
// saga's requests (the operator's credentials; a kept saga keeps none).
type retryBody struct {
	Headers map[string]string `json:"headers"`
}

func serveRetry(w http.ResponseWriter, r *http.Request, a *App, id string) error {
	var body retryBody
	if prob := readAdminBody(r, &body); prob != nil {
		return prob.Write(w)
	}
	header := http.Header{}
	for name, value := range body.Headers {
		header.Set(name, value)
	}
	v, err := a.retrySaga(r.Context(), id, header, r.RemoteAddr)
	if err != nil {
		telemetry.Metrics.SagaActions.WithLabelValues("retry", "refused").Inc()
		return sagaError(w, err)
	}
	telemetry.Metrics.SagaActions.WithLabelValues("retry", v.State).Inc()
	return writeJSON(w, http.StatusOK, v)
}

// resolveBody is a resolve's body: why the operator closes the saga.
type resolveBody struct {
	Reason string `json:"reason"`
}

func serveResolve(w http.ResponseWriter, r *http.Request, a *App, id string) error {
	var body resolveBody
	if prob := readAdminBody(r, &body); prob != nil {
		return prob.Write(w)
	}
	if strings.TrimSpace(body.Reason) == "" {
		return adminProblem(w, http.StatusBadRequest, "invalid-saga-action", `resolve needs a reason for the audit line: {"reason": "restored user 7 by hand"}`)
	}
	v, err := a.resolveSaga(r.Context(), id, body.Reason, r.RemoteAddr)
	if err != nil {
		telemetry.Metrics.SagaActions.WithLabelValues("resolve", "refused").Inc()
		return sagaError(w, err)
	}
	telemetry.Metrics.SagaActions.WithLabelValues("resolve", durable.StateResolved).Inc()
	return writeJSON(w, http.StatusOK, v)
}

// readAdminBody decodes an action's JSON body; an empty body is none.
func readAdminBody(r *http.Request, v any) *problem.Details {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil && len(strings.TrimSpace(string(b))) > 0 {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		p := problem.New(http.StatusBadRequest, "invalid-saga-action", "the body is not the action's JSON object: "+err.Error())
		return &p
	}
	return nil
}

// sagaError answers what durable or a retry could not do.
func sagaError(w http.ResponseWriter, err error) error {
	switch {
	case errors.Is(err, durable.ErrUnknownSaga):
		return adminProblem(w, http.StatusNotFound, "unknown-saga", err.Error())
	case errors.Is(err, durable.ErrSagaRunning):
		return adminProblem(w, http.StatusConflict, "saga-running", err.Error())
	case errors.Is(err, errCannotRun):
		return adminProblem(w, http.StatusConflict, "saga-cannot-run", err.Error()+"; fix the config or the legacy API and retry, or resolve the saga after a repair by hand")
	}
	return adminProblem(w, http.StatusServiceUnavailable, "storage-unavailable", err.Error())
}

func noBatchApp(w http.ResponseWriter) error {
	return adminProblem(w, http.StatusServiceUnavailable, "no-batch-handler", "the running config has no batch handler to act through: load a config with the batch directive")
}

func adminProblem(w http.ResponseWriter, status int, kind, detail string) error {
	return problem.New(status, kind, detail).Write(w)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

// Interface guard
var _ caddy.AdminRouter = adminSagas{}
