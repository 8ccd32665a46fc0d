package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// The expiry index of the Idempotency-Key records (docs/durability.md,
// "Expiry and the sweep"): each record is also filed, under the time
// bucket its expiry falls in, as a small entry
//
//	batch/v1/idem-expiry/<bucket end>/<record name>
//
// so that a sweep lists the buckets, and then only those whose end has
// passed: its work is proportional to what expired, not to what is
// kept. A bucket is named by its end (UTC, sortable), so writers that cut
// buckets of other widths still agree on when one has passed. A record's
// expiry moves (its answer is stored after its claim; a key is claimed
// anew after it expired), so an entry may name a record that expires
// later now: the sweep deletes a record only after reading it again
// under its lock and finding it expired.
const (
	expiryPrefix = "batch/v1/idem-expiry"
	bucketLayout = "20060102T150405Z"
	// maxBucket bounds a bucket's width: the sweep lists at most
	// idempotency_ttl / maxBucket buckets (288 at 24h), and a record
	// outlives its expiry by at most a bucket and a sweep_interval.
	maxBucket = 5 * time.Minute
	// sweepLock is held by the one instance of a cluster that sweeps.
	sweepLock = "batch_idem_sweep"
	// sweepPace spaces the records a sweep deletes (at most 200 a
	// second), so that a sweep of a large backlog (a cluster that was
	// down for a day) never floods the storage the batches need.
	sweepPace = 5 * time.Millisecond
	// sweepLockWait bounds the wait for a record's lock: a record being
	// claimed is looked at again by the next sweep.
	sweepLockWait = 5 * time.Second
)

// expiryEntry is an entry of the index: which record, and the expiry it
// was filed for (for an operator reading the storage).
type expiryEntry struct {
	Version int       `json:"v"`
	Record  string    `json:"record"`
	Expires time.Time `json:"expires"`
}

// bucketWidth is the width of the buckets of records kept for ttl: a
// 64th of it, at least a second and at most maxBucket.
func bucketWidth(ttl time.Duration) time.Duration {
	return min(max((ttl/64).Truncate(time.Second), time.Second), maxBucket)
}

// expiryKey is the index entry of the record at recordKey, expiring at
// expires, in buckets of width.
func expiryKey(recordKey string, expires time.Time, width time.Duration) string {
	end := expires.UTC().Truncate(width).Add(width)
	return path.Join(expiryPrefix, end.Format(bucketLayout), path.Base(recordKey))
}

// fileExpiry indexes the record at recordKey under its expiry, before
// the record is written, in buckets of width: a record is never in storage unindexed (an
// entry whose record's write failed is dropped by the sweep).
func fileExpiry(ctx context.Context, s Storage, recordKey string, expires time.Time, width time.Duration) error {
	entry := expiryWrite(recordKey, expires, width)
	if err := s.Store(ctx, entry.Key, entry.Value); err != nil {
		return fmt.Errorf("indexing %s under its expiry: %w", recordKey, err)
	}
	return nil
}

// bucketWidth is the width of the buckets the record is filed in: those
// of the ttl it was kept for, as near as the record tells.
func (rec *Record) bucketWidth() time.Duration {
	return bucketWidth(rec.Expires.Sub(rec.Created))
}

// sweepsAfter is when the sweep may delete the record: its expiry, or,
// for a batch still running, its lease's end if that is later.
func (rec *Record) sweepsAfter() time.Time {
	if rec.State == StateInFlight && rec.LeaseUntil.After(rec.Expires) {
		return rec.LeaseUntil
	}
	return rec.Expires
}

// Swept is what a sweep did.
type Swept struct {
	// Elsewhere: another instance holds the sweep's lock, and sweeps.
	Elsewhere bool
	// Buckets is how many passed buckets were swept.
	Buckets int
	// Deleted records (or jobs) expired; Kept were found not expired
	// (filed again under their new expiry) or unreadable (left to the
	// build that reads them); Indexed were written by a build without
	// the index.
	Deleted, Kept, Indexed int
}

// Sweeper deletes what expired under one expiry index of a storage (the
// Idempotency-Key records', or the jobs'), one instance of a cluster at a
// time. It belongs to one config's app.
type Sweeper struct {
	storage Storage
	logger  *zap.Logger
	index   expiryIndex
	// unindexedNext is when the records a build without the index
	// wrote are next looked for (indexUnindexedDue).
	unindexedNext time.Time
}

// expiryIndex is what a Sweeper sweeps: the index's folder, what it does
// with each entry of a passed bucket, and whether it looks for what a
// build without the index wrote (the Idempotency-Key records, which
// predate theirs).
type expiryIndex struct {
	prefix    string
	sweep     func(sw *Sweeper, ctx context.Context, entry string, at time.Time, out *Swept) error
	unindexed bool
}

