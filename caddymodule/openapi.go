package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/openapi"
	"github.com/caddy-batch/caddy-batch/policy"
)

// OpenAPIConfig is the legacy API's OpenAPI document in, and the
// document the gateway serves out (docs/openapi.md, "From OpenAPI";
// docs/configuration.md, "openapi").
type OpenAPIConfig struct {
	// The legacy API's OpenAPI 3.0 or 3.1 document, YAML or JSON, read
	// at provision: each of its paths becomes a resource, beside the
	// declared ones (a declared resource on an imported path overrides
	// it). The Caddyfile adapter makes a relative name absolute from the
	// Caddyfile's directory; in JSON it is relative to Caddy's working
	// directory. Default: none (publish describes the declared
	// resources).
	File string `json:"file,omitempty"`

	// The document's SHA-256, hex: the Caddyfile adapter sets it, so
	// that a reload after editing only the document is a new config,
	// which Caddy does not skip. Provision does not check it.
	// Default: none.
	SHA256 string `json:"sha256,omitempty"`

	// Prepended to the document's paths. Default: the path of the
	// document's first servers url ("" without one).
	Prefix *string `json:"prefix,omitempty"`

	// The path where GET and HEAD answer the document as the gateway
	// serves it, batch operations added. It is answered before
	// authentication (docs/security.md, "Security"). Default: none (not published).
	Publish string `json:"publish,omitempty"`

	// Patterns of the document's paths to import, * standing for any
	// text: a path is imported when it matches one (or the list is
	// empty) and matches no Exclude pattern. Default: every path.
	Include []string `json:"include,omitempty"`

	// Patterns of the document's paths to leave out, as Include.
	// Default: none.
	Exclude []string `json:"exclude,omitempty"`
}

// publishedDoc is the document the handler serves at Publish.
type publishedDoc struct {
	path, etag string
	body       []byte
}

// resolved is one resource as the handler serves it: declared,
// imported from the document, or imported and overridden by a declared
// resource block.
type resolved struct {
	Resource
	doc *openapi.Resource // nil for a resource the document lacks
	// keepCollection keeps the collection's methods as a resource block
	// wrote them: no PATCH or DELETE added for batch update and delete.
	keepCollection bool
}

// loadOpenAPI reads and imports the handler's document: what it
// declares, or nil without one.
func (h *Handler) loadOpenAPI() (*openapi.Imported, error) {
	c := h.OpenAPI
	if c == nil || c.File == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.File)
	if err != nil {
		return nil, policy.OptionError("openapi", fmt.Errorf("reading the OpenAPI document: %w", err))
	}
	doc, err := openapi.Parse(c.File, data)
	var imported *openapi.Imported
	if err == nil {
		imported, err = openapi.Import(doc, openapi.Options{Prefix: c.Prefix, Include: c.Include, Exclude: c.Exclude})
	}
	if err != nil {
		var errs []error
		for _, e := range policy.Flatten(err) {
			errs = append(errs, policy.OptionError("openapi", e))
		}
		return nil, errors.Join(errs...)
	}
	return imported, nil
}

// resolveResources lists the resources the handler serves: the declared
// ones first, in their order (each laid over the imported resource of
// the same route, when there is one), then the imported ones no
// resource block names.
func (h *Handler) resolveResources(imported *openapi.Imported) []resolved {
	if imported == nil {
		out := make([]resolved, len(h.Resources))
		for i, r := range h.Resources {
			out[i] = resolved{Resource: r}
		}
		return out
	}
	byRoute := map[string]int{}
	for i, r := range imported.Resources {
		byRoute[openapi.Route(r.Path)] = i
	}
	used := make([]bool, len(imported.Resources))
	var out []resolved
	for _, d := range h.Resources {
		i, ok := byRoute[openapi.Route(d.Path)]
		if !ok {
			out = append(out, resolved{Resource: d})
			continue
		}
		used[i] = true
		out = append(out, h.overlay(&imported.Resources[i], d))
	}
	for i := range imported.Resources {
		if !used[i] {
			out = append(out, h.overlay(&imported.Resources[i], Resource{}))
		}
	}
	return out
}

