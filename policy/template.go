package policy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Template is a path template such as /api/users/{user}/posts: literal
// segments and whole-segment {name} variables, each of which may say what
// its values are, {user:integer}, so that every spelling of one parent
// names one item's lock (docs/configuration.md, "Templates").
type Template struct {
	raw string
	// plain is raw without its variables' formats (Plain).
	plain string
	segs  []segment
	// trailingSlash keeps the operator's trailing slash when a path is
	// built from the template: some APIs (Django's, for one) answer only
	// on /users/1/, and matching ignores it anyway.
	trailingSlash bool
}

type segment struct {
	literal string // unescaped; empty for a variable
	name    string // the variable's name; empty for a literal
	// format is what the variable's values are, written {name:format}
	// (formatted); IDAny (its text) when none is written.
	format    IDFormat
	formatted bool
}

// maxSegments bounds the depth of a template, and so the stack buffer a
// lookup splits a request path into.
const maxSegments = 32

// ParseTemplate parses a path template. Variables are whole segments,
// named with letters, digits and underscores; repeated slashes, dot
// segments and partial-segment braces are refused, since they would make
// a template that matches something other than what it reads as.
func ParseTemplate(s string) (Template, error) {
	t := Template{raw: s}
	switch {
	case s == "":
		return t, errors.New(`the template is empty: write the path, e.g. "/api/users"`)
	case !strings.HasPrefix(s, "/"):
		return t, fmt.Errorf("template %q must start with /: write %q", s, "/"+s)
	case strings.ContainsAny(s, "?#"):
		return t, fmt.Errorf("template %q holds a query or a fragment: a template is a path alone", s)
	}
	body := strings.TrimPrefix(s, "/")
	if strings.HasSuffix(body, "/") {
		t.trailingSlash = true
		body = strings.TrimSuffix(body, "/")
	}
	if body == "" {
		return t, fmt.Errorf(`template %q has no segment: write the collection's path, e.g. "/api/users"`, s)
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(body, "/") {
		open, close := strings.Count(part, "{"), strings.Count(part, "}")
		switch {
		case part == "":
			return t, fmt.Errorf("template %q has an empty segment (//): remove the extra slash", s)
		case part == "." || part == "..":
			return t, fmt.Errorf("template %q has a dot segment (%s): write the path it resolves to", s, part)
		case strings.Contains(part, "*"):
			return t, fmt.Errorf("template %q has a wildcard (%s), which templates do not have: name one segment with a variable instead, e.g. {name} (wildcards go in the batch directive's matcher)", s, part)
		case open != close || strings.Index(part, "}") < strings.Index(part, "{"):
			return t, fmt.Errorf("template %q: segment %q has unbalanced braces: a variable is a whole segment, {name}", s, part)
		case open == 1 && strings.HasPrefix(part, "{") && strings.HasSuffix(part, "}"):
			v, err := parseVariable(s, part)
			if err != nil {
				return t, err
			}
			if seen[v.name] {
				return t, fmt.Errorf("template %q uses variable {%s} twice: give each variable its own name", s, v.name)
			}
			seen[v.name] = true
			t.segs = append(t.segs, v)
		case open > 0:
			return t, fmt.Errorf("template %q: segment %q mixes a variable with text: a variable is a whole segment, {name}", s, part)
		default:
			lit, err := url.PathUnescape(part)
			if err != nil {
				return t, fmt.Errorf("template %q: segment %q has a bad percent-escape: %v", s, part, err)
			}
			t.segs = append(t.segs, segment{literal: lit})
		}
	}
	if len(t.segs) > maxSegments {
		return t, fmt.Errorf("template %q has more than %d segments, the most a template may have", s, maxSegments)
	}
	t.plain = withoutFormats(s)
	return t, nil
}

// parseVariable parses a variable segment, {name} or {name:format}. The
// id's format is id_format's to say, for every resource alike, so {id}
// takes none.
func parseVariable(template, part string) (segment, error) {
	name, format, hasFormat := strings.Cut(part[1:len(part)-1], ":")
	if !validName(name) {
		return segment{}, fmt.Errorf("template %q: variable %q must be named with letters, digits and underscores, not starting with a digit, e.g. {user_id}", template, part)
	}
	if !hasFormat {
		return segment{name: name}, nil
	}
	if name == idVariable {
		return segment{}, fmt.Errorf("template %q: variable %q: the id's format is id_format's to say: write {%s} and set id_format %s", template, part, idVariable, format)
	}
	f, err := parseFormat("format", format)
	if err != nil {
		return segment{}, fmt.Errorf("template %q: variable %q: %w", template, part, err)
	}
	return segment{name: name, format: f, formatted: true}, nil
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// variables returns the names of the template's variables, in order.
func (t Template) variables() []string {
	var names []string
	for _, s := range t.segs {
		if s.name != "" {
			names = append(names, s.name)
		}
	}
	return names
}

// formats returns the formats written for the template's variables, by
// name, {user:any} included; a variable written without one is not in it.
func (t Template) formats() map[string]IDFormat {
	out := map[string]IDFormat{}
	for _, s := range t.segs {
		if s.formatted {
			out[s.name] = s.format
		}
	}
	return out
}

// Plain returns the template as written without its variables' formats:
// {user:integer} is {user}, as an OpenAPI path names it. It is the
// resource's name in metrics, logs and stored records, which adding a
// format to a variable does not change.
func (t Template) Plain() string { return t.plain }

// withoutFormats drops the formats of a template's variables.
func withoutFormats(template string) string {
	if !strings.Contains(template, ":") {
		return template
	}
	parts := strings.Split(template, "/")
	for i, part := range parts {
		if name, _, ok := strings.Cut(part, ":"); ok && strings.HasPrefix(part, "{") {
			parts[i] = name + "}"
		}
	}
	return strings.Join(parts, "/")
}

// bind matches segs (as splitPath returns them) against t and returns the
// variables' values.
func (t Template) bind(segs []string) (map[string]string, bool) {
	if len(segs) != len(t.segs) {
		return nil, false
	}
	vars := make(map[string]string, len(t.segs))
	for i, s := range t.segs {
		switch {
		case s.name != "":
			vars[s.name] = segs[i]
		case s.literal != segs[i]:
			return nil, false
		}
	}
	return vars, true
}

// expand builds an escaped path from t, taking each variable's value from
// vars. Every value is escaped as one segment, so no value can add a
// segment or climb out of the template's path.
func (t Template) expand(vars map[string]string) string {
	var b strings.Builder
	for _, s := range t.segs {
		b.WriteByte('/')
		if s.name != "" {
			b.WriteString(url.PathEscape(vars[s.name]))
		} else {
			b.WriteString(url.PathEscape(s.literal))
		}
	}
	if t.trailingSlash {
		b.WriteByte('/')
	}
	return b.String()
}

// splitPath splits an escaped request path into unescaped segments,
// appending to buf. Empty segments are dropped and dot segments resolved,
// as Caddy's own path matching does, so that neither "/a//b" nor
// "/a/x/../b" slips past a method map that covers "/a/b". A segment is
// unescaped only when it holds a '%', so the common case allocates
// nothing. It reports false for a path that cannot be a resource's: a bad
// escape, a climb above the root, or more segments than any template has.
func splitPath(path string, buf []string) ([]string, bool) {
	segs := buf[:0]
	for len(path) > 0 {
		var seg string
		if i := strings.IndexByte(path, '/'); i >= 0 {
			seg, path = path[:i], path[i+1:]
		} else {
			seg, path = path, ""
		}
		if strings.IndexByte(seg, '%') >= 0 {
			u, err := url.PathUnescape(seg)
			if err != nil {
				return nil, false
			}
			seg = u
		}
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(segs) == 0 {
				return nil, false
			}
			segs = segs[:len(segs)-1]
			continue
		}
		if len(segs) == maxSegments {
			return nil, false
		}
		segs = append(segs, seg)
	}
	return segs, true
}
