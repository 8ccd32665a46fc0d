package batch

import (
	"net/http"

	"github.com/caddy-batch/caddy-batch/policy"
)

// target is where one item's requests go: an operation on a collection of
// one resource, the collection's variables bound, with the query every
// request of the item carries. The items of a batch share one; each
// operation of an envelope has its own, known once its references are
// filled (docs/envelope.md).
type target struct {
	// kind is what the item's own request does, as one of the four batch
	// operations.
	kind policy.Op
	// method is the item's own request's method: an envelope's PUT is an
	// update that replaces the whole item.
	method         string
	match          policy.Match     // the collection
	settings       *policy.Settings // the resource's
	paths          policy.ItemPaths
	collectionPath string
	query          string
}

func newTarget(kind policy.Op, method string, m policy.Match, query string) *target {
	return &target{
		kind:           kind,
		method:         method,
		match:          m,
		settings:       &m.Resource.Settings,
		paths:          m.ItemPaths(),
		collectionPath: m.CollectionPath(),
		query:          query,
	}
}

// batchMethods are the methods of the four batch operations' sub-requests.
var batchMethods = [...]string{
	policy.OpGet:    http.MethodGet,
	policy.OpCreate: http.MethodPost,
	policy.OpUpdate: http.MethodPatch,
	policy.OpDelete: http.MethodDelete,
}

// replaces reports whether the item's write replaces the whole item (PUT)
// rather than merging into it (PATCH).
func (t *target) replaces() bool { return t.method == http.MethodPut }
