package batch

import (
	"fmt"
	"net/http"

	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Admit is the one front door of a batch. For a request to the collection
// m matched, it tells whether the request is one of the four batch
// operations and, if it is, applies every input rule of docs/wire-format.md,
// "Bad input" (the operation being on for the resource included): it returns
// the plan, or the problem to answer with before anything is sent. A
// request that is not a batch passes on as it came: a body read to
// decide is put back.
func Admit(r *http.Request, m policy.Match) (op policy.Op, isBatch bool, plan *Plan, prob *problem.Details) {
	op, isBatch, err := detectOp(r, m.Resource)
	switch {
	case err != nil:
		d := problem.New(http.StatusBadRequest, "invalid-batch", "reading the body: "+err.Error())
		return op, true, nil, &d
	case !isBatch:
		return op, false, nil, nil
	}
	if prob := disabled(op, m); prob != nil {
		return op, true, nil, prob
	}
	plan, prob = parsePlan(r, m, op)
	return op, true, plan, prob
}

// disabled refuses a batch operation that is off for m's resource.
func disabled(op policy.Op, m policy.Match) *problem.Details {
	if m.Resource.BatchEnabled(op) {
		return nil
	}
	d := problem.New(http.StatusMethodNotAllowed, "method-not-allowed",
		fmt.Sprintf("batch %s is not enabled for %s", op, m.Resource.Collection))
	return &d
}
