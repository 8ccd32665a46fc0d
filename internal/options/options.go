// Package options is the batch handler's options: the Options fields
// (the JSON a handler or a resource is configured with, and its
// reference), one row of optionTable per option that drives its
// Caddyfile line, the "did you mean" suggestions and how it is laid over
// the settings, and the readers of the values a Caddyfile line gives.
// Adding an option is its field here, with its doc comment, and its row
// in optionTable; go generate ./... then writes the directive's syntax
// (README.md and caddymodule's UnmarshalCaddyfile) and the README's
// options table from them (package gen).
package options

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Options are the tunables of batch handling. Set on the handler, they
// apply to every resource; set on a resource, they override the
// handler's for that resource alone. An option left out (zero) inherits.
type Options struct {
	// What a batch promises when one of its items fails: `all_or_nothing`
	// undoes what the batch already did; `partial` lets every item stand
	// on its own. Default: all_or_nothing.
	Atomicity string `json:"atomicity,omitempty"`

	// The mode of single operations, keyed by `get`, `create`, `update` or
	// `delete` (e.g. `{"create": "partial"}`); it wins over `atomicity`.
	// Default: none.
	OperationAtomicity map[string]string `json:"operation_atomicity,omitempty"`

	// Whether a client may choose the atomicity of its batch with
	// `Prefer: atomicity=partial` or `atomicity=all-or-nothing`; the
	// answer then carries `Preference-Applied`. Default: false.
	AllowOverride *bool `json:"allow_override,omitempty"`

	// The most ids or elements one batch may hold; more is answered `413`.
	// Default: 100.
	MaxItems int `json:"max_items,omitempty"`

	// The largest batch body, in bytes; larger is answered `413`. It also
	// bounds each item's answer from the upstream kept for the response.
	// Default: 1MiB (1048576).
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// How many sub-requests of one batch may be in flight at once.
	// Default: 8.
	Concurrency int `json:"concurrency,omitempty"`

	// How long one sub-request may take before its item fails with `504`.
	// Default: 10s.
	ItemTimeout caddy.Duration `json:"item_timeout,omitempty"`

	// How long a whole batch may take, preflight and execution; the
	// compensations of a failed batch have their own timeout.
	// Default: 30s.
	BatchTimeout caddy.Duration `json:"batch_timeout,omitempty"`

	// The query parameter that carries the ids of a batch `GET` or
	// `DELETE`. Default: ids.
	IDsParam string `json:"ids_param,omitempty"`

	// The member of an element that holds its id (batch update), and of
	// an upstream answer that holds a created item's id when there is no
	// `Location` header. Default: id.
	IDField string `json:"id_field,omitempty"`

	// What a `DELETE` of a missing item means: `imperative` lets the
	// upstream's `404` stand (the item fails); `declarative` ("the item
	// must not exist") answers `204` for a single `DELETE` and counts a
	// batch item as succeeded. Default: imperative.
	DeleteSemantics string `json:"delete_semantics,omitempty"`

	// How a compensation re-creates an item a failed batch deleted: `put`
	// sends `PUT <item path>` with the pre-image; `post` sends
	// `POST <collection>` with the pre-image, id included, for APIs whose
	// `PUT` cannot create. Default: put.
	RestoreDeleted string `json:"restore_deleted,omitempty"`

	// How a compensation puts back an item a failed batch updated: `put`
	// sends the whole pre-image; `patch` sends the changed fields' old
	// values. Default: put.
	RestoreUpdated string `json:"restore_updated,omitempty"`

	// How many times a failed compensation is sent again (after 100ms,
	// 200ms, 400ms…, at most 2s apart). Default: 3.
	CompensationRetries *int `json:"compensation_retries,omitempty"`

	// How long one compensation attempt may take. Default: 30s.
	CompensationTimeout caddy.Duration `json:"compensation_timeout,omitempty"`

	// Whether the upstream honours `Idempotency-Key`: a write whose
	// outcome is unknown (sent, and no answer said what it did) is then
	// sent again with the same key to learn what it did, before it is
	// undone. Default: false.
	IdempotentUpstream *bool `json:"idempotent_upstream,omitempty"`

	// Whether the upstream enforces `If-Match` / `If-None-Match` on
	// writes: an undo's condition (a strong `ETag`, `If-None-Match: *`)
	// then replaces the read that proves the item is as the batch left
	// it. Without it every undo is proved by a read, and the conditions
	// are still sent: many frameworks put strong `ETag`s on `GET`s and
	// ignore `If-Match` on writes (Django's `ConditionalGetMiddleware`,
	// Spring's `ShallowEtagHeaderFilter`). Default: false.
	ConditionalWrites *bool `json:"conditional_writes,omitempty"`

	// The query parameters that scope or authenticate a request (a
	// tenant, an API key), e.g. `["tenant", "api_key"]`: the only ones an
	// all-or-nothing write batch accepts (a client query that holds any
	// other is refused with `400`: one that shapes the representation,
	// such as `fields`, would make it read a partial item and put back
	// only that), and it sends them on every request it makes. A batch
	// `GET` and a partial batch keep the whole query. The ids parameter
	// and `_method` cannot be named. A resource's list replaces the
	// handler's ([details](docs/configuration.md#scope_query)).
	// Default: none.
	ScopeQuery []string `json:"scope_query,omitempty"`

	// The headers that, beside `Authorization` and `Cookie`, say who a
	// client is, e.g. `["X-API-Key"]` for an API keyed by that header:
	// its `Idempotency-Key` records and the holds of an upstream that
	// throttled it are its own, and another client's key or throttle
	// never reaches it. Without it, clients that send neither
	// `Authorization` nor `Cookie` are one client to the gateway. A
	// resource's list replaces the handler's
	// ([details](docs/configuration.md#scope_headers)). Default: none.
	ScopeHeaders []string `json:"scope_headers,omitempty"`

	// What the upstream's ids are, so that two spellings of one item are
	// one item: under `integer`, `03`, `+3` and `3` are the id `3`
	// (leading zeros and sign dropped; the canonical text is what is
	// sent, locked, compared for duplicates and reported), and an id that
	// is not a decimal integer is refused; under `uuid`, ids are compared
	// and sent in lower case with hyphens, and one that is not a UUID is
	// refused; under `any` an id is its text, so `3` and `03` of an API
	// that reads both as item 3 are two items to the gateway: two writes
	// under two locks, which neither exclude each other nor count as a
	// duplicate ([details](docs/configuration.md#id_format)). Default: any.
	IDFormat string `json:"id_format,omitempty"`

	// The members the upstream stamps on every save, e.g. `["updated_at"]`
	// (Rails' timestamps, Django's `auto_now`): every comparison an undo's
	// proof makes (the read that learns what an unanswered write did,
	// the read before an undo, the write's answer it is compared with)
	// leaves them out, so that an update the upstream stamped can still
	// be proved the batch's and undone. They are still sent back with
	// the pre-image where an undo sends it. Not the id field, nor an
	// optimistic-lock counter such as `lock_version`, which an undo must
	// not send back stale. A resource's list replaces the handler's
	// ([details](docs/configuration.md#stamped_fields)). Default: none.
	StampedFields []string `json:"stamped_fields,omitempty"`

	// Where the locks an all-or-nothing batch takes on the items it
	// writes live: `local` within this Caddy process; `storage` in Caddy's
	// storage, shared by every instance of a
	// [cluster](docs/durability.md#clusters). Single-item writes through
	// the gateway take the same locks. Default: local.
	ItemLocks string `json:"item_locks,omitempty"`

	// The largest whole batch answer, in bytes, with the item bodies it
	// carries; items whose answers would pass it are left out, and the
	// batch fails. Default: 16MiB (16777216).
	MaxResponseSize int64 `json:"max_response_size,omitempty"`

	// How many sub-requests of all the batches of this handler may be in
	// flight at once; batches wait, in turn, for a free slot (the wait
	// counts against `batch_timeout`), and compensations go before every
	// batch that waits. It is the handler's alone: set in a resource, it
	// is refused. The slots are kept across config reloads that leave
	// this value and the resources' paths as they were. Size it with
	// `reverse_proxy`'s `keepalive_idle_conns_per_host` (32 by default),
	// so that batches reuse kept-alive connections
	// ([Sizing the limits](docs/security.md#sizing-the-limits)). A number
	// turns the default `max_in_flight auto` off. Default: none (the
	// bound is `max_in_flight auto`'s).
	MaxInFlight int `json:"max_in_flight,omitempty"`

	// Makes the handler's bound on sub-requests in flight follow the
	// legacy API instead of `max_in_flight`: it grows while sub-requests'
	// latency stays near the lowest recently seen, and shrinks when it
	// rises or the API throttles, between `min` (default `4`) and `max`
	// (default `32`), e.g. `{"min": 4, "max": 32}`
	// ([Sizing the limits](docs/security.md#sizing-the-limits)). It is the
	// handler's alone, kept across reloads as `max_in_flight` is, and
	// cannot be set with `max_in_flight`. It is the default because it
	// keeps single requests fast while batches and bulk jobs load the
	// API. Default: on
	// (between `4` and `32`), unless `max_in_flight` sets a number.
	MaxInFlightAuto *AutoInFlight `json:"max_in_flight_auto,omitempty"`

	// The longest pause a throttling answer of the legacy API (`429`, or
	// `503` with `Retry-After`) may ask for and still be waited out: the
	// sub-request is sent again after it, if the batch's deadline allows,
	// and the same client's other sub-requests to the resource wait with
	// it ([Throttling](docs/security.md#throttling)). A longer pause fails
	// the item at once with the API's status and `Retry-After`; `0` waits
	// out none. Default: 5s.
	MaxThrottleWait *caddy.Duration `json:"max_throttle_wait,omitempty"`

	// How long the answer of a batch write (create, update, delete) that
	// carried an `Idempotency-Key` is kept in Caddy's storage, so that the
	// same request again is answered with it instead of running again
	// ([Idempotency-Key replay](docs/durability.md#idempotency-key-replay)).
	// Default: 24h.
	IdempotencyTTL caddy.Duration `json:"idempotency_ttl,omitempty"`

	// Whether an all-or-nothing write batch keeps its saga in Caddy's
	// storage (a journal) while it runs, so that a batch cut short by a
	// crash is finished by this or another instance sharing the storage,
	// with the same proofs
	// ([Durability](docs/durability.md#durability-the-saga-journal)). The
	// journal holds the client's forwarded headers, `Authorization`
	// included, until the saga ends. A saga that leaves items behind is
	// kept after it ends, without any header value but harmless ones,
	// until an operator retries or resolves it
	// ([Sagas left behind](docs/operations.md#sagas-left-behind)). Off,
	// nothing is kept: a batch cut short stays half done, and the `ERROR`
	// line of a batch that left items behind carries their pre-images.
	// Default: true.
	Journal *bool `json:"journal,omitempty"`

	// The most ids or elements one bulk job (a batch sent with `Prefer:
	// respond-async` to a handler with `jobs`) may hold; more is answered
	// `413` and no job is made
	// ([Bulk jobs](docs/jobs.md)).
	// Default: 100000.
	MaxJobItems int `json:"max_job_items,omitempty"`

	// The most items an all-or-nothing bulk job may hold: it keeps every
	// item's lock, and its window logs every pre-image, until it ends, so
	// a larger one is answered `413` and should run `partial`
	// ([All-or-nothing jobs](docs/jobs.md#all-or-nothing-jobs)).
	// Default: 5000.
	MaxAtomicJobItems int `json:"max_atomic_job_items,omitempty"`

	// The largest body of a bulk job, in bytes, read as a stream; larger
	// is answered `413` and no job is made. Each element is still bounded
	// by `max_body_size`, as a sub-request's body. Default: 64MiB
	// (67108864).
	MaxJobBodySize int64 `json:"max_job_body_size,omitempty"`

	// How many bulk jobs this handler runs at once on this instance, the
	// ones it took over from other instances included; a job started
	// beyond it waits `queued` for any instance with room
	// ([Where a job runs](docs/jobs.md#where-a-job-runs)). It is the
	// handler's alone: set in a resource, it is refused. Default: 4.
	MaxJobs int `json:"max_jobs,omitempty"`

	// How many bulk jobs one client (its `Authorization`, `Cookie`,
	// `scope_query` values and `scope_headers`) may have running, queued
	// or cancelling across the cluster; one more is refused `429` with
	// `Retry-After`. The handler's alone. Default: 2.
	MaxJobsPerClient int `json:"max_jobs_per_client,omitempty"`

	// How many bulk jobs may wait in the cluster's queue, as this
	// instance allows it: a start that would wait (this instance runs
	// `max_jobs` already) beyond it is refused `429` with `Retry-After`.
	// The handler's alone. Default: 16.
	MaxQueuedJobs int `json:"max_queued_jobs,omitempty"`

	// How long a bulk job's status and results are kept once it ended,
	// then swept; a job found past it is answered `404`.
	// Default: 24h.
	JobTTL caddy.Duration `json:"job_ttl,omitempty"`

	// How long a bulk job may take from its start, waits included; past
	// it no new item starts and the job ends `partial` (or `failed` when
	// nothing succeeded; an all-or-nothing one is undone), its status
	// saying why; so does a job paused past it ([Paused
	// jobs](docs/jobs.md#paused-jobs)). Default: 6h.
	JobTimeout caddy.Duration `json:"job_timeout,omitempty"`

	// How many sub-requests of one bulk job may be in flight at once,
	// as `concurrency` bounds a synchronous batch's; a job's requests
	// still take `max_in_flight` slots below every synchronous batch's
	// ([Bulk jobs](docs/jobs.md#configuration)). Default: concurrency
	// (the resource's).
	JobConcurrency int `json:"job_concurrency,omitempty"`

	// `max_throttle_wait` for a bulk job's sub-requests: the longest pause
	// a throttling answer of the legacy API (`429`, or `503` with
	// `Retry-After`) may ask of a job and still be waited out, so that a
	// job slows down with the API instead of failing its items
	// ([Bulk jobs](docs/jobs.md#configuration)); `0` waits out none.
	// Default: 1m.
	JobThrottleWait *caddy.Duration `json:"job_throttle_wait,omitempty"`
}

