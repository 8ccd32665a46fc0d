package jsonvalue

import "testing"

func TestKind(t *testing.T) {
	for v, want := range map[string]string{
		``: "nothing", `{}`: "object", `[]`: "array", `"x"`: "string", `true`: "boolean",
		`false`: "boolean", `null`: "null", `-1`: "number", `2.5`: "number",
	} {
		if got := Kind([]byte(v)); got != want {
			t.Errorf("Kind(%s) = %s, want %s", v, got, want)
		}
	}
}

// An id is a string or an integer written as one: a number that another
// decoder might read as another item is refused.
func TestID(t *testing.T) {
	for raw, want := range map[string]string{`7`: "7", `"7"`: "7", `"a/b"`: "a/b", `-3`: "-3"} {
		if got, ok := ID([]byte(raw)); !ok || got != want {
			t.Errorf("ID(%s) = %q, %v; want %q", raw, got, ok, want)
		}
	}
	for _, raw := range []string{`1e3`, `1.0`, `true`, `null`, `{}`, `[1]`, ``} {
		if got, ok := ID([]byte(raw)); ok {
			t.Errorf("ID(%s) = %q, want none", raw, got)
		}
	}
}

func TestMergePatch(t *testing.T) {
	got := MergePatch([]byte(`{"a": 1, "b": {"c": 2, "d": 3}, "e": 4}`), []byte(`{"b": {"c": null, "x": 9}, "e": null, "f": [1]}`))
	if want := `{"a":1,"b":{"d":3,"x":9},"f":[1]}`; !Same(got, []byte(want)) {
		t.Errorf("MergePatch = %s, want %s", got, want)
	}
}

func TestSame(t *testing.T) {
	if !Same([]byte(`{"a": 1, "b": [1, 2]}`), []byte(`{"b":[1,2],"a":1}`)) {
		t.Error("the same value, spaced and ordered otherwise, is not Same")
	}
	for _, pair := range [][2]string{
		{`{"a": 1}`, `{"a": 1.0}`}, // not rounded: two texts of one number differ
		{`{"a": 1}`, `{"a": 1, "b": null}`},
		{`{"a": 1}`, `{"a": 1} {}`},
		{`{`, `{`},
	} {
		if Same([]byte(pair[0]), []byte(pair[1])) {
			t.Errorf("%s and %s are Same", pair[0], pair[1])
		}
	}
}

func TestWithoutMember(t *testing.T) {
	if got := WithoutMember([]byte(`{"id": 7, "name": "a"}`), "id"); string(got) != `{"name":"a"}` {
		t.Errorf("WithoutMember = %s", got)
	}
	if got := WithoutMember([]byte(`[1]`), "id"); string(got) != `[1]` {
		t.Errorf("WithoutMember of an array = %s, want it as it was", got)
	}
}

func TestIsObject(t *testing.T) {
	for b, want := range map[string]bool{
		` {"a": 1} `: true, `{"a": "\xff"}`: false, `{"a": 1`: false, `[{}]`: false, ``: false,
	} {
		if got := IsObject([]byte(b)); got != want {
			t.Errorf("IsObject(%q) = %v, want %v", b, got, want)
		}
	}
}