// NewSweeper sweeps the Idempotency-Key records of storage; logger hears
// of locks it could not release.
func NewSweeper(s Storage, logger *zap.Logger) *Sweeper {
	return &Sweeper{storage: s, logger: logger, index: expiryIndex{prefix: expiryPrefix, sweep: (*Sweeper).sweepEntry, unindexed: true}}
}

// unlockFailed logs a storage lock the sweep could not release (it
// lapses on its own: Redis's in 5 s, the file system's in 10 s).
func (sw *Sweeper) unlockFailed(name string) func(error) {
	return func(err error) {
		sw.logger.Warn("releasing a storage lock after a sweep", zap.String("lock", name), zap.Error(err))
	}
}

// Sweep deletes what expired by at, if no other instance is sweeping:
// what is filed under buckets that ended by then. Once a day for the
// cluster, the Idempotency-Key records' sweep also indexes the records
// written by a build that kept no index, so that they expire too.
func (sw *Sweeper) Sweep(ctx context.Context, at time.Time) (Swept, error) {
	// One try: a storage that cannot try a lock is given a moment in
	// Lock (the Redis module's tries at once, then waits a second).
	lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	unlock, err := Lock(lctx, sw.storage, sweepLock, 0, sw.unlockFailed(sweepLock))
	cancel()
	if errors.Is(err, itemlock.ErrLocked) {
		return Swept{Elsewhere: true}, nil
	}
	if err != nil {
		return Swept{}, fmt.Errorf("taking the sweep's storage lock: %w", err)
	}
	defer unlock()
	var done Swept
	var errs []error
	if sw.index.unindexed {
		n, err := sw.indexUnindexedDue(ctx, at)
		done.Indexed = n
		errs = append(errs, err)
	}
	errs = append(errs, sw.sweepBuckets(ctx, at, &done))
	return done, errors.Join(errs...)
}

// unindexedMarker holds when the records were last looked for
// unindexed ones, for the whole cluster; unindexedPeriod is how often.
// Looking lists every record and every index entry (a few requests
// whose answers grow with what is kept), so it is done once a day, not
// every sweep: in a cluster upgraded one instance at a time, what the
// older instances write after the first upgraded one looked is filed a
// day later at most, and expires then.
const (
	unindexedMarker = "batch/v1/idem-sweep/unindexed-checked"
	unindexedPeriod = 24 * time.Hour
)

// indexUnindexedDue runs IndexUnindexed if the cluster did not for a
// day, and notes when it did; this sweeper reads the note once a day.
func (sw *Sweeper) indexUnindexedDue(ctx context.Context, at time.Time) (int, error) {
	if at.Before(sw.unindexedNext) {
		return 0, nil
	}
	var last time.Time
	b, err := sw.storage.Load(ctx, unindexedMarker)
	switch {
	case err == nil:
		_ = last.UnmarshalText(b) // unreadable: looked for now, and noted again
	case !errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("reading %s: %w", unindexedMarker, err)
	}
	if next := last.Add(unindexedPeriod); at.Before(next) {
		sw.unindexedNext = next
		return 0, nil
	}
	n, err := IndexUnindexed(ctx, sw.storage)
	if err != nil {
		return n, err
	}
	stamp, _ := at.UTC().MarshalText()
	if err := sw.storage.Store(ctx, unindexedMarker, stamp); err != nil {
		return n, fmt.Errorf("noting the look for unindexed records: %w", err)
	}
	sw.unindexedNext = at.Add(unindexedPeriod)
	return n, nil
}

// sweepBuckets sweeps each bucket that ended by at, oldest first.
func (sw *Sweeper) sweepBuckets(ctx context.Context, at time.Time, out *Swept) error {
	buckets, err := listNames(ctx, sw.storage, sw.index.prefix)
	if err != nil {
		return fmt.Errorf("listing the expiry index %s: %w", sw.index.prefix, err)
	}
	slices.Sort(buckets)
	var errs []error
	for _, b := range buckets {
		end, err := time.Parse(bucketLayout, b)
		if err != nil || end.After(at) {
			continue // not a bucket, or not passed yet
		}
		if ctx.Err() != nil {
			return errors.Join(append(errs, ctx.Err())...)
		}
		out.Buckets++
		errs = append(errs, sw.sweepBucket(ctx, path.Join(sw.index.prefix, b), at, out))
	}
	return errors.Join(errs...)
}

