package caddymodule

import (
	"fmt"
	"strings"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

// jobsPathOf checks the handler's jobs path and answers it without a
// trailing slash: a plain path that neither it nor a job's monitor
// (<jobs>/<id>, <jobs>/<id>/results) shares with a resource or the
// envelope, so that a monitor's request never reaches the legacy API.
func (h *Handler) jobsPathOf(p *policy.Policy, envelope *batch.Envelope) (string, error) {
	path := h.Jobs
	if path == "" {
		return "", nil
	}
	refuse := func(format string, args ...any) (string, error) {
		return "", policy.OptionError("jobs", fmt.Errorf(format, args...))
	}
	if !strings.HasPrefix(path, "/") || path == "/" || strings.ContainsAny(path, "?#{}") {
		return refuse("jobs %q must be a plain path other than /, such as jobs /api/jobs", path)
	}
	path = strings.TrimSuffix(path, "/")
	for _, probe := range []string{path, path + "/x", path + "/x/results"} {
		if m, ok := p.Lookup(probe); ok {
			return refuse("jobs %s: %s is a path of the resource %s: give the jobs a path no resource template matches, such as %s",
				path, probe, m.Resource.Collection, jobsExample(path))
		}
	}
	if envelope != nil && envelope.Path == path {
		return refuse("jobs %s is the envelope's path: give the jobs a path of their own, such as %s", path, jobsExample(path))
	}
	return path, nil
}

// jobsExample is a jobs path beside path, for the errors that refuse it.
func jobsExample(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		return path[:i] + "/jobs"
	}
	return "/jobs"
}
