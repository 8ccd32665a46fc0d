package e2e

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/crypto/bcrypt"

	"github.com/caddy-batch/caddy-batch/internal/fixture"
)

// TestOpenAPIImport: the document's resources are served as declared
// ones are (the method map from the document, collection PATCH and
// DELETE for the batch operations, id_format from the item parameter),
// and a resource block overrides what it names.
func TestOpenAPIImport(t *testing.T) {
	file := fixture.WriteFile(t, t.TempDir(), "legacy.yaml", fixture.WidgetsOpenAPI)
	site := `
		batch /api/* {
			openapi ` + file + ` {
				publish /api/openapi.json
			}
			resource /api/widgets {
				restore_deleted post
			}
		}
		reverse_proxy UPSTREAM`
	g := startGateway(t, seededAPI(), site)
	for path, allow := range map[string]string{
		"/api/widgets":    "GET, HEAD, POST, PATCH, DELETE, OPTIONS",
		"/api/widgets/3":  "GET, HEAD, PUT, PATCH, DELETE, OPTIONS",
		"/api/gizmos":     "GET, HEAD, OPTIONS",
		"/api/gizmos/abc": "GET, HEAD, DELETE, OPTIONS",
	} {
		if r := g.do(t, http.MethodOptions, path, nil); r.Status != http.StatusNoContent || r.Header.Get("Allow") != allow {
			t.Errorf("OPTIONS %s: %d Allow %q, want %q", path, r.Status, r.Header.Get("Allow"), allow)
		}
	}
	if r := g.do(t, "TRACE", "/api/widgets/3", nil); r.Status != http.StatusNotImplemented {
		t.Errorf("TRACE: %s", r)
	}
	if r := g.do(t, http.MethodPut, "/api/widgets", []any{}); r.Status != http.StatusMethodNotAllowed {
		t.Errorf("PUT on the collection: %s", r)
	}
	// id_format integer, from the item parameter: 03 is widget 3.
	a := g.do(t, http.MethodGet, "/api/widgets?ids=03,2", nil).batch(t)
	if len(a.Items) != 2 || a.Items[0].ID != "3" || a.Outcome != "succeeded" {
		t.Fatalf("batch GET: %+v", a)
	}
	// A batch update through the collection's PATCH the gateway adds.
	r := g.do(t, http.MethodPatch, "/api/widgets", []map[string]any{{"id": 1, "name": "one"}, {"id": 2, "name": "two"}})
	if r.Status != http.StatusOK {
		t.Fatalf("batch update: %s", r)
	}
	if w, _ := g.API.Item("/api/widgets", "2"); w["name"] != "two" {
		t.Errorf("widget 2 is %v", w)
	}
	// A gizmo cannot be put back once deleted: no batch delete, said once.
	if r := g.do(t, http.MethodDelete, "/api/gizmos?ids=1", nil); r.Status != http.StatusMethodNotAllowed {
		t.Errorf("batch delete of gizmos: %s", r)
	}
}

