// Package jsonvalue reads JSON values as the gateway meets them in
// bodies: their kind, the id one names, whether two are the same value,
// a merge patch's result, and the value a JSON pointer (RFC 6901) names.
package jsonvalue

import (
	"bytes"
	"encoding/json"
	"reflect"
	"unicode/utf8"
)

// Kind names the kind of a JSON value from its first byte: "object",
// "array", "string", "boolean", "null", "number", or "nothing" for no
// value at all.
func Kind(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// ID returns the text of a string or integer id: 7 and "7" name the
// same item. A number with a fraction or an exponent is refused, not
// normalized: 1e3, 1.0 and 1000 are the same number but three different
// texts, and whichever one the gateway picked, the upstream's own JSON
// decoder might pick another item (or round 1.5e300 to something else).
func ID(raw json.RawMessage) (string, bool) {
	switch Kind(raw) {
	case "string":
		var s string
		return s, json.Unmarshal(raw, &s) == nil
	case "number":
		return string(raw), !bytes.ContainsAny(raw, ".eE")
	}
	return "", false
}

// MergePatch applies a JSON merge patch (RFC 7396) to an object: what an
// update should have left when its answer does not say.
func MergePatch(target, patch []byte) []byte {
	t, _ := Decode(target)
	pt, _ := Decode(patch)
	b, _ := json.Marshal(applyMerge(t, pt))
	return b
}

func applyMerge(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
		} else {
			t[k] = applyMerge(t[k], v)
		}
	}
	return t
}

// Decode decodes one JSON value, numbers as json.Number so that none is
// rounded, and reports whether b held exactly one.
func Decode(b []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return nil, false
	}
	return v, true
}

// Same reports whether two JSON texts hold the same value, whatever
// their spacing and member order.
func Same(a, b []byte) bool {
	va, oka := Decode(a)
	vb, okb := Decode(b)
	return oka && okb && reflect.DeepEqual(va, vb)
}

// WithoutMember returns the object without one member, or obj as it is
// when it is not an object.
func WithoutMember(obj []byte, name string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(obj, &m) != nil {
		return obj
	}
	delete(m, name)
	b, _ := json.Marshal(m)
	return b
}

// IsObject reports whether b is a JSON object a strict parser accepts.
func IsObject(b []byte) bool {
	return Kind(bytes.TrimSpace(b)) == "object" && Valid(b)
}

// Valid reports whether b is JSON a strict parser accepts: valid
// syntax, and valid UTF-8 inside its strings.
func Valid(b []byte) bool { return json.Valid(b) && utf8.Valid(b) }
