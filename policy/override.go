package policy

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// methodOverrideHeaders name a method for frameworks that let a client
// tunnel PUT, PATCH or DELETE through POST (Google's APIs, Rails,
// Express's method-override, Symfony, Laravel). Each is looked up by its
// canonical key: indexing the header map with it spares Header.Get's
// canonicalization, which allocates for these names on every request.
var methodOverrideHeaders = [...]struct{ name, key string }{
	{"X-HTTP-Method-Override", "X-Http-Method-Override"},
	{"X-HTTP-Method", "X-Http-Method"},
	{"X-Method-Override", "X-Method-Override"},
}

// MethodParam is the query parameter that overrides a request's method,
// as Rails and Laravel forms send it.
const MethodParam = "_method"

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
	var f overrideFinder
	for _, h := range methodOverrideHeaders {
		for _, v := range r.Header[h.key] {
			if err := f.consider(h.name, v); err != nil {
				return MethodOverride{}, false, err
			}
		}
	}
	if r.URL != nil {
		if err := f.query(r.URL.RawQuery); err != nil {
			return MethodOverride{}, false, err
		}
	}
	return f.o, f.ok, nil
}

// FindQueryMethodOverride returns the method the _method parameters of
// rawQuery name, as FindMethodOverride reads them: for a url that has no
// headers of its own, an envelope operation's.
func FindQueryMethodOverride(rawQuery string) (o MethodOverride, ok bool, err error) {
	var f overrideFinder
	if err := f.query(rawQuery); err != nil {
		return MethodOverride{}, false, err
	}
	return f.o, f.ok, nil
}

// overrideFinder gathers the overrides of one request, so that two that
// disagree are caught wherever each was found.
type overrideFinder struct {
	o  MethodOverride
	ok bool
}

func (f *overrideFinder) consider(from, value string) error {
	value = strings.ToUpper(strings.TrimSpace(value))
	switch {
	case value == "":
	case !f.ok:
		f.o, f.ok = MethodOverride{Method: value, From: from}, true
	case value != f.o.Method:
		return fmt.Errorf("%s names %s but %s names %s: send one method override, or none", f.o.From, f.o.Method, from, value)
	}
	return nil
}

func (f *overrideFinder) query(rawQuery string) error {
	return EachParam(rawQuery, func(_, key, value string) error {
		if !IsMethodParam(key) {
			return nil
		}
		if v, err := url.QueryUnescape(value); err == nil {
			value = v
		}
		return f.consider("the "+MethodParam+" parameter", value)
	})
}

// RemoveMethodOverride deletes every method override from r, so that the
// handlers after the gateway, and the upstream, see the request only as
// the method the gateway judged.
func RemoveMethodOverride(r *http.Request) {
	RemoveMethodOverrideHeaders(r.Header)
	if r.URL != nil {
		if q := WithoutMethodParam(r.URL.RawQuery); q != r.URL.RawQuery {
			r.URL.RawQuery = q
			r.RequestURI = r.URL.RequestURI()
		}
	}
}

// RemoveMethodOverrideHeaders deletes the method override headers from
// h: a sub-request's method is the gateway's decision, and an override
// would let the upstream turn an item's GET into a DELETE.
func RemoveMethodOverrideHeaders(h http.Header) {
	for _, o := range methodOverrideHeaders {
		delete(h, o.key)
	}
}

// MethodRefusal says why the method map refuses a request's method.
type MethodRefusal uint8

const (
	// MethodAccepted: the request goes on.
	MethodAccepted MethodRefusal = iota
	// MethodNotImplemented: a method the gateway does not know (501).
	MethodNotImplemented
	// MethodNotAllowed: a method the matched route does not allow (405,
	// with Allow).
	MethodNotAllowed
	// InvalidMethodOverride: overrides that name different methods, or
	// an override on a request other than POST that names another
	// method (400).
	InvalidMethodOverride
)

// MethodDecision is the method map's word on a request's method, a
// method override considered.
type MethodDecision struct {
	// Method is the method the request goes on as: the one an override
	// names, or the request's own.
	Method string
	// Override is true when the request carried an override that is
	// applied: the gateway removes every override (RemoveMethodOverride)
	// and goes on as Method, so that the map, batch detection and the
	// upstream all see one method.
	Override bool
	// Refusal is why the request is refused; MethodAccepted when it is
	// not.
	Refusal MethodRefusal
	// Detail says why, for the problem's detail, when it is refused.
	Detail string
}

// JudgeMethod judges r's method on the matched route: a method override
// (a header, or the _method parameter) as the method it names, else the
// request's own method. It allocates nothing for a request it accepts
// that carries no override.
//
// Only a POST is turned into another method, as Rails, Symfony and
// Laravel do: a link or an image can make a browser send a GET with
// ?_method=DELETE, but not a POST.
func (m Match) JudgeMethod(r *http.Request) MethodDecision {
	o, ok, err := FindMethodOverride(r)
	switch {
	case err != nil:
		return MethodDecision{Refusal: InvalidMethodOverride, Detail: err.Error()}
	case !ok:
		return m.judge(r.Method, "")
	}
	d := m.judge(o.Method, o.From)
	switch {
	case d.Refusal != MethodAccepted:
		return d
	case o.Method != r.Method && r.Method != http.MethodPost:
		return MethodDecision{Refusal: InvalidMethodOverride,
			Detail: fmt.Sprintf("%s names %s on a %s request; a method override is honoured on POST only: send %s itself",
				o.From, o.Method, r.Method, o.Method)}
	}
	d.Override = true
	return d
}

// judge tells whether the route allows method; namedBy is the override
// that names it, or "" for the request's own method.
func (m Match) judge(method, namedBy string) MethodDecision {
	bit, standard := ParseMethod(method)
	switch {
	case !standard && namedBy == "":
		return MethodDecision{Refusal: MethodNotImplemented, Detail: "the gateway does not implement the method " + method}
	case !standard:
		return MethodDecision{Refusal: MethodNotImplemented,
			Detail: fmt.Sprintf("%s names the method %s, which the gateway does not implement", namedBy, method)}
	case !m.Methods().Has(bit):
		named := method
		if namedBy != "" {
			named += " (named by " + namedBy + ")"
		}
		return MethodDecision{Refusal: MethodNotAllowed,
			Detail: fmt.Sprintf("%s is not allowed on %s; allowed: %s", named, m.path, m.Allow())}
	}
	return MethodDecision{Method: method}
}
