package e2e

import (
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestMain keeps Caddy's default storage in a directory of this test run
// alone: every all-or-nothing write batch keeps its journal there, and
// every config's recovery looks there for journals to finish, which must
// never be another test run's (or a real Caddy's in the home directory).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "caddybatch-storage-")
	if err != nil {
		panic(err)
	}
	caddy.DefaultStorage.Path = dir
	// Caddy's tracing exports nowhere: the tests read spans through the
	// span tap (tracing_e2e_test.go), and no collector is listening.
	os.Setenv("OTEL_TRACES_EXPORTER", "none")
	code := m.Run()
	os.RemoveAll(dir)
	removeBinary()
	os.Exit(code)
}
