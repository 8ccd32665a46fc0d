package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/fixture"
)

// oapiCodegen is the client generator the published document is checked
// with, fetched through the Go module proxy.
const oapiCodegen = "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2"

// unreachable says whether the go command failed because the module
// proxy could not be reached, the one reason the test skips.
func unreachable(out []byte) bool {
	for _, s := range []string{"dial tcp", "no such host", "connection refused", "i/o timeout", "proxyconnect", "network is unreachable", "TLS handshake timeout"} {
		if bytes.Contains(out, []byte(s)) {
			return true
		}
	}
	return false
}

// TestOpenAPIGeneratedClient: oapi-codegen generates a client from the
// document the gateway publishes (3.0.3); the client compiles and, with
// its typed methods, performs a batch GET, CREATE, UPDATE and DELETE
// through the gateway, and the fake API's final state is what they did.
// It needs the Go module proxy; it skips, saying so, only where that
// cannot be reached.
func TestOpenAPIGeneratedClient(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: generating and building a client takes minutes on a cold module cache")
	}
	file := fixture.WriteFile(t, t.TempDir(), "legacy.yaml", fixture.WidgetsOpenAPI)
	g := startGateway(t, seededAPI(), `
		batch /api/* {
			openapi `+file+` {
				publish /api/openapi.json
				exclude /gizmos*
			}
			resource /api/widgets {
				restore_deleted post
			}
		}
		reverse_proxy UPSTREAM`)
	doc := g.do(t, http.MethodGet, "/api/openapi.json", nil)
	if doc.Status != http.StatusOK {
		t.Fatal(doc)
	}
	mod := t.TempDir()
	main, err := os.ReadFile("testdata/openapiclient/main.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{
		"openapi.json": doc.Body,
		"go.mod":       []byte("module batchclient\n\ngo 1.26\n"),
		"main.go":      main,
	} {
		if err := os.WriteFile(filepath.Join(mod, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(goTool, args...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			if unreachable(stderr.Bytes()) {
				t.Skipf("the Go module proxy cannot be reached: %s", stderr.Bytes())
			}
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return out
	}
	run("run", oapiCodegen, "-generate", "types,client", "-package", "main", "-o", "client.gen.go", "openapi.json")
	run("mod", "tidy")
	run("vet", ".")
	var got struct {
		Get     []string `json:"get"`
		Created []int    `json:"created"`
		Updated int      `json:"updated"`
		Deleted int      `json:"deleted"`
		Refused int      `json:"refused"`
	}
	out := run("run", ".", g.URL+"/api")
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Join(got.Get, ",") != "w2,w1" || len(got.Created) != 2 || got.Updated != 2 || got.Deleted != 2 || got.Refused != http.StatusBadRequest {
		t.Errorf("the client read %+v\n%s", got, out)
	}
	// The API's final state, as the client's batches left it.
	for id, name := range map[string]string{"1": "uno", "2": "dos"} {
		if w, ok := g.API.Item("/api/widgets", id); !ok || w["name"] != name {
			t.Errorf("widget %s is %v, want %s", id, w, name)
		}
	}
	for _, id := range []string{"3", "4"} {
		if w, ok := g.API.Item("/api/widgets", id); ok {
			t.Errorf("widget %s is still there: %v", id, w)
		}
	}
	for i, id := range got.Created {
		if w, ok := g.API.Item("/api/widgets", strconv.Itoa(id)); !ok || w["name"] != []string{"new-a", "new-b"}[i] {
			t.Errorf("created widget %d is %v", id, w)
		}
	}
}
