package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Op is one of the four batch operations.
type Op uint8

// The batch operations, in the order the configuration lists them.
const (
	OpGet Op = iota
	OpCreate
	OpUpdate
	OpDelete
	opCount
)

// OpEnvelope is a batch across resources, an envelope of single-item
// operations: not an operation a resource turns on, but the name such a
// batch is journaled, counted and logged under.
const OpEnvelope = opCount

var opNames = [opCount]string{"get", "create", "update", "delete"}

// String returns the operation's configuration name: get, create, update
// or delete.
func (o Op) String() string {
	switch {
	case o < opCount:
		return opNames[o]
	case o == OpEnvelope:
		return "envelope"
	}
	return fmt.Sprintf("Op(%d)", o)
}

// ParseOp parses an operation's configuration name.
func ParseOp(s string) (Op, error) {
	for i, n := range opNames {
		if n == s {
			return Op(i), nil
		}
	}
	if s == "list" {
		return 0, fmt.Errorf("unknown batch operation %q (want %s): a list (GET on the collection without ids) always passes through, so it needs no batch operation", s, orList(opNames[:]))
	}
	return 0, unknown("batch operation", s, opNames[:])
}

// Writes reports whether the operation changes the upstream's state, and
// so carries an Idempotency-Key and may need undoing.
//
// OpEnvelope names no one operation: whether an envelope writes depends
// on its operations, which the engine looks at; it indexes no per-operation
// setting.
func (o Op) Writes() bool { return o != OpGet }

// Atomicity says what a batch promises when one of its items fails.
type Atomicity uint8

const (
	// AllOrNothing undoes what a failed batch already did.
	AllOrNothing Atomicity = iota
	// Partial lets every item stand on its own.
	Partial
)

// String returns the configuration and wire name of the mode.
func (a Atomicity) String() string {
	if a == Partial {
		return "partial"
	}
	return "all_or_nothing"
}

// ParseAtomicity parses all_or_nothing or partial.
func ParseAtomicity(s string) (Atomicity, error) {
	switch s {
	case "all_or_nothing":
		return AllOrNothing, nil
	case "partial":
		return Partial, nil
	}
	return 0, unknown("atomicity", s, []string{"all_or_nothing", "partial"})
}

// DeleteSemantics says what a DELETE of a missing item means.
type DeleteSemantics uint8

const (
	// Imperative: "delete it"; a missing item is a 404 failure.
	Imperative DeleteSemantics = iota
	// Declarative: "it must not exist"; a missing item already satisfies it.
	Declarative
)

// ParseDeleteSemantics parses imperative or declarative.
func ParseDeleteSemantics(s string) (DeleteSemantics, error) {
	switch s {
	case "imperative":
		return Imperative, nil
	case "declarative":
		return Declarative, nil
	}
	return 0, unknown("delete_semantics", s, []string{"imperative", "declarative"})
}

// Restore says which request puts a pre-image back during compensation.
type Restore uint8

const (
	// RestorePut sends PUT <item path> with the pre-image.
	RestorePut Restore = iota
	// RestorePatch sends PATCH <item path> with the changed fields' old values.
	RestorePatch
	// RestorePost sends POST <collection> with the pre-image, id included,
	// for APIs whose PUT cannot create.
	RestorePost
)

// String returns the configuration name.
func (r Restore) String() string {
	switch r {
	case RestorePatch:
		return "patch"
	case RestorePost:
		return "post"
	}
	return "put"
}

// ParseRestoreDeleted parses restore_deleted: put or post.
func ParseRestoreDeleted(s string) (Restore, error) {
	switch s {
	case "put":
		return RestorePut, nil
	case "post":
		return RestorePost, nil
	}
	return 0, unknown("restore_deleted", s, []string{"put", "post"})
}

// ParseRestoreUpdated parses restore_updated: put or patch.
func ParseRestoreUpdated(s string) (Restore, error) {
	switch s {
	case "put":
		return RestorePut, nil
	case "patch":
		return RestorePatch, nil
	}
	return 0, unknown("restore_updated", s, []string{"put", "patch"})
}

