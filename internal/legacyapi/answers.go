package legacyapi

// The answers a legacy API sends: JSON, plain text, HTML error pages,
// absolute Locations, and what a body it reads must be.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// response is a computed answer, kept apart from writing so that AfterApply
// faults can change the state and still decide not to send it.
type response struct {
	status int
	header http.Header
	body   []byte
}

// normalize turns a Go value into what a JSON body would have decoded to
// (json.Number for numbers), which also makes it a private deep copy.
func normalize(v map[string]any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return decodeObject(b)
}

func write(w http.ResponseWriter, r *http.Request, res response) {
	h := w.Header()
	for k, v := range res.header {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(res.body)))
	w.WriteHeader(res.status)
	if r.Method != http.MethodHead {
		w.Write(res.body)
	}
}

// location builds an absolute URL from the request's Host, as legacy
// frameworks do, so the gateway has to cope with absolute Location headers.
func location(r *http.Request, c *collection, id string) string {
	loc := origin(r) + c.Path + "/" + url.PathEscape(id)
	if c.TrailingSlash {
		loc += "/"
	}
	return loc
}

// origin is "<scheme>://<host>" of the request, as the client addressed it.
func origin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func queryInt(q url.Values, name string, def int) (int, bool) {
	if !q.Has(name) {
		return def, true
	}
	n, err := strconv.Atoi(q.Get(name))
	return n, err == nil && n >= 0
}

// decodeObject decodes exactly one JSON object, keeping numbers as
// json.Number so ids and values round-trip without becoming floats.
func decodeObject(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.Decode(new(any)) != io.EOF {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a JSON object")
	}
	return m, nil
}

// checkName is the API's only validation rule, enough to provoke a 422.
func (c *collection) checkName(rec map[string]any) (response, bool) {
	v, has := rec["name"]
	if !has {
		return response{}, false
	}
	if s, ok := v.(string); ok && s != "" {
		return response{}, false
	}
	if c.FastAPI {
		return fastAPIInvalid(), true
	}
	return htmlPage(http.StatusUnprocessableEntity, "Validation failed: name must be a non-empty string."), true
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, e := range v {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

func (res response) clone() response {
	h := res.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	return response{status: res.status, header: h, body: bytes.Clone(res.body)}
}

func jsonHeader() http.Header {
	return http.Header{"Content-Type": {"application/json; charset=utf-8"}}
}

func jsonAnswer(status int, v any) response {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return plain(http.StatusInternalServerError, "cannot encode record")
	}
	return response{status: status, header: jsonHeader(), body: bytes.TrimSuffix(buf.Bytes(), []byte("\n"))}
}

func plain(status int, msg string) response {
	return response{status: status, header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, body: []byte(msg)}
}

// htmlPage renders the kind of error page a legacy web stack emits, which a
// gateway must not try to parse as JSON.
func htmlPage(status int, msg string) response {
	text := http.StatusText(status)
	page := fmt.Sprintf("<!DOCTYPE html><html><head><title>%d %s</title></head><body><h1>%s</h1><p>%s</p></body></html>",
		status, text, text, html.EscapeString(msg))
	return response{status: status, header: http.Header{"Content-Type": {"text/html; charset=utf-8"}}, body: []byte(page)}
}

func notFound(path string) response {
	return htmlPage(http.StatusNotFound, "The requested URL "+path+" was not found on this server.")
}

func methodNotAllowed(method, allow string) response {
	res := htmlPage(http.StatusMethodNotAllowed, "The method "+method+" is not allowed for the requested URL.")
	res.header.Set("Allow", allow)
	return res
}
