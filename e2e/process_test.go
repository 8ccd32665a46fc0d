package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// builtCaddy is cmd/caddy, built at most once per test run for the tests
// that must run Caddy as a process of its own (to kill it, or to run two).
var builtCaddy struct {
	once sync.Once
	path string
	err  error
	out  []byte
	dir  string
}

// caddyBinary returns the path of a cmd/caddy binary: $BATCH_TEST_CADDY
// when set (.ci/run builds one binary for every step), else one built
// for this run. Tests that need it are skipped under -short.
func caddyBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs cmd/caddy as a process of its own")
	}
	if bin := os.Getenv("BATCH_TEST_CADDY"); bin != "" {
		return bin
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build cmd/caddy with")
	}
	builtCaddy.once.Do(func() {
		builtCaddy.dir, builtCaddy.err = os.MkdirTemp("", "batch-caddy-")
		if builtCaddy.err != nil {
			return
		}
		builtCaddy.path = filepath.Join(builtCaddy.dir, "caddy")
		builtCaddy.out, builtCaddy.err = exec.Command(goTool, "build", "-o", builtCaddy.path, "../cmd/caddy").CombinedOutput()
	})
	if builtCaddy.err != nil {
		t.Fatalf("building cmd/caddy: %v\n%s", builtCaddy.err, builtCaddy.out)
	}
	return builtCaddy.path
}

// removeBinary removes what caddyBinary built; TestMain calls it.
func removeBinary() {
	if builtCaddy.dir != "" {
		os.RemoveAll(builtCaddy.dir)
	}
}
