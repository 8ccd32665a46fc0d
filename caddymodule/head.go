package caddymodule

import (
	"bytes"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-batch/caddy-batch/policy"
)

// headless remembers the resources whose legacy API has no HEAD: it
// answered one 405 with an Allow that lacks HEAD. It lives as long as
// the provisioned handler, so a reload asks the API again.
type headless struct{ resources sync.Map } // *policy.Resource → struct{}

// serveHead passes a HEAD the map allows on, and answers one the legacy
// API refuses with 405 as the API answers its GET, without the body
// (RFC 9110, 9.3.2): the map's Allow says HEAD wherever it says GET,
// and FastAPI's routes, for one, have no HEAD (docs/wire-format.md, "HEAD"). Once a
// resource's API is known to have none, its HEADs go as GETs at once,
// so that the API is not asked twice for each. A HEAD the API answers
// otherwise streams through as it comes.
func (h *Handler) serveHead(w http.ResponseWriter, r *http.Request, m policy.Match, next caddyhttp.Handler) error {
	if _, learnt := h.headless.resources.Load(m.Resource); learnt {
		return serveHeadAsGet(w, r, next)
	}
	before := w.Header().Clone()
	rec := caddyhttp.NewResponseRecorder(w, new(bytes.Buffer), func(status int, _ http.Header) bool {
		return status == http.StatusMethodNotAllowed
	})
	if err := next.ServeHTTP(rec, r); err != nil {
		return err
	}
	if rec.Status() != http.StatusMethodNotAllowed {
		return nil
	}
	if !allows(w.Header().Get("Allow"), http.MethodHead) {
		h.headless.resources.Store(m.Resource, struct{}{})
	}
	// The 405's headers went to w's header map; the GET's replace them.
	clear(w.Header())
	maps.Copy(w.Header(), before)
	return serveHeadAsGet(w, r, next)
}

// allows reports whether an Allow header value lists method.
func allows(allow, method string) bool {
	for m := range strings.SplitSeq(allow, ",") {
		if strings.EqualFold(strings.TrimSpace(m), method) {
			return true
		}
	}
	return false
}

// serveHeadAsGet sends a HEAD on as a GET and answers its status and
// headers, Content-Length included, with no body.
func serveHeadAsGet(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	get := r.Clone(r.Context())
	get.Method = http.MethodGet
	return next.ServeHTTP(bodyless{&caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}, get)
}

// bodyless answers a HEAD sent as GET: the GET's status and headers go
// to the client, its body is read as it comes and dropped, never held
// whole, however large.
type bodyless struct {
	*caddyhttp.ResponseWriterWrapper
}

func (bodyless) Write(p []byte) (int, error) { return len(p), nil }

// ReadFrom drops the body as Write does: the wrapper's own ReadFrom
// would copy it to the client's connection.
func (bodyless) ReadFrom(r io.Reader) (int64, error) { return io.Copy(io.Discard, r) }
