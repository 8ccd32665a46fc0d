package batch

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Undo is the compensation of one item's write, computed as data when the
// write is answered (or, for a write whose outcome was unknown, when the
// saga learned what it did): what to send, and what must be proved before
// it is sent, so that an undo never destroys what the batch did not
// write.
type Undo struct {
	Method string
	Path   string // escaped; the batch's query goes with it
	Body   []byte
	// IfMatch makes the undo conditional on the strong ETag the batch's
	// own write was answered with: the upstream itself then proves that
	// the item is as the batch left it.
	IfMatch string
	// IfNoneMatch "*" makes a re-create conditional on the item being
	// absent.
	IfNoneMatch string
	// Proof is what a read of the item must show first; nil when the
	// undo's condition is proof enough.
	Proof *Proof
	// WantID is the id a re-create by POST must come back under.
	WantID string
}

// Proof is what a read of an item must show before its undo is sent.
type Proof struct {
	// Absent: the item must be missing (404 or 410): a re-create must not
	// overwrite an item someone made since.
	Absent bool
	// Expect is the item as the batch left it: the read must equal it,
	// or, with Subset, hold each of its members (when Expect was built
	// from what the batch sent rather than read from the upstream).
	Expect json.RawMessage
	Subset bool
	// ETag is the strong ETag the batch's write was answered with: a read
	// that carries it proves the item as the batch left it, whatever its
	// body.
	ETag string
	// GoneIsUndone counts an item that is already missing as undone: what
	// the batch created was deleted by someone else. Without it a missing
	// item proves nothing: the create may have put it elsewhere.
	GoneIsUndone bool
}

// undoOf computes the undo of the item's write from its answer, or
// says why there can be none. An answer that is the item (namesItem) is
// the item as the write left it, whatever the legacy API normalised or
// ignored; only an answer that is not falls back to what was sent. A
// strong ETag on the answer becomes the undo's condition, and replaces
// the proof read only where the upstream enforces conditions
// (conditional_writes).
func (st *itemState) undoOf(it *ItemResult, resp *SubResponse) (*Undo, string) {
	t := st.tgt
	var u *Undo
	var expect []byte // the item as the write left it, if the answer says
	var sent []byte   // what the write sent, when the answer does not say
	switch t.kind {
	case policy.OpCreate:
		if it.ID == "" {
			return nil, fmt.Sprintf("the created item cannot be deleted: the upstream named no id (no Location naming an item of %s, no %q in the body)", t.collectionPath, t.settings.IDField)
		}
		u = &Undo{Method: http.MethodDelete, Path: st.tgt.paths.Path(it.ID)}
		if resp.Status == http.StatusAccepted {
			// A 202's body and validators describe the pending request,
			// not the item.
			u.Proof = &Proof{Expect: jsonvalue.WithoutMember(st.body, t.settings.IDField), Subset: true}
			return u, ""
		}
		sent = jsonvalue.WithoutMember(st.body, t.settings.IDField)
	case policy.OpUpdate:
		u = st.restore(it.ID)
		sent = st.updated()
	case policy.OpDelete:
		return st.recreate(it.ID), ""
	default:
		return nil, "a read needs no undo"
	}
	if st.namesItem(resp.Body, it.ID) {
		expect = resp.Body
	}
	etag := strongETag(resp.Header)
	u.IfMatch = etag
	if etag != "" && t.settings.ConditionalWrites {
		return u, ""
	}
	u.Proof = &Proof{ETag: etag, Expect: expect}
	if expect == nil {
		u.Proof.Expect, u.Proof.Subset = sent, true
	}
	// What a create made under an id the upstream named is undone if
	// someone deleted it since; under the element's own id, a missing
	// item proves nothing (the upstream may have put it elsewhere).
	u.Proof.GoneIsUndone = t.kind == policy.OpCreate && st.idNamedByAPI()
	return u, ""
}

// namesItem reports whether an answer's body is item id itself: a JSON
// object whose id field names it. Such a body is the item as the
// upstream stored it; a body that is not ({}, a status object, nothing)
// says nothing of the item.
func (st *itemState) namesItem(body []byte, id string) bool {
	return id != "" && jsonvalue.IsObject(body) && st.tgt.idOf(body) == id
}

// restore is the undo of an update: the pre-image put back whole (PUT),
// or the changed fields' old values (PATCH).
func (st *itemState) restore(id string) *Undo {
	path := st.tgt.paths.Path(id)
	if st.tgt.settings.RestoreUpdated == policy.RestorePatch {
		return &Undo{Method: http.MethodPatch, Path: path, Body: restorePatch(st.preimage, st.restoredFields(), st.body)}
	}
	return &Undo{Method: http.MethodPut, Path: path, Body: st.preimage}
}

