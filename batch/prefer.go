package batch

import (
	"iter"
	"net/http"
	"strings"

	"github.com/caddy-batch/caddy-batch/policy"
)

// preferences are the preferences of the client's Prefer headers (RFC
// 7240), in order: each one's name, and its value unquoted.
func preferences(h http.Header) iter.Seq2[string, string] {
	return func(yield func(name, value string) bool) {
		for _, line := range h.Values("Prefer") {
			for _, pref := range strings.Split(line, ",") {
				if !yield(parsePreference(pref)) {
					return
				}
			}
		}
	}
}

// parsePreference reads one preference of a Prefer list: its name, and
// its value unquoted; its parameters are dropped.
func parsePreference(pref string) (name, value string) {
	pref, _, _ = strings.Cut(pref, ";")
	name, value, _ = strings.Cut(pref, "=")
	return strings.TrimSpace(name), strings.Trim(strings.TrimSpace(value), `"`)
}

// preferredAtomicity reads "Prefer: atomicity=partial" (or
// all-or-nothing) from the client's headers; other preferences are left
// alone.
func preferredAtomicity(h http.Header) (policy.Atomicity, bool) {
	for name, value := range preferences(h) {
		if !strings.EqualFold(name, "atomicity") {
			continue
		}
		switch value {
		case "partial":
			return policy.Partial, true
		case "all-or-nothing", "all_or_nothing":
			return policy.AllOrNothing, true
		}
	}
	return 0, false
}

// withoutPreference drops the preference name from h's Prefer headers,
// keeping the others as they were written, and returns h.
func withoutPreference(h http.Header, name string) http.Header {
	var kept []string
	for _, line := range h.Values("Prefer") {
		var prefs []string
		for _, pref := range strings.Split(line, ",") {
			n, _ := parsePreference(pref)
			if pref = strings.TrimSpace(pref); pref != "" && !strings.EqualFold(n, name) {
				prefs = append(prefs, pref)
			}
		}
		if len(prefs) > 0 {
			kept = append(kept, strings.Join(prefs, ", "))
		}
	}
	h.Del("Prefer")
	for _, line := range kept {
		h.Add("Prefer", line)
	}
	return h
}

// preferenceApplied is the Preference-Applied value for a mode a client
// asked for.
func preferenceApplied(a policy.Atomicity) string {
	if a == policy.Partial {
		return "atomicity=partial"
	}
	return "atomicity=all-or-nothing"
}