// AutoInFlight bounds an adaptive max_in_flight.
type AutoInFlight struct {
	// The fewest sub-requests in flight the bound may fall to.
	// Default: 4.
	Min int `json:"min,omitempty"`
	// The most sub-requests in flight the bound may grow to: 32 matches
	// reverse_proxy's pool of kept-alive connections; more is the
	// operator's choice. Default: 32.
	Max int `json:"max,omitempty"`
}

// Level is one level's settings, the handler's or a resource's, as
// resolved so far: what the options are laid over, on the defaults and
// then on the handler's.
type Level struct {
	policy.Settings
	policy.GatewaySettings
	// GeneralAtomicity is the mode "atomicity <mode>" sets, before any
	// operation's own: the envelope's, which runs no one operation.
	GeneralAtomicity policy.Atomicity
}

// Defaults is the level that holds no option: the README's defaults.
func Defaults() Level {
	return Level{Settings: policy.Defaults(), GatewaySettings: policy.GatewayDefaults()}
}

// option is one row of optionTable: all the module knows of an option
// besides its field in Options.
type option struct {
	name string
	// forms are the ways the option is written in a Caddyfile, each a
	// line of the directive's syntax and a row of the README's options
	// table (go generate writes both from them).
	forms []form
	// example is a value that sets the option, for the errors that say
	// how to write it.
	example string
	// key names what one line of the option sets, for the rule that a
	// block sets it once; nil is the option's name.
	key func(args []string) string
	// read sets the option in o from its Caddyfile line. a.d stands on
	// the line's last value, so an option with a block reads it there.
	read func(o *Options, a optionArgs) error
	// apply lays the option, when set, over l. It only refuses a word
	// the policy does not know; whether a value can work is
	// policy.Validate's to say.
	apply func(o *Options, l *Level) error
}

