package caddymodule

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-batch/caddy-batch/internal/options"
	"github.com/caddy-batch/caddy-batch/policy"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("batch", parseCaddyfile)
	orderBeforeAuthentication(httpcaddyfile.RegisterDirectiveOrder)
}

// orderBeforeAuthentication orders the directive before every
// authentication directive, so that each sub-request, not the batch, is
// what authentication, authorization and rate limits see: a batch gets
// no more rights and no more capacity than its single requests. The
// first of them in Caddy's order is the deprecated "basicauth", listed
// just before its new name "basic_auth": ordered after a working
// "basicauth", batch would have the batch judged instead of each item.
// So batch goes before "basicauth" while Caddy lists it, and before
// "basic_auth" once it is gone (register then panics, which is how Caddy
// says a directive is not in its order). It returns the directive batch
// was ordered before.
func orderBeforeAuthentication(register func(dir string, position httpcaddyfile.Positional, standardDir string)) string {
	if orderedBefore(register, "basicauth") {
		return "basicauth"
	}
	register("batch", httpcaddyfile.Before, "basic_auth")
	return "basic_auth"
}

// orderedBefore orders batch before standardDir, and reports whether
// Caddy took it.
func orderedBefore(register func(string, httpcaddyfile.Positional, string), standardDir string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	register("batch", httpcaddyfile.Before, standardDir)
	return true
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens, and
// refuses a configuration that cannot work with the error Provision
// would give, at the line that holds the mistake. Syntax (written by go
// generate from package options: the options' lines are its table's
// forms, in its order):
//
//	batch [<matcher>] {
//	    atomicity            all_or_nothing|partial
//	    atomicity            get|create|update|delete all_or_nothing|partial
//	    allow_override       [on|off]
//	    max_items            <n>
//	    max_body_size        <size>
//	    max_response_size    <size>
//	    concurrency          <n>
//	    max_in_flight        <n>
//	    max_in_flight        auto [<min> <max>]
//	    max_throttle_wait    <duration>
//	    item_timeout         <duration>
//	    batch_timeout        <duration>
//	    ids_param            <name>
//	    id_field             <name>
//	    delete_semantics     imperative|declarative
//	    restore_deleted      put|post
//	    restore_updated      put|patch
//	    compensation_retries <n>
//	    compensation_timeout <duration>
//	    idempotent_upstream  [on|off]
//	    conditional_writes   [on|off]
//	    item_locks           local|storage
//	    idempotency_ttl      <duration>
//	    journal              [on|off]
//	    scope_query          <param...>
//	    scope_headers        <header...>
//	    id_format            any|integer|uuid
//	    stamped_fields       <member...>
//	    max_job_items        <n>
//	    max_atomic_job_items <n>
//	    max_job_body_size    <size>
//	    max_jobs             <n>
//	    max_jobs_per_client  <n>
//	    max_queued_jobs      <n>
//	    job_ttl              <duration>
//	    job_timeout          <duration>
//	    job_concurrency      <n>
//	    job_throttle_wait    <duration>
//	    envelope             <path>
//	    jobs                 <path>
//	    openapi              [<file>] {
//	        prefix  <path>
//	        publish <path>
//	        include <pattern...>
//	        exclude <pattern...>
//	    }
//
//	    resource <collection path template> {
//	        collection <METHOD...>
//	        item       <METHOD...>
//	        item_path  <template>
//	        batch      get|create|update|delete...|none
//	        list_filter <query template> {
//	            items   <JSON pointer>
//	            max_ids <n>
//	            preflight
//	        }
//	        # any option above, for this resource alone
//	    }
//	}
//
// A template is a path of literal segments and whole-segment variables,
// {name}, each of which may say what its values are, {name:format}
// (integer, uuid or any; {id}'s is id_format's): an item's lock names a
// parent variable in its canonical spelling, so that /users/020/posts/5
// and /users/20/posts/5 under {user:integer} are one lock. A variable
// with no format is its text.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	at, err := h.unmarshal(d)
	if err != nil {
		return err
	}
	// caddy adapt does not provision, so without this a configuration
	// that cannot work would be adapted, and refused later with no line.
	if _, err := h.resolve(at.lines(), false); err != nil {
		return at.locate(err)
	}
	return nil
}

// places remembers where each part of the directive is written, so that
// a mistake resolve finds, placed by resource and option, is reported
// at its line.
type places struct {
	directive caddyfile.Token
	options   map[string]caddyfile.Token // by option key: "max_items", "atomicity create"
	resources []resourcePlaces
}

