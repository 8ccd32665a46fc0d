package batch

import (
	"net/http"
	"strings"

	"github.com/caddy-batch/caddy-batch/policy"
)

// preferredAtomicity reads "Prefer: atomicity=partial" (or
// all-or-nothing) from the client's headers (RFC 7240). Preference names
// are case-insensitive; the value may be quoted; other preferences are
// left alone.
func preferredAtomicity(h http.Header) (policy.Atomicity, bool) {
	for _, line := range h.Values("Prefer") {
		for _, pref := range strings.Split(line, ",") {
			pref, _, _ = strings.Cut(pref, ";")
			name, value, _ := strings.Cut(pref, "=")
			if !strings.EqualFold(strings.TrimSpace(name), "atomicity") {
				continue
			}
			switch strings.Trim(strings.TrimSpace(value), `"`) {
			case "partial":
				return policy.Partial, true
			case "all-or-nothing", "all_or_nothing":
				return policy.AllOrNothing, true
			}
		}
	}
	return 0, false
}

// preferenceApplied is the Preference-Applied value for a mode a client
// asked for.
func preferenceApplied(a policy.Atomicity) string {
	if a == policy.Partial {
		return "atomicity=partial"
	}
	return "atomicity=all-or-nothing"
}
