package caddymodule

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/openapi"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Options are the tunables of batch handling. Set on the handler, they
// apply to every resource; set on a resource, they override the
// handler's for that resource alone. An option left out (zero) inherits.
type Options struct {
	// What a batch promises when one of its items fails: "all_or_nothing"
	// undoes what the batch already did; "partial" lets every item stand
	// on its own. Default: all_or_nothing.
	Atomicity string `json:"atomicity,omitempty"`

	// Atomicity for single operations, keyed by "get", "create", "update"
	// or "delete"; it wins over Atomicity. Default: none.
	OperationAtomicity map[string]string `json:"operation_atomicity,omitempty"`

	// Whether a client may choose the atomicity of its batch with
	// "Prefer: atomicity=partial" or "atomicity=all-or-nothing"; the
	// answer then carries Preference-Applied. Default: false.
	AllowOverride *bool `json:"allow_override,omitempty"`

	// The most ids or elements one batch may hold; more is answered 413.
	// Default: 100.
	MaxItems int `json:"max_items,omitempty"`

	// The largest batch body, in bytes; larger is answered 413. It also
	// bounds each item's answer from the upstream. Default: 1048576 (1MiB).
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// How many sub-requests of one batch may be in flight at once.
	// Default: 8.
	Concurrency int `json:"concurrency,omitempty"`

	// How long one sub-request may take before its item fails with 504.
	// Default: 10s.
	ItemTimeout caddy.Duration `json:"item_timeout,omitempty"`

	// How long a whole batch may take, preflight and execution; the
	// compensations of a failed batch have their own timeout.
	// Default: 30s.
	BatchTimeout caddy.Duration `json:"batch_timeout,omitempty"`

	// The query parameter that carries the ids of a batch GET or DELETE.
	// Default: ids.
	IDsParam string `json:"ids_param,omitempty"`

	// The member of an element that holds its id (batch update), and of
	// an upstream answer that holds a created item's id when there is no
	// Location header. Default: id.
	IDField string `json:"id_field,omitempty"`

	// What a DELETE of a missing item means: "imperative" lets the
	// upstream's 404 stand; "declarative" ("the item must not exist")
	// answers 204 for a single DELETE and counts a batch item as
	// succeeded. Default: imperative.
	DeleteSemantics string `json:"delete_semantics,omitempty"`

	// How a compensation re-creates an item a failed batch deleted: "put"
	// sends PUT <item path> with the pre-image; "post" sends POST
	// <collection> with the pre-image, id included, for APIs whose PUT
	// cannot create. Default: put.
	RestoreDeleted string `json:"restore_deleted,omitempty"`

	// How a compensation puts back an item a failed batch updated: "put"
	// sends the whole pre-image; "patch" sends the changed fields' old
	// values. Default: put.
	RestoreUpdated string `json:"restore_updated,omitempty"`

	// How many times a failed compensation is sent again (after 100ms,
	// 200ms, 400ms…, at most 2s apart). Default: 3.
	CompensationRetries *int `json:"compensation_retries,omitempty"`

	// How long one compensation attempt may take. Default: 30s.
	CompensationTimeout caddy.Duration `json:"compensation_timeout,omitempty"`

	// Whether the upstream honours Idempotency-Key: a write whose outcome
	// is unknown (sent, and no answer said what it did) is then sent again
	// with the same key to learn what it did, before it is undone.
	// Default: false.
	IdempotentUpstream *bool `json:"idempotent_upstream,omitempty"`

	// Whether the upstream enforces If-Match / If-None-Match on writes:
	// an undo's condition (a strong ETag, If-None-Match: *) then replaces
	// the read that proves the item is as the batch left it. Without it
	// every undo is proved by a read, and the conditions are still sent:
	// many frameworks put strong ETags on GETs and ignore If-Match on
	// writes (Django's ConditionalGetMiddleware, Spring's
	// ShallowEtagHeaderFilter). Default: false.
	ConditionalWrites *bool `json:"conditional_writes,omitempty"`

	// The query parameters that scope or authenticate a request (a
	// tenant, an API key), e.g. ["tenant", "api_key"]. An all-or-nothing
	// write batch reads and undoes items for its own purposes, so it
	// sends these on every request it makes, and refuses with 400 a
	// client query that holds any other parameter: one that shapes the
	// representation ($select, fields, include) would make it read a
	// partial item and put back only that. A batch GET and a partial
	// batch keep the whole query. The ids parameter and _method cannot
	// be named. A resource's list replaces the handler's. Default: none.
	ScopeQuery []string `json:"scope_query,omitempty"`

	// What the upstream's ids are, so that two spellings of one item are
	// one item: "integer" takes 03, +3 and 3 as the id 3 (sent, locked,
	// compared for duplicates and reported as 3) and refuses an id that
	// is not a decimal integer; "uuid" takes ids in lower case with
	// hyphens and refuses one that is not a UUID; "any" takes an id as
	// its text. Default: any.
	IDFormat string `json:"id_format,omitempty"`

	// Where the locks an all-or-nothing batch takes on the items it
	// writes live: "local" locks within this Caddy process; "storage"
	// through Caddy's storage, across the instances that share it.
	// Single-item writes through the gateway take the same locks.
	// Default: local.
	ItemLocks string `json:"item_locks,omitempty"`

	// The largest whole batch answer, in bytes; items whose answers would
	// pass it are left out, and the batch fails. Default: 16777216 (16MiB).
	MaxResponseSize int64 `json:"max_response_size,omitempty"`

	// How many sub-requests of all the batches of this handler may be in
	// flight at once; batches wait, in turn, for a free slot (the wait
	// counts against batch_timeout), and compensations go before every
	// batch that waits. It is the handler's alone: set in a resource, it
	// is refused. The slots are kept across config reloads that leave
	// this value and the resources' paths as they were. Size it with
	// reverse_proxy's keepalive_idle_conns_per_host (32 by default), so
	// that batches reuse kept-alive connections. Default: 32.
	MaxInFlight int `json:"max_in_flight,omitempty"`

	// How long the answer of a batch write (create, update, delete) that
	// carried an Idempotency-Key is kept in Caddy's storage, so that the
	// same request again is answered with it instead of running again.
	// Default: 24h.
	IdempotencyTTL caddy.Duration `json:"idempotency_ttl,omitempty"`
	// Whether an all-or-nothing write batch keeps its saga in Caddy's
	// storage (a journal), so that if this process dies mid-batch, it or
	// another instance sharing the storage finishes the saga: undoes
	// what the batch did, with the same proofs. The journal holds the
	// batch's forwarded headers (Authorization included) until the saga
	// ends. Default: true.
	Journal *bool `json:"journal,omitempty"`
}

