package caddymodule

import "github.com/caddy-batch/caddy-batch/policy"

// jobLookup finds the resource of a job's path as a job's window runs
// it: its settings with job_concurrency and job_throttle_wait in place
// of concurrency and max_throttle_wait (policy.Match.ForJob).
func (h *Handler) jobLookup(escapedPath string) (policy.Match, bool) {
	m, ok := h.policy.Lookup(escapedPath)
	if !ok {
		return m, false
	}
	return m.ForJob(), true
}
