package durable

import (
	"context"
	"fmt"
	"path"
	"slices"
)

// Removing a journal when its saga ends: key by key, under an end marker
// (docs/durability.md, "Durability: the saga journal").

// removeJournal deletes every key the saga wrote (removeKeys). A journal
// none of whose stores landed goes without the end marker, which a
// storage that refuses stores would refuse too: what may be there is a
// segment or two the saga sent nothing after.
func (j *Journal) removeJournal(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	j.mu.Lock()
	landed := j.landed
	j.mu.Unlock()
	if err := j.js.removeKeys(ctx, j.saga, landed); err != nil {
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

// removeKeys deletes every key of saga's journal but its end marker,
// each by its own name (a storage's Delete of a folder may leave the
// keys in it: Redis's does). With marked, it stores the end marker
// first, so that a removal cut short anywhere leaves either the whole
// journal or the marker: the recovery scan clears what is left under a
// marker, and never takes it for a journal whose beginning the storage
// lost. Segment 0 goes first after the marker, the lease keys last; the
// caller deletes the marker (and so the folder) when it is done with
// it.
func (js *Journals) removeKeys(ctx context.Context, saga string, marked bool) error {
	if marked {
		if err := js.storage.Store(ctx, endKey(saga), []byte("{}")); err != nil {
			return fmt.Errorf("storing %s: %w", endKey(saga), err)
		}
	}
	names, err := listNames(ctx, js.storage, journalDir(saga))
	if err != nil {
		return fmt.Errorf("listing %s: %w", journalDir(saga), err)
	}
	keys := removalOrder(saga, names)
	for _, k := range keys[:len(keys)-1] {
		if err := deleteKey(ctx, js.storage, k); err != nil {
			return fmt.Errorf("deleting %s: %w", k, err)
		}
	}
	return nil
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

// removalOrder is the keys of a journal folder that lists names, in the
// order they are deleted: segment 0, the other segments in order, what
// else is there, the lease keys, the end marker.
func removalOrder(saga string, names []string) []string {
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
	if !slices.Contains(segs, segmentName{}) {
		segs = append(segs, segmentName{})
	}
	slices.SortFunc(segs, compareSegments)
	keys := make([]string, 0, len(names)+2)
	for _, sn := range segs {
		keys = append(keys, segmentKeyAt(saga, sn))
	}
	keys = append(append(keys, others...), leases...)
	if !slices.Contains(names, leaseName) {
		keys = append(keys, leaseKey(saga)) // a folder entry an older build's removal left
	}
	return append(keys, endKey(saga))
}