// form is one way of writing an option in a Caddyfile: what follows
// its name, and the JSON name of the field of Options it sets, whose
// doc comment says what it does and its default.
type form struct{ args, field string }

// optionTable is every option, in the order the Caddyfile's syntax, the
// README's options table and the errors list them. Adding an option is
// its field in Options and its row here, then go generate ./..., which
// writes the syntax and the table from them.
//
//go:generate go run ./gen -root ../..
var optionTable = []option{
	{
		name:    "atomicity",
		forms:   []form{{"all_or_nothing|partial", "atomicity"}, {"get|create|update|delete all_or_nothing|partial", "operation_atomicity"}},
		example: "partial",
		key:     atomicityKey,
		read:    readAtomicity,
		apply:   applyAtomicity,
	},
	toggle("allow_override",
		func(o *Options, l *Level) (**bool, *bool) { return &o.AllowOverride, &l.AllowOverride }),
	count("max_items", "100",
		func(o *Options, l *Level) (*int, *int) { return &o.MaxItems, &l.MaxItems }),
	size("max_body_size", "1MiB",
		func(o *Options, l *Level) (*int64, *int64) { return &o.MaxBodySize, &l.MaxBodySize }),
	size("max_response_size", "16MiB",
		func(o *Options, l *Level) (*int64, *int64) { return &o.MaxResponseSize, &l.MaxResponseSize }),
	count("concurrency", "8",
		func(o *Options, l *Level) (*int, *int) { return &o.Concurrency, &l.Concurrency }),
	{
		// A count, or auto with its bounds.
		name:    "max_in_flight",
		forms:   []form{{"<n>", "max_in_flight"}, {"auto [<min> <max>]", "max_in_flight_auto"}},
		example: "32",
		read:    readMaxInFlight,
		apply:   applyMaxInFlight,
	},
	{
		// A duration that may be zero: "wait out no throttle".
		name:    "max_throttle_wait",
		forms:   []form{{"<duration>", "max_throttle_wait"}},
		example: "5s",
		read:    func(o *Options, a optionArgs) error { return a.pause(&o.MaxThrottleWait) },
		apply: func(o *Options, l *Level) error {
			if o.MaxThrottleWait != nil {
				l.MaxThrottleWait = time.Duration(*o.MaxThrottleWait)
			}
			return nil
		},
	},
	duration("item_timeout", "10s",
		func(o *Options, l *Level) (*caddy.Duration, *time.Duration) { return &o.ItemTimeout, &l.ItemTimeout }),
	duration("batch_timeout", "30s",
		func(o *Options, l *Level) (*caddy.Duration, *time.Duration) { return &o.BatchTimeout, &l.BatchTimeout }),
	text("ids_param", "ids",
		func(o *Options, l *Level) (*string, *string) { return &o.IDsParam, &l.IDsParam }),
	text("id_field", "id",
		func(o *Options, l *Level) (*string, *string) { return &o.IDField, &l.IDField }),
	word("delete_semantics", "imperative|declarative", "declarative", policy.ParseDeleteSemantics,
		func(o *Options, l *Level) (*string, *policy.DeleteSemantics) {
			return &o.DeleteSemantics, &l.DeleteSemantics
		}),
	word("restore_deleted", "put|post", "post", policy.ParseRestoreDeleted,
		func(o *Options, l *Level) (*string, *policy.Restore) { return &o.RestoreDeleted, &l.RestoreDeleted }),
	word("restore_updated", "put|patch", "patch", policy.ParseRestoreUpdated,
		func(o *Options, l *Level) (*string, *policy.Restore) { return &o.RestoreUpdated, &l.RestoreUpdated }),
	{
		// A count that may be zero: "no retry".
		name:    "compensation_retries",
		forms:   []form{{"<n>", "compensation_retries"}},
		example: "3",
		read: func(o *Options, a optionArgs) error {
			o.CompensationRetries = new(int)
			return a.number(o.CompensationRetries)
		},
		apply: func(o *Options, l *Level) error { setNonNil(&l.CompensationRetries, o.CompensationRetries); return nil },
	},
	duration("compensation_timeout", "30s",
		func(o *Options, l *Level) (*caddy.Duration, *time.Duration) {
			return &o.CompensationTimeout, &l.CompensationTimeout
		}),
	toggle("idempotent_upstream",
		func(o *Options, l *Level) (**bool, *bool) { return &o.IdempotentUpstream, &l.IdempotentUpstream }),
	toggle("conditional_writes",
		func(o *Options, l *Level) (**bool, *bool) { return &o.ConditionalWrites, &l.ConditionalWrites }),
	word("item_locks", "local|storage", "local", policy.ParseItemLocks,
		func(o *Options, l *Level) (*string, *policy.ItemLocks) { return &o.ItemLocks, &l.ItemLocks }),
	duration("idempotency_ttl", "24h",
		func(o *Options, l *Level) (*caddy.Duration, *time.Duration) {
			return &o.IdempotencyTTL, &l.IdempotencyTTL
		}),
	toggle("journal",
		func(o *Options, l *Level) (**bool, *bool) { return &o.Journal, &l.Journal }),
	list("scope_query", "<param...>", "query parameter names", "tenant api_key",
		func(o *Options, l *Level) (*[]string, *[]string) { return &o.ScopeQuery, &l.ScopeQuery }),
	list("scope_headers", "<header...>", "header names", "X-API-Key",
		func(o *Options, l *Level) (*[]string, *[]string) { return &o.ScopeHeaders, &l.ScopeHeaders }),
	word("id_format", "any|integer|uuid", "integer", policy.ParseIDFormat,
		func(o *Options, l *Level) (*string, *policy.IDFormat) { return &o.IDFormat, &l.IDFormat }),
	list("stamped_fields", "<member...>", "member names", "updated_at",
		func(o *Options, l *Level) (*[]string, *[]string) { return &o.StampedFields, &l.StampedFields }),
	count("max_job_items", "100000",
		func(o *Options, l *Level) (*int, *int) { return &o.MaxJobItems, &l.MaxJobItems }),
	count("max_atomic_job_items", "5000",
		func(o *Options, l *Level) (*int, *int) { return &o.MaxAtomicJobItems, &l.MaxAtomicJobItems }),
	size("max_job_body_size", "64MiB",
		func(o *Options, l *Level) (*int64, *int64) { return &o.MaxJobBodySize, &l.MaxJobBodySize }),
	count("max_jobs", "4",
		func(o *Options, l *Level) (*int, *int) { return &o.MaxJobs, &l.MaxJobs }),
	count("max_jobs_per_client", "2",
		func(o *Options, l *Level) (*int, *int) { return &o.MaxJobsPerClient, &l.MaxJobsPerClient }),
	count("max_queued_jobs", "16",
		func(o *Options, l *Level) (*int, *int) { return &o.MaxQueuedJobs, &l.MaxQueuedJobs }),
	duration("job_ttl", "24h",
		func(o *Options, l *Level) (*caddy.Duration, *time.Duration) { return &o.JobTTL, &l.JobTTL }),
	duration("job_timeout", "6h",
		func(o *Options, l *Level) (*caddy.Duration, *time.Duration) { return &o.JobTimeout, &l.JobTimeout }),
	count("job_concurrency", "4",
		func(o *Options, l *Level) (*int, *int) { return &o.JobConcurrency, &l.JobConcurrency }),
	{
		// A duration that may be zero, as max_throttle_wait.
		name:    "job_throttle_wait",
		forms:   []form{{"<duration>", "job_throttle_wait"}},
		example: "1m",
		read:    func(o *Options, a optionArgs) error { return a.pause(&o.JobThrottleWait) },
		apply: func(o *Options, l *Level) error {
			if o.JobThrottleWait != nil {
				l.JobThrottleWait = time.Duration(*o.JobThrottleWait)
			}
			return nil
		},
	},
}

