package caddymodule

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// The OpenAPI tests that start no Caddy: the adapter's errors, the
// document beside the Caddyfile, the slots key. The end-to-end ones are
// in e2e/openapi_e2e_test.go.

// widgetsDocument describes e2e's seededAPI widgets (integer ids, no PATCH
// on the collection: the gateway adds it) and gizmos, whose items have no
// PUT and whose collection has no POST, so that a deleted gizmo could not
// be put back; and a TRACE the method map does not know.
// It is read from the module's testdata, which caddymodule's and e2e's
// tests share.
var widgetsDocument = func() string {
	b, err := os.ReadFile("../testdata/widgets.openapi.yaml")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

func writeDocument(t testing.TB, dir, name, doc string) string {
	t.Helper()
	file := filepath.Join(dir, name)
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestOpenAPIConfigErrors: a document the gateway cannot use, and a
// publish path inside a resource, fail caddy adapt at the openapi
// line, naming the file, the JSON pointer and what to do.
func TestOpenAPIConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notOpenAPI := writeDocument(t, dir, "notes.yaml", "title: my notes\n")
	odd := writeDocument(t, dir, "odd.yaml", "openapi: 3.1.0\ninfo: {title: x, version: '1'}\npaths:\n  /files/{name}.json:\n    get:\n      parameters:\n        - {name: name, in: path, required: true, schema: {type: string}}\n      responses:\n        '200': {description: ok}\n")
	good := writeDocument(t, dir, "legacy.yaml", widgetsDocument)
	for _, tc := range []struct {
		name, block string
		want        []string
	}{
		{"not OpenAPI", "openapi " + notOpenAPI, []string{"Caddyfile:3", "notes.yaml#", "not an OpenAPI document"}},
		{"a missing file", "openapi " + filepath.Join(dir, "nothing.yaml"), []string{"Caddyfile:3", "reading the document"}},
		{"a template the map cannot express", "openapi " + odd, []string{"Caddyfile:3", "odd.yaml:4 (#/paths/~1files~1{name}.json)", "exclude /files/*"}},
		{"publish inside a resource", "openapi " + good + " {\n\t\tpublish /api/widgets/openapi.json\n\t}", []string{"Caddyfile:4", "resource /api/widgets", "publish /api/widgets/openapi.json"}},
		{"openapi in a resource", "resource /api/x {\n\t\topenapi " + good + "\n\t}", []string{"Caddyfile:4", "belongs in the batch block"}},
		{"neither file nor publish", "openapi {\n\t\tprefix /api\n\t}", []string{"Caddyfile:3", "publish <path>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := ":8080 {\n\tbatch /api/* {\n\t" + tc.block + "\n\t}\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(config), map[string]any{"filename": "Caddyfile"})
			if err == nil {
				t.Fatal("adapted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nwant it to hold %q", err, w)
				}
			}
		})
	}
}

// TestOpenAPIFileBesideTheCaddyfile: a relative file name is the
// Caddyfile's directory's, and the document's hash is in the config, so
// that editing only the document changes the adapted config.
func TestOpenAPIFileBesideTheCaddyfile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeDocument(t, dir, "legacy.yaml", widgetsDocument)
	caddyfile := filepath.Join(dir, "Caddyfile")
	config := []byte(":8080 {\n\tbatch /api/* {\n\t\topenapi legacy.yaml\n\t}\n}\n")
	adapt := func() string {
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(config, map[string]any{"filename": caddyfile})
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	first := adapt()
	if !strings.Contains(first, `"file":"`+filepath.Join(dir, "legacy.yaml")+`"`) || !strings.Contains(first, `"sha256":"`) {
		t.Fatalf("%s", first)
	}
	writeDocument(t, dir, "legacy.yaml", strings.Replace(widgetsDocument, "    trace:", "    options:", 1))
	if adapt() == first {
		t.Error("editing the document left the config as it was: caddy reload would skip it")
	}
}

// TestOpenAPISlotsKeyCountsImportedResources: two handlers with the same
// max_in_flight share slots only when they serve the same resources,
// imported ones included.
func TestOpenAPISlotsKeyCountsImportedResources(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := writeDocument(t, dir, "a.yaml", widgetsDocument)
	b := writeDocument(t, dir, "b.yaml", strings.Replace(widgetsDocument, "/gizmos", "/gadgets", -1))
	key := func(file string) string {
		h := &Handler{OpenAPI: &OpenAPIConfig{File: file}}
		cfg, err := h.resolve(nil, true)
		if err != nil {
			t.Fatal(err)
		}
		return slotsKey(cfg.resources, cfg.handler.GatewaySettings)
	}
	if key(a) == key(b) {
		t.Error("two documents with different resources share one key")
	}
	if key(a) != key(a) {
		t.Error("one document gets two keys")
	}
}
