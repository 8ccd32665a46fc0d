// Package problem writes the RFC 9457 problem details that every error the
// gateway itself produces is answered with.
package problem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
)

// ContentType is the media type of a problem details body.
const ContentType = "application/problem+json"

// typeBase prefixes each problem type's slug; the README documents every
// slug under this anchor, so a client that follows the type finds what it
// means.
const typeBase = "https://github.com/caddy-batch/caddy-batch#problem-"

// Details is a problem details object (RFC 9457, section 3).
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// New returns the details of a problem of the given kind (a slug such as
// "invalid-batch") and status, with the standard status text as its title.
func New(status int, kind, detail string) Details {
	return Details{Type: typeBase + kind, Title: statusText(status), Status: status, Detail: detail}
}

// statusText is the standard text of a status, and a title for the
// non-standard ones the gateway uses: 499, nginx's and Caddy's code for a
// client that closed its request.
func statusText(status int) string {
	if status == 499 {
		return "Client Closed Request"
	}
	return http.StatusText(status)
}

// Write answers with the problem.
func (d Details) Write(w http.ResponseWriter) error {
	// HTML stays unescaped (an upstream's error page in body_text reads as
	// sent): the media type is JSON and nosniff keeps browsers to it.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return err
	}
	raw := buf.Bytes()
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(raw)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(d.Status)
	_, err := w.Write(raw)
	return err
}