// Form is one way of writing an option in a Caddyfile, for the
// generator of its documentation: the option's name, what follows it,
// and the JSON name of the field of Options it sets.
type Form struct{ Option, Args, Field string }

// Forms is every option's forms, in optionTable's order.
func Forms() []Form {
	var all []Form
	for _, o := range optionTable {
		for _, f := range o.forms {
			all = append(all, Form{Option: o.name, Args: f.args, Field: f.field})
		}
	}
	return all
}

// Apply lays the options that are set over l, in the table's order.
func (o *Options) Apply(l *Level) error {
	var errs []error
	for _, opt := range optionTable {
		errs = append(errs, opt.apply(o, l))
	}
	return errors.Join(errs...)
}

// binding ties an option's field in Options to the setting it is laid
// over in a level: one row says both, so that they cannot drift apart.
type binding[O, S any] func(o *Options, l *Level) (field *O, setting *S)

// field is the option's field in o.
func (b binding[O, S]) field(o *Options) *O {
	f, _ := b(o, new(Level))
	return f
}

// The kinds of option. Zero (or "") means "not set" in JSON, so a kind
// whose zero is a value of its own (a flag's off) is a pointer in
// Options; a negative limit is set, for policy.Validate to refuse.

// plain is an option whose value is its setting, laid over it when set.
func plain[T comparable](name, args, example string, read func(optionArgs, *T) error, b binding[T, T]) option {
	return option{name: name, forms: []form{{args, name}}, example: example,
		read:  func(o *Options, a optionArgs) error { return read(a, b.field(o)) },
		apply: func(o *Options, l *Level) error { f, s := b(o, l); setNonZero(s, *f); return nil },
	}
}

