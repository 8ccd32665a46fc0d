package batch

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
)

// nameCreated finds the id of a created item (docs/all-or-nothing.md): see
// createdID; failing that, the id the element carried, which the saga
// proved free before the create. An id that could not be safely put in a
// path is not used: the item then cannot be undone, which the report
// says.
func (st *itemState) nameCreated(it *ItemResult, resp *SubResponse) {
	id, from := st.tgt.createdID(resp)
	if id == "" {
		id, from = st.elementID, "element"
	}
	if reason := badID(id); reason != "" {
		if id != "" {
			it.Error = fmt.Sprintf("the upstream named the created item %q, which %s", id, reason)
		}
		id, from = "", ""
	}
	it.ID = id
	st.createdFrom = from
}

// createdID names the item a create's answer made: its Location when that
// names an item of the same collection, else the answer body's id field
// (not a 202's: that body describes the pending request, not the item).
func (t *target) createdID(resp *SubResponse) (id, from string) {
	if v, ok := t.match.IDFromLocation(resp.Header.Get("Location")); ok {
		return v, "location"
	}
	if resp.Status != http.StatusAccepted {
		var body map[string]json.RawMessage
		if json.Unmarshal(resp.Body, &body) == nil {
			if v, ok := jsonvalue.ID(body[t.settings.IDField]); ok && v != "" {
				return v, "body"
			}
		}
	}
	return "", ""
}