// sweepBucket sweeps the entries filed under one passed bucket, paced,
// and removes the bucket's emptied folder.
func (sw *Sweeper) sweepBucket(ctx context.Context, bucket string, at time.Time, out *Swept) error {
	names, err := listNames(ctx, sw.storage, bucket)
	if err != nil {
		return fmt.Errorf("listing %s: %w", bucket, err)
	}
	pace := time.NewTicker(sweepPace)
	defer pace.Stop()
	var errs []error
	for _, name := range names {
		select {
		case <-ctx.Done():
			return errors.Join(append(errs, ctx.Err())...)
		case <-pace.C:
		}
		errs = append(errs, sw.index.sweep(sw, ctx, path.Join(bucket, name), at, out))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return removeEmptyFolder(ctx, sw.storage, bucket)
}

// sweepEntry looks at the record an entry names, under the record's
// lock: an expired record goes, then its entry; a record that expires
// later now is filed under its new bucket; a record this build cannot
// read (a newer build's) is left alone, with its entry, for the build
// that reads it; an entry without a record goes.
func (sw *Sweeper) sweepEntry(ctx context.Context, entry string, at time.Time, out *Swept) error {
	s := sw.storage
	recordKey := path.Join(IdempotencyPrefix, path.Base(entry))
	lctx, cancel := context.WithTimeout(ctx, sweepLockWait)
	unlock, err := Lock(lctx, s, IdempotencyLock(recordKey), LockPoll, sw.unlockFailed(IdempotencyLock(recordKey)))
	cancel()
	if errors.Is(err, itemlock.ErrLocked) {
		out.Kept++
		return nil // being claimed: the next sweep looks again
	}
	if err != nil {
		return fmt.Errorf("locking %s: %w", recordKey, err)
	}
	defer unlock()
	rec, err := readRecord(ctx, s, recordKey)
	switch {
	case errors.Is(err, errUnreadable):
		out.Kept++
		return nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("reading %s: %w", recordKey, err)
	case rec != nil && !rec.expired(at):
		out.Kept++
		// Its expiry moved past the passed bucket: filed again under the
		// bucket it falls in now, a later one.
		if err := fileExpiry(ctx, s, recordKey, rec.sweepsAfter(), rec.bucketWidth()); err != nil {
			return err
		}
	case rec != nil:
		if err := deleteKey(ctx, s, recordKey); err != nil {
			return fmt.Errorf("deleting %s: %w", recordKey, err)
		}
		out.Deleted++
	}
	if err := deleteKey(ctx, s, entry); err != nil {
		return fmt.Errorf("deleting %s: %w", entry, err)
	}
	return nil
}

// IndexUnindexed files under their expiry the records written by a
// build that kept no expiry index, so that they expire too (an upgrade
// in place loses no replay, and leaks no record), and returns how many
// it filed. It lists the records and the index once (a few requests,
// whose answers grow with what is kept), and reads only the records no
// entry names; a record that cannot be read is left alone. The records
// are listed before the index, so a record being claimed meanwhile,
// which is indexed before it is written, is never filed twice.
func IndexUnindexed(ctx context.Context, s Storage) (int, error) {
	records, err := listNames(ctx, s, IdempotencyPrefix)
	if err != nil || len(records) == 0 {
		return 0, err
	}
	unindexed := make(map[string]bool, len(records))
	for _, name := range records {
		unindexed[name] = true
	}
	buckets, err := listNames(ctx, s, expiryPrefix)
	if err != nil {
		return 0, err
	}
	for _, b := range buckets {
		names, err := listNames(ctx, s, path.Join(expiryPrefix, b))
		if err != nil {
			return 0, err
		}
		for _, name := range names {
			delete(unindexed, name)
		}
	}
	pace := time.NewTicker(sweepPace)
	defer pace.Stop()
	filed := 0
	for name := range unindexed {
		select {
		case <-ctx.Done():
			return filed, ctx.Err()
		case <-pace.C:
		}
		key := path.Join(IdempotencyPrefix, name)
		rec, err := readRecord(ctx, s, key)
		if errors.Is(err, errUnreadable) || errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = fileExpiry(ctx, s, key, rec.sweepsAfter(), rec.bucketWidth())
		}
		if err != nil {
			return filed, fmt.Errorf("indexing %s: %w", key, err)
		}
		filed++
	}
	return filed, nil
}

// listNames lists the names right under dir (a folder none of whose
// keys is ever a folder of its own), as base names; a folder that is
// not there lists nothing. A storage may list a name twice (a key being
// written), so names are de-duplicated, in linear time.
func listNames(ctx context.Context, s Storage, dir string) ([]string, error) {
	keys, err := s.List(ctx, dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool, len(keys))
	names := make([]string, 0, len(keys))
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, dir+"/")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, "/")
		if name != "" && !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names, nil
}

// deleteKey deletes one key; a key already gone is not an error.
func deleteKey(ctx context.Context, s Storage, key string) error {
	if err := s.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