// updated is the item as an update should have left it when its answer
// does not say: the pre-image merged with the patch, or what a PUT sent.
// A member the patch removed (null) stays in it as null, so that a proof
// member by member (differing) asks that it be gone still, and a value
// another writer gave it since fails the proof.
func (st *itemState) updated() []byte {
	if st.tgt.replaces() {
		return st.body
	}
	merged := jsonvalue.MergePatch(st.preimage, st.body)
	pm, ok := decodeObject(st.body)
	mm, isObject := decodeObject(merged)
	if !ok || !isObject {
		return merged
	}
	for k, v := range pm {
		if v == nil {
			mm[k] = nil
		}
	}
	b, err := json.Marshal(mm)
	if err != nil {
		return merged
	}
	return b
}

// restoredFields are the members a PATCH restore puts back: those the
// update sent, and for a PUT, which replaced the whole item, those the
// pre-image had too.
func (st *itemState) restoredFields() []string {
	fields := st.fields
	if !st.tgt.replaces() {
		return fields
	}
	var before map[string]json.RawMessage
	_ = json.Unmarshal(st.preimage, &before) // the preflight checked it is an object
	for name := range before {
		if !slices.Contains(fields, name) {
			fields = append(slices.Clip(fields), name)
		}
	}
	return fields
}

// recreate is the undo of a delete: the pre-image created again, only
// where the item is still absent. A PUT carries If-None-Match: *, which
// is proof enough when the upstream enforces conditions
// (conditional_writes) and showed it knows validators (the preflight read
// a strong ETag); otherwise, and for a POST, a read proves the item
// absent first.
func (st *itemState) recreate(id string) *Undo {
	t := st.tgt
	if t.settings.RestoreDeleted == policy.RestorePost {
		return &Undo{Method: http.MethodPost, Path: t.collectionPath, Body: st.preimage, Proof: &Proof{Absent: true}, WantID: id}
	}
	u := &Undo{Method: http.MethodPut, Path: st.tgt.paths.Path(id), Body: st.preimage, IfNoneMatch: "*"}
	if st.preETag == "" || !t.settings.ConditionalWrites {
		u.Proof = &Proof{Absent: true}
	}
	return u
}

// restorePatch is the merge patch that puts back the fields an update
// changed: each field's old value, or null where the field did not
// exist; and where the update sent an object into an object, the patch
// that turns the two merged back into the old one (a member it added
// inside removed), since the upstream merges a patch's objects into
// what it holds (RFC 7396) and the old object alone would leave it.
func restorePatch(preimage json.RawMessage, fields []string, sent []byte) []byte {
	var before map[string]json.RawMessage
	_ = json.Unmarshal(preimage, &before) // the preflight checked it is an object
	var patched map[string]json.RawMessage
	_ = json.Unmarshal(sent, &patched)
	patch := make(map[string]json.RawMessage, len(fields))
	for _, f := range fields {
		v, ok := before[f]
		if !ok {
			patch[f] = json.RawMessage("null")
			continue
		}
		patch[f] = v
		old, oldIsObject := decodeObject(v)
		if _, setIsObject := decodeObject(patched[f]); oldIsObject && setIsObject {
			merged, _ := decodeObject(jsonvalue.MergePatch(v, patched[f]))
			if b, err := json.Marshal(mergeDiff(merged, old)); err == nil {
				patch[f] = b
			}
		}
	}
	b, _ := json.Marshal(patch)
	return b
}

// decodeObject is raw as a JSON object, numbers kept as written.
func decodeObject(raw []byte) (map[string]any, bool) {
	v, ok := jsonvalue.Decode(raw)
	m, isObject := v.(map[string]any)
	return m, ok && isObject
}

// mergeDiff is the merge patch (RFC 7396) that turns the object from
// into the object to.
func mergeDiff(from, to map[string]any) map[string]any {
	out := map[string]any{}
	for k := range from {
		if _, ok := to[k]; !ok {
			out[k] = nil
		}
	}
	for k, tv := range to {
		fv, has := from[k]
		switch fm, fromObject := fv.(map[string]any); {
		case has && reflect.DeepEqual(fv, tv):
		case fromObject:
			if tm, toObject := tv.(map[string]any); toObject {
				out[k] = mergeDiff(fm, tm)
				continue
			}
			out[k] = tv
		default:
			out[k] = tv
		}
	}
	return out
}

// proves tells whether a read of the item (resp) proves what proof asks,
// the members the legacy API stamps left out of every comparison. It
// returns "" when it does, else why not.
func (st *itemState) proves(proof *Proof, resp *SubResponse) string {
	missing := gone(resp.Status)
	switch {
	case proof.Absent && missing:
		return ""
	case proof.Absent && is2xx(resp.Status):
		return "the item exists again: someone created it after the batch deleted it, so it was left as it is"
	case missing:
		return "the item is gone, so whether it was the batch's could not be proved"
	case !is2xx(resp.Status):
		return fmt.Sprintf("the item could not be read to prove it is as the batch left it (GET answered %d)", resp.Status)
	case proof.ETag != "" && strongETag(resp.Header) == proof.ETag,
		proof.Subset && st.holds(resp.Body, proof.Expect),
		!proof.Subset && st.same(resp.Body, proof.Expect):
		return ""
	}
	return st.changedReason(resp.Body, proof.Expect, proof.Subset, "the item is no longer as the batch left it")
}
