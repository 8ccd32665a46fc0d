package batch

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/caddy-batch/caddy-batch/policy"
)

// hopByHop are the headers that describe one connection, not the request
// (RFC 9110, section 7.6.1), as net/http/httputil lists them.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// batchOnly are headers that describe the batch request as a whole, so
// they would be wrong on every sub-request: with every Content-* header,
// its body's framing, encoding, type and digests (each sub-request has
// its own JSON body), the client's
// idempotency key (each write gets a derived one), compression the
// gateway would have to undo, and preconditions and ranges that name the
// collection's representation rather than any item's.
var batchOnly = []string{
	"Expect", "Accept-Encoding", "Idempotency-Key",
	"Digest", "Repr-Digest",
	"If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range", "Range",
}

// forwardHeader returns the client's headers as every sub-request carries
// them: Authorization, Cookie, tracing and the rest stay; what is
// hop-by-hop, true only of the batch request, a method override, or the
// preference respond-async goes.
func forwardHeader(client http.Header) http.Header {
	h := client.Clone()
	if h == nil {
		h = http.Header{}
	}
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
	for _, name := range batchOnly {
		h.Del(name)
	}
	policy.RemoveMethodOverrideHeaders(h)
	for name := range h {
		if strings.HasPrefix(name, "Content-") {
			delete(h, name)
		}
	}
	// The gateway answers the batch itself, at once: an upstream that
	// honoured respond-async would answer an item 202 for a write not yet
	// done, which the batch would count as done (RFC 7240, 4.1).
	return withoutPreference(h, "respond-async")
}

// idempotencyKey is the batch's Idempotency-Key, from which every write
// sub-request's key is derived so that an upstream that honours the
// header can tell a retried item from a new one.
type idempotencyKey struct {
	base   string
	quoted bool // the client sent a structured-field string ("..."), so derived keys are too
}

// newIdempotencyKey takes the client's key, or makes one. A made key is a
// structured-field string, as the IETF draft defines the header.
func newIdempotencyKey(client string) idempotencyKey {
	client = strings.TrimSpace(client)
	if len(client) >= 2 && client[0] == '"' && client[len(client)-1] == '"' {
		return idempotencyKey{base: client[1 : len(client)-1], quoted: true}
	}
	if client != "" {
		return idempotencyKey{base: client}
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return idempotencyKey{base: hex.EncodeToString(b[:]), quoted: true}
}

// forItem returns the key of item index's write; suffix tells apart the
// writes one item can cause (its own, and the one that undoes it).
func (k idempotencyKey) forItem(index int, suffix string) string {
	v := k.base + ":" + strconv.Itoa(index) + suffix
	if k.quoted {
		return `"` + v + `"`
	}
	return v
}

// headerName is a header as it is usually spelled, for messages and
// answers, and its canonical key, under which Go's header maps hold it:
// indexing the map with the key spares Header.Get's canonicalization,
// which allocates for a name like X-HTTP-Method-Override on every
// request.
type headerName struct{ name, key string }

func headerNames(names ...string) []headerName {
	out := make([]headerName, len(names))
	for i, n := range names {
		out[i] = headerName{n, http.CanonicalHeaderKey(n)}
	}
	return out
}

// JobHeader is header as a job's requests would carry it, and the names
// of header they would not (hop-by-hop, the batch request's own, a
// method override, a Content-* header), sorted: what a resume of a job
// gives among its forwarded headers, and what it is refused.
func JobHeader(header http.Header) (forwarded http.Header, dropped []string) {
	forwarded = forwardHeader(header)
	for name := range header {
		if _, ok := forwarded[http.CanonicalHeaderKey(name)]; !ok {
			dropped = append(dropped, name)
		}
	}
	slices.Sort(dropped)
	return forwarded, dropped
}
