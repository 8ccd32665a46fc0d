package durable

import "github.com/caddy-batch/caddy-batch/batch"

// JobHooks are what a Jobs tells its caller of the jobs this process
// runs, for the caller's metrics and events: durable keeps no metrics
// library and knows no Caddy. A nil hook is not called. Each is called
// on the goroutine that runs the job, so it must not block.
type JobHooks struct {
	// Finished hears of the items a window of a job finished, as the
	// job's progress tallies them: once per item and per process that
	// ran it. A window carried on from an earlier owner's results is
	// not heard of again here: that owner's process heard of it.
	Finished func(items []batch.ItemResult)
	// Ended hears of a job this process ended, with its final status
	// (never its token), once the end is stored: once per job.
	Ended func(*JobStatus)
}

// WithHooks makes js tell h of the jobs it runs and ends, and answers js.
// Set it before js runs any job.
func (js *Jobs) WithHooks(h JobHooks) *Jobs {
	js.hooks = h
	return js
}

func (h JobHooks) finished(items []batch.ItemResult) {
	if h.Finished != nil && len(items) > 0 {
		h.Finished(items)
	}
}

func (h JobHooks) ended(st *JobStatus) {
	if h.Ended != nil {
		h.Ended(st)
	}
}
