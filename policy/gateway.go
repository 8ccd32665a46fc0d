package policy

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"golang.org/x/net/http/httpguts"
)

// GatewaySettings are a resource's settings that only the gateway reads,
// resolved as Settings are: where its items' locks live, the bound on
// sub-requests in flight, how long a keyed batch's answer is kept, and
// whether a saga keeps a journal. The engine (package batch) never sees
// them.
type GatewaySettings struct {
	ItemLocks   ItemLocks
	MaxInFlight int
	// AutoInFlight makes the bound on sub-requests in flight follow the
	// upstream, between MinInFlight and MaxInFlight.
	AutoInFlight bool
	MinInFlight  int
	// IdempotencyTTL is how long the answer of a batch write that
	// carried an Idempotency-Key is kept for replay.
	IdempotencyTTL time.Duration
	// Journal says an all-or-nothing write batch keeps its saga in
	// storage, so that another process can finish it if this one dies.
	Journal bool
	// ScopeHeaders names the headers that, beside Authorization and
	// Cookie, say who a client is (an API keyed by X-API-Key): its
	// Idempotency-Key records and throttle holds are its own.
	ScopeHeaders []string
	// MaxJobItems and MaxJobBodySize bound what a bulk job is given;
	// MaxAtomicJobItems, what an all-or-nothing one is.
	MaxJobItems       int
	MaxAtomicJobItems int
	MaxJobBodySize    int64
	// MaxJobs, MaxJobsPerClient and MaxQueuedJobs are the jobs this
	// instance runs at once, one client may have, and may wait.
	MaxJobs          int
	MaxJobsPerClient int
	MaxQueuedJobs    int
	// JobTTL is how long an ended job is kept; JobTimeout how long a job
	// may take from its start.
	JobTTL     time.Duration
	JobTimeout time.Duration
}

// GatewayDefaults returns the gateway's settings README's
// "Configuration" gives for an option that is not configured.
func GatewayDefaults() GatewaySettings {
	return GatewaySettings{
		ItemLocks: LocalLocks,
		// max_in_flight auto is the default since bulk jobs (README's
		// "Configuration"): a job's steady load is where a fixed bound
		// slows the API's other clients most, and the limit gives way to
		// them at almost a fixed bound's throughput.
		AutoInFlight:   true,
		MinInFlight:    AutoInFlightMin,
		MaxInFlight:    AutoInFlightMax,
		IdempotencyTTL: 24 * time.Hour,
		Journal:        true,

		MaxJobItems:       100000,
		MaxAtomicJobItems: 5000,
		MaxJobBodySize:    64 << 20,
		MaxJobs:           4,
		MaxJobsPerClient:  2,
		MaxQueuedJobs:     16,
		JobTTL:            24 * time.Hour,
		JobTimeout:        6 * time.Hour,
	}
}

// The bounds of max_in_flight auto when none are given: 32 is the size
// of reverse_proxy's pool of kept-alive connections.
const (
	AutoInFlightMin = 4
	AutoInFlightMax = 32
)

// checkScopeHeaders refuses a scope_headers name that is not a header
// name, one named twice, and Authorization or Cookie, which always say
// who a client is.
func (g GatewaySettings) checkScopeHeaders() error {
	var errs []error
	for i, name := range g.ScopeHeaders {
		canonical := http.CanonicalHeaderKey(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			errs = append(errs, OptionError("scope_headers", fmt.Errorf("scope_headers names %q, which is not a header name: name each header that identifies a client, e.g. scope_headers X-API-Key", name)))
		case canonical == "Authorization" || canonical == "Cookie":
			errs = append(errs, OptionError("scope_headers", fmt.Errorf("scope_headers names %s, which always identifies a client: remove it from scope_headers", name)))
		case slices.ContainsFunc(g.ScopeHeaders[:i], func(n string) bool { return http.CanonicalHeaderKey(n) == canonical }):
			errs = append(errs, OptionError("scope_headers", fmt.Errorf("scope_headers names %q twice: keep one", name)))
		}
	}
	return errors.Join(errs...)
}

// checkAutoInFlight refuses bounds of max_in_flight auto that cannot
// work.
func (g GatewaySettings) checkAutoInFlight() error {
	if !g.AutoInFlight {
		return nil
	}
	if g.MinInFlight < 1 || g.MinInFlight > g.MaxInFlight {
		return OptionError("max_in_flight", fmt.Errorf("max_in_flight auto %d %d: the least must be at least 1 and at most the most, e.g. max_in_flight auto %d %d",
			g.MinInFlight, g.MaxInFlight, AutoInFlightMin, AutoInFlightMax))
	}
	return nil
}

// ItemLocks says where the locks a saga takes on its items live.
type ItemLocks uint8

const (
	// LocalLocks lock items within one Caddy process.
	LocalLocks ItemLocks = iota
	// StorageLocks lock items through Caddy's storage, across instances.
	StorageLocks
)

// String returns the configuration name.
func (l ItemLocks) String() string {
	if l == StorageLocks {
		return "storage"
	}
	return "local"
}

// ParseItemLocks parses item_locks: local or storage.
func ParseItemLocks(s string) (ItemLocks, error) {
	switch s {
	case "local":
		return LocalLocks, nil
	case "storage":
		return StorageLocks, nil
	}
	return 0, unknown("item_locks", s, []string{"local", "storage"})
}

// checkJobs refuses job limits that would refuse every job, or start
// ones that cannot end: a job's body smaller than one element may be, a
// job_timeout no longer than one sub-request may take.
func (g GatewaySettings) checkJobs(s Settings) error {
	var errs []error
	if g.MaxJobBodySize > 0 && g.MaxJobBodySize < s.MaxBodySize {
		errs = append(errs, OptionError("max_job_body_size", fmt.Errorf(
			"max_job_body_size (%d bytes) is below max_body_size (%d bytes), which bounds one element of a job: raise max_job_body_size, e.g. max_job_body_size 64MiB",
			g.MaxJobBodySize, s.MaxBodySize)))
	}
	if g.JobTimeout > 0 && g.JobTimeout <= s.ItemTimeout {
		errs = append(errs, OptionError("job_timeout", fmt.Errorf(
			"job_timeout (%s) must be longer than item_timeout (%s), which one of its sub-requests may take: raise job_timeout, e.g. job_timeout 6h",
			g.JobTimeout, s.ItemTimeout)))
	}
	return errors.Join(errs...)
}
