package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// position names an element in a problem's detail: "item 3" (an array's
// element, by its index from 0) or "line 4" (a JSON Lines body's, by its
// line from 1).
type position struct {
	noun string
	n    int
}

func itemAt(i int) position { return position{"item", i} }

func (p position) String() string { return fmt.Sprintf("%s %d", p.noun, p.n) }

// elementRules are the input rules of the elements of a CREATE or UPDATE
// body (docs/wire-format.md, "Bad input"), applied one element at a time:
// the same rules for a synchronous batch, which holds its body whole, and
// for a job, whose body streams past. They remember only what a later
// element is checked against: the ids an update has given.
type elementRules struct {
	op policy.Op
	s  policy.Settings
	// noun is how the problems name an element ("item", "line").
	noun string
	ids  idSet
}

func newElementRules(op policy.Op, s policy.Settings, noun string) *elementRules {
	return &elementRules{op: op, s: s, noun: noun, ids: idSet{}}
}

// item applies the rules to the element at n, and returns it as an Item
// (without its target, nor firstWithID). A create's Body is elem itself,
// trimmed: the caller gives an element the item may keep.
func (r *elementRules) item(n int, elem json.RawMessage) (Item, *problem.Details) {
	pos := position{r.noun, n}
	elem = bytes.Trim(elem, jsonSpace)
	if kind := jsonvalue.Kind(elem); kind != "object" {
		return Item{}, invalid("%v: must be a JSON object, not a JSON %s", pos, kind)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(elem, &members); err != nil {
		return Item{}, invalid("%v: %v", pos, err)
	}
	it := Item{Body: elem}
	idField := r.s.IDField
	rawID, hasID := members[idField]
	if hasID && string(rawID) == "null" {
		// Refused rather than read as no id: the client may mean "let the
		// API assign one" or have sent an id it failed to fill in, and
		// only the latter is worth a write to find out.
		if r.op == policy.OpUpdate {
			return Item{}, invalid("%v: its %s is null; give the id of the item to update, a string or an integer", pos, idField)
		}
		return Item{}, invalid("%v: its %s is null; leave the %s out for the API to assign one, or give a string or an integer", pos, idField, idField)
	}
	if !hasID {
		if r.op == policy.OpUpdate {
			return Item{}, invalid("%v: has no %q field, so there is no item to update", pos, idField)
		}
		return it, nil
	}
	id, ok := jsonvalue.ID(rawID)
	if !ok {
		what := "a JSON " + jsonvalue.Kind(rawID)
		if what == "a JSON number" {
			what = "the number " + string(rawID) + ", which has a fraction or an exponent"
		}
		return Item{}, invalid("%v: field %q must be a string or an integer, not %s", pos, idField, what)
	}
	id, prob := checkID(pos, id, r.s.IDFormat)
	if prob != nil {
		return Item{}, prob
	}
	it.ID = id
	if first, dup := r.ids.add(id, n); dup {
		return Item{}, invalid("%ss %d and %d both have id %q: each id may appear once in a batch %s", r.noun, first, n, id, r.op)
	}
	if r.op != policy.OpUpdate {
		return it, nil
	}
	delete(members, idField)
	for name := range members {
		it.fields = append(it.fields, name)
	}
	it.Body, _ = json.Marshal(members) // re-encoding decoded JSON cannot fail
	return it, nil
}

// idSet is the ids a body's elements gave, each with the position of the
// element that first gave it. It keeps 16 bytes of each id's SHA-256, not
// the id, so that a job of 100,000 items holds a few megabytes however
// long its ids are; two ids sharing those 128 bits are beyond any body's
// reach.
type idSet map[[16]byte]int

// add records id at n, unless it is there already: then it returns the
// first position that gave it, and true.
func (s idSet) add(id string, n int) (int, bool) {
	sum := sha256.Sum256([]byte(id))
	key := [16]byte(sum[:16])
	if first, dup := s[key]; dup {
		return first, true
	}
	s[key] = n
	return n, false
}
