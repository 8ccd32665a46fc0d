package batch

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
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
// req to its own path with a trailing slash added or removed (Django REST
// framework's router redirects /api/authors/1 to /api/authors/1/): every
// request of the resource would meet the same redirect. It records the
// hint for the batch's WARN log line, and returns "" for any other
// answer.
func (sg *saga) movedHint(i int, req *SubRequest, resp *SubResponse) string {
	if resp == nil || !notCarriedOut(resp.Status) {
		return ""
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return ""
	}
	to, from := loc.EscapedPath(), req.Path
	res := sg.tgt(i).match.Resource
	var hint string
	switch {
	case to == from+"/":
		hint = fmt.Sprintf("the legacy API redirects %s to %s: declare the resource with a trailing slash, as %q (its items are then %q), so that the gateway sends the paths it serves",
			from, to, res.Collection.String()+"/", strings.TrimSuffix(res.Item.String(), "/")+"/")
	case to+"/" == from:
		hint = fmt.Sprintf("the legacy API redirects %s to %s: declare the resource without the trailing slash, as %q, so that the gateway sends the paths it serves",
			from, to, strings.TrimSuffix(res.Collection.String(), "/"))
	default:
		return ""
	}
	sg.warnOnce.Do(func() { sg.warning = hint })
	return hint
}
