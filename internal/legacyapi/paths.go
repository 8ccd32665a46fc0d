package legacyapi

// Routing: collections and items by path, nested collections, tenants
// chosen by the query, and the trailing-slash redirects of frameworks.

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

func checkCollectionPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path must start with /")
	case strings.HasSuffix(p, "/"):
		return fmt.Errorf("path must not end with /")
	case strings.Contains(p, "//"):
		return fmt.Errorf("path must not contain empty segments")
	case strings.ContainsAny(p, "?#"):
		return fmt.Errorf("path must not contain a query or fragment")
	}
	if _, err := url.PathUnescape(p); err != nil {
		return err
	}
	return nil
}

// isPattern reports whether a collection path has a "*" segment.
func isPattern(p string) bool {
	return slices.Contains(strings.Split(p, "/"), "*")
}

// matches reports whether the concrete collection path p is one the pattern
// serves: as many segments, each "*" matching any non-empty one.
func matches(pattern, p string) bool {
	ps, cs := strings.Split(pattern, "/"), strings.Split(p, "/")
	if len(ps) != len(cs) {
		return false
	}
	for i, seg := range ps {
		if seg != cs[i] && (seg != "*" || cs[i] == "") {
			return false
		}
	}
	return true
}

// collectionAt returns the collection served at the escaped collection path
// p: the declared one, or the one a pattern serves there, made on first use;
// nil when none is. Callers hold mu.
func (a *API) collectionAt(p string) *collection {
	if c := a.cols[p]; c != nil {
		return c
	}
	for _, pat := range a.patterns {
		if !matches(pat.Path, p) {
			continue
		}
		if pat.FastAPI {
			p = canonicalParents(pat.Path, p)
		}
		c := pat.concrete[p]
		if c == nil {
			c = &collection{Collection: pat.Collection, tables: map[string]*table{}, pattern: pat}
			c.Path = p
			pat.concrete[p] = c
		}
		return c
	}
	return nil
}

// parentExists reports whether a concrete collection of a pattern may be
// served: see Collection.Path. Callers hold mu.
func (a *API) parentExists(c *collection, r *http.Request) bool {
	if c.pattern == nil {
		return true
	}
	parentPath, seg := c.parentItem()
	parent := a.collectionAt(parentPath)
	if parent == nil {
		return true
	}
	id, ok := parent.itemID(seg)
	if !ok {
		return false
	}
	_, ok = parent.table(parent.tenant(r)).records[id]
	return ok
}

// parentItem is where a pattern's concrete collection's parent item is:
// the path of its collection, and the escaped segment the last "*"
// matched.
func (c *collection) parentItem() (collectionPath, seg string) {
	pat, segs := strings.Split(c.pattern.Path, "/"), strings.Split(c.Path, "/")
	last := len(pat) - 1
	for pat[last] != "*" {
		last--
	}
	return strings.Join(segs[:last], "/"), segs[last]
}

// route finds the collection a path names, and the item id when it names
// an item ("" for the collection itself): the unescaped segment, or with
// LenientIDs its canonical form. slash reports a trailing slash, which
// only a TrailingSlash collection's items may have. Callers hold mu.
func (a *API) route(path string) (c *collection, id string, slash bool) {
	trimmed, slash := strings.CutSuffix(path, "/")
	if c := a.collectionAt(trimmed); c != nil {
		return c, "", slash
	}
	i := strings.LastIndexByte(trimmed, '/')
	c = a.collectionAt(trimmed[:max(i, 0)])
	if c == nil || (slash && !c.TrailingSlash && !c.FastAPI) {
		return nil, "", false
	}
	id, ok := c.itemID(trimmed[i+1:])
	if !ok {
		return nil, "", false
	}
	return c, id, slash
}

// misrouted is what a framework's router answers before any route runs
// (TrailingSlash's APPEND_SLASH, FastAPI's redirect_slashes and its
// missing HEAD); false when the route runs.
func (c *collection) misrouted(r *http.Request, path string, item, slash bool) (response, bool) {
	switch {
	case c.TrailingSlash && !slash:
		return appendSlash(r, path), true
	case c.FastAPI && r.Method == http.MethodHead:
		if res, moved := fastAPIRedirect(r, path, item, slash); moved {
			return res, true
		}
		return fastAPINoHead(item), true
	case c.FastAPI:
		return fastAPIRedirect(r, path, item, slash)
	}
	return response{}, false
}

// appendSlash redirects a request to its path with a slash appended, as
// Django's APPEND_SLASH does.
func appendSlash(r *http.Request, path string) response {
	loc := sameQuery(r, origin(r)+path+"/")
	res := htmlPage(http.StatusMovedPermanently, "The resource has moved to "+loc+".")
	res.header.Set("Location", loc)
	return res
}

// sameQuery is loc with the query of r, as a redirect keeps it.
func sameQuery(r *http.Request, loc string) string {
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	return loc
}

// tenant is the tenant a request addresses.
func (c *collection) tenant(r *http.Request) string {
	if !c.Tenants {
		return ""
	}
	return r.URL.Query().Get("tenant")
}

// table returns the records of one tenant, making an empty set for a tenant
// not seen before. Callers hold mu.
func (c *collection) table(tenant string) *table {
	t := c.tables[tenant]
	if t == nil {
		t = &table{records: map[string]*record{}, nextID: firstAutoID}
		c.tables[tenant] = t
	}
	return t
}
