package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-batch/caddy-batch/policy"
)

// resolvedDirective reads a batch directive and resolves it, as Provision does.
func resolvedDirective(t *testing.T, lines ...string) (*Handler, config) {
	t.Helper()
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(strings.Join(lines, "\n"))); err != nil {
		t.Fatal(err)
	}
	cfg, err := h.resolve(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	return &h, cfg
}

// TestEnvelopeTakesTheHandlersSettings: the envelope runs under the
// handler's own settings and its general atomicity; neither an
// operation's atomicity nor a resource's options reach it.
func TestEnvelopeTakesTheHandlersSettings(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lines []string
		want  policy.Atomicity
	}{
		{"default", nil, policy.AllOrNothing},
		{"general", []string{"\tatomicity partial"}, policy.Partial},
		{"an operation's beside it", []string{"\tatomicity partial", "\tatomicity create all_or_nothing"}, policy.Partial},
		{"an operation's alone", []string{"\tatomicity delete partial"}, policy.AllOrNothing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lines := append(append([]string{"\tenvelope /batch", "\tmax_items 7", "\titem_locks storage"}, tt.lines...),
				"\tresource /users {", "\t\tcollection GET POST PATCH DELETE", "\t\titem GET PUT PATCH DELETE",
				"\t\tatomicity partial", "\t\tmax_items 3", "\t\titem_locks local", "\t}")
			_, cfg := resolvedDirective(t, batchBlock(lines)...)
			e := cfg.envelope
			if e == nil || e.Path != "/batch" {
				t.Fatalf("envelope %+v", e)
			}
			if e.Atomicity != tt.want {
				t.Errorf("atomicity %s, want %s", e.Atomicity, tt.want)
			}
			if e.Settings.MaxItems != 7 || cfg.handler.ItemLocks != policy.StorageLocks {
				t.Errorf("max_items %d, item_locks %s: want the handler's, 7 and storage", e.Settings.MaxItems, cfg.handler.ItemLocks)
			}
		})
	}
}

// TestSlotsFollowTheResolvedMaxInFlight: the max_in_flight slots are as
// many as the resolved max_in_flight says, the default included, and
// named by it, so that a handler that leaves it out shares its slots
// with one that writes the default. The default is max_in_flight auto
// (4 to 32), whose slots start at its least; a written 32 is a fixed
// bound, no longer the default, so its slots are others.
func TestSlotsFollowTheResolvedMaxInFlight(t *testing.T) {
	var keys []string
	for _, tt := range []struct {
		option string
		want   int
	}{
		{"", policy.AutoInFlightMin},
		{"\tmax_in_flight auto", policy.AutoInFlightMin},
		{"\tmax_in_flight auto 4 32", policy.AutoInFlightMin},
		{"\tmax_in_flight 32", 32},
		{"\tmax_in_flight 5", 5},
	} {
		h, cfg := resolvedDirective(t, batchBlock([]string{tt.option}, usersResource)...)
		h.config = cfg
		slots := h.provisionSlots()
		if slots.Cap() != tt.want {
			t.Errorf("%q: %d slots, want %d", tt.option, slots.Cap(), tt.want)
		}
		if auto := slots.limit != nil; auto != (tt.want == policy.AutoInFlightMin) {
			t.Errorf("%q: adaptive %t", tt.option, auto)
		}
		keys = append(keys, slots.key)
		if _, err := pools.Delete(slots.key); err != nil {
			t.Fatal(err)
		}
	}
	if keys[0] != keys[1] || keys[1] != keys[2] || keys[2] == keys[3] || keys[3] == keys[4] {
		t.Errorf("the slots are named %q: want the default's and auto's one name, 32's another and 5's a third", keys)
	}
}
