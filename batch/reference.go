package batch

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/policy"
)

// reference is "$<id>" (the id of the item that the operation with that
// id created or named) or "$<id>#<JSON pointer>" (that member of its
// answer's body, with its JSON type), in an envelope's url segment or body
// string.
type reference struct {
	operation int      // the index of the operation it names
	member    bool     // "#" was given: a member of the answer, not the id
	pointer   []string // the member's pointer, parsed
	text      string   // as the client wrote it
}

// parseReference reads a url segment or a body string. A string that
// starts with "$" followed by an operation id is a reference, and must
// name an earlier operation; "$$" starts a string that begins with a
// literal "$"; any other string is itself.
func parseReference(s string, names map[string]int) (reference, bool, error) {
	if !strings.HasPrefix(s, "$") || strings.HasPrefix(s, "$$") {
		return reference{}, false, nil
	}
	name, pointer, member := strings.Cut(s[1:], "#")
	if !validOperationID(name) {
		return reference{}, false, nil
	}
	j, ok := names[name]
	if !ok {
		return reference{}, false, fmt.Errorf("names %q, which is no earlier operation: a reference may name only an operation before it (write $$ for a string that starts with $)", name)
	}
	ref := reference{operation: j, member: member, text: s}
	if member {
		var err error
		if ref.pointer, err = jsonvalue.ParsePointer(pointer); err != nil {
			return reference{}, false, fmt.Errorf("is not a JSON pointer after #: %w", err)
		}
	}
	return ref, true, nil
}

// markReferences is a decoded body with every reference string replaced
// by its reference, and every "$$" string given back its one "$"; it
// reports the operations the body references.
func markReferences(v any, names map[string]int) (any, []int, error) {
	var deps []int
	marked, err := rebuild(v, func(leaf any) (any, error) {
		s, ok := leaf.(string)
		if !ok {
			return leaf, nil
		}
		if strings.HasPrefix(s, "$$") {
			return s[1:], nil
		}
		ref, isRef, err := parseReference(s, names)
		switch {
		case err != nil:
			return nil, fmt.Errorf("its body's string %q %w", s, err)
		case isRef:
			deps = append(deps, ref.operation)
			return ref, nil
		}
		return s, nil
	})
	return marked, deps, err
}

// rebuild copies a decoded JSON value, objects and arrays rebuilt, every
// other value replaced by what leaf makes of it.
func rebuild(v any, leaf func(any) (any, error)) (out any, err error) {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			if m[k], err = rebuild(e, leaf); err != nil {
				return nil, err
			}
		}
		return m, nil
	case []any:
		a := make([]any, len(v))
		for k, e := range v {
			if a[k], err = rebuild(e, leaf); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return leaf(v)
}

// filling fills in an operation's references from the items of the
// run that it references: their answers, which ended before the
// operation started (the graph waits for them).
type filling struct {
	plan *Plan
	// ended is the result of an operation by its index in the plan
	// (batchRun.result).
	ended func(int) *ItemResult
}

// url fills the references of the operation's url: it returns its
// target and its item's id, as target does.
func (f filling) url(eo *envelopeOperation) (*target, string, error) {
	path, err := eo.pathWith(func(ref reference) (string, error) {
		text, err := f.text(ref)
		if err == nil && badID(text) != "" {
			err = fmt.Errorf("%s is %q, which %s", ref.text, text, badID(text))
		}
		return text, err
	})
	if err != nil {
		return nil, "", err
	}
	m, ok := f.plan.lookup(path)
	// The same resource by its template: a job's lookup gives each
	// match a copy of it, with a job's settings (policy.Match.ForJob).
	if !ok || m.Resource.Collection.Plain() != eo.resource.Collection.Plain() || m.Item != (eo.kind != policy.OpCreate) {
		return nil, "", fmt.Errorf("its filled url %s is no longer a path of %s", path, eo.resource.Collection)
	}
	return eo.target(m)
}

// text is what a reference in a url segment stands for: an id, or a
// member that is a string or an integer.
func (f filling) text(ref reference) (string, error) {
	v, err := f.value(ref)
	if err != nil {
		return "", err
	}
	text, ok := jsonvalue.ID(v)
	if !ok {
		return "", fmt.Errorf("%s is a JSON %s, which cannot stand in a url: it must be a string or an integer", ref.text, jsonvalue.Kind(v))
	}
	return text, nil
}

// value is the JSON a reference stands for: the id of the operation's
// item as a string, or the member of its answer's body.
func (f filling) value(ref reference) (json.RawMessage, error) {
	// The operation referenced ended before this one started: the graph
	// waits for it.
	done := f.ended(ref.operation)
	if !ref.member {
		if done.ID == "" {
			return nil, fmt.Errorf("%s names operation %q, whose item's id is not known", ref.text, done.OperationID)
		}
		b, _ := json.Marshal(done.ID)
		return b, nil
	}
	if done.Body == nil {
		return nil, fmt.Errorf("%s names a member of operation %q's answer, which has no JSON body", ref.text, done.OperationID)
	}
	v, err := jsonvalue.At(done.Body, ref.pointer, ref.text)
	if err != nil {
		return nil, fmt.Errorf("operation %q's answer: %w", done.OperationID, err)
	}
	return v, nil
}

// body is a marked body (markReferences) with every reference
// filled in.
func (f filling) body(v any) (any, error) {
	return rebuild(v, func(leaf any) (any, error) {
		ref, ok := leaf.(reference)
		if !ok {
			return leaf, nil
		}
		raw, err := f.value(ref)
		if err != nil {
			return nil, err
		}
		return json.RawMessage(raw), nil
	})
}

// sentURL is the operation's url as its own request is sent, so that the
// answer shows what reached the legacy API: the item's path (its id
// canonical under id_format, references filled, item_path applied), or
// the collection's for a create, with the query the request carries.
// Until its references are filled (t is nil), it is the url as the
// client wrote it.
func (eo *envelopeOperation) sentURL(t *target, id string) string {
	if t == nil {
		return eo.url
	}
	path := t.collectionPath
	if t.kind != policy.OpCreate {
		path = t.paths.Path(id)
	}
	return joinNonEmpty("?", path, t.query)
}