// buildPolicy resolves every resource's settings (defaults, then the
// handler's options, then the resource's) and builds the method map. It
// is the one validation of a configuration: Provision runs it, and so
// does the Caddyfile adapter, which turns its errors' places into lines.
// lines, when not nil, holds the line each resource is declared on.
func (h *Handler) buildPolicy(lines []int) (*policy.Policy, error) {
	settings, gateway := policy.Defaults(), policy.GatewayDefaults()
	err := h.Options.apply(&settings, &gateway)
	if err == nil {
		err = policy.Validate(settings, gateway)
	}
	if err != nil {
		// Every resource inherits these, so one error each is enough.
		return nil, err
	}
	var errs []error
	h.resolved = h.resolveResources()
	h.gaps = nil
	specs := make([]policy.ResourceSpec, len(h.resolved))
	for i, r := range h.resolved {
		specs[i] = r.spec(settings, gateway)
		if err := r.Options.apply(&specs[i].Settings, &specs[i].Gateway); err != nil {
			errs = append(errs, policy.Flatten(policy.InResource(i, r.Path, err))...)
		}
		if r.MaxInFlight != 0 {
			errs = append(errs, policy.InResource(i, r.Path, policy.OptionError("max_in_flight",
				errors.New("max_in_flight bounds the sub-requests of every batch of the handler together, so a resource cannot have its own: set it in the batch block"))))
		}
		if r.doc != nil {
			h.gaps = append(h.gaps, openapi.Derive(&specs[i], r.keepCollection)...)
		}
		if i < len(lines) {
			specs[i].Line = lines[i]
		}
	}
	p, err := policy.New(specs)
	if len(errs) == 0 {
		return p, h.placeImported(err)
	}
	// Every mistake at once, in the order the resources are declared.
	all := append(errs, policy.Flatten(err)...)
	slices.SortStableFunc(all, func(a, b error) int { return resourceOf(a) - resourceOf(b) })
	return nil, h.placeImported(errors.Join(all...))
}

