package batchapp

import (
	"context"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
)

// Operating bulk jobs (docs/jobs.md, "Operations"): the app keeps the
// config's jobs for the admin API, and counts them for the jobs gauge.

// JobHooks are what every durable.Jobs of the process tells of the jobs
// it runs: the items its windows finish (caddy_http_batch_job_items_total)
// and each job's end (the batch.job.finished event).
func JobHooks() durable.JobHooks {
	return durable.JobHooks{Finished: telemetry.Metrics.JobItemsFinished, Ended: EmitJobFinished}
}

// countJobs sets the jobs gauge from the storage: every instance of a
// cluster reports the shared count.
func (a *App) countJobs(ctx context.Context) {
	counts, err := a.jobs.CountJobs(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.logger.Warn("counting the bulk jobs in storage", zap.Error(err))
		}
		return
	}
	for state, n := range counts {
		telemetry.Metrics.Jobs.WithLabelValues(state).Set(float64(n))
	}
}
