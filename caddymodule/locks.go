package caddymodule

import (
	"context"
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/internal/telemetry"
	"github.com/caddy-batch/caddy-batch/policy"
)

// localLocks is the one table of local item locks of the process. It
// lives as long as the process, not as long as some handler: a saga
// outlives its config (a reload to a config without a batch handler
// cleans up every handler while the saga may still be compensating), and
// later configs' writers must still wait for it. Its entries remove
// themselves when unused, so it holds nothing for long. Every handler
// shares it: two sites in front of one API must exclude each other, and
// two in front of different APIs only share keys when their item paths
// are the same.
var localLocks itemlock.Local

// provisionLocks sets up storage locks when a resource asks for them;
// local locks are the process's table.
func (h *Handler) provisionLocks(storage certmagic.Storage) error {
	h.locks = &localLocks
	if h.policy.Uses(func(g policy.GatewaySettings) bool { return g.ItemLocks == policy.StorageLocks }) {
		if storage == nil {
			return errors.New("item_locks storage needs Caddy's storage, and this context has none")
		}
		h.storageLocks = durable.NewItemLocks(h.locks, batchapp.DurableStorage(storage), func(name string, err error) { unlockFailed(h.logger, name)(err) })
	}
	return nil
}

// lockerFor returns the locks of the matched resource's items: storage
// locks take the local lock too, so writers of one process exclude each
// other whatever their resource's item_locks.
func (h *Handler) lockerFor(m policy.Match) itemlock.Locker {
	if m.Resource.Gateway.ItemLocks == policy.StorageLocks && h.storageLocks != nil {
		return h.storageLocks
	}
	return h.locks
}

// unlockFailed logs a storage lock that could not be released: it lapses
// only when the storage's lease on it does.
func unlockFailed(logger *zap.Logger, name string) func(error) {
	return func(err error) {
		logger.Error("releasing a storage lock", zap.String("lock", name), zap.Error(err))
	}
}

// isWrite reports whether a single-item request changes the item, and so
// must not interleave with a saga that holds it.
func isWrite(method string) bool {
	return method == http.MethodPut || method == http.MethodPatch || method == http.MethodDelete
}

// serveLockedWrite passes a single-item write on while it holds its
// item's lock: it waits while a batch holds the item (at most
// item_timeout), and a batch waits for it.
func (h *Handler) serveLockedWrite(w http.ResponseWriter, r *http.Request, m policy.Match, serve func() error) error {
	key := m.ItemKey()
	ctx, cancel := context.WithTimeout(r.Context(), m.Resource.Settings.ItemTimeout)
	unlock, err := telemetry.ObserveLocks(h.lockerFor(m), serverName(r), m.Resource.Collection.Plain(), telemetry.LockBySingle).Lock(ctx, key)
	cancel()
	if err != nil {
		ref := batch.RefuseLock(key, err, batch.LockWait{Client: r.Context(), ItemTimeout: m.Resource.Settings.ItemTimeout})
		switch ref.Status {
		case 499:
			return caddyhttp.Error(499, err)
		case http.StatusServiceUnavailable:
			// The storage failed: the write cannot be excluded from a
			// saga on another instance, so it is not sent.
			h.logger.Error("locking an item", zap.String("item", key), zap.Error(err))
		}
		w.Header().Set("Retry-After", ref.RetryAfter)
		return problem.New(ref.Status, ref.Type, ref.Detail).Write(w)
	}
	defer unlock()
	return serve()
}
