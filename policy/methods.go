package policy

import (
	"net/http"
	"strings"
)

// MethodSet is a set of the standard methods a route can allow. A bit set
// keeps the per-request question "is this method allowed?" free of maps
// and allocations.
type MethodSet uint8

// The standard methods, in the order an Allow header lists them.
const (
	MethodGet MethodSet = 1 << iota
	MethodHead
	MethodPost
	MethodPut
	MethodPatch
	MethodDelete
	MethodOptions
)

var methodNames = [...]struct {
	bit  MethodSet
	name string
}{
	{MethodGet, http.MethodGet},
	{MethodHead, http.MethodHead},
	{MethodPost, http.MethodPost},
	{MethodPut, http.MethodPut},
	{MethodPatch, http.MethodPatch},
	{MethodDelete, http.MethodDelete},
	{MethodOptions, http.MethodOptions},
}

// ParseMethod returns the bit of a standard method. Method names are
// case-sensitive (RFC 9110, section 9.1), so "get" is not GET.
func ParseMethod(method string) (MethodSet, bool) {
	for _, m := range methodNames {
		if m.name == method {
			return m.bit, true
		}
	}
	return 0, false
}

// ParseMethods builds a set from method names as an operator writes them
// in a configuration; names are taken case-insensitively there, since
// "get" in a Caddyfile can only mean GET.
func ParseMethods(names []string) (MethodSet, error) {
	var set MethodSet
	for _, n := range names {
		bit, ok := ParseMethod(strings.ToUpper(n))
		if !ok {
			return 0, unknown("method", n, standardMethods())
		}
		set |= bit
	}
	return set, nil
}

func standardMethods() []string {
	names := make([]string, len(methodNames))
	for i, m := range methodNames {
		names[i] = m.name
	}
	return names
}

// Has reports whether every method of o is in s.
func (s MethodSet) Has(o MethodSet) bool { return s&o == o }

// withImplied adds what HTTP implies: HEAD wherever GET is allowed, and
// OPTIONS everywhere, since the gateway itself answers it.
func (s MethodSet) withImplied() MethodSet {
	if s.Has(MethodGet) {
		s |= MethodHead
	}
	return s | MethodOptions
}

// String lists the methods as an Allow header does: "GET, HEAD, OPTIONS".
func (s MethodSet) String() string {
	var b strings.Builder
	for _, m := range methodNames {
		if s.Has(m.bit) {
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			b.WriteString(m.name)
		}
	}
	return b.String()
}
