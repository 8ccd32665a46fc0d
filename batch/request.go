package batch

import (
	"net/http"

	"github.com/caddy-batch/caddy-batch/policy"
)

// newSubRequest builds a sub-request to t: the client's forwarded
// headers, the item's query (the client's, without the ids parameter: an
// API keyed or scoped by query sees it on every request of the batch,
// preflight and undo included), a JSON body if any, and an
// Idempotency-Key for a write.
func newSubRequest(header http.Header, t *target, method, path string, body []byte, key string) *SubRequest {
	h := header.Clone()
	if body != nil {
		h.Set("Content-Type", "application/json")
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &SubRequest{Method: method, Path: path, RawQuery: t.query, Header: h, Body: body}
}

// read builds a GET of id in t's collection.
func (t *target) read(header http.Header, id string) *SubRequest {
	return newSubRequest(header, t, http.MethodGet, t.paths.Path(id), nil, "")
}

// clone copies a request so that a sender may change the copy's header.
func (r *SubRequest) clone() *SubRequest {
	c := *r
	c.Header = r.Header.Clone()
	return &c
}

// itemRequest is an item's own request, id its item's and body what it
// writes, with key as its Idempotency-Key: a create is a POST to the
// collection, every other operation its method on the item.
func (t *target) itemRequest(header http.Header, id string, body []byte, key string) *SubRequest {
	switch {
	case !t.kind.Writes():
		return newSubRequest(header, t, t.method, t.paths.Path(id), nil, "")
	case t.kind == policy.OpCreate:
		return newSubRequest(header, t, t.method, t.collectionPath, body, key)
	}
	return newSubRequest(header, t, t.method, t.paths.Path(id), body, key)
}