// TestOpenAPIWarnsOnce: provisioning says once, at WARN, that gizmos'
// batch delete is left off, and how to turn it on.
func TestOpenAPIWarnsOnce(t *testing.T) {
	file := fixture.WriteFile(t, t.TempDir(), "legacy.yaml", fixture.WidgetsOpenAPI)
	site := "batch /api/* {\n\topenapi " + file + "\n}\nreverse_proxy UPSTREAM"
	g := startGateway(t, seededAPI(), site)
	// startGateway forgets what provisioning logged: provision again,
	// and send nothing while the servers change over.
	loadCaddyfile(t, g.config(site))
	var warned []string
	for _, e := range testLogs.entries("http.handlers.batch") {
		if e["level"] == "warn" {
			warned = append(warned, e["msg"].(string))
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "batch delete of /api/gizmos is off") || !strings.Contains(warned[0], "atomicity delete partial") {
		t.Errorf("warnings %q, want one about gizmos' batch delete with its recipe", warned)
	}
}

// TestOpenAPIPublish: the published document answers GET and HEAD with
// an ETag, no-cache and JSON; a matching If-None-Match is 304; other
// methods are 405.
func TestOpenAPIPublish(t *testing.T) {
	file := fixture.WriteFile(t, t.TempDir(), "legacy.yaml", fixture.WidgetsOpenAPI)
	g := startGateway(t, seededAPI(), `
		batch /api/* {
			openapi `+file+` {
				publish /api/openapi.json
				exclude /gizmos*
			}
		}
		reverse_proxy UPSTREAM`)
	r := g.do(t, http.MethodGet, "/api/openapi.json", nil)
	if r.Status != http.StatusOK || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Cache-Control") != "no-cache" || r.Header.Get("ETag") == "" {
		t.Fatalf("%s %v", r, r.Header)
	}
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Servers []map[string]string       `json:"servers"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(r.Body, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.0.3" || len(doc.Servers) != 1 || doc.Servers[0]["url"] != "/api" {
		t.Errorf("openapi %s, servers %v: want the input's version and the gateway's relative url", doc.OpenAPI, doc.Servers)
	}
	if strings.Contains(string(r.Body), "legacy.internal") {
		t.Error("the internal host name is published")
	}
	if _, ok := doc.Paths["/gizmos"]; ok {
		t.Error("an excluded path is published")
	}
	if _, ok := doc.Paths["/widgets/{widget_id}"]["trace"]; ok {
		t.Error("TRACE, which the gateway answers 501, is published")
	}
	if id := doc.Paths["/widgets"]["patch"].(map[string]any)["operationId"]; id != "batchUpdateWidgets" {
		t.Errorf("collection PATCH operationId %v", id)
	}
	if id := doc.Paths["/widgets"]["delete"].(map[string]any)["operationId"]; id != "batchDeleteWidgets" {
		t.Errorf("collection DELETE operationId %v", id)
	}
	if r := g.do(t, http.MethodGet, "/api/openapi.json", nil, "If-None-Match", r.Header.Get("ETag")); r.Status != http.StatusNotModified {
		t.Errorf("If-None-Match: %s", r)
	}
	if h := g.do(t, http.MethodHead, "/api/openapi.json", nil); h.Status != http.StatusOK || len(h.Body) != 0 || h.Header.Get("ETag") != r.Header.Get("ETag") {
		t.Errorf("HEAD: %s", h)
	}
	if p := g.do(t, http.MethodPost, "/api/openapi.json", "{}"); p.Status != http.StatusMethodNotAllowed || p.Header.Get("Allow") != "GET, HEAD, OPTIONS" {
		t.Errorf("POST: %s", p)
	}
}

// TestOpenAPIPublishDeclared: without a document, publish describes the
// declared resources, in OpenAPI 3.0.3.
func TestOpenAPIPublishDeclared(t *testing.T) {
	g := startGateway(t, seededAPI(), `
		batch /api/* {
			openapi {
				publish /api/openapi.json
			}
			envelope /api/batch
			resource /api/widgets {
				collection GET POST PATCH DELETE
				item GET PUT PATCH DELETE
				restore_deleted post
			}
		}
		reverse_proxy UPSTREAM`)
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(g.do(t, http.MethodGet, "/api/openapi.json", nil).Body, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("version %s", doc.OpenAPI)
	}
	for path, methods := range map[string][]string{
		"/api/widgets":      {"get", "post", "patch", "delete"},
		"/api/widgets/{id}": {"get", "put", "patch", "delete"},
		"/api/batch":        {"post"},
	} {
		for _, m := range methods {
			if doc.Paths[path][m] == nil {
				t.Errorf("%s %s is not published", m, path)
			}
		}
	}
}

// TestOpenAPIReload: reloading after editing only the document serves
// the edited document.
func TestOpenAPIReload(t *testing.T) {
	file := fixture.WriteFile(t, t.TempDir(), "legacy.yaml", fixture.WidgetsOpenAPI)
	site := "batch /api/* {\n\topenapi " + file + "\n}\nreverse_proxy UPSTREAM"
	g := startGateway(t, seededAPI(), site)
	if r := g.do(t, http.MethodOptions, "/api/gizmos/1", nil); r.Header.Get("Allow") != "GET, HEAD, DELETE, OPTIONS" {
		t.Fatalf("%v", r.Header)
	}
	fixture.WriteFile(t, filepath.Dir(file), "legacy.yaml", strings.Replace(fixture.WidgetsOpenAPI, "    delete:\n      responses:\n        '200': {description: deleted}\ncomponents", "components", 1))
	config := adaptCaddyfile(t, g.config(site))
	if err := caddy.Load(config, true); err != nil {
		t.Fatal(err)
	}
	// A request while the servers change over may find the port closed:
	// wait for the new config to answer.
	eventually(t, 5*time.Second, "the edited document's map", func() bool {
		r, err := g.try(http.MethodOptions, "/api/gizmos/1", nil)
		return err == nil && r.Header.Get("Allow") == "GET, HEAD, OPTIONS"
	})
	// A document that no longer parses fails the reload, and the config
	// that was serving goes on serving.
	fixture.WriteFile(t, filepath.Dir(file), "legacy.yaml", "openapi: 3.0.3\npaths: [\n")
	if err := caddy.Load(config, true); err == nil || !strings.Contains(err.Error(), "legacy.yaml") {
		t.Errorf("reloading with a broken document: %v", err)
	}
	if r := g.do(t, http.MethodOptions, "/api/gizmos/1", nil); r.Header.Get("Allow") != "GET, HEAD, OPTIONS" {
		t.Errorf("after the failed reload: Allow %q", r.Header.Get("Allow"))
	}
}

// TestOpenAPIPublishBehindAuth: docs/security.md's way to keep the published
// document private (basic_auth before batch in a route) asks for
// credentials there, and lets batches through as before.
func TestOpenAPIPublishBehindAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	file := fixture.WriteFile(t, t.TempDir(), "legacy.yaml", fixture.WidgetsOpenAPI)
	g := startGateway(t, seededAPI(), `
		route {
			basic_auth /api/openapi.json {
				docs `+string(hash)+`
			}
			batch /api/* {
				openapi `+file+` {
					publish /api/openapi.json
				}
			}
		}
		reverse_proxy UPSTREAM`)
	if r := g.do(t, http.MethodGet, "/api/openapi.json", nil); r.Status != http.StatusUnauthorized {
		t.Errorf("without credentials: %s", r)
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("docs:secret"))
	if r := g.do(t, http.MethodGet, "/api/openapi.json", nil, "Authorization", auth); r.Status != http.StatusOK {
		t.Errorf("with credentials: %s", r)
	}
	if r := g.do(t, http.MethodGet, "/api/widgets?ids=1", nil); r.Status != http.StatusOK {
		t.Errorf("a batch: %s", r)
	}
}