// overlay lays a declared resource block over an imported resource.
func (h *Handler) overlay(doc *openapi.Resource, d Resource) resolved {
	r := d
	r.Path, r.ItemPath = doc.Path, doc.ItemPath
	if d.ItemPath != "" {
		r.Path, r.ItemPath = d.Path, d.ItemPath
	}
	if d.Collection == nil {
		r.Collection = doc.Collection
	}
	if d.Item == nil {
		r.Item = doc.Item
	}
	// What the document says, unless the configuration says it.
	if h.IDFormat == "" && d.IDFormat == "" {
		r.IDFormat = doc.IDFormat
	}
	if h.RestoreUpdated == "" && d.RestoreUpdated == "" {
		r.RestoreUpdated = doc.RestoreUpdated
	}
	if h.RestoreDeleted == "" && d.RestoreDeleted == "" {
		r.RestoreDeleted = doc.RestoreDeleted
	}
	return resolved{Resource: r, doc: doc, keepCollection: d.Collection != nil}
}

// importedError names, in an error about a resource the configuration
// does not declare, the document and the path it comes from.
func (h *Handler) importedError(r resolved, i int, err error) error {
	if i < len(h.Resources) || r.doc == nil {
		return err
	}
	return fmt.Errorf("%w (imported from %s#%s)", err, h.OpenAPI.File, r.doc.Pointer)
}

// publishOf checks the publish path and builds the document served
// there, over the resources served and what the document declared
// (imported); nil when the handler publishes none.
func (h *Handler) publishOf(p *policy.Policy, resources []resolved, imported *openapi.Imported, build bool) (*publishedDoc, error) {
	c := h.OpenAPI
	if c == nil || c.Publish == "" {
		return nil, nil
	}
	refuse := func(format string, args ...any) (*publishedDoc, error) {
		return nil, policy.OptionError("publish", fmt.Errorf(format, args...))
	}
	path := c.Publish
	switch {
	case !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?#{}*"):
		return refuse("publish %q must be a plain path, such as publish /api/openapi.json", path)
	case path == h.Envelope || path+"/" == h.Envelope || path == h.Envelope+"/":
		return refuse("publish %s is the envelope's path: give the document a path of its own, such as /openapi.json", path)
	}
	if m, ok := p.Lookup(path); ok {
		return refuse("publish %s is a path of the resource %s, whose requests are the legacy API's: give the document a path no resource matches, such as %s",
			path, m.Resource.Collection, "/openapi.json")
	}
	if !build {
		return nil, nil
	}
	var served []openapi.Served
	for i, r := range p.Resources() {
		s := openapi.Served{Resource: r}
		if doc := resources[i].doc; doc != nil {
			s.DocPath, s.DocItemPath = doc.DocPath, doc.DocItemPath
		}
		served = append(served, s)
	}
	g := openapi.Gateway{Envelope: h.Envelope}
	switch {
	case imported != nil:
		g.Prefix = imported.Prefix
	case c.Prefix != nil:
		g.Prefix = strings.TrimSuffix(*c.Prefix, "/")
	}
	body, err := openapi.Publish(imported, served, g)
	if err != nil {
		return nil, fmt.Errorf("publishing the OpenAPI document: %w", err)
	}
	sum := sha256.Sum256(body)
	return &publishedDoc{path: path, body: body, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}, nil
}

// publishAllow is what the published document's path allows.
const publishAllow = "GET, HEAD, OPTIONS"

// servePublished answers the published document's path.
func (h *Handler) servePublished(w http.ResponseWriter, r *http.Request) error {
	doc := h.published
	w.Header().Set("Allow", publishAllow)
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodOptions:
		w.WriteHeader(http.StatusNoContent)
		return nil
	default:
		return problem.New(http.StatusMethodNotAllowed, "method-not-allowed",
			fmt.Sprintf("%s is the gateway's OpenAPI document: it takes GET and HEAD", doc.path)).Write(w)
	}
	w.Header().Del("Allow")
	hdr := w.Header()
	hdr.Set("ETag", doc.etag)
	hdr.Set("Cache-Control", "no-cache")
	if match := r.Header.Get("If-None-Match"); match != "" && (match == "*" || strings.Contains(match, doc.etag)) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", fmt.Sprint(len(doc.body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	_, err := w.Write(doc.body)
	return err
}

// placeImported names the document and path in each error of err about
// an imported resource no resource block declares.
func (h *Handler) placeImported(err error, resources []resolved) error {
	if err == nil || !slices.ContainsFunc(resources, func(r resolved) bool { return r.doc != nil }) {
		return err
	}
	var out []error
	for _, e := range policy.Flatten(err) {
		var pe *policy.Error
		if errors.As(e, &pe) && pe.Resource >= 0 && pe.Resource < len(resources) {
			e = h.importedError(resources[pe.Resource], pe.Resource, e)
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}
