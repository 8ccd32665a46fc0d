package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/batch"
)

// pooledSlots are one handler's max_in_flight slots, kept in pools so
// that a reload does not reset them: the new config is provisioned
// before the old one is cleaned up, and the old config's batches run on
// after that, so both share one bound instead of having one each.
type pooledSlots struct {
	*batch.FIFOSlots
	key string
}

func (*pooledSlots) Destruct() error { return nil }

// provisionSlots takes the handler's share of its max_in_flight slots.
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
	key, n := h.slotsKey()
	v, _, _ := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &pooledSlots{FIFOSlots: batch.NewFIFOSlots(n), key: key}, nil
	})
	return v.(*pooledSlots)
}

// slotsKey names the handler's slots in pools, and says how many there
// are.
func (h *Handler) slotsKey() (key string, n int) {
	// buildPolicy has already refused whatever apply could refuse.
	g := defaults()
	_ = h.Options.apply(&g)
	resources := h.resolveResources() // the imported ones too
	paths := make([]string, len(resources))
	for i, r := range resources {
		paths[i] = r.Path
	}
	slices.Sort(paths) // reordering the resources is no new handler
	id, _ := json.Marshal(struct {
		Paths       []string `json:"paths"`
		MaxInFlight int      `json:"max_in_flight"`
	}{paths, g.MaxInFlight})
	sum := sha256.Sum256(id)
	return "batch.max_in_flight." + hex.EncodeToString(sum[:12]), g.MaxInFlight
}