// count is an option that takes a whole number greater than zero.
func count(name, example string, b binding[int, int]) option {
	return plain(name, "<n>", example, optionArgs.number, b)
}

// size is an option that takes a size in bytes (1MiB, 512KiB).
func size(name, example string, b binding[int64, int64]) option {
	return plain(name, "<size>", example, optionArgs.size, b)
}

// text is an option that takes a name, as it is written.
func text(name, example string, b binding[string, string]) option {
	return plain(name, "<name>", example, optionArgs.text, b)
}

// duration is an option that takes a duration (10s, 1m30s).
func duration(name, example string, b binding[caddy.Duration, time.Duration]) option {
	return option{name: name, forms: []form{{"<duration>", name}}, example: example,
		read:  func(o *Options, a optionArgs) error { return a.duration(b.field(o)) },
		apply: func(o *Options, l *Level) error { f, s := b(o, l); setNonZero(s, time.Duration(*f)); return nil },
	}
}

// word is an option that takes one of the words args lists, which
// parse knows.
func word[T any](name, args, example string, parse func(string) (T, error), b binding[string, T]) option {
	return option{name: name, forms: []form{{args, name}}, example: example,
		read: func(o *Options, a optionArgs) error { return a.text(b.field(o)) },
		apply: func(o *Options, l *Level) error {
			f, s := b(o, l)
			if *f == "" {
				return nil
			}
			v, err := parse(*f)
			if err != nil {
				return policy.OptionError(name, err)
			}
			*s = v
			return nil
		},
	}
}

