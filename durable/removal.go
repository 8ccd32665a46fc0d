package durable

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/caddy-batch/caddy-batch/batch"
)

// Removing a journal when its saga ends: key by key, under an end marker
// (docs/durability.md, "Durability: the saga journal").

// removeJournal deletes every key the saga wrote (removeKeys), and no
// name it never wrote: a lease key it never renewed is not there to be
// deleted (on the Redis module, a Delete is three commands whether the
// key is there or not). A journal none of whose stores landed goes
// without the end marker, which a storage that refuses stores would
// refuse too: what may be there is a segment or two the saga sent
// nothing after.
func (j *Journal) removeJournal(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	j.mu.Lock()
	landed := j.landed
	var written []string
	if j.renewals > 0 || j.epoch > 0 {
		written = append(written, leaseKeyOf(j.saga, j.epoch, Owner()))
	}
	g, maybe := j.leaseGuardLocked(), j.maybeLease
	first, segments := !j.removing, max(j.seq, 1)
	j.removing = true
	j.mu.Unlock()
	if ar, ok := j.removedAtOnce(); ok {
		var stored []string
		if first {
			// The first removal knows every key the journal stored, or
			// may have (a store that failed may have written): no listing.
			for seq := range segments {
				stored = append(stored, path.Base(segmentKey(j.saga, seq)))
			}
		}
		err := overOwn(g.Holds, maybe, func(was []byte) error {
			g.Holds = was
			return j.js.removeAtOnce(ctx, ar, g, j.saga, stored, written)
		})
		if lost, ok := errors.AsType[*lostLease](err); ok {
			j.lease.lose(lost.why)
			j.takenOver.Store(lost.takenOver)
			j.logLost(lost.why)
		}
		j.endRecordedIf(err == nil)
		return err
	}
	if landed && !j.endRecorded() {
		if err := j.js.markEnd(ctx, j.saga); err != nil {
			return err
		}
		j.endRecordedIf(true)
	}
	if err := j.js.removeKeys(ctx, j.saga, landed, written); err != nil {
		return err
	}
	if j.epoch > 0 {
		// A saga taken over may have an owner that lost it and is
		// waiting to learn how it ended (AwaitEnd): the end marker stays
		// a lease for it to find, then the scan clears it.
		return nil
	}
	return j.js.deleteEnd(ctx, j.saga)
}

// removedAtOnce is the storage that removes the saga's journal in one
// call, where its own removal goes so: a journal taken over (epoch 1 and
// on) goes key by key, keeping its end marker for an owner that lost it.
func (j *Journal) removedAtOnce() (AtomicRemover, bool) {
	ar, ok := j.js.storage.(AtomicRemover)
	return ar, ok && j.epoch == 0
}

