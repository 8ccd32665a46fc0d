package batch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// report settles the batch's outcome and status (docs/wire-format.md,
// "Batch requests and responses").
func (run *batchRun) report(clientCtx, batchCtx context.Context) *Result {
	p := run.plan
	r := &Result{
		Op:                p.Op,
		Atomicity:         p.Atomicity,
		Items:             run.items,
		Compensations:     run.sentUndos,
		PreferenceApplied: p.PreferenceApplied,
		RetryAfter:        retryAfter(run.items, time.Now()),
		Warning:           run.warning.text,
		ListRequests:      run.lists.requests,
		ListFallbacks:     run.lists.fallbacks,
		ListFailures:      run.lists.failures,
	}
	firstFailure, rolledBack := tally(r, run.items, run.state, run.allOrNothing)
	cause := run.cause(firstFailure, clientCtx, batchCtx)
	if firstFailure >= 0 && run.state[firstFailure].byGateway && r.RetryAfter == "" {
		r.RetryAfter = gatewayRetryAfter
	}
	switch {
	case run.refusal != nil:
		r.Outcome, r.Status, r.Detail = Failed, run.refusal.status, run.refusal.detail
		if run.refusal.retryAfter != "" {
			r.RetryAfter = run.refusal.retryAfter
		}
		if run.refusal.cause != nil {
			r.Errors = append(r.Errors, run.refusal.cause.Error())
		}
	case r.Succeeded == len(run.items):
		r.Outcome, r.Status = Succeeded, http.StatusOK
		if p.Op == policy.OpCreate {
			r.Status = http.StatusCreated
		}
	case !run.allOrNothing:
		r.Outcome, r.Status = Partial, http.StatusMultiStatus
		if r.Succeeded == 0 {
			r.Outcome = Failed
		}
	case len(r.LeftBehind) > 0:
		r.Outcome, r.Status = RollbackFailed, http.StatusInternalServerError
		r.Detail = fmt.Sprintf("%s, and the rollback left %s as the batch made them: %s",
			cause, plural(len(r.LeftBehind), "item"), strings.Join(r.LeftBehind, ", "))
	case rolledBack > 0:
		r.Outcome, r.Status = RolledBack, run.failureStatus(firstFailure, batchCtx)
		r.Detail = fmt.Sprintf("%s; the %s that had taken effect %s undone", cause, plural(rolledBack, "item"), wasWere(rolledBack))
	default:
		r.Outcome, r.Status = Failed, run.failureStatus(firstFailure, batchCtx)
		r.Detail = cause
		if p.Writes() {
			r.Detail += "; nothing was changed"
		}
	}
	return r
}

// tally counts the outcomes of items (whose states are state) into r, with what the operator must
// know of them (errors, items left as the batch made them, their
// pre-images), and returns the first failed item (-1 when none failed)
// and how many items were rolled back.
func tally(r *Result, items []ItemResult, state []itemState, allOrNothing bool) (firstFailure, rolledBack int) {
	firstFailure = -1
	for i, it := range items {
		switch it.Outcome {
		case Succeeded:
			r.Succeeded++
		case RolledBack:
			rolledBack++
		case RollbackFailed, Unknown:
			if allOrNothing {
				r.LeftBehind = append(r.LeftBehind, it.describeLeft())
			}
		}
		if it.cause != nil {
			r.Errors = append(r.Errors, fmt.Sprintf("%s: %v", it.describe(), it.cause))
		}
		if c := it.Compensation; c != nil && c.cause != nil {
			r.Errors = append(r.Errors, fmt.Sprintf("undoing %s: %v", it.describe(), c.cause))
		}
		if it.Outcome == RollbackFailed && state[i].preimage != nil {
			r.Preimages = append(r.Preimages, Preimage{Item: it.describe(), Body: state[i].preimage})
		}
		if state[i].failure {
			r.Failed++
			if firstFailure < 0 {
				firstFailure = i
			}
		}
	}
	return firstFailure, rolledBack
}