// toggle is an option that is on when named alone, or set on or off.
func toggle(name string, b binding[*bool, bool]) option {
	return option{name: name, forms: []form{{"[on|off]", name}},
		read:  func(o *Options, a optionArgs) error { return a.flag(b.field(o)) },
		apply: func(o *Options, l *Level) error { f, s := b(o, l); setNonNil(s, *f); return nil },
	}
}

// list is an option that takes one or more words, each what says; a
// resource's list replaces the handler's.
func list(name, args, what, example string, b binding[[]string, []string]) option {
	return option{name: name, forms: []form{{args, name}}, example: example,
		read: func(o *Options, a optionArgs) error {
			if len(a.args) == 0 {
				return a.d.Errf("%s takes one or more %s, e.g. %s", a.opt.name, what, a.example())
			}
			*b.field(o) = a.args
			return nil
		},
		apply: func(o *Options, l *Level) error {
			if f, s := b(o, l); *f != nil {
				*s = *f
			}
			return nil
		},
	}
}

// readMaxInFlight reads max_in_flight <n>, or max_in_flight auto
// [<min> <max>].
func readMaxInFlight(o *Options, a optionArgs) error {
	if len(a.args) == 0 || a.args[0] != "auto" {
		return a.number(&o.MaxInFlight)
	}
	bounds := &AutoInFlight{}
	switch len(a.args) {
	case 1:
	case 3:
		lo, err1 := strconv.Atoi(a.args[1])
		hi, err2 := strconv.Atoi(a.args[2])
		if err1 != nil || err2 != nil || lo < 1 || hi < 1 {
			return a.d.Errf("max_in_flight auto takes two whole numbers above zero, the least and the most, e.g. max_in_flight auto 4 32, not %q", strings.Join(a.args[1:], " "))
		}
		bounds.Min, bounds.Max = lo, hi
	default:
		return a.d.Errf("max_in_flight auto takes no bounds, or the least and the most, e.g. max_in_flight auto 4 32")
	}
	o.MaxInFlightAuto = bounds
	return nil
}

