package batch

import (
	"context"
	"errors"
	"net/http"
)

// SubRequest is one single-resource request a batch fans out, or one that
// reads or restores an item for the saga.
type SubRequest struct {
	Method   string
	Path     string // escaped
	RawQuery string
	Header   http.Header // the request's own copy: the sender may change it
	Body     []byte      // nil for none
}

// SubResponse is the upstream's answer to a SubRequest.
type SubResponse struct {
	Status int
	Header http.Header
	Body   []byte
	// Resent is true when the request went out more than once: an HTTP
	// client may resend a request on a fresh connection when a kept-alive
	// one dies under it. The answer is to the last copy; an earlier copy
	// may have taken effect all the same. Only writes report it: a read
	// sent twice changed nothing.
	Resent bool
}

// Sender sends one sub-request and returns the upstream's answer. It
// returns both a response and an error when the upstream answered with a
// status but the body could not be read whole; the status then stands.
// An error that wraps ErrNotSent promises the request never left the
// gateway (a refused dial, say), so a write it carried did not happen.
type Sender interface {
	Send(ctx context.Context, req *SubRequest) (*SubResponse, error)
}

// ErrNotSent marks a sub-request that never reached the upstream.
var ErrNotSent = errors.New("sub-request not sent")

// ErrBodyTooLarge marks an answer whose body was larger than the sender
// keeps; the answer comes without its body, and its status stands.
var ErrBodyTooLarge = errors.New("the answer's body is larger than max_body_size")