// spec declares the resource to the policy, with the handler's resolved
// settings, which its own options then override.
func (r Resource) spec(settings policy.Settings, gateway policy.GatewaySettings) policy.ResourceSpec {
	var ops []string // nil: every operation the methods allow
	if r.Batch != nil {
		ops = append([]string{}, *r.Batch...)
	}
	spec := policy.ResourceSpec{
		Path:              r.Path,
		CollectionMethods: r.Collection,
		ItemMethods:       r.Item,
		ItemPath:          r.ItemPath,
		Batch:             ops,
		Settings:          settings,
		Gateway:           gateway,
	}
	if f := r.ListFilter; f != nil {
		spec.ListFilter = &policy.ListFilterSpec{Template: f.Query, Items: f.Items, MaxIDs: f.MaxIDs, Preflight: f.Preflight}
	}
	return spec
}

func resourceOf(err error) int {
	var pe *policy.Error
	if errors.As(err, &pe) {
		return pe.Resource
	}
	return -1
}

// apply lays the options that are set over s and g. It only reads the
// values, refusing a word the policy does not know (an unknown atomicity,
// say); whether a value can work is the policy's to say, in
// policy.Validate.
func (o Options) apply(s *policy.Settings, g *policy.GatewaySettings) error {
	errs := o.applyAtomicity(s)
	setNonNil(&s.AllowOverride, o.AllowOverride)
	// Zero (or "") means "not set" in JSON; a negative value is set, for
	// Validate to refuse.
	setNonZero(&s.MaxItems, o.MaxItems)
	setNonZero(&s.MaxBodySize, o.MaxBodySize)
	setNonZero(&s.Concurrency, o.Concurrency)
	setNonZero(&s.ItemTimeout, time.Duration(o.ItemTimeout))
	setNonZero(&s.BatchTimeout, time.Duration(o.BatchTimeout))
	setNonZero(&s.CompensationTimeout, time.Duration(o.CompensationTimeout))
	setNonZero(&s.MaxResponseSize, o.MaxResponseSize)
	setNonZero(&g.MaxInFlight, o.MaxInFlight)
	setNonZero(&g.IdempotencyTTL, time.Duration(o.IdempotencyTTL))
	setNonZero(&s.IDsParam, o.IDsParam)
	setNonZero(&s.IDField, o.IDField)
	parseWord(&errs, "delete_semantics", o.DeleteSemantics, &s.DeleteSemantics, policy.ParseDeleteSemantics)
	parseWord(&errs, "restore_deleted", o.RestoreDeleted, &s.RestoreDeleted, policy.ParseRestoreDeleted)
	parseWord(&errs, "restore_updated", o.RestoreUpdated, &s.RestoreUpdated, policy.ParseRestoreUpdated)
	setNonNil(&s.CompensationRetries, o.CompensationRetries)
	setNonNil(&s.IdempotentUpstream, o.IdempotentUpstream)
	setNonNil(&g.Journal, o.Journal)
	setNonNil(&s.ConditionalWrites, o.ConditionalWrites)
	if o.ScopeQuery != nil {
		s.ScopeQuery = o.ScopeQuery
	}
	parseWord(&errs, "id_format", o.IDFormat, &s.IDFormat, policy.ParseIDFormat)
	parseWord(&errs, "item_locks", o.ItemLocks, &g.ItemLocks, policy.ParseItemLocks)
	return errors.Join(errs...)
}

// applyAtomicity lays the atomicity options over s: the general mode,
// then each operation's, which wins over it.
func (o Options) applyAtomicity(s *policy.Settings) []error {
	var errs []error
	if o.Atomicity != "" {
		if a, err := policy.ParseAtomicity(o.Atomicity); err != nil {
			errs = append(errs, policy.OptionError("atomicity", err))
		} else {
			s.SetAtomicity(a)
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
		s.Atomicity[op] = a
	}
	return errs
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

// parseWord parses an option's word, when it is set, into dst; a word
// the policy does not know is an error that names the option.
func parseWord[T any](errs *[]error, option, value string, dst *T, parse func(string) (T, error)) {
	if value == "" {
		return
	}
	var err error
	if *dst, err = parse(value); err != nil {
		*errs = append(*errs, policy.OptionError(option, err))
	}
}
