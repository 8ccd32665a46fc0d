// Package policy answers, from a structure built once at provisioning, the
// questions the gateway asks of every request: which resource a path
// names, whether it is the collection or one item, which methods it
// allows, and which batch operations and settings apply. It knows nothing
// of Caddy.
package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ResourceSpec declares one resource as an operator configures it.
type ResourceSpec struct {
	// Path is the collection's path template, e.g. /api/users/{user}/posts.
	Path string
	// CollectionMethods and ItemMethods are the methods the legacy API
	// supports on the collection and on one item.
	CollectionMethods []string
	ItemMethods       []string
	// ItemPath is the item's path template; it must hold {id}. Empty
	// means Path + "/{id}", or Path + "{id}/" when Path ends with a slash.
	ItemPath string
	// Batch names the batch operations that are on; nil means every one
	// the methods allow.
	Batch []string
	// Settings are the resource's resolved settings.
	Settings Settings
}

// idVariable is the item template's variable that an id fills.
const idVariable = "id"

// Resource is one configured resource, ready to answer requests.
type Resource struct {
	Collection Template
	Item       Template
	// CollectionMethods and ItemMethods include what HTTP implies: HEAD
	// where GET is allowed, and OPTIONS.
	CollectionMethods MethodSet
	ItemMethods       MethodSet
	Settings          Settings

	batch                      [opCount]bool
	collectionAllow, itemAllow string
}

// BatchEnabled reports whether op is on for the resource.
func (r *Resource) BatchEnabled(op Op) bool { return r.batch[op] }

// Policy maps request paths to resources.
type Policy struct {
	root      node
	resources []*Resource
}

type node struct {
	literals   map[string]*node
	variable   *node
	collection *Resource
	item       *Resource
}

