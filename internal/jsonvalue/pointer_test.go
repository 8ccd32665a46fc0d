package jsonvalue

import (
	"slices"
	"strings"
	"testing"
)

func TestParsePointer(t *testing.T) {
	for p, want := range map[string][]string{
		"":            nil,
		"/results":    {"results"},
		"/data/items": {"data", "items"},
		"/a~1b":       {"a/b"},
		"/m~0n":       {"m~n"},
		"/":           {""},
	} {
		got, err := ParsePointer(p)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %q, %v; want %q", p, got, err, want)
		}
	}
}

func TestParsePointerRefuses(t *testing.T) {
	for _, p := range []string{"results", "/a~", "/a~2b"} {
		if got, err := ParsePointer(p); err == nil {
			t.Errorf("%q: parsed as %q, want an error", p, got)
		}
	}
}

// Pointer escapes what ParsePointer unescapes: a token holding / or ~
// comes back whole.
func TestPointerRoundTrip(t *testing.T) {
	tokens := []string{"paths", "/users/{id}", "a~b", ""}
	p := Pointer(tokens...)
	if p != "/paths/~1users~1{id}/a~0b/" {
		t.Errorf("Pointer = %q", p)
	}
	if got, err := ParsePointer(p); err != nil || !slices.Equal(got, tokens) {
		t.Errorf("ParsePointer(%q) = %q, %v; want %q", p, got, err, tokens)
	}
}

func TestAt(t *testing.T) {
	doc := []byte(` {"data": {"items": [{"id": 1}, {"id": 2}]}, "n": 5} `)
	for _, c := range []struct {
		pointer, want, err string
	}{
		{"", `{"data": {"items": [{"id": 1}, {"id": 2}]}, "n": 5}`, ""},
		{"/data/items/1/id", "2", ""},
		{"/n", "5", ""},
		{"/nope", "", `has no member "nope" where p points`},
		{"/data/items/2", "", `has no element "2" where p points`},
		{"/data/items/01", "", `has no element "01" where p points`},
		{"/data/items/-", "", `has no element "-" where p points`},
		{"/data/items/+1", "", `has no element "+1" where p points`},
		{"/n/x", "", "is a JSON number where p points into it"},
	} {
		tokens, err := ParsePointer(c.pointer)
		if err != nil {
			t.Fatal(err)
		}
		v, err := At(doc, tokens, "p")
		switch {
		case c.err == "" && (err != nil || string(v) != c.want):
			t.Errorf("%q: %s, %v; want %s", c.pointer, v, err, c.want)
		case c.err != "" && (err == nil || err.Error() != c.err):
			t.Errorf("%q: %s, %v; want the error %q", c.pointer, v, err, c.err)
		}
	}
	if _, err := At([]byte(`{"a": `), []string{"a"}, "p"); err == nil || !strings.HasPrefix(err.Error(), "is not JSON: ") {
		t.Errorf("a broken document: %v, want is not JSON", err)
	}
}
