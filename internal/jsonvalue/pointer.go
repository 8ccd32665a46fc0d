package jsonvalue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ParsePointer parses a JSON pointer (RFC 6901) into its unescaped
// reference tokens; the empty pointer, which names the whole value, has
// none.
func ParsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, errors.New("it must start with /")
	}
	var tokens []string
	for _, tok := range strings.Split(p[1:], "/") {
		for i := 0; i < len(tok); i++ {
			if tok[i] == '~' && (i+1 == len(tok) || tok[i+1] != '0' && tok[i+1] != '1') {
				return nil, fmt.Errorf("~ must be followed by 0 or 1 (at %q)", tok)
			}
		}
		tokens = append(tokens, unescape.Replace(tok))
	}
	return tokens, nil
}

// Pointer escapes reference tokens into a JSON pointer: ParsePointer's
// inverse.
func Pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(escape.Replace(t))
	}
	return b.String()
}

var (
	escape   = strings.NewReplacer("~", "~0", "/", "~1")
	unescape = strings.NewReplacer("~1", "/", "~0", "~")
)

// At returns the value a parsed pointer names in doc. When it names
// none, the error says why, worded to follow the document's name, with
// what naming the pointer: "the answer " + err.Error() reads "the answer
// has no member "id" where items points".
func At(doc []byte, pointer []string, what string) (json.RawMessage, error) {
	raw := json.RawMessage(bytes.TrimSpace(doc))
	for _, tok := range pointer {
		switch Kind(raw) {
		case "object":
			var members map[string]json.RawMessage
			if err := json.Unmarshal(raw, &members); err != nil {
				return nil, fmt.Errorf("is not JSON: %w", err)
			}
			v, ok := members[tok]
			if !ok {
				return nil, fmt.Errorf("has no member %q where %s points", tok, what)
			}
			raw = bytes.TrimSpace(v)
		case "array":
			var elems []json.RawMessage
			if err := json.Unmarshal(raw, &elems); err != nil {
				return nil, fmt.Errorf("is not JSON: %w", err)
			}
			n, ok := arrayIndex(tok)
			if !ok || n >= len(elems) {
				return nil, fmt.Errorf("has no element %q where %s points", tok, what)
			}
			raw = bytes.TrimSpace(elems[n])
		default:
			return nil, fmt.Errorf("is a JSON %s where %s points into it", Kind(raw), what)
		}
	}
	return raw, nil
}

// arrayIndex reads a reference token as an index into an array: digits,
// with no leading zero.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || len(tok) > 1 && tok[0] == '0' || strings.TrimLeft(tok, "0123456789") != "" {
		return 0, false // RFC 6901: digits only, so no sign, no space
	}
	n, err := strconv.Atoi(tok)
	return n, err == nil && n >= 0
}
