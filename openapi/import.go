package openapi

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Options choose what of a document is imported, and where it is served.
type Options struct {
	// Prefix is prepended to the document's paths; nil means the path
	// of its first servers url ("" when it has none).
	Prefix *string
	// Include and Exclude are patterns of the document's paths, where
	// * stands for any text, / included: a path is imported when it
	// matches an Include pattern (or there are none) and no Exclude one.
	Include, Exclude []string
}

// Resource is one resource the document declares: a path and, where the
// document has one, its item sibling <path>/{param}.
type Resource struct {
	// Path and ItemPath are the gateway's templates: the prefix and the
	// document's path, with variables renamed so that the item's own is
	// {id} (the method map's name for it) and no other is. ItemPath is
	// "" for a path without an item sibling.
	Path, ItemPath string
	// DocPath and DocItemPath are the document's own keys.
	DocPath, DocItemPath string
	// Collection and Item are the methods the document declares on
	// each path.
	Collection, Item []string
	// IDFormat is what the item parameter's schema says the ids are:
	// "integer", "uuid", or "" (any).
	IDFormat string
	// Formats are what the collection's parameters' schemas say their
	// values are, by their names in Path (integer, uuid); a parameter of
	// any other schema is not in it, and is its text.
	Formats map[string]policy.IDFormat
	// RestoreUpdated and RestoreDeleted name the way of undoing that the
	// document's methods allow where the default (PUT on the item) is
	// not declared: "patch" and "post", else "".
	RestoreUpdated, RestoreDeleted string
	// Pointer is the JSON pointer of the path in the document.
	Pointer string
}

// Imported is what a document declares for the gateway.
type Imported struct {
	Doc       *Document
	Prefix    string
	Resources []Resource
	// Paths are the document's paths that were imported, as keys.
	Paths map[string]bool
}

