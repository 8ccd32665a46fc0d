package caddymodule

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/options"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Under max_in_flight auto, the slots follow the legacy API: in front of
// 4 workers they grow from their least, stay within their most, and the
// API never holds more of the gateway's requests than the most.
func TestMaxInFlightAutoE2E(t *testing.T) {
	api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", Workers: 4, ServiceTime: 2 * time.Millisecond, Seed: records("w", 1, 50)})
	site := `
	batch {
		max_in_flight auto 2 12
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
	g := startGateway(t, api, site)
	h := Handler{Options: options.Options{MaxInFlightAuto: &options.AutoInFlight{Min: 2, Max: 12}}, Resources: []Resource{{Path: "/api/widgets"}}}
	key := slotsKey(h.resolveResources(nil), policy.GatewaySettings{AutoInFlight: true, MinInFlight: 2, MaxInFlight: 12})
	var slots *pooledSlots
	pools.Range(func(k, v any) bool {
		if k == key {
			slots = v.(*pooledSlots)
		}
		return slots == nil
	})
	if slots == nil || slots.limit == nil {
		t.Fatal("no adaptive slots for the handler")
	}
	var mu sync.Mutex
	highest := slots.Cap()
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for range 4 {
				if resp := g.do(t, "GET", "/api/widgets?ids="+idList(1, 50), nil); resp.Status != 200 {
					t.Errorf("batch: %s", resp)
					return
				}
				mu.Lock()
				highest = max(highest, slots.Cap())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if highest <= 2 {
		t.Errorf("the limit never rose above its least, 2, in front of 4 idle workers")
	}
	if highest > 12 || api.PeakInFlight() > 12 {
		t.Errorf("the limit reached %d and the API held %d requests at once; the most is 12", highest, api.PeakInFlight())
	}
}
