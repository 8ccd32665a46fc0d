package batch

import (
	"github.com/caddy-batch/caddy-batch/policy"

	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// methodOverrideHeaders name a method for frameworks that let a client
// tunnel PUT, PATCH or DELETE through POST (Google's APIs, Rails,
// Express's method-override, Symfony, Laravel).
var methodOverrideHeaders = headerNames("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")

// MethodParam is the query parameter that does what the override
// headers do.
const MethodParam = policy.MethodParam

// MethodOverride is the method a request asks for with an override
// header or the _method parameter, and where it asked.
type MethodOverride struct {
	// Method is the named method, upper-cased: the frameworks that honour
	// an override upper-case it, and "delete" must not slip past a map
	// that refuses DELETE.
	Method string
	// From names the header or parameter, for an error message.
	From string
}

// FindMethodOverride returns the method r's overrides name; ok is false
// when it carries none (an empty value is none). Overrides that name
// different methods are an error: which one an upstream would honour is
// anyone's guess.
func FindMethodOverride(r *http.Request) (o MethodOverride, ok bool, err error) {
	consider := func(from, value string) error {
		value = strings.ToUpper(strings.TrimSpace(value))
		switch {
		case value == "":
		case !ok:
			o, ok = MethodOverride{Method: value, From: from}, true
		case value != o.Method:
			return fmt.Errorf("%s names %s but %s names %s: send one method override, or none", o.From, o.Method, from, value)
		}
		return nil
	}
	for _, h := range methodOverrideHeaders {
		for _, v := range r.Header[h.key] {
			if err := consider(h.name, v); err != nil {
				return MethodOverride{}, false, err
			}
		}
	}
	if r.URL != nil {
		err = eachParam(r.URL.RawQuery, func(_, key, value string) error {
			if key != MethodParam {
				return nil
			}
			if v, err := url.QueryUnescape(value); err == nil {
				value = v
			}
			return consider("the "+MethodParam+" parameter", value)
		})
		if err != nil {
			return MethodOverride{}, false, err
		}
	}
	return o, ok, nil
}

// RemoveMethodOverride deletes every method override from r, so that the
// handlers after the gateway, and the upstream, see the request only as
// the method the gateway judged.
func RemoveMethodOverride(r *http.Request) {
	for _, h := range methodOverrideHeaders {
		delete(r.Header, h.key)
	}
	if r.URL != nil {
		if q := withoutParam(r.URL.RawQuery, MethodParam); q != r.URL.RawQuery {
			r.URL.RawQuery = q
			r.RequestURI = r.URL.RequestURI()
		}
	}
}

// withoutParam returns the raw query without the parameter name, the
// other pairs as they were sent.
func withoutParam(rawQuery, name string) string {
	if !hasParam(rawQuery, name) {
		return rawQuery
	}
	var rest []string
	_ = eachParam(rawQuery, func(pair, key, _ string) error {
		if key != name {
			rest = append(rest, pair)
		}
		return nil
	})
	return strings.Join(rest, "&")
}