// Import reads the resources a document declares: every path with an
// item sibling <path>/{param} is a collection and its items, every other
// path a resource of its own with just its methods. A path the method
// map cannot express (a variable that is not a whole segment) is an
// error that names it and how to leave it out.
func Import(d *Document, opts Options) (*Imported, error) {
	prefix, err := d.prefix(opts.Prefix)
	if err != nil {
		return nil, err
	}
	im := &Imported{Doc: d, Prefix: prefix, Paths: map[string]bool{}}
	var paths []docPath
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(d.model.Paths.Map())) {
		if !selected(key, opts) {
			continue
		}
		p, err := parseDocPath(d, key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		im.Paths[key] = true
		paths = append(paths, p)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(paths) == 0 {
		return nil, &Error{File: d.File, Pointer: "/paths", Msg: "no path to import: check include and exclude, or give a document with paths"}
	}
	im.Resources = pair(prefix, paths)
	return im, nil
}

// docPath is a document path split into segments, "" for a variable.
type docPath struct {
	key      string
	segs     []string // literal segments, "" for a variable
	vars     []string // the variables' names, in order
	trailing bool
	item     *openapi3.PathItem
}

// shape names a path's route: its literals, its variables as {} and
// no trailing slash, so that /users/ and /users are one route.
func (p docPath) shape() string {
	parts := make([]string, len(p.segs))
	for i, s := range p.segs {
		parts[i] = s
		if s == "" {
			parts[i] = "{}"
		}
	}
	return "/" + strings.Join(parts, "/")
}

func parseDocPath(d *Document, key string) (docPath, error) {
	p := docPath{key: key, item: d.model.Paths.Value(key)}
	fail := func(format string, args ...any) (docPath, error) {
		return p, &Error{File: d.File, Pointer: jsonvalue.Pointer("paths", key), Line: pathLine(p.item), Msg: fmt.Sprintf(format, args...)}
	}
	body := strings.TrimPrefix(key, "/")
	if strings.HasSuffix(body, "/") {
		p.trailing = true
		body = strings.TrimSuffix(body, "/")
	}
	if body == "" {
		return fail("the root path is no resource the gateway can map: exclude it (exclude %s)", key)
	}
	for _, seg := range strings.Split(body, "/") {
		switch {
		case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") && strings.Count(seg, "{") == 1 && strings.Count(seg, "}") == 1 && len(seg) > 2:
			p.segs = append(p.segs, "")
			p.vars = append(p.vars, seg[1:len(seg)-1])
		case strings.ContainsAny(seg, "{}"):
			return fail("segment %q holds a variable and text, and the method map matches whole segments only: exclude the path (exclude %s), and the gateway passes its requests through untouched", seg, excludePattern(key))
		case seg == "" || seg == "." || seg == "..":
			return fail("segment %q cannot be matched as written: exclude the path (exclude %s)", seg, key)
		default:
			p.segs = append(p.segs, seg)
		}
	}
	return p, nil
}

// excludePattern suggests a pattern that leaves out a path and the
// paths below its first odd segment.
func excludePattern(key string) string {
	if i := strings.IndexAny(key, "{"); i > 0 {
		if j := strings.LastIndex(key[:i], "/"); j >= 0 {
			return key[:j+1] + "*"
		}
	}
	return key
}

func pathLine(item *openapi3.PathItem) int {
	if item != nil && item.Origin != nil && item.Origin.Key != nil {
		return item.Origin.Key.Line
	}
	return 0
}

// pair makes the resources: each path with an item sibling is a
// collection with its items; every other path stands alone.
func pair(prefix string, paths []docPath) []Resource {
	byShape := map[string]int{}
	for i, p := range paths {
		byShape[p.shape()] = i
	}
	isItem := make([]bool, len(paths))
	itemOf := make([]int, len(paths))
	for i, p := range paths {
		itemOf[i] = -1
		if len(p.segs) < 2 || p.segs[len(p.segs)-1] != "" {
			continue
		}
		parent := docPath{segs: p.segs[:len(p.segs)-1]}
		if j, ok := byShape[parent.shape()]; ok && itemOf[j] < 0 {
			itemOf[j], isItem[i] = i, true
		}
	}
	var out []Resource
	for i, p := range paths {
		if isItem[i] {
			continue
		}
		r := Resource{DocPath: p.key, Pointer: jsonvalue.Pointer("paths", p.key), Collection: methodsOf(p.item)}
		if j := itemOf[i]; len(r.Collection) == 0 && (j < 0 || len(methodsOf(paths[j].item)) == 0) {
			continue // nothing the map knows (TRACE alone): the gateway leaves it to the API
		}
		names := templateNames(p.vars, false)
		r.Path = prefix + expandTemplate(p, names)
		r.Formats = parentFormats(p, names)
		if j := itemOf[i]; j >= 0 {
			item := paths[j]
			r.DocItemPath = item.key
			r.Item = methodsOf(item.item)
			r.ItemPath = prefix + expandTemplate(item, templateNames(item.vars, true))
			if f := paramFormat(item.item, item.vars[len(item.vars)-1]); f != policy.IDAny {
				r.IDFormat = f.String()
			}
			if !slices.Contains(r.Item, "PUT") && slices.Contains(r.Item, "PATCH") {
				r.RestoreUpdated = policy.RestorePatch.String()
			}
			if !slices.Contains(r.Item, "PUT") && slices.Contains(r.Collection, "POST") {
				r.RestoreDeleted = policy.RestorePost.String()
			}
		}
		out = append(out, r)
	}
	return out
}

// templateNames renames a path's variables for the method map: names
// it takes (letters, digits, _), none of them {id} but the item's own.
func templateNames(vars []string, item bool) []string {
	names := make([]string, len(vars))
	used := map[string]bool{}
	for i, v := range vars {
		if item && i == len(vars)-1 {
			names[i] = "id"
			break
		}
		base := sanitize(v)
		name := base
		for n := 1; name == "id" || used[name]; n++ {
			name = base + "_" + strconv.Itoa(n)
		}
		used[name] = true
		names[i] = name
	}
	return names
}

func sanitize(v string) string {
	var b strings.Builder
	for i, c := range v {
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9' && i > 0:
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func expandTemplate(p docPath, names []string) string {
	var b strings.Builder
	v := 0
	for _, s := range p.segs {
		b.WriteByte('/')
		if s == "" {
			b.WriteString("{" + names[v] + "}")
			v++
		} else {
			b.WriteString(s)
		}
	}
	if p.trailing {
		b.WriteByte('/')
	}
	return b.String()
}

// mappedMethods are the methods the method map knows, in the order the
// document's path item lists them; TRACE and the rest are left out, so
// the gateway answers them 501.
var mappedMethods = []string{"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH"}

func methodsOf(item *openapi3.PathItem) []string {
	var out []string
	for _, m := range mappedMethods {
		if item.GetOperation(m) != nil {
			out = append(out, m)
		}
	}
	return out
}

// parentFormats reads the formats of a collection's parameters, by
// their names in its template.
func parentFormats(p docPath, names []string) map[string]policy.IDFormat {
	out := map[string]policy.IDFormat{}
	for i, v := range p.vars {
		if f := paramFormat(p.item, v); f != policy.IDAny {
			out[names[i]] = f
		}
	}
	return out
}

// paramFormat reads a path parameter's schema: integers, UUIDs, or any
// text. A 3.1 nullable ({type: [integer, null]}, anyOf with null) reads
// as its other type.
func paramFormat(item *openapi3.PathItem, name string) policy.IDFormat {
	s := pathParamSchema(item, name)
	if s == nil {
		return policy.IDAny
	}
	if len(s.AnyOf) > 0 || len(s.OneOf) > 0 {
		for _, alt := range slices.Concat(s.AnyOf, s.OneOf) {
			if alt.Value != nil && !alt.Value.Type.Is("null") {
				s = alt.Value
				break
			}
		}
	}
	types := slices.DeleteFunc(slices.Clone(s.Type.Slice()), func(t string) bool { return t == "null" })
	switch {
	case len(types) == 1 && types[0] == "integer":
		return policy.IDInteger
	case len(types) == 1 && types[0] == "string" && s.Format == "uuid":
		return policy.IDUUID
	}
	return policy.IDAny
}

// pathParamSchema finds the schema of the path parameter name: on the
// path item, or on its first operation that declares it.
func pathParamSchema(item *openapi3.PathItem, name string) *openapi3.Schema {
	lists := []openapi3.Parameters{item.Parameters}
	for _, m := range mappedMethods {
		if op := item.GetOperation(m); op != nil {
			lists = append(lists, op.Parameters)
		}
	}
	for _, params := range lists {
		for _, ref := range params {
			if p := ref.Value; p != nil && p.In == openapi3.ParameterInPath && p.Name == name && p.Schema != nil {
				return p.Schema.Value
			}
		}
	}
	return nil
}

// prefix is the configured prefix, or the path of the document's first
// servers url, variables at their defaults.
func (d *Document) prefix(configured *string) (string, error) {
	if configured != nil {
		return strings.TrimSuffix(*configured, "/"), nil
	}
	if len(d.model.Servers) == 0 {
		return "", nil
	}
	s := d.model.Servers[0]
	raw := s.URL
	for name, v := range s.Variables {
		raw = strings.ReplaceAll(raw, "{"+name+"}", v.Default)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", &Error{File: d.File, Pointer: "/servers/0/url", Msg: fmt.Sprintf("%v: fix the url, or set prefix", err)}
	}
	return strings.TrimSuffix(u.EscapedPath(), "/"), nil
}

// selected says whether a path is imported under include and exclude.
func selected(key string, opts Options) bool {
	if len(opts.Include) > 0 && !slices.ContainsFunc(opts.Include, func(p string) bool { return Glob(p, key) }) {
		return false
	}
	return !slices.ContainsFunc(opts.Exclude, func(p string) bool { return Glob(p, key) })
}

// Glob matches s against pattern, where * stands for any text, /
// included, and every other character for itself.
func Glob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// Spec declares the resource to the method map with settings s and g,
// over which it lays what the document says (id_format, restore_*): for
// a configuration that sets none of those itself. Derive then turns its
// batch operations on.
func (r Resource) Spec(s policy.Settings, g policy.GatewaySettings) policy.ResourceSpec {
	if f, err := policy.ParseIDFormat(r.IDFormat); err == nil {
		s.IDFormat = f
	}
	if v, err := policy.ParseRestoreUpdated(r.RestoreUpdated); err == nil {
		s.RestoreUpdated = v
	}
	if v, err := policy.ParseRestoreDeleted(r.RestoreDeleted); err == nil {
		s.RestoreDeleted = v
	}
	return policy.ResourceSpec{
		Path: r.Path, ItemPath: r.ItemPath, Formats: r.Formats,
		CollectionMethods: r.Collection, ItemMethods: r.Item,
		Settings: s, Gateway: g,
	}
}

// Route names the route of a path template: its literals, its variables
// as {} and no trailing slash, so that /users/{id}/ and /users/{user}
// are one route, as the method map matches them.
func Route(template string) string {
	segs := strings.Split(strings.Trim(template, "/"), "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			segs[i] = "{}"
		}
	}
	return "/" + strings.Join(segs, "/")
}
