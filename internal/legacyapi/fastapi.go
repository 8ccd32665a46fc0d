package legacyapi

import (
	"net/http"
	"net/url"
	"strings"
)

// What an API written as FastAPI's tutorials write it does that other
// legacy APIs do not (Collection.FastAPI).

// fastAPIRedirect is Starlette's redirect_slashes for a collection
// routed at Path+"/" beside items at Path+"/{id}": a request for the
// other spelling is answered 307 to the routed one, query kept, with
// nothing applied; false when the path is the routed spelling.
func fastAPIRedirect(r *http.Request, path string, item, slash bool) (response, bool) {
	to := ""
	switch {
	case !item && !slash:
		to = path + "/"
	case item && slash:
		to = strings.TrimSuffix(path, "/")
	default:
		return response{}, false
	}
	loc := origin(r) + to
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	return response{status: http.StatusTemporaryRedirect, header: http.Header{"Location": {loc}}}, true
}

// fastAPINoHead is FastAPI's answer to a HEAD: its routes declare GET
// alone, so Starlette answers 405 with the route's methods, HEAD not
// among them.
func fastAPINoHead(item bool) response {
	allow := "GET, POST"
	if item {
		allow = "GET, PUT, PATCH, DELETE"
	}
	res := jsonAnswer(http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
	res.header.Set("Allow", allow)
	return res
}

// fastAPIInvalid is Pydantic's 422 for the API's one validation rule.
func fastAPIInvalid() response {
	return jsonAnswer(http.StatusUnprocessableEntity, map[string]any{"detail": []any{map[string]any{
		"loc": []string{"body", "name"}, "msg": "name must be a non-empty string", "type": "value_error",
	}}})
}

// canonicalParents spells each escaped segment of a pattern's concrete path that
// a "*" matched as an int path parameter is read ("020" is "20"), so that
// every spelling of a parent is one collection, as FastAPI's
// /users/{user_id}/items reads user_id: int. A segment that is no
// integer is kept, and then names no parent the parent collection has.
func canonicalParents(pattern, p string) string {
	pat, segs := strings.Split(pattern, "/"), strings.Split(p, "/")
	for i, seg := range pat {
		if seg != "*" {
			continue
		}
		if seg, err := url.PathUnescape(segs[i]); err == nil {
			if id, ok := intParam(seg); ok {
				segs[i] = id
			}
		}
	}
	return strings.Join(segs, "/")
}

// intParam reads a path segment as Pydantic reads an int: an optional
// sign, then decimal digits, leading zeros dropped.
func intParam(seg string) (string, bool) {
	seg = strings.TrimPrefix(seg, "+")
	if !isDigits(seg) {
		return "", false
	}
	if seg = strings.TrimLeft(seg, "0"); seg == "" {
		return "0", true
	}
	return seg, true
}