type resourcePlaces struct {
	resource caddyfile.Token
	options  map[string]caddyfile.Token
}

func (at *places) lines() []int {
	lines := make([]int, len(at.resources))
	for i, r := range at.resources {
		lines[i] = r.resource.Line
	}
	return lines
}

// locate puts the line of its place on each mistake err holds, and lists
// them in the order of their lines, as a reader fixes them.
func (at *places) locate(err error) error {
	type located struct {
		tok caddyfile.Token
		err error
	}
	var all []located
	for _, e := range policy.Flatten(err) {
		tok := at.directive
		if pe := (*policy.Error)(nil); errors.As(e, &pe) {
			tok = at.token(pe.Resource, pe.Option)
		}
		all = append(all, located{tok, e})
	}
	slices.SortStableFunc(all, func(a, b located) int {
		if a.tok.File != b.tok.File {
			return 0 // an imported file's lines do not compare with ours
		}
		return a.tok.Line - b.tok.Line
	})
	errs := make([]error, len(all))
	for i, l := range all {
		d := caddyfile.NewDispenser([]caddyfile.Token{l.tok})
		d.Next()
		errs[i] = d.WrapErr(l.err)
	}
	return errors.Join(errs...)
}

// token finds where an option is set: in the resource when the mistake
// is in one (or the resource line itself when the option is not written
// there, as for methods the map lacks), else in the handler's block.
func (at *places) token(resource int, option string) caddyfile.Token {
	if tok, ok := at.options["openapi"]; ok && resource >= len(at.resources) {
		return tok // a resource the OpenAPI document declares
	}
	if resource >= 0 && resource < len(at.resources) {
		r := at.resources[resource]
		if tok, ok := r.options[option]; ok {
			return tok
		}
		return r.resource
	}
	if tok, ok := at.options[option]; ok {
		return tok
	}
	return at.directive
}

// resourceWords are the subdirectives of a resource block besides the
// options.
var resourceWords = []string{"collection", "item", "item_path", "batch", "list_filter"}

// listFilterWords are the subdirectives of a list_filter block.
var listFilterWords = []string{"items", "max_ids", "preflight"}

// unmarshal reads the tokens into h, refusing what the Caddyfile's syntax
// does not allow; resolve judges the values.
func (h *Handler) unmarshal(d *caddyfile.Dispenser) (*places, error) {
	d.Next() // the directive's name
	at := &places{directive: d.Token(), options: map[string]caddyfile.Token{}}
	if d.NextArg() {
		return nil, d.Errf("batch takes a matcher and a block, nothing else: remove %q", d.Val())
	}
	for d.NextBlock(0) {
		switch name := d.Val(); {
		case name == "resource":
			r, rat, err := unmarshalResource(d)
			if err != nil {
				return nil, err
			}
			h.Resources = append(h.Resources, r)
			at.resources = append(at.resources, rat)
		case name == "envelope":
			if err := unmarshalPath(d, at.options, name, "the path its POSTs come on, e.g. envelope /api/batch", &h.Envelope); err != nil {
				return nil, err
			}
		case name == "jobs":
			if err := unmarshalPath(d, at.options, name, "the path its jobs' monitors live under, e.g. jobs /api/jobs", &h.Jobs); err != nil {
				return nil, err
			}
		case name == "openapi":
			if err := h.unmarshalOpenAPI(d, at.options); err != nil {
				return nil, err
			}
		case slices.Contains(resourceWords, name):
			return nil, d.Errf("%s belongs in a resource block: resource <collection path> { %s ... }", name, name)
		default:
			if err := h.Options.UnmarshalOption(d, at.options, []string{"resource", "envelope", "jobs", "openapi"}); err != nil {
				return nil, err
			}
		}
	}
	return at, nil
}

// unmarshalPath reads "<name> <path>" (envelope, jobs) into dst; what
// says what the path is for, with an example.
func unmarshalPath(d *caddyfile.Dispenser, seen map[string]caddyfile.Token, name, what string, dst *string) error {
	if err := options.Once(d, seen, name, d.Token()); err != nil {
		return err
	}
	if !d.NextArg() {
		return d.Errf("%s takes %s", name, what)
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.Errf("%s takes one path, not %q too", name, d.Val())
	}
	if d.NextBlock(d.Nesting()) {
		return d.Errf("%s takes no block", name)
	}
	return nil
}

