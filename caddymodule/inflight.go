package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/adaptive"
	"github.com/caddy-batch/caddy-batch/internal/slots"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
	"github.com/caddy-batch/caddy-batch/policy"
)

// pools keep what must outlive one config: a reload provisions the new
// handlers before the old ones are cleaned up, so a batch running on the
// old config and one arriving on the new share the max_in_flight slots.
var pools = caddy.NewUsagePool()

// pooledSlots are one handler's max_in_flight slots, kept in pools so
// that a reload does not reset them: the new config is provisioned
// before the old one is cleaned up, and the old config's batches run on
// after that, so both share one bound instead of having one each.
//
// The throttles the legacy API asked for are kept with them, so that a
// batch on the new config waits out a pause a batch on the old one was
// asked for: both send to the same API.
//
// Under max_in_flight auto, the number of slots follows limit, which
// every sub-request's answer is told to (observer).
type pooledSlots struct {
	*slots.FIFO
	key       string
	throttles *batch.Throttles
	limit     *adaptive.Limit // nil: a fixed max_in_flight
}

// observer is what a batch's Runtime tells each sub-request's answer
// to: the slots under max_in_flight auto, and nothing under a fixed
// max_in_flight, whose slots do not move.
func (p *pooledSlots) observer() batch.Observer {
	if p.limit == nil {
		return nil
	}
	return p
}

// Observe tells the adaptive limit what one sub-request's answer
// showed, and moves the slots where it goes. The limit is told the slots
// Used, not those in flight: while the background cap holds bulk jobs
// back the limit counts as used, so that it grows under jobs alone.
func (p *pooledSlots) Observe(latency time.Duration, overloaded bool) {
	if n, changed := p.limit.Observe(latency, p.Used(), overloaded); changed {
		p.SetCap(n)
	}
}

func (*pooledSlots) Destruct() error { return nil }

// provisionSlots takes the handler's share of its max_in_flight slots,
// as resolve set max_in_flight.
//
// The slots are found again after a reload by what names the handler
// across configs: its resources' paths, and max_in_flight itself. A
// reload that changes neither keeps the slots, and batches on the old
// and the new config wait in one queue. A reload that changes
// max_in_flight (or the resources) gets new slots at the new value; the
// old config's batches finish on the old ones, so for that while the
// two bounds add up. Two handlers that list the same resources with the
// same max_in_flight (two sites in front of one API) share one bound.
func (h *Handler) provisionSlots() *pooledSlots {
	g := h.handler.GatewaySettings
	key := slotsKey(h.resources, g)
	v, _, _ := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		p := &pooledSlots{key: key, throttles: batch.NewThrottles(telemetry.Metrics.ThrottledWait)}
		if g.AutoInFlight {
			p.limit = adaptive.New(g.MinInFlight, g.MaxInFlight)
			p.FIFO = slots.NewFIFO(p.limit.Current())
		} else {
			p.FIFO = slots.NewFIFO(g.MaxInFlight)
		}
		return p, nil
	})
	return v.(*pooledSlots)
}

// slotsKey names in pools the slots of a handler's resources (the
// imported ones too, as resolve found them), as g says how many there
// are.
func slotsKey(resources []resolved, g policy.GatewaySettings) string {
	paths := make([]string, len(resources))
	for i, r := range resources {
		paths[i] = r.Path
	}
	slices.Sort(paths) // reordering the resources is no new handler
	id, _ := json.Marshal(struct {
		Paths       []string `json:"paths"`
		MaxInFlight int      `json:"max_in_flight"`
		Auto        bool     `json:"auto,omitempty"`
		MinInFlight int      `json:"min,omitempty"`
	}{paths, g.MaxInFlight, g.AutoInFlight, g.MinInFlight})
	sum := sha256.Sum256(id)
	return "batch.max_in_flight." + hex.EncodeToString(sum[:12])
}

// Cleanup lets go of the handler's share of what the pools keep.
func (h *Handler) Cleanup() error {
	if h.slots == nil {
		return nil
	}
	h.untrackSlots()
	_, err := pools.Delete(h.slots.key)
	return err
}
