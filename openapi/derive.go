package openapi

import (
	"fmt"
	"slices"

	"github.com/caddy-batch/caddy-batch/policy"
)

// batchSingles are the single methods each batch operation fans out to,
// as the document must declare them: the item's GET, the collection's
// POST, the item's PATCH, the item's DELETE.
var batchSingles = []struct {
	op     policy.Op
	method string
	item   bool
}{
	{policy.OpGet, "GET", true},
	{policy.OpCreate, "POST", false},
	{policy.OpUpdate, "PATCH", true},
	{policy.OpDelete, "DELETE", true},
}

// Gap is a batch operation an imported resource leaves off because an
// all-or-nothing batch of it could not be undone with the methods the
// document declares.
type Gap struct {
	Resource string // the collection's template
	Op       policy.Op
	Missing  string // the methods its undo needs that the map lacks
	How      string // how it would be undone
}

// Warning says what is off and the recipes that turn it on.
func (g Gap) Warning() string {
	methods := map[policy.Op]string{
		policy.OpCreate: "DELETE on the item",
		policy.OpUpdate: "GET and PUT on the item, or GET and PATCH with restore_updated patch",
		policy.OpDelete: "GET and PUT on the item, or GET on the item and POST on the collection with restore_deleted post",
	}[g.Op]
	return fmt.Sprintf("batch %s of %s is off: a failed all-or-nothing batch is undone as %s, and the document declares no %s. To turn it on: resource %s { atomicity %s partial } (nothing is undone), or declare what the undo needs (%s)",
		g.Op, g.Resource, g.How, g.Missing, g.Resource, g.Op, methods)
}

// Derive turns on, for an imported resource whose settings are resolved,
// the batch operations whose single methods its map allows (docs/openapi.md,
// "From OpenAPI"), and the collection's PATCH and DELETE
// that batch update and delete are served on. An operation whose
// all-or-nothing undo needs a method the map lacks stays off, and is
// returned as a Gap. spec.Batch set by the operator is kept as written;
// keepCollection keeps the collection's methods as the operator wrote
// them.
func Derive(spec *policy.ResourceSpec, keepCollection bool) []Gap {
	addToCollection := func(ops []string) {
		if keepCollection {
			return
		}
		if slices.Contains(ops, "update") && !slices.Contains(spec.CollectionMethods, "PATCH") {
			spec.CollectionMethods = append(slices.Clone(spec.CollectionMethods), "PATCH")
		}
		if slices.Contains(ops, "delete") && !slices.Contains(spec.CollectionMethods, "DELETE") {
			spec.CollectionMethods = append(slices.Clone(spec.CollectionMethods), "DELETE")
		}
	}
	if spec.Batch != nil {
		addToCollection(spec.Batch)
		return nil
	}
	ops := []string{}
	var gaps []Gap
	if spec.ItemPath == "" {
		// A path without items: nothing to fan out to.
		spec.Batch = ops
		return nil
	}
	for _, b := range batchSingles {
		methods := spec.CollectionMethods
		if b.item {
			methods = spec.ItemMethods
		}
		if !slices.Contains(methods, b.method) {
			continue
		}
		if b.op.Writes() && mayRunAllOrNothing(spec.Settings, b.op) {
			if missing, how := spec.UndoMissing(b.op); missing != "" {
				gaps = append(gaps, Gap{Resource: spec.Path, Op: b.op, Missing: missing, How: how})
				continue
			}
		}
		ops = append(ops, b.op.String())
	}
	spec.Batch = ops
	addToCollection(ops)
	return gaps
}

// mayRunAllOrNothing says whether a batch of op can run all-or-nothing:
// its mode, or any mode when clients may choose.
func mayRunAllOrNothing(s policy.Settings, op policy.Op) bool {
	return s.Atomicity[op] == policy.AllOrNothing || s.AllowOverride
}
