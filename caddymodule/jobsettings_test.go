package caddymodule

import (
	"encoding/json"
	"testing"
	"time"
)

// TestJobOptionsReachTheWindow: a job's window runs its resource with
// job_concurrency (its concurrency where unset) and job_throttle_wait
// (1m where unset; 0 included) in place of concurrency and
// max_throttle_wait, each inherited and overridden as every resource
// option; a batch still runs with its own.
func TestJobOptionsReachTheWindow(t *testing.T) {
	t.Parallel()
	var h Handler
	raw := `{"concurrency": 6, "max_throttle_wait": "1s", "resources": [
		{"path": "/default", "collection": ["GET"], "item": ["GET"]},
		{"path": "/own", "collection": ["GET"], "item": ["GET"], "concurrency": 3, "job_concurrency": 2, "job_throttle_wait": 0},
		{"path": "/inherit", "collection": ["GET"], "item": ["GET"], "concurrency": 5}]}`
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	cfg, err := h.resolve(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	jh := &Handler{config: cfg}
	for path, want := range map[string]struct {
		concurrency, jobConcurrency int
		jobWait                     time.Duration
	}{
		"/default": {6, 6, time.Minute},
		"/own":     {3, 2, 0},
		"/inherit": {5, 5, time.Minute},
	} {
		batch, _ := cfg.policy.Lookup(path)
		job, ok := jh.jobLookup(path)
		if !ok {
			t.Fatalf("%s: not found", path)
		}
		if s := batch.Resource.Settings; s.Concurrency != want.concurrency || s.MaxThrottleWait != time.Second {
			t.Errorf("%s: a batch runs with concurrency %d, max_throttle_wait %s, want %d and 1s", path, s.Concurrency, s.MaxThrottleWait, want.concurrency)
		}
		if s := job.Resource.Settings; s.Concurrency != want.jobConcurrency || s.MaxThrottleWait != want.jobWait {
			t.Errorf("%s: a job's window runs with concurrency %d, max_throttle_wait %s, want %d and %s", path, s.Concurrency, s.MaxThrottleWait, want.jobConcurrency, want.jobWait)
		}
	}
	for _, bad := range []string{`{"job_concurrency": -1}`, `{"job_throttle_wait": "-1s"}`} {
		var h Handler
		if err := json.Unmarshal([]byte(bad), &h); err != nil {
			t.Fatal(err)
		}
		if _, err := h.resolve(nil, true); err == nil {
			t.Errorf("%s was taken, want refused", bad)
		}
	}
}