// Settings are the tunables of batch handling that the engine (package
// batch) reads, resolved for one resource: the handler's values over the
// defaults, the resource's over those. What only the gateway reads is in
// GatewaySettings.
type Settings struct {
	Atomicity           [opCount]Atomicity
	AllowOverride       bool
	MaxItems            int
	MaxBodySize         int64
	Concurrency         int
	ItemTimeout         time.Duration
	BatchTimeout        time.Duration
	IDsParam            string
	IDField             string
	DeleteSemantics     DeleteSemantics
	RestoreDeleted      Restore
	RestoreUpdated      Restore
	CompensationRetries int
	CompensationTimeout time.Duration
	// IdempotentUpstream says the upstream honours Idempotency-Key, so a
	// write whose outcome is unknown may be sent again with the same key
	// to learn it.
	IdempotentUpstream bool
	// ConditionalWrites says the upstream enforces If-Match and
	// If-None-Match on writes, so an undo's condition may stand in for
	// the read that proves the item is as the batch left it. Many
	// upstreams put strong ETags on reads and ignore the conditions on
	// writes, so without it every undo is proved by a read.
	ConditionalWrites bool
	MaxResponseSize   int64
	// ScopeQuery names the query parameters that scope or authenticate a
	// request (a tenant, an API key): the only ones an all-or-nothing
	// write batch carries onto its sub-requests. Any other parameter may
	// shape the representation, and a saga that read a shaped item would
	// put back only what it read (docs/configuration.md, "scope_query").
	ScopeQuery []string
	// IDFormat says what the upstream's ids are, so that two spellings
	// of one id name one item.
	IDFormat IDFormat
	// StampedFields names the members the upstream stamps on every save
	// (updated_at): every comparison an undo's proof makes leaves them
	// out, since a read after a write the upstream stamped differs from
	// any image the gateway holds in them alone (docs/configuration.md,
	// "stamped_fields").
	StampedFields []string
	// MaxThrottleWait is the longest delay a throttling answer (429, or
	// 503 with Retry-After) may ask for and still be waited out and sent
	// again; 0 waits out none (docs/security.md, "Throttling").
	MaxThrottleWait time.Duration
	// JobConcurrency bounds the sub-requests of one bulk job in flight at
	// once, as Concurrency bounds a batch's; 0 is Concurrency
	// (ForJob).
	JobConcurrency int
	// JobThrottleWait is MaxThrottleWait for a bulk job's sub-requests:
	// a job has no client waiting on it, so it slows down with the API
	// for longer instead of failing the items.
	JobThrottleWait time.Duration
}

// Defaults returns the settings README's "Configuration" gives for an
// option that is not configured.
func Defaults() Settings {
	return Settings{
		MaxItems:            100,
		MaxBodySize:         1 << 20,
		Concurrency:         8,
		ItemTimeout:         10 * time.Second,
		BatchTimeout:        30 * time.Second,
		IDsParam:            "ids",
		IDField:             "id",
		DeleteSemantics:     Imperative,
		RestoreDeleted:      RestorePut,
		RestoreUpdated:      RestorePut,
		CompensationRetries: 3,
		CompensationTimeout: 30 * time.Second,
		MaxResponseSize:     16 << 20,
		MaxThrottleWait:     5 * time.Second,
		JobThrottleWait:     time.Minute,
	}
}

// SetAtomicity sets the mode of every operation.
func (s *Settings) SetAtomicity(a Atomicity) {
	for i := range s.Atomicity {
		s.Atomicity[i] = a
	}
}

// limit is an option that must be greater than zero.
type limit struct {
	option string
	value  int64
	kind   limitKind
}

type limitKind uint8

const (
	countLimit limitKind = iota
	sizeLimit
	durationLimit
)

// limits returns the limits of s and g, in the order the configuration
// lists them.
func limits(s Settings, g GatewaySettings) []limit {
	return []limit{
		{"max_items", int64(s.MaxItems), countLimit},
		{"max_body_size", s.MaxBodySize, sizeLimit},
		{"max_response_size", s.MaxResponseSize, sizeLimit},
		{"concurrency", int64(s.Concurrency), countLimit},
		{"job_concurrency", int64(s.jobConcurrency()), countLimit},
		{"max_in_flight", int64(g.MaxInFlight), countLimit},
		{"item_timeout", int64(s.ItemTimeout), durationLimit},
		{"batch_timeout", int64(s.BatchTimeout), durationLimit},
		{"compensation_timeout", int64(s.CompensationTimeout), durationLimit},
		{"idempotency_ttl", int64(g.IdempotencyTTL), durationLimit},
		{"max_job_items", int64(g.MaxJobItems), countLimit},
		{"max_atomic_job_items", int64(g.MaxAtomicJobItems), countLimit},
		{"max_job_body_size", g.MaxJobBodySize, sizeLimit},
		{"max_jobs", int64(g.MaxJobs), countLimit},
		{"max_jobs_per_client", int64(g.MaxJobsPerClient), countLimit},
		{"max_queued_jobs", int64(g.MaxQueuedJobs), countLimit},
		{"job_ttl", int64(g.JobTTL), durationLimit},
		{"job_timeout", int64(g.JobTimeout), durationLimit},
	}
}

// format writes v as an operator would write it for this limit.
func (k limitKind) format(v int64) string {
	switch {
	case k == durationLimit:
		return time.Duration(v).String()
	case k == sizeLimit && v > 0 && v%(1<<20) == 0:
		return strconv.FormatInt(v>>20, 10) + "MiB"
	case k == sizeLimit && v > 0 && v%(1<<10) == 0:
		return strconv.FormatInt(v>>10, 10) + "KiB"
	}
	return strconv.FormatInt(v, 10)
}

// CheckLimit refuses a value of a limit (max_items, max_body_size,
// item_timeout…; a durationLimit in nanoseconds) that is zero or negative.
// A configuration format that cannot carry a zero (in JSON it means "the
// default") calls it while it still has the value.
func CheckLimit(option string, value int64) error {
	if value > 0 {
		return nil
	}
	for _, def := range limits(Defaults(), GatewayDefaults()) {
		if def.option == option {
			return OptionError(option, fmt.Errorf("%s must be greater than zero, not %s: set a positive value, or leave it out for the default, %s",
				option, def.kind.format(value), def.kind.format(def.value)))
		}
	}
	return nil
}

