package caddymodule

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-batch/caddy-batch/policy"
)

// TestSettingsInheritance checks that defaults, handler options and
// resource options stack as documented.
func TestSettingsInheritance(t *testing.T) {
	t.Parallel()
	var h Handler
	raw := `{
		"atomicity": "partial",
		"operation_atomicity": {"delete": "all_or_nothing"},
		"max_items": 7,
		"item_timeout": "2s",
		"conditional_writes": true,
		"scope_query": ["tenant"],
		"id_format": "integer",
		"stamped_fields": ["updated_at"],
		"idempotency_ttl": "1h",
		"item_locks": "storage",
		"max_in_flight": 5,
		"resources": [
			{"path": "/plain", "collection": ["GET", "POST", "DELETE"], "item": ["GET", "PUT", "DELETE"]},
			{"path": "/tuned", "collection": ["GET"], "item": ["GET"], "atomicity": "all_or_nothing", "max_items": 3, "compensation_retries": 0, "allow_override": true,
				"conditional_writes": false, "scope_query": ["api_key", "tenant"], "id_format": "uuid",
				"stamped_fields": ["modified", "etag"],
				"journal": false, "item_locks": "local", "idempotency_ttl": "2m", "scope_headers": ["X-API-Key"]}
		]
	}`
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	// What Provision builds, without the app a bare Context cannot load.
	cfg, err := h.resolve(nil, true)
	if err != nil {
		t.Fatal(err)
	}
	h.config = cfg
	plain := policy.Defaults()
	plain.SetAtomicity(policy.Partial)
	plain.Atomicity[policy.OpDelete] = policy.AllOrNothing
	plain.MaxItems, plain.ItemTimeout = 7, 2*time.Second
	plain.ConditionalWrites, plain.ScopeQuery, plain.IDFormat = true, []string{"tenant"}, policy.IDInteger
	plain.StampedFields = []string{"updated_at"}
	tuned := plain
	tuned.SetAtomicity(policy.AllOrNothing)
	tuned.MaxItems, tuned.CompensationRetries, tuned.AllowOverride = 3, 0, true
	tuned.ConditionalWrites, tuned.ScopeQuery, tuned.IDFormat = false, []string{"api_key", "tenant"}, policy.IDUUID
	tuned.StampedFields = []string{"modified", "etag"}

	plainGateway := policy.GatewayDefaults()
	plainGateway.IdempotencyTTL, plainGateway.ItemLocks, plainGateway.MaxInFlight = time.Hour, policy.StorageLocks, 5
	// A number is a fixed bound: it turns the default max_in_flight auto off.
	plainGateway.AutoInFlight, plainGateway.MinInFlight = false, 0
	tunedGateway := plainGateway
	tunedGateway.Journal, tunedGateway.ItemLocks, tunedGateway.IdempotencyTTL = false, policy.LocalLocks, 2*time.Minute
	tunedGateway.ScopeHeaders = []string{"X-API-Key"}

	for path, want := range map[string]policy.Settings{"/plain": plain, "/tuned": tuned} {
		m, ok := h.policy.Lookup(path)
		if !ok {
			t.Fatalf("no resource at %s", path)
		}
		if got := m.Resource.Settings; !reflect.DeepEqual(got, want) {
			t.Errorf("%s settings\n got %+v\nwant %+v", path, got, want)
		}
		wantGateway := map[string]policy.GatewaySettings{"/plain": plainGateway, "/tuned": tunedGateway}[path]
		if got := m.Resource.Gateway; !reflect.DeepEqual(got, wantGateway) {
			t.Errorf("%s gateway settings\n got %+v\nwant %+v", path, got, wantGateway)
		}
	}
}

// TestListFilterReachesThePolicy: a list_filter block, in a Caddyfile or
// in JSON, is the resource's list filter, with its defaults.
func TestListFilterReachesThePolicy(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		block     []string
		query     string
		maxIDs    int
		preflight bool
	}{
		{[]string{`		list_filter "id__in={ids}&page_size=100" {`, "\t\t\titems /results", "\t\t\tmax_ids 40", "\t\t\tpreflight", "\t\t}"}, "id__in=1,2&page_size=100", 40, true},
		{[]string{`		list_filter "id={id}"`}, "id=1&id=2", 50, false},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(strings.Join(batchBlock(listResource(tt.block...)), "\n"))); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(&h)
		var fromJSON Handler
		if err := json.Unmarshal(raw, &fromJSON); err != nil {
			t.Fatal(err)
		}
		cfg, err := fromJSON.resolve(nil, true)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := cfg.policy.Lookup("/users")
		f := m.Resource.List
		if f == nil || f.Query([]string{"1", "2"}) != tt.query || f.MaxIDs != tt.maxIDs || f.Preflight != tt.preflight {
			t.Errorf("%s: list filter %+v", tt.block[0], f)
		}
	}
}

// TestAdaptiveOptionsReachThePolicy: max_throttle_wait (0 included) is
// inherited and overridden as every resource option; max_in_flight auto
// takes its bounds, or 4 and 32.
func TestAdaptiveOptionsReachThePolicy(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		raw      string
		wait     map[string]time.Duration
		min, max int
	}{
		{`{"max_throttle_wait": 0, "max_in_flight_auto": {}, "resources": [
			{"path": "/off", "collection": ["GET"], "item": ["GET"]},
			{"path": "/on", "collection": ["GET"], "item": ["GET"], "max_throttle_wait": "2s"}]}`,
			map[string]time.Duration{"/off": 0, "/on": 2 * time.Second}, 4, 32},
		{`{"max_in_flight_auto": {"min": 2, "max": 64}, "resources": [
			{"path": "/default", "collection": ["GET"], "item": ["GET"]}]}`,
			map[string]time.Duration{"/default": 5 * time.Second}, 2, 64},
	} {
		var h Handler
		if err := json.Unmarshal([]byte(tt.raw), &h); err != nil {
			t.Fatal(err)
		}
		cfg, err := h.resolve(nil, true)
		if err != nil {
			t.Fatal(err)
		}
		for path, wait := range tt.wait {
			m, _ := cfg.policy.Lookup(path)
			if got := m.Resource.Settings.MaxThrottleWait; got != wait {
				t.Errorf("%s: max_throttle_wait %s, want %s", path, got, wait)
			}
			if g := m.Resource.Gateway; !g.AutoInFlight || g.MinInFlight != tt.min || g.MaxInFlight != tt.max {
				t.Errorf("%s: gateway %+v, want auto %d..%d", path, g, tt.min, tt.max)
			}
		}
	}
}
