package batch

import (
	"strings"
	"testing"
)

// docs/wire-format.md, "Method overrides": a method override, in any of its four forms, is found; forms
// that disagree are refused.
func TestFindMethodOverride(t *testing.T) {
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
			o, ok, err := FindMethodOverride(newRequest("POST", tt.target, "", tt.header...))
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
	r := newRequest("GET", "/widgets/1?a=1", "", "Authorization", "Bearer t", "Accept", "application/json")
	if n := testing.AllocsPerRun(100, func() {
		if _, ok, err := FindMethodOverride(r); ok || err != nil {
			t.Fatal(ok, err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per request without an override, want 0", n)
	}
}

func TestRemoveMethodOverride(t *testing.T) {
	r := newRequest("POST", "/widgets?a=1&_method=DELETE&b=%20&%5Fmethod=x", "",
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

	untouched := newRequest("GET", "/widgets?b=2&&a", "")
	RemoveMethodOverride(untouched)
	equal(t, "a query without _method", untouched.URL.RawQuery, "b=2&&a")
}

// docs/wire-format.md, "Method overrides": no sub-request carries a method override, whatever the
// client sent: not the headers, not _method in the query.
func TestSubRequestsCarryNoMethodOverride(t *testing.T) {
	override := []string{"X-HTTP-Method-Override", "POST", "X-HTTP-Method", "POST", "X-Method-Override", "POST"}
	tests := []struct {
		name, method, target, body string
		query                      string
	}{
		{name: "batch GET", method: "GET", target: "/widgets?_method=GET&ids=1,2&x=1", query: "x=1"},
		{name: "batch DELETE", method: "DELETE", target: "/widgets?ids=1,2&_method=DELETE", query: ""},
		{name: "batch CREATE", method: "POST", target: "/widgets?notify=0&_method=POST", body: elements(2), query: "notify=0"},
		{name: "batch UPDATE", method: "PATCH", target: "/widgets?_method=PATCH", body: `[{"id":"1","v":1},{"id":"2","v":2}]`, query: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// An update whose second item fails, so that preflight reads
			// and an undo are sent too.
			f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(409, `{}`))
			run(mustPlan(t, newRequest(tt.method, tt.target, tt.body, override...), concurrency(1), scopeQuery("notify")), f)
			log := f.log()
			if len(log) == 0 {
				t.Fatal("nothing was sent")
			}
			for _, c := range log {
				equal(t, c.String()+" query", c.RawQuery, tt.query)
				for i := 0; i < len(override); i += 2 {
					if v := c.Header.Values(override[i]); len(v) > 0 {
						t.Errorf("%s carries %s %q", c, override[i], v)
					}
				}
			}
		})
	}
}
