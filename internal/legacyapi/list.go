package legacyapi

// LIST: the collection's items, filtered by id as json-server does, and
// paged where the collection pages.

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// list answers a LIST: every item the query selects, a page of them
// (PageSize), or the slice offset and limit ask for.
func (c *collection) list(t *table, r *http.Request) response {
	keys := c.listed(t, r)
	if c.PageSize > 0 {
		return c.page(t, r, keys)
	}
	q := r.URL.Query()
	offset, ok1 := queryInt(q, "offset", 0)
	limit, ok2 := queryInt(q, "limit", -1)
	if !ok1 || !ok2 {
		return plain(http.StatusBadRequest, "offset and limit must be non-negative integers")
	}
	keys = keys[min(offset, len(keys)):]
	if limit >= 0 {
		keys = keys[:min(limit, len(keys))]
	}
	return jsonAnswer(http.StatusOK, c.elements(t, r, keys))
}

// listed is the ids of the records a LIST answers, in order: filtered by
// FilterParam, without the Hidden ones. Callers hold mu.
func (c *collection) listed(t *table, r *http.Request) []string {
	var keys []string
	if ids, filtered := c.filterIDs(r); filtered {
		for _, id := range ids {
			if _, ok := t.records[id]; ok && !slices.Contains(keys, id) {
				keys = append(keys, id)
			}
		}
	} else {
		keys = make([]string, 0, len(t.records))
		for k := range t.records {
			keys = append(keys, k)
		}
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return slices.Contains(c.Hidden, k) })
	slices.SortFunc(keys, compareIDs)
	return keys
}

// filterIDs reads the ids the LIST's filter asks for, and whether it
// asks: see Collection.FilterParam.
func (c *collection) filterIDs(r *http.Request) ([]string, bool) {
	if c.FilterParam == "" {
		return nil, false
	}
	var ids []string
	filtered := false
	for _, pair := range strings.Split(r.URL.RawQuery, "&") {
		rawKey, value, _ := strings.Cut(pair, "=")
		if key, err := url.QueryUnescape(rawKey); err != nil || key != c.FilterParam {
			continue
		}
		filtered = true
		parts := []string{value}
		if c.FilterComma {
			parts = strings.Split(value, ",")
		}
		for _, part := range parts {
			if id, err := url.QueryUnescape(part); err == nil && id != "" {
				ids = append(ids, id)
			}
		}
	}
	return ids, filtered
}

// elements are the LIST's records of keys, shaped by SelectParam.
// Callers hold mu.
func (c *collection) elements(t *table, r *http.Request, keys []string) []any {
	sel := c.selected(r)
	list := make([]any, len(keys))
	for i, k := range keys {
		list[i] = only(t.records[k].fields, sel)
	}
	return list
}

// page answers one page of the LIST: see Collection.PageSize. Callers
// hold mu.
func (c *collection) page(t *table, r *http.Request, keys []string) response {
	q := r.URL.Query()
	number, ok1 := queryInt(q, "page", 1)
	size, ok2 := queryInt(q, "page_size", c.PageSize)
	if !ok1 || !ok2 || number < 1 || size < 1 {
		return plain(http.StatusBadRequest, "page and page_size must be positive integers")
	}
	if c.MaxPageSize > 0 {
		size = min(size, c.MaxPageSize)
	}
	start := (number - 1) * size
	if start >= len(keys) && number > 1 {
		return htmlPage(http.StatusNotFound, "Invalid page.")
	}
	end := min(start+size, len(keys))
	link := func(n int) any {
		q.Set("page", strconv.Itoa(n))
		return origin(r) + r.URL.EscapedPath() + "?" + q.Encode()
	}
	var next, previous any
	if end < len(keys) {
		next = link(number + 1)
	}
	if number > 1 {
		previous = link(number - 1)
	}
	return jsonAnswer(http.StatusOK, map[string]any{
		"count": len(keys), "next": next, "previous": previous, "results": c.elements(t, r, keys[start:end]),
	})
}