// New builds a policy from the resource declarations, refusing any that
// cannot work with an error that names the resource and the option.
func New(specs []ResourceSpec) (*Policy, error) {
	p := &Policy{}
	var errs []error
	for _, spec := range specs {
		r, err := newResource(spec)
		if err == nil {
			err = p.add(r)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("resource %q: %w", spec.Path, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Resources returns the resources in declaration order.
func (p *Policy) Resources() []*Resource { return p.resources }

// batchNeeds lists, per operation, the methods its client request and
// fan-out use: the client's on the collection, and the sub-requests' on
// items (a create's sub-requests go to the collection).
var batchNeeds = [opCount]struct{ collection, item MethodSet }{
	OpGet:    {MethodGet, MethodGet},
	OpCreate: {MethodPost, 0},
	OpUpdate: {MethodPatch, MethodPatch},
	OpDelete: {MethodDelete, MethodDelete},
}

func newResource(spec ResourceSpec) (*Resource, error) {
	coll, err := ParseTemplate(spec.Path)
	if err != nil {
		return nil, fmt.Errorf("path: %w", err)
	}
	if slices.Contains(coll.variables(), idVariable) {
		return nil, fmt.Errorf("path: variable {%s} is reserved for the item's id", idVariable)
	}
	itemPath := spec.ItemPath
	if itemPath == "" {
		// A collection written with a trailing slash is of an API that
		// wants one (Django's, for one) on its items too.
		itemPath = spec.Path + "/{" + idVariable + "}"
		if strings.HasSuffix(spec.Path, "/") {
			itemPath = spec.Path + "{" + idVariable + "}/"
		}
	}
	item, err := ParseTemplate(itemPath)
	if err != nil {
		return nil, fmt.Errorf("item_path: %w", err)
	}
	if err := checkItemVariables(coll, item); err != nil {
		return nil, fmt.Errorf("item_path %q: %w", itemPath, err)
	}
	if len(spec.CollectionMethods) == 0 && len(spec.ItemMethods) == 0 {
		return nil, errors.New("collection and item methods are both empty: declare at least one method")
	}
	collMethods, err := ParseMethods(spec.CollectionMethods)
	if err != nil {
		return nil, fmt.Errorf("collection: %w", err)
	}
	itemMethods, err := ParseMethods(spec.ItemMethods)
	if err != nil {
		return nil, fmt.Errorf("item: %w", err)
	}
	if err := spec.Settings.Validate(); err != nil {
		return nil, err
	}
	r := &Resource{
		Collection:        coll,
		Item:              item,
		CollectionMethods: collMethods.withImplied(),
		ItemMethods:       itemMethods.withImplied(),
		Settings:          spec.Settings,
	}
	r.collectionAllow = r.CollectionMethods.String()
	r.itemAllow = r.ItemMethods.String()
	if err := r.enableBatch(spec.Batch); err != nil {
		return nil, err
	}
	return r, nil
}

func checkItemVariables(coll, item Template) error {
	collVars := coll.variables()
	found := false
	for _, v := range item.variables() {
		switch {
		case v == idVariable:
			found = true
		case !slices.Contains(collVars, v):
			return fmt.Errorf("variable {%s} is not in the collection's path, so no request can give it a value", v)
		}
	}
	if !found {
		return fmt.Errorf("must contain {%s}", idVariable)
	}
	return nil
}

// enableBatch turns on the listed operations, or by default every one
// whose methods the map allows, and checks that an all-or-nothing batch
// of each can be undone with methods the legacy API supports.
func (r *Resource) enableBatch(names []string) error {
	explicit := names != nil
	if explicit {
		for _, n := range names {
			op, err := ParseOp(n)
			if err != nil {
				return fmt.Errorf("batch: %w", err)
			}
			r.batch[op] = true
		}
	}
	var errs []error
	for op := range opCount {
		need := batchNeeds[op]
		methodsAllow := r.CollectionMethods.Has(need.collection) && r.ItemMethods.Has(need.item)
		if !explicit {
			r.batch[op] = methodsAllow
		}
		if !r.batch[op] {
			continue
		}
		if !methodsAllow {
			errs = append(errs, fmt.Errorf("batch %s needs %s on the collection and %s on the item; allow them or leave %s out of batch",
				op, need.collection, orNone(need.item), op))
			continue
		}
		if err := r.checkUndo(op); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkUndo refuses an operation that may run all-or-nothing (its mode, or
// any mode when clients may override it) but whose compensation needs a
// method the legacy API does not support.
func (r *Resource) checkUndo(op Op) error {
	if r.Settings.Atomicity[op] == Partial && !r.Settings.AllowOverride {
		return nil
	}
	var needItem, needColl MethodSet
	var how string
	switch op {
	case OpCreate:
		needItem, how = MethodDelete, "a created item is undone with DELETE on the item"
	case OpUpdate:
		needItem, how = MethodGet, "the pre-image is read with GET on the item"
		if r.Settings.RestoreUpdated == RestorePut {
			needItem |= MethodPut
			how += " and put back with PUT (restore_updated put)"
		} else {
			how += " and put back with PATCH (restore_updated patch)"
		}
	case OpDelete:
		needItem, how = MethodGet, "the pre-image is read with GET on the item"
		if r.Settings.RestoreDeleted == RestorePut {
			needItem |= MethodPut
			how += " and re-created with PUT on the item (restore_deleted put)"
		} else {
			needColl = MethodPost
			how += " and re-created with POST on the collection (restore_deleted post)"
		}
	default:
		return nil
	}
	if r.ItemMethods.Has(needItem) && r.CollectionMethods.Has(needColl) {
		return nil
	}
	return fmt.Errorf("batch %s can run all_or_nothing, where %s; allow those methods, set atomicity %s partial, or leave %s out of batch",
		op, how, op, op)
}

func orNone(s MethodSet) string {
	if s == 0 {
		return "nothing"
	}
	return s.String()
}

func (p *Policy) add(r *Resource) error {
	if err := p.attach(r.Collection, r, false); err != nil {
		return err
	}
	if err := p.attach(r.Item, r, true); err != nil {
		return fmt.Errorf("item_path: %w", err)
	}
	p.resources = append(p.resources, r)
	return nil
}

func (p *Policy) attach(t Template, r *Resource, item bool) error {
	n := &p.root
	for _, s := range t.segs {
		if s.name != "" {
			if n.variable == nil {
				n.variable = &node{}
			}
			n = n.variable
			continue
		}
		if n.literals == nil {
			n.literals = map[string]*node{}
		}
		c := n.literals[s.literal]
		if c == nil {
			c = &node{}
			n.literals[s.literal] = c
		}
		n = c
	}
	switch {
	case n.collection != nil:
		return fmt.Errorf("path %q is the same route as the collection path %q of resource %q", t, n.collection.Collection, n.collection.Collection)
	case n.item != nil:
		return fmt.Errorf("path %q is the same route as the item path %q of resource %q", t, n.item.Item, n.item.Collection)
	case item:
		n.item = r
	default:
		n.collection = r
	}
	return nil
}

// Match is what a lookup found for a request path.
type Match struct {
	Resource *Resource
	// Item is true for one item's path, false for the collection's.
	Item bool
	path string
}

// Lookup finds the resource whose collection or item template matches the
// escaped request path. Literal segments win over variables, so
// /users/me/posts can be configured beside /users/{user}/posts. It
// allocates only for a path segment that holds a percent-escape.
func (p *Policy) Lookup(escapedPath string) (Match, bool) {
	var buf [maxSegments]string
	segs, ok := splitPath(escapedPath, buf[:0])
	if !ok {
		return Match{}, false
	}
	n := p.root.match(segs)
	switch {
	case n == nil:
		return Match{}, false
	case n.collection != nil:
		return Match{Resource: n.collection, path: escapedPath}, true
	default:
		return Match{Resource: n.item, Item: true, path: escapedPath}, true
	}
}

func (n *node) match(segs []string) *node {
	if len(segs) == 0 {
		if n.collection != nil || n.item != nil {
			return n
		}
		return nil
	}
	if c := n.literals[segs[0]]; c != nil {
		if found := c.match(segs[1:]); found != nil {
			return found
		}
	}
	if n.variable != nil {
		return n.variable.match(segs[1:])
	}
	return nil
}

// Methods returns the methods the matched route allows, OPTIONS and the
// implied HEAD included.
func (m Match) Methods() MethodSet {
	if m.Item {
		return m.Resource.ItemMethods
	}
	return m.Resource.CollectionMethods
}

// Allow returns the Allow header value for the matched route.
func (m Match) Allow() string {
	if m.Item {
		return m.Resource.itemAllow
	}
	return m.Resource.collectionAllow
}

// CollectionPath returns the escaped path of the matched collection,
// rebuilt from its template: the form the upstream is sent, whatever
// repeated slashes or dot segments the client's path held.
func (m Match) CollectionPath() string {
	return m.Resource.Collection.expand(m.variables())
}

// ItemPath returns the escaped path of the item with the given id in the
// matched collection: the collection's variables keep the values the
// request gave them, and the id is escaped as one segment.
func (m Match) ItemPath(id string) string {
	vars := m.variables()
	vars[idVariable] = id
	return m.Resource.Item.expand(vars)
}

// variables returns the values the request path gave the collection
// template's variables.
func (m Match) variables() map[string]string {
	var buf [maxSegments]string
	segs, _ := splitPath(m.path, buf[:0])
	vars, ok := m.Resource.Collection.bind(segs)
	if !ok {
		vars = map[string]string{}
	}
	return vars
}
