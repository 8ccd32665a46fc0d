package policy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// docs/wire-format.md, "Method overrides": a method override, in any of its four forms, is found; forms
// that disagree are refused.
func TestFindMethodOverride(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, target string
		header       []string
		method, from string // "" when there is none
		err          string
	}{
		{name: "none", target: "/widgets?a=1"},
		{name: "X-HTTP-Method-Override", target: "/widgets", header: []string{"X-HTTP-Method-Override", "DELETE"}, method: "DELETE", from: "X-HTTP-Method-Override"},
		{name: "X-HTTP-Method", target: "/widgets", header: []string{"X-HTTP-Method", "PUT"}, method: "PUT", from: "X-HTTP-Method"},
		{name: "X-Method-Override", target: "/widgets", header: []string{"X-Method-Override", "PATCH"}, method: "PATCH", from: "X-Method-Override"},
		{name: "_method", target: "/widgets?a=1&_method=DELETE", method: "DELETE", from: "the _method parameter"},
		{name: "_method escaped", target: "/widgets?%5Fmethod=%44ELETE", method: "DELETE", from: "the _method parameter"},
		{name: "lower case, as Rails forms send it", target: "/widgets?_method=delete", method: "DELETE"},
		{name: "a dot, as PHP reads it", target: "/widgets?.method=DELETE", method: "DELETE"},
		{name: "a dot escaped", target: "/widgets?%2Emethod=DELETE", method: "DELETE"},
		{name: "a leading space PHP drops", target: "/widgets?+_method=DELETE", method: "DELETE"},
		{name: "leading spaces, then a dot", target: "/widgets?%20%20.method=DELETE", method: "DELETE"},
		{name: "a leading space alone is dropped, not read as _", target: "/widgets?%20method=DELETE"},
		{name: "spaces around", target: "/widgets", header: []string{"X-HTTP-Method-Override", " patch "}, method: "PATCH"},
		{name: "an unknown method is found, for the map to refuse", target: "/widgets", header: []string{"X-HTTP-Method", "BREW"}, method: "BREW"},
		{name: "an empty value is none", target: "/widgets?_method=", header: []string{"X-HTTP-Method-Override", ""}},
		{name: "forms that agree", target: "/widgets?_method=DELETE", header: []string{"X-HTTP-Method-Override", "DELETE", "X-Method-Override", "delete"}, method: "DELETE"},
		{name: "headers that disagree", target: "/widgets", header: []string{"X-HTTP-Method-Override", "GET", "X-HTTP-Method", "DELETE"}, err: "X-HTTP-Method-Override names GET but X-HTTP-Method names DELETE"},
		{name: "a header repeated with another value", target: "/widgets", header: []string{"X-HTTP-Method-Override", "GET", "X-HTTP-Method-Override", "DELETE"}, err: "names DELETE"},
		{name: "header and parameter disagree", target: "/widgets?_method=PUT", header: []string{"X-HTTP-Method-Override", "DELETE"}, err: "the _method parameter names PUT"},
		{name: "two parameters disagree", target: "/widgets?_method=GET&_method=DELETE", err: "send one method override, or none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, ok, err := FindMethodOverride(newRequest("POST", tt.target, tt.header...))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			equal(t, "found", ok, tt.method != "")
			equal(t, "method", o.Method, tt.method)
			if tt.from != "" {
				equal(t, "from", o.From, tt.from)
			}
		})
	}
}