// applyMaxInFlight lays max_in_flight over l: a count, or auto, which
// makes the bound adaptive with max_in_flight its most.
func applyMaxInFlight(o *Options, l *Level) error {
	a := o.MaxInFlightAuto
	if a == nil {
		if o.MaxInFlight != 0 {
			// A number is the operator's fixed bound: it turns the
			// default auto off rather than becoming auto's most.
			l.AutoInFlight, l.MinInFlight, l.MaxInFlight = false, 0, o.MaxInFlight
		}
		return nil
	}
	if o.MaxInFlight != 0 {
		return policy.OptionError("max_in_flight", fmt.Errorf("max_in_flight is set both to %d and to auto: choose one", o.MaxInFlight))
	}
	l.AutoInFlight, l.MinInFlight, l.MaxInFlight = true, policy.AutoInFlightMin, policy.AutoInFlightMax
	setNonZero(&l.MinInFlight, a.Min)
	setNonZero(&l.MaxInFlight, a.Max)
	return nil
}

// atomicityKey: "atomicity <operation> <mode>" sets one operation's
// mode, besides the general one.
func atomicityKey(args []string) string {
	if len(args) == 2 {
		return "atomicity " + args[0]
	}
	return "atomicity"
}

// readAtomicity reads atomicity <mode>, or atomicity <operation> <mode>.
func readAtomicity(o *Options, a optionArgs) error {
	switch len(a.args) {
	case 1:
		return a.text(&o.Atomicity)
	case 2:
		if o.OperationAtomicity == nil {
			o.OperationAtomicity = map[string]string{}
		}
		o.OperationAtomicity[a.args[0]] = a.args[1]
		return nil
	}
	return a.d.Errf("atomicity takes a mode, or an operation and a mode: atomicity [get|create|update|delete] all_or_nothing|partial")
}

