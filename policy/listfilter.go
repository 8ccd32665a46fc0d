package policy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
)

// ListFilterSpec is a resource's list_filter block as configured: how the
// legacy API's LIST is asked for the items of a batch (docs/list-filter.md).
type ListFilterSpec struct {
	// Template is the query that selects ids: pairs joined by "&", one of
	// which holds {id} (repeated once per id) or {ids} (the ids joined by
	// commas).
	Template string
	// Items is the JSON pointer to the array in the LIST's answer; empty
	// is the answer itself.
	Items string
	// MaxIDs bounds the ids of one LIST; 0 is the default.
	MaxIDs int
	// Preflight reads the pre-images of batch updates and deletes through
	// the LIST too.
	Preflight bool
}

// DefaultListMaxIDs is how many ids one LIST asks for when max_ids is not
// set.
const DefaultListMaxIDs = 50

// ListFilter is a parsed list_filter: it builds the LIST queries of a
// batch's ids and says where its answers hold their items.
type ListFilter struct {
	// before and after are the pairs around the one that holds the ids,
	// as written; idPair is that pair split at its placeholder.
	before, after   []string
	prefix, suffix  string
	repeat          bool // {id}: the pair once per id; {ids}: once, ids joined
	itemsPointer    []string
	MaxIDs          int
	Preflight       bool
	template, items string
}

// CheckListMaxIDs refuses a list_filter's max_ids below 1. A
// configuration format that cannot carry a zero (in JSON it means "the
// default") calls it while it still has the value.
func CheckListMaxIDs(n int) error {
	if n >= 1 {
		return nil
	}
	return OptionError("max_ids", fmt.Errorf("list_filter's max_ids must be 1 or more, not %d: it is how many ids one LIST asks for (default %d)", n, DefaultListMaxIDs))
}

// ParseListFilter checks a list_filter block and builds it. Its errors
// name the option at fault (list_filter, items, max_ids).
func ParseListFilter(spec ListFilterSpec) (*ListFilter, error) {
	f := &ListFilter{MaxIDs: spec.MaxIDs, Preflight: spec.Preflight, template: spec.Template, items: spec.Items}
	var errs []error
	if f.MaxIDs == 0 {
		f.MaxIDs = DefaultListMaxIDs
	}
	if err := CheckListMaxIDs(f.MaxIDs); err != nil {
		errs = append(errs, err)
	}
	if err := f.parseTemplate(spec.Template); err != nil {
		errs = append(errs, OptionError("list_filter", err))
	}
	ptr, err := jsonvalue.ParsePointer(spec.Items)
	if err != nil {
		errs = append(errs, OptionError("items", fmt.Errorf("list_filter's items %q is not a JSON pointer (RFC 6901): %v; write it as /results, or leave it out when the answer is the array itself", spec.Items, err)))
	}
	f.itemsPointer = ptr
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return f, nil
}

func (f *ListFilter) parseTemplate(tmpl string) error {
	const example = `e.g. "id={id}" (json-server), "id__in={ids}" (django-filter), "filter[id]={ids}"`
	if tmpl == "" || strings.ContainsAny(tmpl, "?# ") {
		return fmt.Errorf("list_filter's query %q must be query pairs joined by &, without ? or # or spaces, %s", tmpl, example)
	}
	found := 0
	for _, pair := range strings.Split(tmpl, "&") {
		if pair == "" {
			return fmt.Errorf("list_filter's query %q has an empty pair: join its pairs with one &", tmpl)
		}
		n := strings.Count(pair, "{id}") + strings.Count(pair, "{ids}")
		switch {
		case n == 0 && found == 0:
			f.before = append(f.before, pair)
		case n == 0:
			f.after = append(f.after, pair)
		case n == 1 && found == 0:
			placeholder := "{ids}"
			if strings.Contains(pair, "{id}") {
				placeholder, f.repeat = "{id}", true
			}
			f.prefix, f.suffix, _ = strings.Cut(pair, placeholder)
		}
		found += n
	}
	if found != 1 {
		return fmt.Errorf("list_filter's query %q must hold exactly one {id} (repeated once per id) or {ids} (the ids joined by commas), not %d; %s", tmpl, found, example)
	}
	return nil
}

// Query is the filter's query for ids: each id query-escaped (a comma in
// an id is sent as %2C, so that a list of them stays splittable).
func (f *ListFilter) Query(ids []string) string {
	var b strings.Builder
	for _, p := range f.before {
		b.WriteString(p)
		b.WriteByte('&')
	}
	if f.repeat {
		for i, id := range ids {
			if i > 0 {
				b.WriteByte('&')
			}
			b.WriteString(f.prefix)
			b.WriteString(url.QueryEscape(id))
			b.WriteString(f.suffix)
		}
	} else {
		b.WriteString(f.prefix)
		for i, id := range ids {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(url.QueryEscape(id))
		}
		b.WriteString(f.suffix)
	}
	for _, p := range f.after {
		b.WriteByte('&')
		b.WriteString(p)
	}
	return b.String()
}

// Split groups ids for LISTs: at most MaxIDs ids a group, and no more
// than fit a query of room bytes (Query's length), except that an id too
// long to fit with any other goes alone. Lengths are counted as ids are
// added, never by building the query.
func (f *ListFilter) Split(ids []string, room int) [][]string {
	fixed := len(f.prefix) + len(f.suffix)
	for _, p := range f.before {
		fixed += len(p) + 1
	}
	for _, p := range f.after {
		fixed += len(p) + 1
	}
	var groups [][]string
	start, size := 0, fixed
	for i, id := range ids {
		cost := escapedLen(id)
		if i > start {
			cost++ // the & or , before it
			if f.repeat {
				cost += len(f.prefix) + len(f.suffix)
			}
		}
		if i > start && (i-start == f.MaxIDs || size+cost > room) {
			groups = append(groups, ids[start:i])
			start, size, cost = i, fixed, escapedLen(id)
		}
		size += cost
	}
	if start < len(ids) {
		groups = append(groups, ids[start:])
	}
	return groups
}

// escapedLen is len(url.QueryEscape(s)), without escaping it.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if c := s[i]; !unreservedQuery(c) && c != ' ' {
			n += 2 // %XX
		}
	}
	return n
}

// unreservedQuery reports whether url.QueryEscape leaves c as it is.
func unreservedQuery(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~'
}

// ItemsPointer is the parsed items pointer: the member names or array
// indices to follow from the answer to its array, none for the answer
// itself.
func (f *ListFilter) ItemsPointer() []string { return f.itemsPointer }
