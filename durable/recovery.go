package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// Recovered is a saga whose owner's lease lapsed, taken over by this
// process (docs/durability.md, "Durability: the saga journal"): what the caller needs to
// finish it.
type Recovered struct {
	Saga    string
	Origin  Origin
	Started time.Time
	// Snapshot is the saga as its journal left it.
	Snapshot *batch.Snapshot
	// Dead is the lease that lapsed: who held the saga, and until when.
	Dead Lease
	// Journal goes on after the dead owner's last segment, under this
	// process's lease; batch.Resume ends it.
	Journal *Journal
}

// abandon gives back a saga that could not be finished: Resume ends the
// journal only when it ran, so the journal stays in storage for a later
// try, this process's or another's, once the lease lapses.
func (r *Recovered) abandon() {
	r.Journal.stopRenewal()
	owned.done()
	owned.forget(r.Saga)
}

// Scan takes over every saga in storage whose owner's lease lapsed, and
// hands each to finish, on a goroutine of its own; it sweeps what is left
// of journals whose removal was cut short. A saga that cannot be taken
// over, read or finished is told to failed, with what was being done; it
// stays in storage and the next scan tries again. The error is the
// listing's: then nothing was scanned.
func (js *Journals) Scan(ctx context.Context, finish func(*Recovered) error, failed func(saga, doing string, err error)) error {
	sagas, err := js.sagas(ctx)
	if err != nil {
		return err
	}
	for _, saga := range sagas {
		if ctx.Err() != nil {
			return nil
		}
		if owned.has(saga) {
			continue
		}
		l, err := js.leaseOf(ctx, saga)
		switch {
		case errors.Is(err, errNoIntent):
			js.clearLeftover(ctx, saga, failed)
		case err != nil:
			failed(saga, "reading the saga's lease", err)
		case now().After(l.Expires):
			js.takeOver(ctx, saga, finish, failed)
		}
	}
	return nil
}

// takeOver claims a dead owner's saga and finishes it on a goroutine of
// its own. The claim is a new lease, written under the saga's storage
// lock after reading again that the old one lapsed, so that of several
// instances that find the saga at once only one takes it; the lock is
// held for the claim only, the lease for as long as the saga runs.
func (js *Journals) takeOver(ctx context.Context, saga string, finish func(*Recovered) error, failed func(saga, doing string, err error)) {
	unlock, ok := js.lock(ctx, saga, failed)
	if !ok {
		return // another instance is claiming it; its lease will show
	}
	defer unlock()
	dead, err := js.leaseOf(ctx, saga)
	if err != nil || !now().After(dead.Expires) {
		return
	}
	r, doing, err := js.claim(ctx, saga, dead)
	if err != nil {
		if doing != "" {
			failed(saga, doing, err)
		}
		return
	}
	go func() {
		if err := finish(r); err != nil {
			r.abandon()
			failed(saga, "finishing the saga", err)
		}
	}()
}

// claim makes a saga whose lease (dead) lapsed, or that was given up,
// this process's: a new lease, then its journal read back to go on
// after the last segment. The saga's storage lock is held. An error
// comes with what was being done, or none when this process has the
// saga already.
func (js *Journals) claim(ctx context.Context, saga string, dead Lease) (*Recovered, string, error) {
	until := now().Add(js.leases.Length)
	b, _ := json.Marshal(Lease{Owner: Owner(), Expires: until})
	sctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	err := js.storage.Store(sctx, leaseKey(saga), b)
	cancel()
	if err != nil {
		return nil, "claiming the saga's lease", err
	}
	if !owned.add(saga) {
		return nil, "", errOwned
	}
	st, err := js.load(ctx, saga)
	if err != nil {
		owned.done()
		owned.forget(saga)
		return nil, "reading the saga's journal", err
	}
	// The journal goes on after the dead owner's last segment.
	j := newJournalOf(&Journal{js: js, saga: saga, seq: st.next, written: st.listed, stored: true, leaseUntil: until, revived: st.intent.Revived})
	j.startRenewal()
	return &Recovered{Saga: saga, Origin: st.intent.Origin, Started: st.intent.Started, Snapshot: st.snap, Dead: dead, Journal: j}, "", nil
}

