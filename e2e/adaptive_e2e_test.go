package e2e

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
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
	limit := func() float64 {
		l, err := metric("in_flight_limit")
		if err != nil {
			t.Error(err)
		}
		return l
	}
	highest := limit()
	if highest < 2 || highest > 12 {
		t.Fatalf("in_flight_limit %v: no adaptive slots between 2 and 12 for the handler", highest)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for range 4 {
				if resp, err := g.try("GET", "/api/widgets?ids="+idList(1, 50), nil); err != nil || resp.Status != 200 {
					t.Errorf("batch: %s %v", resp, err)
					return
				}
				l := limit()
				mu.Lock()
				highest = max(highest, l)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if highest <= 2 {
		t.Errorf("the limit never rose above its least, 2, in front of 4 idle workers")
	}
	if highest > 12 || api.PeakInFlight() > 12 {
		t.Errorf("the limit reached %v and the API held %d requests at once; the most is 12", highest, api.PeakInFlight())
	}
}
