package batch

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
)

// What a proof compares: a read of an item against an image the saga
// holds (the pre-image, the write's answer, what the write sent), with
// the members the legacy API stamps on every save (stamped_fields) left
// out; and, where they differ, in which members, so that the reason
// blames only what the read shows (docs/all-or-nothing.md).

// differing lists the members in which the object have is not the
// object want, leaving out the members named in leaveOut: with subset,
// only want's members count (want is what the batch sent, and the item
// may hold more), a null one asking that have hold it null or not at
// all (a merge patch's null removes a member); otherwise a member
// either has. ok is false when either is not a JSON object.
func differing(have, want []byte, subset bool, leaveOut []string) (names []string, ok bool) {
	h, ok1 := jsonvalue.Decode(have)
	w, ok2 := jsonvalue.Decode(want)
	hm, ok3 := h.(map[string]any)
	wm, ok4 := w.(map[string]any)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, false
	}
	for k, v := range wm {
		hv, has := hm[k]
		if subset && v == nil && (!has || hv == nil) {
			continue
		}
		if !slices.Contains(leaveOut, k) && (!has || !reflect.DeepEqual(hv, v)) {
			names = append(names, k)
		}
	}
	if !subset {
		for k := range hm {
			if _, has := wm[k]; !has && !slices.Contains(leaveOut, k) {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	return names, true
}

// same reports whether a read of the item is the image want, but for the
// members the legacy API stamps.
func (st *itemState) same(have, want []byte) bool {
	names, ok := differing(have, want, false, st.tgt.settings.StampedFields)
	if !ok {
		return jsonvalue.Same(have, want)
	}
	return len(names) == 0
}

// holds reports whether a read of the item holds every member of want
// (what the batch sent, or would leave) with the same value, but for the
// id field and the members the legacy API stamps.
func (st *itemState) holds(have, want []byte) bool {
	names, ok := differing(have, want, true, st.leftOut())
	return ok && len(names) == 0
}

// leftOut is what a comparison with what the batch sent leaves out: the
// stamped members, and the id field, which names the item in the path
// rather than in what was sent.
func (st *itemState) leftOut() []string {
	s := st.tgt.settings
	return append(slices.Clip(s.StampedFields), s.IDField)
}

// changedReason says why a read of the item (have) is not the image a
// proof expected (want, compared whole or, with subset, member by
// member), after lead, which says what it is not. Where a member the
// batch's write sent holds another value, another writer changed it;
// where only members the write did not send differ, the legacy API may
// have changed them itself (a time it stamps on every save), and the
// reason names stamped_fields instead of blaming a writer it has no
// evidence of.
func (st *itemState) changedReason(have, want []byte, subset bool, lead string) string {
	leaveOut := st.tgt.settings.StampedFields
	if subset {
		leaveOut = st.leftOut()
	}
	names, ok := differing(have, want, subset, leaveOut)
	if !ok || len(names) == 0 {
		return lead + ": another writer changed it, so it was left as it is"
	}
	sent := st.sentMembers()
	var theirs []string
	for _, n := range names {
		if slices.Contains(sent, n) {
			theirs = append(theirs, n)
		}
	}
	if len(theirs) > 0 {
		return fmt.Sprintf("%s: another writer changed %s, which the batch's write sent, so it was left as it is", lead, memberList(theirs))
	}
	return fmt.Sprintf("%s, and the difference is only in %s, which the batch's write did not send: the legacy API may have changed %s itself, as an API that stamps a time on every save does; "+
		"if it does, name %s in stamped_fields, and such an item is undone. It was left as it is", lead, memberList(names), them(len(names)), them(len(names)))
}

// sentMembers are the members the item's write sent.
func (st *itemState) sentMembers() []string {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(st.body, &m) // an object, or nothing (a delete)
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	return names
}

// memberList names members as a reason lists them: "updated_at", or
// "name" and "updated_at".
func memberList(names []string) string {
	q := make([]string, len(names))
	for k, n := range names {
		q[k] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " and " + q[len(q)-1]
}

func them(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}
