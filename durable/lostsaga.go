package durable

import (
	"context"
	"errors"
	"path"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// What a saga that lost its lease does with the storage
// (docs/durability.md, "A saga never writes after it lost its lease"):
// it writes nothing under the journal, which is the new owner's; it
// keeps what it could not undo of its own under a saga of its own; and
// it watches for the new owner's end, to tell its client.

// KeepLost keeps snap, as the saga that lost its lease ended it (res),
// as a left-behind saga of its own linked to the lost one (LostFrom), so
// that a listing shows it and a retry can finish it: under kept, if it
// was kept already, else under a new id; an ERROR line names it. With
// nothing left behind, the copy kept before is removed.
func (j *Journal) KeepLost(ctx context.Context, kept string, snap *batch.Snapshot, res *batch.Result) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	if len(res.LeftBehind) == 0 {
		if kept == "" {
			return "", nil
		}
		return "", j.js.removeKept(ctx, kept)
	}
	saga := kept
	if saga == "" {
		saga = NewID()
	}
	k := keptOf(&storedSaga{intent: &intent{Saga: saga, Origin: j.origin, Started: j.began}, snap: snap}, res)
	k.LostFrom = j.saga
	if err := j.js.storeKept(ctx, k); err != nil {
		return kept, err
	}
	j.js.logger.Error("a saga that lost its lease kept what it left behind, or may have: retry or resolve it once the items are checked",
		zap.String("saga", saga), zap.String("lost_from", j.saga), zap.Strings("left_behind", res.LeftBehind),
		zap.String("command", "caddy batch saga "+saga))
	return saga, nil
}

// AwaitEnd waits, until ctx is done, for the instance that took the
// saga over to end it (batch.LostKeeper): its journal gone, after a
// lease of a later epoch than this process's showed. Its kept copy, if
// any, says it left items behind. A journal gone with no sign of a
// takeover is a storage that forgot it, not an end.
func (j *Journal) AwaitEnd(ctx context.Context) (bool, batch.Outcome, []string, bool) {
	poll := min(max(j.js.leases.Length/20, 50*time.Millisecond), time.Second)
	look := context.WithoutCancel(ctx) // the first look, whatever time is left
	for {
		ended, outcome, left, orphaned := j.endSeen(look)
		if ended || orphaned {
			return ended, outcome, left, orphaned
		}
		look = ctx
		select {
		case <-ctx.Done():
			return false, "", nil, false
		case <-time.After(poll):
		}
	}
}

// endSeen looks once for the saga's end (AwaitEnd): a kept copy is an
// end with items left behind; a journal gone (or being removed) after
// another instance's lease showed is an end rolled back; one gone with
// no such sign is orphaned (the storage forgot it, or an end this
// process cannot tell from that).
func (j *Journal) endSeen(ctx context.Context) (ended bool, outcome batch.Outcome, left []string, orphaned bool) {
	sctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	names, err := listNames(sctx, j.js.storage, journalDir(j.saga))
	if err != nil {
		return false, "", nil, false
	}
	if epoch, _ := topLeases(names); epoch > j.epoch {
		j.takenOver.Store(true)
	}
	k, err := j.js.loadKept(sctx, j.saga)
	switch {
	case err == nil:
		return true, batch.RollbackFailed, k.LeftBehind, false
	case !errors.Is(err, ErrUnknownSaga):
		return false, "", nil, false
	}
	gone := !slices.Contains(names, path.Base(segmentKey(j.saga, 0)))
	switch {
	case gone && (j.takenOver.Load() || slices.Contains(names, endName)):
		return true, batch.RolledBack, nil, false
	case gone:
		return false, "", nil, true
	}
	return false, "", nil, false
}

// Interface guard
var _ batch.LostKeeper = (*Journal)(nil)
