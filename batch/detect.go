package batch

import (
	"bytes"
	"errors"
	"io"
	"net/http"

	"github.com/caddy-batch/caddy-batch/policy"
)

// detectOp tells whether r, a request to a collection, is one of the four
// batch operations, and which:
//
//   - GET with the ids parameter (even empty: that is a bad batch, not a
//     LIST);
//   - DELETE, always while batch delete is on (so a DELETE without the
//     ids parameter is a bad batch: many legacy APIs read a DELETE of the
//     whole collection as "delete everything"), and otherwise only with
//     the ids parameter (so it can be refused as a batch that is off);
//   - POST whose body is a JSON array (its first byte other than
//     whitespace is '['); a POST of an object is a single create;
//   - PATCH, always while batch update is on (so a non-array body is a bad
//     batch), and otherwise only with an array body (so it can be refused
//     as a batch that is off rather than reach the legacy API).
//
// It may read the start of a POST or PATCH body to decide, and then puts
// back a body that yields the same bytes, so a request that is not a
// batch passes through intact.
func detectOp(r *http.Request, res *policy.Resource) (policy.Op, bool, error) {
	switch r.Method {
	case http.MethodGet:
		return policy.OpGet, policy.HasParam(r.URL.RawQuery, res.Settings.IDsParam), nil
	case http.MethodDelete:
		return policy.OpDelete, res.BatchEnabled(policy.OpDelete) || policy.HasParam(r.URL.RawQuery, res.Settings.IDsParam), nil
	case http.MethodPatch:
		if res.BatchEnabled(policy.OpUpdate) {
			return policy.OpUpdate, true, nil
		}
		array, err := startsWithArray(r, res.Settings.MaxBodySize)
		return policy.OpUpdate, array, err
	case http.MethodPost:
		array, err := startsWithArray(r, res.Settings.MaxBodySize)
		return policy.OpCreate, array, err
	}
	return 0, false, nil
}

// startsWithArray reads r's body up to its first byte that is not JSON
// whitespace, looking no further than limit bytes, and reports whether
// that byte opens an array.
func startsWithArray(r *http.Request, limit int64) (bool, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return false, nil
	}
	var read []byte
	chunk := make([]byte, 512)
	array := false
	var err error
	for int64(len(read)) < limit {
		var n int
		n, err = r.Body.Read(chunk)
		start := len(read)
		read = append(read, chunk[:n]...)
		if i := firstNonSpace(read[start:]); i >= 0 {
			array = read[start+i] == '['
			break
		}
		if err != nil {
			break
		}
	}
	r.Body = replayBody{io.MultiReader(bytes.NewReader(read), r.Body), r.Body}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return array, err
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
		default:
			return i
		}
	}
	return -1
}

// replayBody yields the bytes already read, then the rest of the original
// body, and closes the original.
type replayBody struct {
	io.Reader
	io.Closer
}
