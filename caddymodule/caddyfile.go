package caddymodule

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("batch", parseCaddyfile)
	// Before every authentication directive ("basicauth" is the first of
	// them in Caddy's order), so that each sub-request, not the batch, is
	// what authentication, authorization and rate limits see: a batch
	// gets no more rights and no more capacity than its single requests.
	httpcaddyfile.RegisterDirectiveOrder("batch", httpcaddyfile.Before, "basicauth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	batch [<matcher>] {
//	    atomicity            all_or_nothing|partial
//	    atomicity            get|create|update|delete all_or_nothing|partial
//	    allow_override       [on|off]
//	    max_items            <n>
//	    max_body_size        <size>
//	    concurrency          <n>
//	    item_timeout         <duration>
//	    batch_timeout        <duration>
//	    ids_param            <name>
//	    id_field             <name>
//	    delete_semantics     imperative|declarative
//	    restore_deleted      put|post
//	    restore_updated      put|patch
//	    compensation_retries <n>
//	    compensation_timeout <duration>
//
//	    resource <collection path template> {
//	        collection <METHOD...>
//	        item       <METHOD...>
//	        item_path  <template>
//	        batch      get|create|update|delete...|none
//	        # any option above, for this resource alone
//	    }
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if d.Val() == "resource" {
			r, err := unmarshalResource(d)
			if err != nil {
				return err
			}
			h.Resources = append(h.Resources, r)
			continue
		}
		if err := h.Options.unmarshalOption(d); err != nil {
			return err
		}
	}
	return nil
}

func unmarshalResource(d *caddyfile.Dispenser) (Resource, error) {
	var r Resource
	if !d.NextArg() {
		return r, d.Errf("resource needs a collection path template, e.g. resource /api/users")
	}
	r.Path = d.Val()
	if d.NextArg() {
		return r, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "collection", "item":
			name := d.Val()
			methods := d.RemainingArgs()
			if len(methods) == 0 {
				return r, d.Errf("%s needs one or more methods, e.g. %s GET POST", name, name)
			}
			for i, m := range methods {
				methods[i] = strings.ToUpper(m)
			}
			if name == "collection" {
				r.Collection = methods
			} else {
				r.Item = methods
			}
		case "item_path":
			if !d.AllArgs(&r.ItemPath) {
				return r, d.ArgErr()
			}
		case "batch":
			ops := d.RemainingArgs()
			switch {
			case len(ops) == 0:
				return r, d.Errf("batch needs operations (get create update delete) or none")
			case len(ops) == 1 && ops[0] == "none":
				ops = []string{}
			}
			r.Batch = &ops
		default:
			if err := r.Options.unmarshalOption(d); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// unmarshalOption sets the option the dispenser is on.
func (o *Options) unmarshalOption(d *caddyfile.Dispenser) error {
	name := d.Val()
	args := d.RemainingArgs()
	one := func() (string, error) {
		if len(args) != 1 {
			return "", d.Errf("%s takes one value", name)
		}
		return args[0], nil
	}
	count := func(min int) (int, error) {
		v, err := one()
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < min {
			if min == 0 {
				return 0, d.Errf("%s must be a whole number, zero or more, not %q", name, v)
			}
			return 0, d.Errf("%s must be a whole number greater than zero, not %q", name, v)
		}
		return n, nil
	}
	duration := func(dst *caddy.Duration) error {
		v, err := one()
		if err != nil {
			return err
		}
		dur, err := caddy.ParseDuration(v)
		if err != nil || dur <= 0 {
			return d.Errf("%s must be a duration greater than zero, e.g. 10s, not %q", name, v)
		}
		*dst = caddy.Duration(dur)
		return nil
	}
	// enum checks a value now, so the error can name its line.
	enum := func(dst *string, check func(string) error) error {
		v, err := one()
		if err == nil {
			if err = check(v); err != nil {
				return d.Err(err.Error())
			}
			*dst = v
		}
		return err
	}
	size := func() (int64, error) {
		v, err := one()
		if err != nil {
			return 0, err
		}
		n, err := humanize.ParseBytes(v)
		if err != nil || n == 0 || n > 1<<62 {
			return 0, d.Errf("%s must be a size greater than zero, e.g. 1MiB, not %q", name, v)
		}
		return int64(n), nil
	}
	// flag reads an option that is on when named alone.
	flag := func() (*bool, error) {
		on := true
		switch {
		case len(args) == 1 && args[0] == "off":
			on = false
		case len(args) > 1 || len(args) == 1 && args[0] != "on":
			return nil, d.Errf("%s takes no value, or on or off", name)
		}
		return &on, nil
	}
	checkAtomicity := func(v string) error { _, err := policy.ParseAtomicity(v); return err }
	var err error
	switch name {
	case "atomicity":
		switch len(args) {
		case 1:
			err = enum(&o.Atomicity, checkAtomicity)
		case 2:
			if _, err := policy.ParseOp(args[0]); err != nil {
				return d.Err(err.Error())
			}
			if err := checkAtomicity(args[1]); err != nil {
				return d.Err(err.Error())
			}
			if o.OperationAtomicity == nil {
				o.OperationAtomicity = map[string]string{}
			}
			o.OperationAtomicity[args[0]] = args[1]
		default:
			return d.Errf("atomicity takes a mode, or an operation and a mode: atomicity [get|create|update|delete] all_or_nothing|partial")
		}
	case "allow_override":
		o.AllowOverride, err = flag()
	case "idempotent_upstream":
		o.IdempotentUpstream, err = flag()
	case "item_locks":
		err = enum(&o.ItemLocks, func(v string) error { _, err := policy.ParseItemLocks(v); return err })
	case "max_in_flight":
		o.MaxInFlight, err = count(1)
	case "max_response_size":
		o.MaxResponseSize, err = size()
	case "max_items":
		o.MaxItems, err = count(1)
	case "concurrency":
		o.Concurrency, err = count(1)
	case "compensation_retries":
		var n int
		n, err = count(0)
		o.CompensationRetries = &n
	case "max_body_size":
		o.MaxBodySize, err = size()
	case "item_timeout":
		err = duration(&o.ItemTimeout)
	case "batch_timeout":
		err = duration(&o.BatchTimeout)
	case "compensation_timeout":
		err = duration(&o.CompensationTimeout)
	case "ids_param":
		o.IDsParam, err = one()
		if err == nil && o.IDsParam == batch.MethodParam {
			err = d.Errf(`ids_param must not be %q: the gateway reads that parameter as a method override; choose another name, e.g. ids`, o.IDsParam)
		}
	case "id_field":
		o.IDField, err = one()
	case "delete_semantics":
		err = enum(&o.DeleteSemantics, func(v string) error { _, err := policy.ParseDeleteSemantics(v); return err })
	case "restore_deleted":
		err = enum(&o.RestoreDeleted, func(v string) error { _, err := policy.ParseRestoreDeleted(v); return err })
	case "restore_updated":
		err = enum(&o.RestoreUpdated, func(v string) error { _, err := policy.ParseRestoreUpdated(v); return err })
	default:
		return d.Errf("unknown batch option %q", name)
	}
	return err
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
