package batch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"unicode/utf8"

	"github.com/caddy-batch/caddy-batch/policy"
)

// What the saga reads and compares in JSON bodies: elements, answers,
// pre-images and proofs.

// jsonKind names the kind of a JSON value from its first byte.
func jsonKind(v []byte) string {
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

// idFromJSON returns the text of a string or integer id: 7 and "7" name
// the same item. A number with a fraction or an exponent is refused, not
// normalized: 1e3, 1.0 and 1000 are the same number but three different
// texts, and whichever one the gateway picked, the upstream's own JSON
// decoder might pick another item (or round 1.5e300 to something else).
func idFromJSON(raw json.RawMessage) (string, bool) {
	switch jsonKind(raw) {
	case "string":
		var s string
		return s, json.Unmarshal(raw, &s) == nil
	case "number":
		return string(raw), !bytes.ContainsAny(raw, ".eE")
	}
	return "", false
}

// mergePatch applies a JSON merge patch (RFC 7396) to an object: what an
// update should have left when its answer does not say.
func mergePatch(target, patch []byte) []byte {
	t, _ := decodeJSON(target)
	pt, _ := decodeJSON(patch)
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

func decodeJSON(b []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil || dec.More() {
		return nil, false
	}
	return v, true
}

// sameJSON reports whether two JSON texts hold the same value, whatever
// their spacing and member order.
func sameJSON(a, b []byte) bool {
	va, oka := decodeJSON(a)
	vb, okb := decodeJSON(b)
	return oka && okb && reflect.DeepEqual(va, vb)
}

// holdsMembers reports whether the object have holds every member of the
// object want with the same value, skip aside.
func holdsMembers(have, want []byte, skip string) bool {
	h, ok1 := decodeJSON(have)
	w, ok2 := decodeJSON(want)
	hm, ok3 := h.(map[string]any)
	wm, ok4 := w.(map[string]any)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return false
	}
	for k, v := range wm {
		if k != skip && !reflect.DeepEqual(hm[k], v) {
			return false
		}
	}
	return true
}

// withoutMember returns the object without one member.
func withoutMember(obj []byte, name string) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(obj, &m) != nil {
		return obj
	}
	delete(m, name)
	b, _ := json.Marshal(m)
	return b
}

func isObject(b []byte) bool {
	return jsonKind(bytes.TrimSpace(b)) == "object" && validJSON(b)
}

// validJSON reports whether b is JSON a strict parser accepts: valid
// syntax, and valid UTF-8 inside its strings.
func validJSON(b []byte) bool { return json.Valid(b) && utf8.Valid(b) }

// valueAt is the value a parsed JSON pointer (RFC 6901) names in body, or
// why there is none; what names the pointer in the reason.
func valueAt(body []byte, pointer []string, what string) (json.RawMessage, string) {
	raw := json.RawMessage(bytes.TrimSpace(body))
	for _, tok := range pointer {
		switch jsonKind(raw) {
		case "object":
			var members map[string]json.RawMessage
			if err := json.Unmarshal(raw, &members); err != nil {
				return nil, "the answer is not JSON: " + err.Error()
			}
			v, ok := members[tok]
			if !ok {
				return nil, fmt.Sprintf("the answer has no member %q where %s points", tok, what)
			}
			raw = bytes.TrimSpace(v)
		case "array":
			var elems []json.RawMessage
			if err := json.Unmarshal(raw, &elems); err != nil {
				return nil, "the answer is not JSON: " + err.Error()
			}
			n, ok := policy.ArrayIndex(tok)
			if !ok || n >= len(elems) {
				return nil, fmt.Sprintf("the answer has no element %q where %s points", tok, what)
			}
			raw = bytes.TrimSpace(elems[n])
		default:
			return nil, fmt.Sprintf("the answer is a JSON %s where %s points into it", jsonKind(raw), what)
		}
	}
	return raw, ""
}
