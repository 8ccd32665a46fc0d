package batchapp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
)

// Operating the sagas (docs/operations.md, "Sagas left behind"): what the admin API's
// retry and resolve do, through the running config's batch app, whose
// servers a retry's requests go through as a recovery's do.

// operated is the batch app of the running config, if it has batch
// handlers: a config reload starts the new one before it stops the old.
var operated atomic.Pointer[App]

// Journals are the saga journals in the config's storage.
func (a *App) Journals() *durable.Journals { return a.journals }

// errCannotRun is a retry that the current config cannot run: no batch
// handler serves the saga, or its items are locked.
var errCannotRun = errors.New("the saga cannot be retried under the current config")

// countSagas sets the sagas gauge from the storage: every instance of a
// cluster reports the shared count.
func (a *App) countSagas(ctx context.Context) {
	counts, err := a.journals.CountSagas(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.logger.Warn("counting the sagas in storage", zap.Error(err))
		}
		return
	}
	for state, n := range counts {
		telemetry.Metrics.Sagas.WithLabelValues(state).Set(float64(n))
	}
}

// retrySaga undoes again, now, what saga left behind, under the current
// config, with header added to its requests, and answers the saga as
// it then is: resolved (and gone), or left behind with the new reasons.
func (a *App) retrySaga(ctx context.Context, saga string, header http.Header, caller string) (*durable.SagaView, error) {
	before, err := a.journals.Saga(ctx, saga)
	if err != nil {
		return nil, err
	}
	rv, err := a.journals.Revive(ctx, saga, header)
	if err != nil {
		return nil, err
	}
	res, err := a.finishThrough(rv.Origin, Job{Snap: rv.Snapshot, Journal: rv.Journal, Prev: rv.Prev, Retry: true})
	if err != nil {
		rv.GiveUp(context.WithoutCancel(ctx), err.Error())
		return nil, fmt.Errorf("%w: %v", errCannotRun, err)
	}
	defer a.countSagas(context.WithoutCancel(ctx))
	a.logAction("retry", saga, caller, res.LeftBehind, zap.String("outcome", string(res.Outcome)), zap.Int("compensations", res.Compensations))
	if res.Outcome == batch.RollbackFailed {
		EmitLeftBehind(LeftBehind{Saga: saga, Source: "retry", Server: before.Server, Resource: before.Resource, Op: before.Op, Result: res})
		return a.journals.Saga(ctx, saga)
	}
	emitResolved(saga, "retry", before.Server, before.Resource, before.Op, "", len(before.LeftBehind))
	return resolvedView(before, res), nil
}

// resolvedView is a saga as it was before a retry that undid the rest.
func resolvedView(v *durable.SagaView, res *batch.Result) *durable.SagaView {
	ended := time.Now()
	v.State, v.Reason, v.LeftBehind, v.Ended = durable.StateResolved, "", []string{}, &ended
	for i := range v.Items {
		if i < len(res.Items) {
			v.Items[i].Outcome, v.Items[i].Compensation = res.Items[i].Outcome, res.Items[i].Compensation
		}
		v.Items[i].Reason = ""
	}
	return v
}

// resolveSaga removes a saga that the operator repaired by hand, and
// writes the audit line: the saga, its items' ids and why they were
// left, the caller and the operator's reason; never a pre-image or body.
func (a *App) resolveSaga(ctx context.Context, saga, reason, caller string) (*durable.SagaView, error) {
	v, err := a.journals.Resolve(ctx, saga)
	if err != nil {
		return nil, err
	}
	defer a.countSagas(context.WithoutCancel(ctx))
	why := v.LeftBehind
	if len(why) == 0 && v.Reason != "" {
		why = []string{v.Reason}
	}
	a.logAction("resolve", saga, caller, why, zap.Strings("items", v.ItemIDs()), zap.String("was", v.State), zap.String("reason", reason))
	emitResolved(saga, "operator", v.Server, v.Resource, v.Op, reason, len(v.LeftBehind))
	ended := time.Now()
	v.State, v.Ended = durable.StateResolved, &ended
	return v, nil
}

// logAction writes the line of an operator's action: WARN, since it
// changes what the gateway promised (a resolve closes a saga by hand; a
// retry that leaves items still leaves them), INFO for a retry that
// finished the saga.
func (a *App) logAction(action, saga, caller string, leftBehind []string, more ...zap.Field) {
	level := zapcore.WarnLevel
	if action == "retry" && len(leftBehind) == 0 {
		level = zapcore.InfoLevel
	}
	ce := a.logger.Check(level, "saga "+action+" by an operator")
	if ce == nil {
		return
	}
	ce.Write(append([]zap.Field{zap.String("saga", saga), zap.String("caller", caller), zap.Strings("left_behind", leftBehind)}, more...)...)
}