// checkName refuses an empty ids_param or id_field.
func checkName(option, value string) error {
	if value != "" {
		return nil
	}
	def := map[string]string{"ids_param": "ids", "id_field": "id"}[option]
	return OptionError(option, fmt.Errorf("%s must not be empty: give it a name, or leave it out for the default, %s", option, def))
}

// Validate refuses a resource's settings that cannot work; each error is
// an *Error that names the option.
func Validate(s Settings, g GatewaySettings) error {
	var errs []error
	for _, l := range limits(s, g) {
		if l.option == "job_concurrency" && s.JobConcurrency == 0 {
			continue // concurrency's, which its own limit checks
		}
		errs = append(errs, CheckLimit(l.option, l.value))
	}
	errs = append(errs, checkName("ids_param", s.IDsParam), checkName("id_field", s.IDField))
	if s.CompensationRetries < 0 {
		errs = append(errs, OptionError("compensation_retries",
			fmt.Errorf("compensation_retries must be 0 or more, not %d: 0 sends an undo once, with no retry", s.CompensationRetries)))
	}
	if s.JobThrottleWait < 0 {
		errs = append(errs, OptionError("job_throttle_wait",
			fmt.Errorf("job_throttle_wait must be 0 or more, not %s: 0 fails a job's throttled item at once", s.JobThrottleWait)))
	}
	if s.MaxThrottleWait < 0 {
		errs = append(errs, OptionError("max_throttle_wait",
			fmt.Errorf("max_throttle_wait must be 0 or more, not %s: 0 fails a throttled item at once, as a gateway that does not wait", s.MaxThrottleWait)))
	}
	if s.IDsParam == MethodParam {
		errs = append(errs, OptionError("ids_param",
			fmt.Errorf("ids_param must not be %q: the gateway reads that parameter as a method override; choose another name, e.g. ids", s.IDsParam)))
	}
	errs = append(errs, s.checkScopeQuery(), s.checkStampedFields(), g.checkAutoInFlight(), g.checkScopeHeaders(), g.checkJobs(s))
	return errors.Join(errs...)
}

// checkScopeQuery refuses a scope_query name that no query can use: the
// gateway takes the ids parameter and _method out of every batch's query
// itself, so naming them would promise a parameter that is never sent.
func (s Settings) checkScopeQuery() error {
	return checkNames("scope_query", s.ScopeQuery, "query parameter that scopes a request, e.g. scope_query tenant api_key",
		reserved{s.IDsParam, ", the ids parameter (ids_param): the gateway takes the ids out of the query and sends each item's id in its path"},
		reserved{MethodParam, ": the gateway reads that parameter as a method override and never passes it on"})
}

// checkStampedFields refuses a stamped_fields name that is the id field:
// an item's id is what every proof reads it by, and left out of a
// comparison it would let a read of another item pass.
func (s Settings) checkStampedFields() error {
	return checkNames("stamped_fields", s.StampedFields, "member the legacy API stamps on every save, e.g. stamped_fields updated_at",
		reserved{s.IDField, ", the id field (id_field): the id is what proves a read is of the item"})
}

// reserved is a name a list option may not hold, and why, as the error
// goes on after the name.
type reserved struct{ name, why string }

// checkNames refuses, in the list of names an option holds, an empty
// one (each says what to name instead), a reserved one, and one named
// twice.
func checkNames(option string, names []string, each string, taken ...reserved) error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, OptionError(option, fmt.Errorf(format, args...)))
	}
	for i, name := range names {
		k := slices.IndexFunc(taken, func(r reserved) bool { return r.name == name })
		switch {
		case name == "":
			fail("%s holds an empty name: name each %s", option, each)
		case k >= 0:
			fail("%s must not name %q%s; remove it from %s", option, name, taken[k].why, option)
		case slices.Contains(names[:i], name):
			fail("%s names %q twice: keep one", option, name)
		}
	}
	return errors.Join(errs...)
}

// jobConcurrency is JobConcurrency, or Concurrency where it is not set.
func (s *Settings) jobConcurrency() int {
	if s.JobConcurrency == 0 {
		return s.Concurrency
	}
	return s.JobConcurrency
}

// ForJob is m for a bulk job's window: its resource's settings with a
// job's bounds in place of a batch's, job_concurrency for concurrency
// and job_throttle_wait for max_throttle_wait, so that the engine runs a
// job's items as it runs a batch's and reads no job setting itself.
func (m Match) ForJob() Match {
	if m.Resource == nil {
		return m
	}
	r := *m.Resource
	r.Settings = r.Settings.ForJob()
	m.Resource = &r
	return m
}

// ForJob is s as a job's requests run under it: job_concurrency and
// job_throttle_wait in place of concurrency and max_throttle_wait.
func (s Settings) ForJob() Settings {
	s.Concurrency = s.jobConcurrency()
	s.MaxThrottleWait = s.JobThrottleWait
	return s
}
