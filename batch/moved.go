package batch

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/caddy-batch/caddy-batch/policy"
)

// notCarriedOut reports whether an answer says the request was not
// carried out at its URL (RFC 9110, 15.4): 301, 307 and 308 send it
// elsewhere unapplied. A 302 or 303 may follow a write that was carried
// out, which is why only these three make a write's item failed rather
// than unknown.
func notCarriedOut(status int) bool {
	return status == http.StatusMovedPermanently || status == http.StatusTemporaryRedirect || status == http.StatusPermanentRedirect
}

// movedHint says how to declare the resource when the upstream redirected
// req to its own path with a trailing slash added or removed: every
// request of the resource would meet the same redirect. Frameworks
// disagree about the slash, and not always with themselves: Django REST
// framework's router wants it on the collection and its items, FastAPI's
// tutorials on the collection alone (/users/ beside /users/{id}). So the
// advice changes only the side that redirected, the collection's path
// for a request to the collection and item_path for one to an item, and
// pins the other side as it is with item_path: followed, it never makes
// the side that worked redirect (docs/legacy-apis.md, "Trailing
// slashes"). It returns "" for any other answer.
func (t *target) movedHint(req *SubRequest, resp *SubResponse) string {
	if resp == nil || !notCarriedOut(resp.Status) {
		return ""
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return ""
	}
	to, from := loc.EscapedPath(), req.Path
	var wanted func(string) string
	var change string
	switch {
	case to == from+"/":
		wanted, change = withSlash, "a trailing slash added"
	case to+"/" == from:
		wanted, change = withoutSlash, "the trailing slash removed"
	default:
		return ""
	}
	coll, item := t.match.Resource.Collection.String(), t.match.Resource.Item.String()
	if from == t.collectionPath {
		coll = wanted(coll)
	} else {
		item = wanted(item)
	}
	hint := fmt.Sprintf("the legacy API redirects %s to %s (%s): declare the resource as `%s`, so that the gateway sends the paths it serves",
		from, to, change, declaration(coll, item))
	return hint
}

func withSlash(template string) string    { return withoutSlash(template) + "/" }
func withoutSlash(template string) string { return strings.TrimSuffix(template, "/") }

// declaration is how the Caddyfile declares a resource of these two
// templates: item_path only where it is not the collection's default.
func declaration(collection, item string) string {
	if item == policy.DefaultItemPath(collection) {
		return "resource " + collection
	}
	return "resource " + collection + " { item_path " + item + " }"
}

// firstWarning is what the operator should fix in the configuration,
// found while a batch ran (movedHint), for its WARN log line: the first
// found stands.
type firstWarning struct {
	once sync.Once
	text string
}

// note keeps warning if it is the first, and returns it.
func (w *firstWarning) note(warning string) string {
	if warning != "" {
		w.once.Do(func() { w.text = warning })
	}
	return warning
}