// markedEnd ends a saga that left nothing behind, on a storage whose
// removal of a journal goes key by key, by storing its end marker
// (markEnd), and reports whether it did: its client is then answered,
// and the rest of the removal goes on after the answer (measured: 20 to
// 30 ms of a batch's answer on Redis 1 ms away off the fast path,
// docs/performance.md, "Round trips per batch"). A saga kept for an
// operator, and an operator's retry of one, are removed before their
// answer as before, so that no retry, which writes the saga's journal
// again under the same name, meets a removal still going; nor is a
// journal that one call removes, or that no store landed, marked here.
func (j *Journal) markedEnd(ctx context.Context, res *batch.Result) bool {
	j.mu.Lock()
	landed := j.landed
	j.mu.Unlock()
	_, atOnce := j.removedAtOnce()
	if !landed || res.Outcome == batch.RollbackFailed || j.revived || atOnce {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	if j.js.markEnd(ctx, j.saga) != nil {
		return false // the removal tries again, and says why
	}
	j.endRecordedIf(true)
	return true
}

// markEnd stores saga's end marker, so that a removal cut short
// anywhere after it leaves either the whole journal or the marker: the
// recovery scan clears what is left under a marker, and never takes it
// for a journal whose beginning the storage lost, and a listing shows
// no saga there (errEnded).
func (js *Journals) markEnd(ctx context.Context, saga string) error {
	if err := js.storage.Store(ctx, endKey(saga), []byte("{}")); err != nil {
		return fmt.Errorf("storing %s: the end marker was not stored: %w", endKey(saga), err)
	}
	return nil
}

// removeKeys deletes every key of saga's journal but its end marker,
// each by its own name (a storage's Delete of a folder may leave the
// keys in it: Redis's does): what the folder lists, and the keys of
// unlisted that it does not (names that may be there unlisted). With
// marked, the end marker is stored (markEnd): segment 0 goes first; the
// rest then goes together (the marker covers it, in whatever order it
// goes), or, unmarked, one at a time with the lease keys last. The
// caller deletes the marker (and so the folder) when it is done with it.
func (js *Journals) removeKeys(ctx context.Context, saga string, marked bool, unlisted []string) error {
	names, err := listNames(ctx, js.storage, journalDir(saga))
	if err != nil {
		return fmt.Errorf("listing %s: %w", journalDir(saga), err)
	}
	keys := removalOrder(saga, names, unlisted)
	keys = keys[:len(keys)-1] // the end marker is the caller's
	if !marked || len(keys) == 0 || keys[0] != segmentKey(saga, 0) {
		return deleteInOrder(ctx, js.storage, keys)
	}
	if err := deleteInOrder(ctx, js.storage, keys[:1]); err != nil {
		return err
	}
	return deleteTogether(ctx, js.storage, keys[1:])
}

// leaseGuardLocked is the check under which the saga's removal deletes
// anything at once: its lease key holds what this process last stored
// there, or, never stored, is not there (unless a renewal whose outcome
// is unknown may have stored it), and no other instance outranks it.
// j.mu is held.
func (j *Journal) leaseGuardLocked() LeaseGuard {
	return LeaseGuard{
		Key:    leaseKeyOf(j.saga, j.epoch, Owner()),
		Epoch:  j.epoch,
		Holds:  j.leaseBytes,
		Absent: j.leaseBytes == nil && j.renewals == 0,
	}
}

// removeAtOnce deletes every key of saga's journal in one call, in the
// order removalOrder gives, if g holds: a removal that cannot be cut
// short needs no end marker (one an earlier attempt stored goes too). A
// guard that fails is a *lostLease, and nothing is deleted.
func (js *Journals) removeAtOnce(ctx context.Context, ar AtomicRemover, g LeaseGuard, saga string, stored, unlisted []string) error {
	names := stored
	if names == nil {
		var err error
		if names, err = listNames(ctx, js.storage, journalDir(saga)); err != nil {
			return fmt.Errorf("listing %s: %w", journalDir(saga), err)
		}
		if len(names) == 0 {
			// Its stores list every key at once: nothing is left (an
			// earlier attempt whose answer was lost removed it).
			return nil
		}
	}
	keys := removalOrder(saga, names, unlisted)
	if !slices.Contains(names, endName) {
		keys = keys[:len(keys)-1]
	}
	switch err := ar.DeleteAllIf(ctx, g, keys); {
	case errors.Is(err, ErrKeyGone):
		return &lostLease{why: "the saga's lease is gone from storage (the storage lost it, or an operator deleted it)"}
	case errors.Is(err, ErrKeyChanged):
		return &lostLease{"another instance wrote the saga's lease", true}
	case errors.Is(err, ErrOutranked):
		return &lostLease{"another instance took the saga over", true}
	case err != nil:
		return err
	}
	return removeEmptyFolder(ctx, js.storage, journalDir(saga))
}

// deleteInOrder deletes keys one at a time, in order.
func deleteInOrder(ctx context.Context, s Storage, keys []string) error {
	for _, k := range keys {
		if err := deleteKey(ctx, s, k); err != nil {
			return fmt.Errorf("deleting %s: %w", k, err)
		}
	}
	return nil
}

// deleteWidth bounds the deletes deleteTogether has in flight.
const deleteWidth = 32

// deleteTogether deletes keys, several at once; the error is one of
// those that failed.
func deleteTogether(ctx context.Context, s Storage, keys []string) error {
	var g errgroup.Group
	g.SetLimit(deleteWidth)
	for _, k := range keys {
		g.Go(func() error {
			if err := deleteKey(ctx, s, k); err != nil {
				return fmt.Errorf("deleting %s: %w", k, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// deleteEnd deletes saga's end marker, the last key of its removal, and
// its emptied folder.
func (js *Journals) deleteEnd(ctx context.Context, saga string) error {
	if err := deleteKey(ctx, js.storage, endKey(saga)); err != nil {
		return fmt.Errorf("deleting %s: %w", endKey(saga), err)
	}
	if err := removeEmptyFolder(ctx, js.storage, journalDir(saga)); err != nil {
		return fmt.Errorf("removing the folder %s: %w", journalDir(saga), err)
	}
	return nil
}

// removalOrder is the keys of a journal folder that lists names, and
// of unlisted where it does not list them, in the order they are
// deleted: segment 0, the other segments in order, what else is there,
// the lease keys, the end marker.
func removalOrder(saga string, names, unlisted []string) []string {
	for _, k := range unlisted {
		if base := path.Base(k); !slices.Contains(names, base) {
			names = append(slices.Clip(names), base)
		}
	}
	var segs []segmentName
	var others, leases []string
	for _, n := range names {
		if sn, ok := parseSegment(n); ok {
			segs = append(segs, sn)
		} else if _, ok := leaseEpoch(n); ok {
			leases = append(leases, path.Join(journalDir(saga), n))
		} else if n != endName {
			others = append(others, path.Join(journalDir(saga), n))
		}
	}
	slices.SortFunc(segs, compareSegments)
	keys := make([]string, 0, len(names)+1)
	for _, sn := range segs {
		keys = append(keys, segmentKeyAt(saga, sn))
	}
	keys = append(append(keys, others...), leases...)
	return append(keys, endKey(saga))
}

// mayBeUnlisted are the names a journal folder may hold without listing
// them, for a removal of what another process (or an older build) left:
// segment 0, and the lease key an older build's removal left listed
// after deleting it.
func mayBeUnlisted(saga string) []string {
	return []string{segmentKey(saga, 0), leaseKey(saga)}
}

// endRecordedIf notes, if recorded, that the saga's end is recorded:
// its journal is gone, or its end marker stored, so that no recovery
// takes it for a saga cut short.
func (j *Journal) endRecordedIf(recorded bool) {
	if recorded {
		j.mu.Lock()
		j.ended = true
		j.mu.Unlock()
	}
}

// endRecorded says whether the saga's end is recorded (endRecordedIf).
func (j *Journal) endRecorded() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ended
}
