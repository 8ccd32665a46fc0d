package batchapp

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestGlobalOptionMistakes checks that the batch global option refuses
// what it cannot use, and that the app refuses a lease too short to be
// renewed.
func TestGlobalOptionMistakes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ block, want string }{
		{"lease", "lease takes a duration"},
		{"lease soon", `lease takes a positive duration such as 10s, not "soon"`},
		{"lease 0s", `lease takes a positive duration such as 10s, not "0s"`},
		{"lease 10s 20s", "lease takes one duration"},
		{"interval 10s", `unknown batch global option "interval"`},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n\tbatch {\n\t\t"+tc.block+"\n\t}\n}\n:8080 {\n\trespond ok\n}\n"), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.block, err, tc.want)
		}
	}
	a := &App{Lease: caddy.Duration(100 * time.Millisecond), RecoveryInterval: caddy.Duration(time.Second)}
	if err := a.Validate(); err == nil || !strings.Contains(err.Error(), "lease 100ms is too short") {
		t.Errorf("a 100ms lease: %v", err)
	}
}

// TestJobStoppedBetweenWindowsIsHandedOver checks that a job whose next
// window found no config, because its own had stopped, is told apart
// from one that stopped short: Run released its lease as a hand-over
// does, and the line that says so is the one operators look for.
func TestJobStoppedBetweenWindowsIsHandedOver(t *testing.T) {
	t.Parallel()
	noConfig := fmt.Errorf("running job j from item 1000: %w", errNoConfig)
	running, stopped := make(chan struct{}), make(chan struct{})
	close(stopped)
	if !handedOver(noConfig, stopped) {
		t.Error("a job whose config stopped before its next window was not handed over")
	}
	if handedOver(noConfig, running) {
		t.Error("a job that found no config while its own still ran was taken as handed over")
	}
	if handedOver(errors.New("storing the results: timeout"), stopped) {
		t.Error("a job that stopped for its storage was taken as handed over")
	}
}
