package durable

import (
	"context"
	"errors"
	"path"
	"slices"
	"time"

	"github.com/caddy-batch/caddy-batch/batch"
)

// What a saga that lost its lease does with the storage
// (docs/durability.md, "A saga never writes after it lost its lease"):
// it writes nothing under the journal, which is the new owner's; it
// keeps what it could not undo of its own under a saga of its own; and
// it watches for the new owner's end, to tell its client.

// KeepLost keeps snap, as the saga that lost its lease ended it (res),
// as a left-behind saga of its own linked to the lost one (LostFrom), so
// that a listing shows it and a retry can finish it.
func (j *Journal) KeepLost(ctx context.Context, snap *batch.Snapshot, res *batch.Result) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	saga := NewID()
	k := keptOf(&storedSaga{intent: &intent{Saga: saga, Origin: j.origin, Started: j.began}, snap: snap}, res)
	k.LostFrom = j.saga
	if err := j.js.storeKept(ctx, k); err != nil {
		return "", err
	}
	return saga, nil
}

// AwaitEnd waits, until ctx is done, for the instance that took the
// saga over to end it (batch.LostKeeper): its journal gone, after a
// lease of a later epoch than this process's showed. Its kept copy, if
// any, says it left items behind. A journal gone with no sign of a
// takeover is a storage that forgot it, not an end.
func (j *Journal) AwaitEnd(ctx context.Context) (bool, batch.Outcome, []string, bool) {
	poll := min(max(j.js.leases.Length/20, 50*time.Millisecond), time.Second)
	for {
		if ended, outcome, left := j.endSeen(ctx); ended {
			return true, outcome, left, true
		}
		select {
		case <-ctx.Done():
			return false, "", nil, j.takenOver.Load()
		case <-time.After(poll):
		}
	}
}

// endSeen looks once for the saga's end (AwaitEnd).
func (j *Journal) endSeen(ctx context.Context) (bool, batch.Outcome, []string) {
	sctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	names, err := listNames(sctx, j.js.storage, journalDir(j.saga))
	if err != nil {
		return false, "", nil
	}
	if epoch, _ := topLeases(names); epoch > j.epoch {
		j.takenOver.Store(true)
	}
	if slices.Contains(names, path.Base(segmentKey(j.saga, 0))) || !j.takenOver.Load() && !slices.Contains(names, endName) {
		k, err := j.js.loadKept(sctx, j.saga)
		if err == nil {
			return true, batch.RollbackFailed, k.LeftBehind
		}
		return false, "", nil
	}
	k, err := j.js.loadKept(sctx, j.saga)
	switch {
	case err == nil:
		return true, batch.RollbackFailed, k.LeftBehind
	case errors.Is(err, ErrUnknownSaga):
		return true, batch.RolledBack, nil
	}
	return false, "", nil
}

// Interface guard
var _ batch.LostKeeper = (*Journal)(nil)
