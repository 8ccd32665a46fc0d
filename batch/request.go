package batch

import (
	"net/http"
)

// request builds a sub-request of the batch: the client's forwarded
// headers, the client's query (without the ids parameter: an API keyed
// or scoped by query sees it on every request of the batch, preflight
// and undo included), a JSON body if any, and an Idempotency-Key for a
// write.
func (sg *saga) request(method, path string, body []byte, key string) *SubRequest {
	h := sg.plan.header.Clone()
	if body != nil {
		h.Set("Content-Type", "application/json")
	}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	return &SubRequest{Method: method, Path: path, RawQuery: sg.plan.query, Header: h, Body: body}
}

// read builds a GET of item id.
func (sg *saga) read(id string) *SubRequest {
	return sg.request(http.MethodGet, sg.itemPath(id), nil, "")
}

// itemPath is the escaped path of item id in the batch's collection.
func (sg *saga) itemPath(id string) string { return sg.paths.Path(id) }

// clone copies a request so that a sender may change the copy's header.
func (r *SubRequest) clone() *SubRequest {
	c := *r
	c.Header = r.Header.Clone()
	return &c
}
