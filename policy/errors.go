package policy

import (
	"errors"
	"fmt"
	"strings"
)

// Error is a configuration mistake, placed: a configuration written in
// lines (a Caddyfile) uses Resource and Option to point at the line that
// holds it, so its message never needs to say where it is.
type Error struct {
	// Resource is the index of the resource at fault among the specs, or
	// -1 for the handler's own options and the configuration as a whole.
	Resource int
	// Option is the option at fault, spelled as the Caddyfile spells it
	// ("item_path", "max_items", "atomicity create"); empty for the
	// resource's (or the handler's) declaration itself.
	Option string
	msg    string
}

func (e *Error) Error() string { return e.msg }

// OptionError places err in the named option of the handler; InResource
// moves it into a resource.
func OptionError(option string, err error) error {
	return &Error{Resource: -1, Option: option, msg: err.Error()}
}

func resourceErrorf(i int, path, option, format string, args ...any) *Error {
	return &Error{Resource: i, Option: option, msg: resourceName(i, path) + ": " + fmt.Sprintf(format, args...)}
}

// InResource places the mistakes err holds in resource i and names the
// resource in their messages, so that a JSON configuration's error says
// which resource it is about.
func InResource(i int, path string, err error) error {
	var out []error
	for _, e := range Flatten(err) {
		var pe *Error
		if errors.As(e, &pe) {
			out = append(out, &Error{Resource: i, Option: pe.Option, msg: resourceName(i, path) + ": " + pe.msg})
		} else {
			out = append(out, resourceErrorf(i, path, "", "%v", e))
		}
	}
	return errors.Join(out...)
}

// Flatten lists the single errors an errors.Join (however nested) holds.
func Flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Flatten(e)...)
		}
		return out
	}
	return []error{err}
}

func resourceName(i int, path string) string {
	if path == "" {
		return fmt.Sprintf("resources[%d]", i)
	}
	return "resource " + path
}

// unknown says that value is none of the names an option takes, and
// which one it most likely meant.
func unknown(what, value string, names []string) error {
	return fmt.Errorf("unknown %s %q (want %s)%s", what, value, orList(names), didYouMean(value, names))
}

// didYouMean returns ": did you mean X?" when one of names is a likely
// typo of s, or nothing.
func didYouMean(s string, names []string) string {
	if n := Nearest(s, names); n != "" {
		return ": did you mean " + n + "?"
	}
	return ""
}

// Nearest returns the name of names that s most likely misspells (one
// edit for every three characters, at least one; case aside), or "".
func Nearest(s string, names []string) string {
	best, bestDist := "", max(1, len(s)/3)+1
	for _, n := range names {
		if d := editDistance(strings.ToLower(s), strings.ToLower(n)); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// orList writes names as "a, b or c".
func orList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