// cause says in a clause why the batch failed.
func (run *batchRun) cause(firstFailure int, clientCtx, batchCtx context.Context) string {
	switch {
	case firstFailure >= 0:
		it := &run.items[firstFailure]
		if is2xx(it.Status) && it.Error != "" {
			// The upstream did what was asked; the gateway could not keep it.
			return fmt.Sprintf("%s was answered %d, but %s", it.describe(), it.Status, it.Error)
		}
		if it.Error != "" {
			return fmt.Sprintf("%s failed with %d (%s)", it.describe(), it.Status, it.Error)
		}
		return fmt.Sprintf("%s failed with %d", it.describe(), it.Status)
	case clientCtx.Err() != nil:
		return "the client went away before every item was sent"
	case batchCtx.Err() != nil:
		return fmt.Sprintf("the batch did not finish within batch_timeout (%s)", run.batchSettings.BatchTimeout)
	}
	return "the batch did not finish"
}

// failureStatus is the status of a failed all-or-nothing batch: the first
// failing item's, mapped; 504 if the batch ran out of time first, and
// 499 (Caddy's code for a client that closed the request) if the client
// left first.
func (run *batchRun) failureStatus(firstFailure int, batchCtx context.Context) int {
	switch {
	case firstFailure >= 0 && run.state[firstFailure].byGateway:
		return run.items[firstFailure].Status // the gateway's own 503, never the upstream's 502
	case firstFailure >= 0:
		return batchStatus(run.items[firstFailure].Status)
	case errors.Is(batchCtx.Err(), context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return 499
}

// describeLeft names an item a rollback left behind, and why.
func (it *ItemResult) describeLeft() string {
	reason := it.LeftReason()
	if reason == "" {
		return it.describe()
	}
	return it.describe() + ": " + reason
}

// LeftItem is one entry of a result's LeftBehind told apart: the item it
// names and why. Index is -1 for an entry no item of the result wrote
// (another instance's words, when this gateway lost the saga's lease and
// that instance ended it).
type LeftItem struct {
	Index           int
	ID, OperationID string
	Reason          string
}

// LeftItems is the first max entries of r.LeftBehind, each with the item
// it names. LeftBehind is what the answer and the log line list, so
// whatever else reports the items left behind reads them from here, not
// from the items' outcomes: a saga that lost its lease leaves its
// unknown items behind too.
func (r *Result) LeftItems(max int) []LeftItem {
	n := min(max, len(r.LeftBehind))
	if n <= 0 {
		return nil
	}
	named := make(map[string]*ItemResult, len(r.Items))
	for i := range r.Items {
		named[r.Items[i].describe()] = &r.Items[i]
	}
	out := make([]LeftItem, n)
	for k, entry := range r.LeftBehind[:n] {
		out[k] = LeftItem{Index: -1, Reason: entry}
		if it, reason := leftNamed(named, entry); it != nil {
			out[k] = LeftItem{Index: it.Index, ID: it.ID, OperationID: it.OperationID, Reason: reason}
		}
	}
	return out
}

// leftNamed finds the item whose description (describeLeft) begins entry,
// and the reason that follows it. A description can hold ": " itself
// (an operation's quoted id, its URL), so each place it occurs is tried.
func leftNamed(named map[string]*ItemResult, entry string) (*ItemResult, string) {
	if it := named[entry]; it != nil {
		return it, ""
	}
	for at := 0; ; {
		i := strings.Index(entry[at:], ": ")
		if i < 0 {
			return nil, ""
		}
		at += i
		if it := named[entry[:at]]; it != nil {
			return it, entry[at+2:]
		}
		at += 2
	}
}

// LeftReason is why a rollback left the item behind: its undo's error,
// else its own; it quotes what the legacy API answered, never a body.
func (it *ItemResult) LeftReason() string {
	if c := it.Compensation; c != nil && c.Error != "" {
		return c.Error
	}
	return it.Error
}
