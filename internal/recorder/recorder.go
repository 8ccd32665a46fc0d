// Package recorder is a sub-request's own http.ResponseWriter: the
// answer of a request the gateway sends through Caddy's handler chain
// for itself (a batch's sub-requests, a recovery's probe), kept apart
// from any client's answer and from each other's.
package recorder

import (
	"bytes"
	"net/http"
	"strconv"
)

// Recorder is a sub-request's own ResponseWriter. It never wraps the
// client's writer: reverse_proxy writes the upstream's headers into
// whatever writer it is given, and a batch's sub-requests must not write
// into the client's answer, nor into each other's.
type Recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int
	overflow bool
	sized    bool // the body's buffer was sized from Content-Length, or could not be
}

// New is a recorder that keeps at most limit bytes of the body.
func New(limit int64) *Recorder {
	return &Recorder{header: http.Header{}, limit: int(min(limit, int64(^uint(0)>>1)))}
}

func (r *Recorder) Header() http.Header { return r.header }

// Status is the answer's final status; 0 when none was written.
func (r *Recorder) Status() int { return r.status }

// Overflowed reports whether the body passed the limit, and was cut.
func (r *Recorder) Overflowed() bool { return r.overflow }

// Limit is the most of the body kept, in bytes.
func (r *Recorder) Limit() int { return r.limit }

// WriteHeader keeps the first final status; informational ones (103 Early
// Hints) are not the answer.
func (r *Recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

// Write keeps the body up to the limit and drops the rest without an
// error, so the handler finishes normally and the item keeps its status.
func (r *Recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if !r.sized {
		r.sized = true
		r.size()
	}
	if room := r.limit - r.body.Len(); len(b) > room {
		r.overflow = true
		r.body.Write(b[:room])
		return len(b), nil
	}
	return r.body.Write(b)
}

// size makes room for the whole body at once when the answer says how
// long it is (reverse_proxy passes the upstream's Content-Length on): a
// buffer grown by doubling copies a large body several times over and
// ends up to twice its size, all of it held until the batch answers.
// What the header claims is trusted only up to the limit; a body longer
// than it claimed still grows as it comes.
func (r *Recorder) size() {
	n, err := strconv.ParseInt(r.header.Get("Content-Length"), 10, 64)
	if err == nil && n > 0 && n <= int64(r.limit) {
		r.body.Grow(int(n))
	}
}

// Bytes returns the body kept. One that came without a Content-Length
// grew by doubling; when much of its buffer is unused, it is copied to
// one of its size, so that the batch holds each body once, not up to
// twice, while the rest of its items come. A few hundred bytes unused
// are not worth the copy.
func (r *Recorder) Bytes() []byte {
	b := r.body.Bytes()
	if cap(b)-len(b) > max(len(b)/4, 256) {
		return bytes.Clone(b)
	}
	return b
}

// Flush lets reverse_proxy flush a streamed answer; there is nowhere to
// flush it to.
func (r *Recorder) Flush() {}