// Every request on a configured path is looked at for an override: one
// that carries none, as nearly all do, costs no allocation.
func TestFindNoMethodOverrideDoesNotAllocate(t *testing.T) {
	// Not parallel: testing.AllocsPerRun panics in a parallel test.
	r := newRequest("GET", "/widgets/1?a=1", "Authorization", "Bearer t", "Accept", "application/json")
	if n := testing.AllocsPerRun(100, func() {
		if _, ok, err := FindMethodOverride(r); ok || err != nil {
			t.Fatal(ok, err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per request without an override, want 0", n)
	}
}

func TestRemoveMethodOverride(t *testing.T) {
	t.Parallel()
	r := newRequest("POST", "/widgets?a=1&_method=DELETE&b=%20&%5Fmethod=x&.method=x&+_method=x",
		"X-HTTP-Method-Override", "DELETE", "X-HTTP-Method", "DELETE", "X-Method-Override", "DELETE", "X-Other", "kept")
	RemoveMethodOverride(r)
	equal(t, "query", r.URL.RawQuery, "a=1&b=%20")
	equal(t, "RequestURI", r.RequestURI, "/widgets?a=1&b=%20")
	for _, name := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"} {
		if v := r.Header.Values(name); len(v) > 0 {
			t.Errorf("%s %q was kept", name, v)
		}
	}
	equal(t, "X-Other", r.Header.Get("X-Other"), "kept")
	if _, ok, _ := FindMethodOverride(r); ok {
		t.Error("an override is still found")
	}

	untouched := newRequest("GET", "/widgets?b=2&&a")
	RemoveMethodOverride(untouched)
	equal(t, "a query without _method", untouched.URL.RawQuery, "b=2&&a")
}

// JudgeMethod answers for the request's own method, and for an override
// as the method it names (docs/wire-format.md, "Method overrides"): 501 for a method the
// gateway does not know, 405 for one the route does not allow, 400 for an
// override on a request other than POST that names another method.
func TestJudgeMethod(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct {
		name, method, target string
		header               []string
		want                 MethodDecision
		detail               string
	}{
		{name: "own method allowed", method: "GET", target: "/api/reports/1", want: MethodDecision{Method: "GET"}},
		{name: "own method not allowed", method: "DELETE", target: "/api/reports/1", want: MethodDecision{Refusal: MethodNotAllowed},
			detail: "DELETE is not allowed on /api/reports/1; allowed: GET, HEAD, OPTIONS"},
		{name: "own method unknown", method: "BREW", target: "/api/reports/1", want: MethodDecision{Refusal: MethodNotImplemented},
			detail: "the gateway does not implement the method BREW"},
		{name: "override applied on a POST", method: "POST", target: "/api/users/1?_method=delete", want: MethodDecision{Method: "DELETE", Override: true}},
		{name: "override naming the request's own method", method: "GET", target: "/api/users/1", header: []string{"X-HTTP-Method", "GET"},
			want: MethodDecision{Method: "GET", Override: true}},
		{name: "override not allowed", method: "POST", target: "/api/reports", header: []string{"X-HTTP-Method-Override", "DELETE"},
			want: MethodDecision{Refusal: MethodNotAllowed}, detail: "DELETE (named by X-HTTP-Method-Override) is not allowed on /api/reports; allowed: GET, HEAD, OPTIONS"},
		{name: "override unknown", method: "POST", target: "/api/reports", header: []string{"X-HTTP-Method", "BREW"},
			want: MethodDecision{Refusal: MethodNotImplemented}, detail: "X-HTTP-Method names the method BREW, which the gateway does not implement"},
		{name: "override on a GET", method: "GET", target: "/api/users/1?_method=DELETE", want: MethodDecision{Refusal: InvalidMethodOverride},
			detail: "the _method parameter names DELETE on a GET request; a method override is honoured on POST only: send DELETE itself"},
		{name: "overrides that disagree", method: "POST", target: "/api/users/1?_method=PUT", header: []string{"X-HTTP-Method", "DELETE"},
			want: MethodDecision{Refusal: InvalidMethodOverride}, detail: "send one method override, or none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest(tt.method, tt.target, tt.header...)
			m, ok := p.Lookup(r.URL.EscapedPath())
			if !ok {
				t.Fatalf("no match for %s", tt.target)
			}
			got := m.JudgeMethod(r)
			if !strings.Contains(got.Detail, tt.detail) || tt.detail == "" && got.Detail != "" {
				t.Errorf("detail %q, want %q", got.Detail, tt.detail)
			}
			got.Detail = ""
			equal(t, "decision", got, tt.want)
		})
	}
}

// Judging a request that carries no override, as nearly all do, costs no
// allocation.
func TestJudgeMethodDoesNotAllocate(t *testing.T) {
	// Not parallel: testing.AllocsPerRun panics in a parallel test.
	m, _ := mustPolicy(t).Lookup("/api/users/1")
	r := newRequest("PUT", "/api/users/1?a=1", "Authorization", "Bearer t")
	if n := testing.AllocsPerRun(100, func() {
		if d := m.JudgeMethod(r); d.Refusal != MethodAccepted {
			t.Fatal(d)
		}
	}); n != 0 {
		t.Errorf("%v allocations per request without an override, want 0", n)
	}
}

// The header table's keys are what Go's header maps hold the names under.
func TestMethodOverrideHeaderKeys(t *testing.T) {
	t.Parallel()
	for _, h := range methodOverrideHeaders {
		equal(t, h.name+" key", h.key, http.CanonicalHeaderKey(h.name))
	}
}

// newRequest builds a client request; header holds name, value pairs.
func newRequest(method, target string, header ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
