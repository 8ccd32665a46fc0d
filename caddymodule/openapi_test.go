package caddymodule

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-batch/caddy-batch/internal/fixture"
)

// The OpenAPI tests that start no Caddy: the adapter's errors, the
// document beside the Caddyfile, the slots key. The end-to-end ones are
// in e2e/openapi_e2e_test.go.

// TestOpenAPIConfigErrors: a document the gateway cannot use, and a
// publish path inside a resource, fail caddy adapt at the openapi
// line, naming the file, the JSON pointer and what to do.
func TestOpenAPIConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notOpenAPI := fixture.WriteFile(t, dir, "notes.yaml", "title: my notes\n")
	odd := fixture.WriteFile(t, dir, "odd.yaml", "openapi: 3.1.0\ninfo: {title: x, version: '1'}\npaths:\n  /files/{name}.json:\n    get:\n      parameters:\n        - {name: name, in: path, required: true, schema: {type: string}}\n      responses:\n        '200': {description: ok}\n")
	good := fixture.WriteFile(t, dir, "legacy.yaml", fixture.WidgetsOpenAPI)
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
	fixture.WriteFile(t, dir, "legacy.yaml", fixture.WidgetsOpenAPI)
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
	fixture.WriteFile(t, dir, "legacy.yaml", strings.Replace(fixture.WidgetsOpenAPI, "    trace:", "    options:", 1))
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
	a := fixture.WriteFile(t, dir, "a.yaml", fixture.WidgetsOpenAPI)
	b := fixture.WriteFile(t, dir, "b.yaml", strings.Replace(fixture.WidgetsOpenAPI, "/gizmos", "/gadgets", -1))
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

// TestOpenAPIParentFormatsReachTheLocks: an imported parent parameter
// of type integer names every spelling of the parent alike in the
// items' locks, and the path sent keeps the client's spelling.
func TestOpenAPIParentFormatsReachTheLocks(t *testing.T) {
	t.Parallel()
	const ok = "{responses: {'200': {description: ok}}}"
	doc := fixture.WriteFile(t, t.TempDir(), "fastapi.yaml", `openapi: 3.1.0
info: {title: x, version: '1'}
paths:
  /users/{user_id}/items/:
    parameters: [{name: user_id, in: path, required: true, schema: {type: integer}}]
    get: `+ok+`
  /users/{user_id}/items/{item_id}:
    parameters:
      - {name: user_id, in: path, required: true, schema: {type: integer}}
      - {name: item_id, in: path, required: true, schema: {type: integer}}
    get: `+ok+`
    patch: `+ok+`
`)
	h := &Handler{OpenAPI: &OpenAPIConfig{File: doc}}
	cfg, err := h.resolve(nil, false)
	if err != nil {
		t.Fatal(err)
	}
	m, found := cfg.policy.Lookup("/users/020/items/")
	if !found || m.Item {
		t.Fatal("/users/020/items/ is not the imported collection")
	}
	if sent, key := m.ItemPaths().Path("5"), m.ItemPaths().Key("5"); sent != "/users/020/items/5" || key != "/users/20/items/5" {
		t.Errorf("sent %s, locked %s; want /users/020/items/5 locked as /users/20/items/5", sent, key)
	}
}
