package caddymodule

import (
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// scope is what a batch request runs under: one resource's collection, or
// the handler's envelope (docs/envelope.md). It names what the request is
// counted, logged, keyed and journaled under, and holds what bounds it.
type scope struct {
	// resource is the resource label of the metrics and the log line,
	// and of an Idempotency-Key record: the collection's template
	// without its variables' formats (Template.Plain), or the
	// envelope's path.
	resource string
	// collection is the path an Idempotency-Key record is scoped to: the
	// collection's, its variables bound, or the envelope's.
	collection string
	// settings and gateway are the batch's own: its resource's, or the
	// handler's.
	settings policy.Settings
	gateway  policy.GatewaySettings
	// atomicity is what a refused batch is counted under.
	atomicity func(op policy.Op) policy.Atomicity
	// locks lock the items the batch writes.
	locks itemlock.Locker
	// allow is the Allow header of a 405.
	allow string
}

// collectionScope is the scope of a batch on the collection m matched.
func (h *Handler) collectionScope(m policy.Match) scope {
	s := m.Resource.Settings
	return scope{
		resource:   m.Resource.Collection.Plain(),
		collection: m.CollectionPath(),
		settings:   s,
		gateway:    m.Resource.Gateway,
		atomicity:  func(op policy.Op) policy.Atomicity { return s.Atomicity[op] },
		locks:      h.lockerFor(m),
		allow:      m.Allow(),
	}
}

// envelopeScope is the scope of the handler's envelope: each item it
// writes is locked as its own resource says.
func (h *Handler) envelopeScope() scope {
	e := h.envelope
	return scope{
		resource:   e.Path,
		collection: e.Path,
		settings:   e.Settings,
		gateway:    h.handler.GatewaySettings,
		atomicity:  func(policy.Op) policy.Atomicity { return e.Atomicity },
		locks:      envelopeLocks{h},
		allow:      envelopeAllow,
	}
}
