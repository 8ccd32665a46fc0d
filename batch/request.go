package batch

import (
	"net/http"

	"github.com/caddy-batch/caddy-batch/policy"
)

// request builds a sub-request of item i: the client's forwarded
// headers, the item's query (the client's, without the ids parameter: an
// API keyed or scoped by query sees it on every request of the batch,
// preflight and undo included), a JSON body if any, and an
// Idempotency-Key for a write.
func (sg *saga) request(i int, method, path string, body []byte, key string) *SubRequest {
	h := sg.plan.header.Clone()
	if body != nil {
		h.Set("Content-Type", "application/json")
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &SubRequest{Method: method, Path: path, RawQuery: sg.tgt(i).query, Header: h, Body: body}
}

// read builds a GET of item i under id.
func (sg *saga) read(i int, id string) *SubRequest {
	return sg.request(i, http.MethodGet, sg.itemPath(i, id), nil, "")
}

// itemPath is the escaped path of id in item i's collection.
func (sg *saga) itemPath(i int, id string) string { return sg.tgt(i).paths.Path(id) }

// lockKey names the lock of id in item i's collection: its path with the
// collection's variables canonical (policy.ItemPaths.Key).
func (sg *saga) lockKey(i int, id string) string { return sg.tgt(i).paths.Key(id) }

// clone copies a request so that a sender may change the copy's header.
func (r *SubRequest) clone() *SubRequest {
	c := *r
	c.Header = r.Header.Clone()
	return &c
}

// itemRequest is item i's own request: a create is a POST to the
// collection, every other operation its method on the item.
func (sg *saga) itemRequest(i int) *SubRequest {
	t, body := sg.tgt(i), sg.state[i].body
	if !t.kind.Writes() {
		return sg.request(i, t.method, sg.itemPath(i, sg.items[i].ID), nil, "")
	}
	key := sg.plan.key.forItem(i, "")
	if t.kind == policy.OpCreate {
		return sg.request(i, t.method, t.collectionPath, body, key)
	}
	return sg.request(i, t.method, sg.itemPath(i, sg.items[i].ID), body, key)
}