// errOwned is the claim of a saga this process runs already.
var errOwned = errors.New("this process is running the saga already")

// lock takes the storage lock under which a saga is claimed, without
// waiting for an instance that holds it.
func (js *Journals) lock(ctx context.Context, saga string, failed func(saga, doing string, err error)) (unlock func(), ok bool) {
	// A storage that cannot try a lock is given two seconds in Lock.
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	unlock, err := Lock(lctx, js.storage, lockName(saga), 0, func(err error) {
		js.logger.Warn("releasing a saga's storage lock", zap.String("saga", saga), zap.Error(err))
	})
	return unlock, err == nil
}

// clearLeftover removes what is left of a journal whose removal was cut
// short (segment 0, the intent, goes first, so a journal without it is
// no saga), once nothing was written to it for a lease: a journal being
// created is without segment 0 only until its first write lands. Its
// keys go one by one, segments first and the lease last, then its
// folder; the lease is deleted even when not found, which also clears a
// folder entry the Redis module kept when an older build deleted the
// journal's folder instead of its keys.
func (js *Journals) clearLeftover(ctx context.Context, saga string, failed func(saga, doing string, err error)) {
	keys, fresh, err := js.leftoverKeys(ctx, saga)
	if err != nil {
		failed(saga, "reading what is left of a finished saga's journal", err)
		return
	}
	if fresh {
		return
	}
	for _, k := range keys {
		if err := deleteKey(ctx, js.storage, k); err != nil {
			failed(saga, "removing what is left of a finished saga's journal", fmt.Errorf("deleting %s: %w", k, err))
			return
		}
	}
	if err := removeEmptyFolder(ctx, js.storage, journalDir(saga)); err != nil {
		failed(saga, "removing the folder of a finished saga's journal", err)
	}
}

// leftoverKeys lists what is left of saga's journal, in the order it
// goes, and says whether any of it was written within a lease. A key
// listed but not found is being written. Where the folder lists nothing
// (an older build deleted the folder on Redis, whose module then kept
// the keys in it unlisted), the later segments are looked for by name.
func (js *Journals) leftoverKeys(ctx context.Context, saga string) (keys []string, fresh bool, err error) {
	dir := journalDir(saga)
	names, err := listNames(ctx, js.storage, dir)
	if err != nil {
		return nil, false, err
	}
	var seqs []int
	var others []string
	for _, n := range names {
		if seq, ok := segmentSeq(n); ok {
			seqs = append(seqs, seq)
		} else if n != leaseName {
			others = append(others, path.Join(dir, n))
		}
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		keys = append(keys, segmentKey(saga, seq))
	}
	keys = append(append(keys, others...), leaseKey(saga))
	if len(names) == 0 {
		unlisted, err := js.unlistedSegments(ctx, saga)
		if err != nil {
			return nil, false, err
		}
		keys = append(append(unlisted, keys...), dir) // and the folder's own age, where it has one
	}
	for _, k := range keys {
		modified, err := js.storage.Modified(ctx, k)
		switch {
		case errors.Is(err, fs.ErrNotExist) && slices.Contains(names, path.Base(k)):
			return nil, true, nil
		case errors.Is(err, fs.ErrNotExist):
		case err != nil && k == dir:
			// A storage whose folders are no keys (Redis): no age.
		case err != nil:
			return nil, false, err
		case now().Sub(modified) < js.leases.Length:
			return nil, true, nil
		}
	}
	if len(names) == 0 {
		keys = keys[:len(keys)-1]
	}
	return keys, false, nil
}

// unlistedSegments finds the segments after 0 of a journal whose folder
// lists nothing, by name, in order: they were written one after the
// other, so the first one missing ends them.
func (js *Journals) unlistedSegments(ctx context.Context, saga string) ([]string, error) {
	var keys []string
	for seq := 1; ; seq++ {
		_, err := js.storage.Modified(ctx, segmentKey(saga, seq))
		if errors.Is(err, fs.ErrNotExist) {
			return keys, nil
		}
		if err != nil {
			return nil, err
		}
		keys = append(keys, segmentKey(saga, seq))
	}
}
