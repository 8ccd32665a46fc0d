// Package policy answers, from a structure built once at provisioning, the
// questions the gateway asks of every request: which resource a path
// names, whether it is the collection or one item, which methods it
// allows, and which batch operations and settings apply. It knows nothing
// of Caddy.
package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
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
	// Formats are the formats of the path's variables that the
	// templates do not write, by name: those of the imported OpenAPI
	// document's parameters. A format written in a template,
	// {user:integer}, wins.
	Formats map[string]IDFormat
	// Batch names the batch operations that are on; nil means every one
	// the methods allow.
	Batch []string
	// ListFilter, when set, reads the resource's batches through its
	// LIST (docs/list-filter.md).
	ListFilter *ListFilterSpec
	// Settings are the resource's resolved settings, and Gateway those
	// only the gateway reads.
	Settings Settings
	Gateway  GatewaySettings
	// Line is where the resource is declared, when the configuration
	// has lines (0 when not): an error about two resources names both.
	Line int
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
	// Gateway are the settings only the gateway reads; the engine reads
	// Settings alone.
	Gateway GatewaySettings
	// List reads the resource's batch GETs (and, with its Preflight,
	// the pre-images of batch updates and deletes) through the legacy
	// API's LIST filter; nil when there is none.
	List *ListFilter

	// formats are the collection's variables' formats, by name; a
	// variable not in it is its text (docs/configuration.md, "Templates").
	formats                    map[string]IDFormat
	batch                      [opCount]bool
	collectionAllow, itemAllow string
	index, line                int // where it is declared, for errors that name it
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