func unmarshalResource(d *caddyfile.Dispenser) (Resource, resourcePlaces, error) {
	var r Resource
	at := resourcePlaces{resource: d.Token(), options: map[string]caddyfile.Token{}}
	if !d.NextArg() {
		return r, at, d.Err("resource needs the collection's path template, e.g. resource /api/users { collection GET POST }")
	}
	r.Path = d.Val()
	if d.NextArg() {
		return r, at, d.Errf("resource takes one path template, not %q too: declare each collection in its own resource block", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch name := d.Val(); {
		case name == "resource":
			err = d.Errf("resource blocks do not nest: close the block of resource %s before the next resource", r.Path)
		case name == "envelope":
			err = d.Errf("envelope belongs in the batch block, not in resource %s: one envelope serves every resource", r.Path)
		case name == "jobs":
			err = d.Errf("jobs belongs in the batch block, not in resource %s: one jobs path serves every resource", r.Path)
		case name == "openapi":
			err = d.Errf("openapi belongs in the batch block, not in resource %s: one document declares every resource", r.Path)
		case slices.Contains(resourceWords, name):
			err = r.unmarshalWord(d, at.options)
		default:
			err = r.Options.UnmarshalOption(d, at.options, resourceWords)
		}
		if err != nil {
			return r, at, err
		}
	}
	return r, at, nil
}

// unmarshalWord reads the resource's subdirective the dispenser is on,
// one of resourceWords, placing it in seen.
func (r *Resource) unmarshalWord(d *caddyfile.Dispenser, seen map[string]caddyfile.Token) error {
	name := d.Val()
	if err := options.Once(d, seen, name, d.Token()); err != nil {
		return err
	}
	if name == "list_filter" {
		f, err := unmarshalListFilter(d, seen)
		r.ListFilter = f
		return err
	}
	args := d.RemainingArgs()
	switch name {
	case "collection", "item":
		if len(args) == 0 {
			example := map[string]string{"collection": "GET POST", "item": "GET PUT DELETE"}[name]
			return d.Errf("%s needs one or more methods, e.g. %s %s", name, name, example)
		}
		for i, m := range args {
			args[i] = strings.ToUpper(m)
		}
		if name == "collection" {
			r.Collection = args
		} else {
			r.Item = args
		}
	case "item_path":
		if len(args) != 1 {
			return d.Errf("item_path takes one template, e.g. item_path %s/{id}", r.Path)
		}
		r.ItemPath = args[0]
	case "batch":
		switch {
		case len(args) == 0:
			return d.Errf("batch needs operations (get create update delete) or none")
		case len(args) == 1 && args[0] == "none":
			args = []string{}
		case slices.Contains(args, "none"):
			return d.Errf("batch none turns every operation off, so it stands alone: write batch none, or list the operations to keep")
		}
		r.Batch = &args
	}
	return nil
}

// unmarshalListFilter reads list_filter <query> [{ items <pointer>;
// max_ids <n>; preflight }], placing its subdirectives in seen.
func unmarshalListFilter(d *caddyfile.Dispenser, seen map[string]caddyfile.Token) (*ListFilterConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 1 {
		return nil, d.Err(`list_filter takes one query template, quoted, e.g. list_filter "id__in={ids}&page_size=100"`)
	}
	f := &ListFilterConfig{Query: args[0]}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name, tok := d.Val(), d.Token()
		if !slices.Contains(listFilterWords, name) {
			if n := policy.Nearest(name, listFilterWords); n != "" {
				return nil, d.Errf("unknown list_filter option %q: did you mean %s?", name, n)
			}
			return nil, d.Errf("unknown list_filter option %q (this block takes %s)", name, strings.Join(listFilterWords, ", "))
		}
		if err := options.Once(d, seen, name, tok); err != nil {
			return nil, err
		}
		args := d.RemainingArgs()
		switch name {
		case "items":
			if len(args) != 1 {
				return nil, d.Err("items takes one JSON pointer, e.g. items /results")
			}
			f.Items = args[0]
		case "max_ids":
			n, err := strconv.Atoi(strings.Join(args, " "))
			if len(args) != 1 || err != nil {
				return nil, d.Errf("max_ids takes a whole number, e.g. max_ids 50, not %q", strings.Join(args, " "))
			}
			if n == 0 {
				// In JSON a zero is "the default"; written here it is a
				// mistake, refused with the policy's own words.
				return nil, d.Err(policy.CheckListMaxIDs(n).Error())
			}
			f.MaxIDs = n
		case "preflight":
			if len(args) != 0 {
				return nil, d.Errf("preflight takes no value, not %q", strings.Join(args, " "))
			}
			f.Preflight = true
		}
	}
	return f, nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