// applyAtomicity lays the atomicity options over l: the general mode,
// then each operation's, which wins over it.
func applyAtomicity(o *Options, l *Level) error {
	var errs []error
	if o.Atomicity != "" {
		if a, err := policy.ParseAtomicity(o.Atomicity); err != nil {
			errs = append(errs, policy.OptionError("atomicity", err))
		} else {
			l.GeneralAtomicity = a
			l.SetAtomicity(a)
		}
	}
	// Sorted, so that the errors of a configuration come in one order.
	for _, name := range slices.Sorted(maps.Keys(o.OperationAtomicity)) {
		option := "atomicity " + name
		op, err := policy.ParseOp(name)
		if err != nil {
			errs = append(errs, policy.OptionError(option, fmt.Errorf("%s: %w", option, err)))
			continue
		}
		a, err := policy.ParseAtomicity(o.OperationAtomicity[name])
		if err != nil {
			errs = append(errs, policy.OptionError(option, fmt.Errorf("%s: %w", option, err)))
			continue
		}
		l.Atomicity[op] = a
	}
	return errors.Join(errs...)
}

// setNonZero sets dst to an option's value, when it is set: in JSON a zero
// (or "") is "not set".
func setNonZero[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

// setNonNil sets dst to an option's value, when it is set (not nil).
func setNonNil[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}