// New builds a policy from the resource declarations. It refuses any
// that cannot work with *Error values (joined) that name the resource
// and the option, and say what to do.
func New(specs []ResourceSpec) (*Policy, error) {
	if len(specs) == 0 {
		return nil, &Error{Resource: -1, msg: "no resources: declare at least one, with the methods its collection and items support, e.g. resource /api/users { collection GET POST }"}
	}
	p := &Policy{}
	var errs []error
	for i, spec := range specs {
		r, err := newResource(i, spec)
		if err == nil {
			err = p.add(r, spec)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Uses reports whether any resource's gateway settings satisfy f.
func (p *Policy) Uses(f func(GatewaySettings) bool) bool {
	for _, r := range p.resources {
		if f(r.Gateway) {
			return true
		}
	}
	return false
}

// batchNeeds lists, per operation, the methods its client request and
// fan-out use: the client's on the collection, and the sub-requests' on
// items (a create's sub-requests go to the collection).
var batchNeeds = [opCount]struct{ collection, item MethodSet }{
	OpGet:    {MethodGet, MethodGet},
	OpCreate: {MethodPost, 0},
	OpUpdate: {MethodPatch, MethodPatch},
	OpDelete: {MethodDelete, MethodDelete},
}

func newResource(i int, spec ResourceSpec) (*Resource, error) {
	fail := func(option, format string, args ...any) (*Resource, error) {
		return nil, resourceErrorf(i, spec.Path, option, format, args...)
	}
	coll, err := ParseTemplate(spec.Path)
	if err != nil {
		return fail("", "%v", err)
	}
	if slices.Contains(coll.variables(), idVariable) {
		return fail("", "the path uses {%s}, which is the item's id: give that variable another name, e.g. {parent_id}", idVariable)
	}
	item, err := itemTemplate(spec, coll)
	if err != nil {
		return fail("item_path", "%v", err)
	}
	formats, err := variableFormats(spec.Formats, coll, item)
	if err != nil {
		return fail("item_path", "%v", err)
	}
	if len(spec.CollectionMethods) == 0 && len(spec.ItemMethods) == 0 {
		return fail("", "no methods: declare the methods the API supports, with collection <METHOD...>, item <METHOD...> or both")
	}
	collMethods, err := ParseMethods(spec.CollectionMethods)
	if err != nil {
		return fail("collection", "collection: %v", err)
	}
	itemMethods, err := ParseMethods(spec.ItemMethods)
	if err != nil {
		return fail("item", "item: %v", err)
	}
	if err := Validate(spec.Settings, spec.Gateway); err != nil {
		return nil, InResource(i, spec.Path, err)
	}
	r := &Resource{
		Collection:        coll,
		Item:              item,
		CollectionMethods: collMethods.withImplied(),
		ItemMethods:       itemMethods.withImplied(),
		Settings:          spec.Settings,
		Gateway:           spec.Gateway,
		formats:           formats,
		index:             i,
		line:              spec.Line,
	}
	r.collectionAllow = r.CollectionMethods.String()
	r.itemAllow = r.ItemMethods.String()
	if err := r.enableBatch(spec); err != nil {
		return nil, err
	}
	if spec.ListFilter != nil {
		if err := r.listFilter(*spec.ListFilter); err != nil {
			return nil, InResource(i, spec.Path, err)
		}
	}
	return r, nil
}

// DefaultItemPath is the item_path of a collection that declares none:
// collection + "/{id}", or + "{id}/" when the collection is written
// with a trailing slash, as an API that wants one (Django's, for one) on
// its collection wants it on its items too.
func DefaultItemPath(collection string) string {
	if strings.HasSuffix(collection, "/") {
		return collection + "{" + idVariable + "}/"
	}
	return collection + "/{" + idVariable + "}"
}

// itemTemplate parses the item's template, or makes the default one, and
// checks that every variable it uses gets a value: {id} from the id, the
// others from the collection's path.
func itemTemplate(spec ResourceSpec, coll Template) (Template, error) {
	itemPath := spec.ItemPath
	if itemPath == "" {
		itemPath = DefaultItemPath(spec.Path)
	}
	item, err := ParseTemplate(itemPath)
	if err != nil {
		return item, fmt.Errorf("item_path: %w", err)
	}
	collVars, itemVars := coll.variables(), item.variables()
	var strangers []string
	for _, v := range itemVars {
		if v != idVariable && !slices.Contains(collVars, v) {
			strangers = append(strangers, v)
		}
	}
	if !slices.Contains(itemVars, idVariable) {
		hint := ""
		if len(strangers) == 1 {
			hint = fmt.Sprintf(" (did you mean %s?)", strings.Replace(itemPath, "{"+strangers[0]+"}", "{"+idVariable+"}", 1))
		}
		return item, fmt.Errorf("item_path %s has no {%s}: an item's path must contain {%s}, where each id goes%s", itemPath, idVariable, idVariable, hint)
	}
	if len(strangers) > 0 {
		return item, fmt.Errorf("item_path %s uses {%s}, which the collection's path %s does not have, so no request gives it a value: use only {%s} and the collection's variables",
			itemPath, strangers[0], spec.Path, idVariable)
	}
	return item, nil
}

// variableFormats gathers the formats of a resource's variables: the
// imported ones, then those its templates write, which win; the two
// templates may not write two for one variable. itemTemplate checked
// that the item's variables are the collection's and the id, and {id}
// takes no format.
func variableFormats(imported map[string]IDFormat, coll, item Template) (map[string]IDFormat, error) {
	out := map[string]IDFormat{}
	for name, f := range imported {
		if name != idVariable && f != IDAny {
			out[name] = f
		}
	}
	written := coll.formats()
	for name, f := range item.formats() {
		if cf, ok := written[name]; ok && cf != f {
			return nil, fmt.Errorf("item_path %s writes {%s:%s}, and the collection's path {%s:%s}: write the variable's format once", item, name, f, name, cf)
		}
		written[name] = f
	}
	maps.Copy(out, written)
	return out, nil
}

// canonical returns vars with each variable that has a format in its
// canonical spelling (a value not of the format kept as written, as an
// id is), and whether any changed.
func (r *Resource) canonical(vars map[string]string) (map[string]string, bool) {
	var out map[string]string
	for name, f := range r.formats {
		v, ok := vars[name]
		if !ok {
			continue
		}
		c, err := f.Canonical(v)
		if err != nil || c == v {
			continue
		}
		if out == nil {
			out = maps.Clone(vars)
		}
		out[name] = c
	}
	if out == nil {
		return vars, false
	}
	return out, true
}

// enableBatch turns on the listed operations, or by default every one
// whose methods the map allows, and checks that an all-or-nothing batch
// of each can be undone with methods the legacy API supports.
func (r *Resource) enableBatch(spec ResourceSpec) error {
	explicit := spec.Batch != nil
	var errs []error
	for _, n := range spec.Batch {
		if n == "none" {
			// The Caddyfile's word, written into a JSON list.
			errs = append(errs, resourceErrorf(r.index, spec.Path, "batch", `batch: "none" is no operation: an empty list turns every operation off`))
			continue
		}
		op, err := ParseOp(n)
		if err != nil {
			errs = append(errs, resourceErrorf(r.index, spec.Path, "batch", "batch: %v", err))
			continue
		}
		r.batch[op] = true
	}
	for op := range opCount {
		need := batchNeeds[op]
		missing := r.missing(need.collection, need.item)
		if !explicit {
			r.batch[op] = missing == ""
		}
		if !r.batch[op] {
			continue
		}
		if missing != "" {
			needs := need.collection.String() + " on the collection"
			if need.item != 0 {
				needs += " and " + need.item.String() + " on the item"
			}
			errs = append(errs, resourceErrorf(r.index, spec.Path, "batch", "batch %s needs %s, and the map does not allow %s: allow it, or leave %s out of batch",
				op, needs, missing, op))
			continue
		}
		if err := r.checkUndo(op, spec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// listFilter builds the resource's list filter, and refuses one that
// could never be used.
func (r *Resource) listFilter(spec ListFilterSpec) error {
	f, err := ParseListFilter(spec)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if !r.CollectionMethods.Has(MethodGet) {
		errs = append(errs, OptionError("list_filter", errors.New("list_filter reads through the collection's LIST, and the map does not allow GET on the collection: allow it, or leave list_filter out")))
	}
	if spec.Preflight && !r.batch[OpUpdate] && !r.batch[OpDelete] {
		errs = append(errs, OptionError("preflight", errors.New("list_filter's preflight reads the pre-images of batch updates and deletes, and neither is on for this resource: leave preflight out")))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	r.List = f
	return nil
}

// missing names the methods of coll and item that the map does not allow
// ("PUT on the item"), or "" when it allows them all.
func (r *Resource) missing(coll, item MethodSet) string {
	var parts []string
	if m := item &^ r.ItemMethods; m != 0 {
		parts = append(parts, m.String()+" on the item")
	}
	if m := coll &^ r.CollectionMethods; m != 0 {
		parts = append(parts, m.String()+" on the collection")
	}
	return strings.Join(parts, " and ")
}

// undoNeeds returns the methods that undo op under restore, and how.
func undoNeeds(op Op, restore Restore) (coll, item MethodSet, how string) {
	switch op {
	case OpCreate:
		return 0, MethodDelete, "a created item is deleted (DELETE on the item)"
	case OpUpdate:
		if restore == RestorePatch {
			return 0, MethodGet | MethodPatch, "the pre-image is read (GET on the item) and patched back (PATCH on the item, restore_updated patch)"
		}
		return 0, MethodGet | MethodPut, "the pre-image is read (GET on the item) and put back (PUT on the item, restore_updated put)"
	case OpDelete:
		if restore == RestorePost {
			return MethodPost, MethodGet, "the pre-image is read (GET on the item) and re-created (POST on the collection, restore_deleted post)"
		}
		return 0, MethodGet | MethodPut, "the pre-image is read (GET on the item) and re-created (PUT on the item, restore_deleted put)"
	}
	return 0, 0, ""
}

// UndoMissing names the methods, not allowed by the resource's map, that
// undoing an all-or-nothing write of op would need, and says how it is
// undone; missing is "" when the map allows them all.
func (r *Resource) UndoMissing(op Op) (missing, how string) {
	restore := r.Settings.RestoreUpdated
	if op == OpDelete {
		restore = r.Settings.RestoreDeleted
	}
	coll, item, how := undoNeeds(op, restore)
	return r.missing(coll, item), how
}

// checkUndo refuses an operation that may run all-or-nothing (its mode, or
// any mode when clients may override it) but whose compensation needs a
// method the legacy API does not support.
func (r *Resource) checkUndo(op Op, spec ResourceSpec) error {
	s := r.Settings
	partial := s.Atomicity[op] == Partial
	if partial && !s.AllowOverride {
		return nil
	}
	// The other way to restore, which the fix may be.
	var restore, other Restore
	var otherOption string
	switch op {
	case OpUpdate:
		restore, other = s.RestoreUpdated, RestorePatch
		if restore == RestorePatch {
			other = RestorePut
		}
		otherOption = "restore_updated " + other.String()
	case OpDelete:
		restore, other = s.RestoreDeleted, RestorePost
		if restore == RestorePost {
			other = RestorePut
		}
		otherOption = "restore_deleted " + other.String()
	}
	needColl, needItem, how := undoNeeds(op, restore)
	missing := r.missing(needColl, needItem)
	if missing == "" {
		return nil
	}
	fixes := []string{"allow " + missing}
	if otherOption != "" {
		if c, i, _ := undoNeeds(op, other); r.missing(c, i) == "" {
			fixes = append(fixes, "set "+otherOption)
		}
	}
	var why string
	switch {
	case partial:
		why = fmt.Sprintf("batch %s is partial, but allow_override lets a client ask for all_or_nothing, and a failed all_or_nothing batch is undone: %s; the map does not allow %s. Setting it partial alone does not help while allow_override is on",
			op, how, missing)
		fixes = append(fixes, "turn allow_override off")
	case s.AllowOverride:
		why = fmt.Sprintf("batch %s runs all_or_nothing, and a failed batch is undone: %s; the map does not allow %s", op, how, missing)
		fixes = append(fixes, fmt.Sprintf("set atomicity %s partial and turn allow_override off", op))
	default:
		why = fmt.Sprintf("batch %s runs all_or_nothing, and a failed batch is undone: %s; the map does not allow %s", op, how, missing)
		fixes = append(fixes, fmt.Sprintf("set atomicity %s partial", op))
	}
	fixes = append(fixes, fmt.Sprintf("leave %s out of batch", op))
	option := "item"
	if needItem&^r.ItemMethods == 0 {
		option = "collection"
	}
	return resourceErrorf(r.index, spec.Path, option, "%s: %s", why, orList(fixes))
}

func (p *Policy) add(r *Resource, spec ResourceSpec) error {
	if other, otherItem := p.attach(r.Collection, r, false); other != nil {
		switch {
		case otherItem:
			return resourceErrorf(r.index, spec.Path, "", "the path is the same route as %s, the items of resource %s (%s): declare these methods as item methods of %s, or give %s another item_path",
				other.Item, other.Collection, both(other, r), other.Collection, other.Collection)
		case other.Collection.String() == r.Collection.String():
			return &Error{Resource: r.index, msg: fmt.Sprintf("resource %s is declared twice (%s): merge them into one", r.Collection, both(other, r))}
		default:
			return resourceErrorf(r.index, spec.Path, "", "the path is the same route as resource %s (%s): merge them into one", other.Collection, both(other, r))
		}
	}
	if other, otherItem := p.attach(r.Item, r, true); other != nil {
		what := "resource " + other.Collection.String()
		if otherItem {
			what = "the items of resource " + other.Collection.String()
		}
		return resourceErrorf(r.index, spec.Path, "item_path", "the item path %s is the same route as %s (%s): give this resource another item_path", r.Item, what, both(other, r))
	}
	p.resources = append(p.resources, r)
	return nil
}

// both names where two resources are declared: "lines 3 and 9" when
// the configuration has lines, else their places in the list.
func both(a, b *Resource) string {
	if a.line > 0 && b.line > 0 {
		return fmt.Sprintf("lines %d and %d", a.line, b.line)
	}
	return fmt.Sprintf("resources[%d] and resources[%d]", a.index, b.index)
}

// attach routes t to r, or returns the resource that already holds
// t's route and whether it holds it as its item path.
func (p *Policy) attach(t Template, r *Resource, item bool) (*Resource, bool) {
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
		return n.collection, false
	case n.item != nil:
		return n.item, true
	case item:
		n.item = r
	default:
		n.collection = r
	}
	return nil, false
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
	return ItemPaths{item: m.Resource.Item, vars: m.variables()}.Path(id)
}

// ItemPaths binds the matched collection's variables once, so that a
// batch builds each item's path by escaping its id alone.
func (m Match) ItemPaths() ItemPaths {
	vars := m.variables()
	p := m.Resource.Item.paths(vars)
	if canon, changed := m.Resource.canonical(vars); changed {
		lock := m.Resource.Item.paths(canon)
		p.lock = &lock
	}
	return p
}

// paths binds the item template's variables but the id.
func (t Template) paths(vars map[string]string) ItemPaths {
	const mark = "\x00id\x00" // cannot occur in an escaped path
	withMark := maps.Clone(vars)
	withMark[idVariable] = mark
	path := t.expand(withMark)
	escapedMark := url.PathEscape(mark)
	if strings.Count(path, escapedMark) != 1 {
		// A collection variable spelled like the mark: build each path
		// whole.
		return ItemPaths{item: t, vars: vars}
	}
	i := strings.Index(path, escapedMark)
	return ItemPaths{prefix: path[:i], suffix: path[i+len(escapedMark):]}
}

// ItemPaths builds the paths of a collection's items.
type ItemPaths struct {
	prefix, suffix string
	// item and vars are set when the paths must be built whole.
	item Template
	vars map[string]string
	// lock builds the items' lock names when the collection's variables
	// were not spelled canonically; nil when they were.
	lock *ItemPaths
}

// Path returns the escaped path of item id, as the upstream is sent it:
// the collection's variables as the client spelled them.
func (p ItemPaths) Path(id string) string {
	if p.vars != nil {
		vars := maps.Clone(p.vars)
		vars[idVariable] = id
		return p.item.expand(vars)
	}
	return p.prefix + url.PathEscape(id) + p.suffix
}

// Key returns the name of item id's lock: its path with every variable
// that has a format in its canonical spelling, so that /users/020/items/5
// and /users/20/items/5 under {user:integer} are one lock. A path
// already canonical is its own name, as before formats existed: a
// cluster upgraded one instance at a time keeps excluding.
func (p ItemPaths) Key(id string) string {
	if p.lock != nil {
		return p.lock.Path(id)
	}
	return p.Path(id)
}

// Path returns the escaped request path that was matched.
func (m Match) Path() string { return m.path }

// ItemKey names the matched item (an item match) by its path rebuilt from
// the template, so that every spelling of one item's path (escapes, a
// trailing slash, dot segments, and under id_format and the variables'
// formats their spellings) names it alike: the key its lock is taken
// under, as a batch's lock on the same item (ItemPaths.Key). A value
// that is not of its format is taken as written: a single request passes
// through as it came, and its lock names what the upstream is sent.
func (m Match) ItemKey() string {
	var buf [maxSegments]string
	segs, _ := splitPath(m.path, buf[:0])
	vars, _ := m.Resource.Item.bind(segs)
	if id, err := m.Resource.Settings.IDFormat.Canonical(vars[idVariable]); err == nil {
		vars[idVariable] = id
	}
	vars, _ = m.Resource.canonical(vars)
	return m.Resource.Item.expand(vars)
}

// CollectionAndID splits an item match into the match of its collection,
// with the variables the item's path gave it, and the item's id as the
// path spelled it (unescaped). For a collection match it returns m and "".
func (m Match) CollectionAndID() (Match, string) {
	if !m.Item {
		return m, ""
	}
	var buf [maxSegments]string
	segs, _ := splitPath(m.path, buf[:0])
	vars, _ := m.Resource.Item.bind(segs)
	id := vars[idVariable]
	delete(vars, idVariable)
	return Match{Resource: m.Resource, path: m.Resource.Collection.expand(vars)}, id
}

// IDFromLocation returns the id of the item a Location header names, when
// it names an item of the matched collection: the item template matches
// its path and binds the collection's variables to the values the request
// gave them. A Location may be relative or absolute, on any host; one
// that names anything else (a job queue, another collection) names no id.
func (m Match) IDFromLocation(location string) (string, bool) {
	u, err := url.Parse(location)
	if err != nil {
		return "", false
	}
	var buf [maxSegments]string
	segs, ok := splitPath(u.EscapedPath(), buf[:0])
	if !ok {
		return "", false
	}
	vars, ok := m.Resource.Item.bind(segs)
	if !ok {
		return "", false
	}
	for name, value := range m.variables() {
		if vars[name] != value {
			return "", false
		}
	}
	return vars[idVariable], true
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

// UndoMissing answers Resource.UndoMissing for a resource not yet built:
// the methods undoing an all-or-nothing op would need that the spec's
// methods lack ("" when none), and how it is undone. Methods the spec
// cannot parse are taken as absent; New refuses them.
func (spec ResourceSpec) UndoMissing(op Op) (missing, how string) {
	coll, _ := ParseMethods(spec.CollectionMethods)
	item, _ := ParseMethods(spec.ItemMethods)
	r := Resource{CollectionMethods: coll.withImplied(), ItemMethods: item.withImplied(), Settings: spec.Settings}
	return r.UndoMissing(op)
}

// Resources returns the resources in the order they were declared.
func (p *Policy) Resources() []*Resource { return p.resources }
