package caddymodule

import (
	"bytes"
	"net/http"
)

// recorder is a sub-request's own ResponseWriter. It never wraps the
// client's writer: reverse_proxy writes the upstream's headers into
// whatever writer it is given, and a batch's sub-requests must not write
// into the client's answer, nor into each other's.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int
	overflow bool
}

func newRecorder(limit int64) *recorder {
	return &recorder{header: http.Header{}, limit: int(min(limit, int64(^uint(0)>>1)))}
}

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader keeps the first final status; informational ones (103 Early
// Hints) are not the answer.
func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

// Write keeps the body up to the limit and drops the rest without an
// error, so the handler finishes normally and the item keeps its status.
func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if room := r.limit - r.body.Len(); len(b) > room {
		r.overflow = true
		r.body.Write(b[:room])
		return len(b), nil
	}
	return r.body.Write(b)
}

// Flush lets reverse_proxy flush a streamed answer; there is nowhere to
// flush it to.
func (r *recorder) Flush() {}
