package caddymodule

import (
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestMain keeps Caddy's default storage in a directory of this test run
// alone: validating a config (TestExampleIsValid) provisions the batch
// app, which opens the storage and may take its locks, and must never
// wait on, or write into, another run's or a real Caddy's in the home
// directory.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "caddybatch-storage-")
	if err != nil {
		panic(err)
	}
	caddy.DefaultStorage.Path = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
