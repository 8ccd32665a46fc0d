package openapi

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// swaggerParser is the standard validator the published documents are
// checked with: not the gateway's own parser. Pinned, installed once per
// machine from npm.
const swaggerParser = "@apidevtools/swagger-parser@13.0.0"

// installSwaggerParser installs the validator into the user's cache, or
// skips the test saying why it cannot.
func installSwaggerParser(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the validator is installed from npm")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed, so %s cannot run", tool, swaggerParser)
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = t.TempDir()
	}
	dir := filepath.Join(cache, "caddy-batch", strings.NewReplacer("@", "", "/", "-").Replace(swaggerParser))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@apidevtools", "swagger-parser")); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", dir, swaggerParser)
	if out, err := cmd.CombinedOutput(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && strings.Contains(string(out), "ENOTFOUND") || strings.Contains(string(out), "ECONNREFUSED") || strings.Contains(string(out), "ETIMEDOUT") {
			t.Skipf("npm cannot reach its registry: %s", out)
		}
		t.Fatalf("npm install %s: %v\n%s", swaggerParser, err, out)
	}
	return dir
}

// validateWithSwaggerParser runs the validator on a document.
func validateWithSwaggerParser(t *testing.T, dir string, raw []byte) {
	t.Helper()
	if out, err := swaggerParserRefuses(t, dir, raw); err != nil {
		t.Fatalf("%s refuses the published document: %v\n%s", swaggerParser, err, out)
	}
}

func swaggerParserRefuses(t *testing.T, dir string, raw []byte) ([]byte, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "published.json")
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `require("@apidevtools/swagger-parser").validate(process.argv[1])
		.then(() => console.log("valid"))
		.catch((e) => { console.error(e.message); process.exit(1); });`
	cmd := exec.Command("node", "-e", script, file)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	return cmd.CombinedOutput()
}

// TestPublishedDocumentsAreValid: a standard validator other than the
// gateway's parser accepts the documents the gateway publishes, from
// 3.0 and 3.1 inputs and from declared resources alone.
func TestPublishedDocumentsAreValid(t *testing.T) {
	t.Parallel()
	dir := installSwaggerParser(t)
	bad := `{"openapi":"3.0.3","info":{"title":"x","version":"1"},"paths":{"/a":{"get":{"parameters":[{"name":"x","in":"nowhere"}],"responses":{"200":{"description":"ok"}}}}}}`
	if _, err := swaggerParserRefuses(t, dir, []byte(bad)); err == nil {
		t.Fatal("the validator accepts a parameter in nowhere: it validates nothing")
	}
	// The demo legacy API's own document too.
	for _, file := range []string{"drf.yaml", "fastapi.json", "express.yaml", "../../cmd/demo/legacy-openapi.yaml"} {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			_, raw := publish(t, file, Gateway{Envelope: "/batch"})
			validateWithSwaggerParser(t, dir, raw)
		})
	}
	t.Run("declared", func(t *testing.T) {
		t.Parallel()
		s := policy.ResourceSpec{Path: "/api/users/{user}/posts", CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"},
			ItemMethods: []string{"GET", "PUT", "PATCH", "DELETE"}, Settings: policy.Defaults(), Gateway: policy.GatewayDefaults()}
		s.Settings.AllowOverride = true
		p, err := policy.New([]policy.ResourceSpec{s})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := Publish(nil, []Served{{Resource: p.Resources()[0]}}, Gateway{Prefix: "/api", Envelope: "/api/batch"})
		if err != nil {
			t.Fatal(err)
		}
		validateWithSwaggerParser(t, dir, raw)
	})
}
