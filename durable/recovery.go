package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
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

// Scan takes over every saga in storage whose owner lost it, and hands
// each to finish, on a goroutine of its own; it sweeps what is left of
// journals whose removal was cut short, and tells a journal whose
// beginning the storage lost (lostBeginning). A saga that cannot be
// taken over, read or finished is told to failed, with what was being
// done; it stays in storage and the next scan tries again. The error is
// the listing's: then nothing was scanned.
//
// A takeover never trusts another instance's clock (fence.go): a saga is
// taken over only once this process has seen the same lease record
// (key and bytes) unchanged for a whole lease on its own clock, so that
// an owner alive enough to renew is never taken from.
func (js *Journals) Scan(ctx context.Context, finish func(*Recovered) error, failed func(saga, doing string, err error)) error {
	sagas, err := js.sagas(ctx)
	if err != nil {
		return err
	}
	js.watch.forgetAllBut(sagas)
	for _, saga := range sagas {
		if ctx.Err() != nil {
			return nil
		}
		if owned.has(saga) {
			js.watch.forget(saga)
			continue
		}
		v, err := js.readLease(ctx, saga)
		switch {
		case err != nil:
			failed(saga, "reading the saga's lease", err)
		case slices.Contains(v.names, endName) || len(v.names) == 0:
			js.clearLeftover(ctx, saga, failed)
		case !slices.Contains(v.names, path.Base(segmentKey(saga, 0))):
			js.lostBeginning(ctx, saga, v.names, failed)
		case js.watch.unchangedFor(saga, v.record(), js.leases.Length):
			js.takeOver(ctx, saga, v, finish, failed)
		}
	}
	return nil
}

// watched are the lease records a scan saw, by saga, and since when, by
// this process's clocks.
type watched struct {
	mu   sync.Mutex
	seen map[string]sighting
}

type sighting struct {
	record string
	since  time.Time
}

func newWatched() *watched { return &watched{seen: map[string]sighting{}} }

// unchangedFor records that saga's lease record is record, and reports
// whether it was the same for at least d, on both of this process's
// clocks (a suspended VM's monotonic clock stands still).
func (w *watched) unchangedFor(saga, record string, d time.Duration) bool {
	at := now()
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.seen[saga]
	if !ok || s.record != record {
		w.seen[saga] = sighting{record: record, since: at}
		return false
	}
	return at.Sub(s.since) >= d && at.Round(0).Sub(s.since.Round(0)) >= d
}

func (w *watched) forget(saga string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.seen, saga)
}

// forgetAllBut forgets the sagas that are no longer listed.
func (w *watched) forgetAllBut(sagas []string) {
	keep := make(map[string]bool, len(sagas))
	for _, s := range sagas {
		keep[s] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for saga := range w.seen {
		if !keep[saga] {
			delete(w.seen, saga)
		}
	}
}

// takeOver claims a saga whose lease record (seen) stood unchanged for a
// lease, and finishes it on a goroutine of its own. The claim is taken
// under the saga's storage lock, so that of several instances that find
// the saga at once one goes first (the lock only serialises: the claim
// itself proves, see claim); the lock is held for the claim only, the
// lease for as long as the saga runs.
func (js *Journals) takeOver(ctx context.Context, saga string, seen leaseView, finish func(*Recovered) error, failed func(saga, doing string, err error)) {
	unlock, ok := js.lock(ctx, saga, failed)
	if !ok {
		return // another instance is claiming it; its lease will show
	}
	defer unlock()
	js.watch.forget(saga)
	r, doing, err := js.claim(ctx, saga, seen)
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

// errSteppedBack is a claim that found another instance's write: the
// owner renewed its lease, or another instance claimed it too.
var errSteppedBack = errors.New("the lease changed while it was claimed")

// claim makes a saga whose lease record was seen as seen this process's,
// under the next epoch: it writes its own lease key, then reads the old
// record again and lists the folder, and steps back if the record
// changed or another key of its epoch or a higher one is there (of a
// renewal and a claim that race, at least one sees the other's write).
// Then it reads the journal back to go on after the last segment. The
// saga's storage lock is held. An error comes with what was being done,
// or none when this process has the saga already or stepped back.
func (js *Journals) claim(ctx context.Context, saga string, seen leaseView) (*Recovered, string, error) {
	epoch := seen.epoch + 1
	key := leaseKeyOf(saga, epoch, Owner())
	start := now()
	rec := leaseRecord(epoch, start.Add(js.leases.Length), 0)
	sctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	if doing, err := js.claimKey(sctx, saga, seen, epoch, key, rec); err != nil {
		return nil, doing, err
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
	// The journal goes on after the last segment, under this epoch.
	j := newJournalOf(&Journal{js: js, saga: saga, epoch: epoch, seq: st.next, stored: true, landed: true, leaseBytes: rec, revived: st.intent.Revived, origin: st.intent.Origin, began: st.intent.Started})
	j.lease.prove(start)
	j.startRenewal()
	r := &Recovered{Saga: saga, Origin: st.intent.Origin, Started: st.intent.Started, Snapshot: st.snap, Dead: seen.lease(st.intent), Journal: j}
	return r, "", nil
}

// claimKey writes the claim's lease key of epoch, key, holding rec, and
// proves the claim (errSteppedBack if not): in one call on a
// LeaseClaimer, otherwise written first, then the folder listed and the
// old record read again. An error comes with what was being done, or
// none when the claim stepped back.
func (js *Journals) claimKey(ctx context.Context, saga string, seen leaseView, epoch int, key string, rec []byte) (string, error) {
	return claimFolderKey(ctx, js.storage, sagaLeases(saga), seen, epoch, key, rec)
}

// claimFolderKey is claimKey in the lease folder f.
func claimFolderKey(ctx context.Context, s Storage, f leaseFolder, seen leaseView, epoch int, key string, rec []byte) (string, error) {
	if lc, ok := s.(LeaseClaimer); ok {
		err := lc.ClaimLease(ctx, key, epoch, seen.key, seen.raw, rec)
		switch {
		case errors.Is(err, ErrKeyGone), errors.Is(err, ErrKeyChanged), errors.Is(err, ErrOutranked):
			return "", errSteppedBack
		case !errors.Is(err, ErrUndecidable):
			if err != nil {
				return "claiming the " + f.what + "'s lease", err
			}
			return "", nil
		}
	}
	if err := s.Store(ctx, key, rec); err != nil {
		return "claiming the " + f.what + "'s lease", err
	}
	names, err := listNames(ctx, s, f.dir)
	if err != nil {
		return "reading the " + f.what + "'s lease again", err
	}
	if outranks(names, epoch, key) != nil {
		return "", errSteppedBack
	}
	if same, err := unchanged(ctx, s, seen, names); err != nil || !same {
		return "", errSteppedBack
	}
	return "", nil
}

// LeaseClaimer is a storage that makes a takeover's claim in one call,
// at once (the Redis fast path): no renewal or other claim comes between
// its checks and its write.
type LeaseClaimer interface {
	// ClaimLease stores next under key, the lease key of epoch, if
	// seenKey holds seen (ErrKeyGone, ErrKeyChanged if not), or, with
	// seenKey "", if key's folder lists no epoch-0 lease key
	// (ErrKeyChanged if it does); with seen nil and seenKey set, if
	// seenKey, listed with no value when watched, still has none
	// (ErrKeyChanged if it has); and if that folder lists no other lease
	// key of epoch or a higher one (ErrOutranked). ErrUndecidable: the
	// storage cannot compare what seenKey holds.
	ClaimLease(ctx context.Context, key string, epoch int, seenKey string, seen, next []byte) error
}

// unchanged reports whether the lease record seen is still there, by
// names (the folder as listed after the claim was written): the old
// owner's key holds what it held, or, where there was none, the
// owner's first renewal has not written one since. A key seen listed
// with no value (the Redis module lists a key before it sets it, and a
// Store cut short there leaves it so) is unchanged while it still has
// none: watched so for a lease, its owner stopped there, and would
// otherwise keep its saga from ever being finished.
func unchanged(ctx context.Context, s Storage, seen leaseView, names []string) (bool, error) {
	if seen.key == "" {
		return !slices.Contains(names, leaseName), nil
	}
	b, err := s.Load(ctx, seen.key)
	if errors.Is(err, fs.ErrNotExist) {
		return seen.raw == nil, nil
	}
	return seen.raw != nil && bytes.Equal(b, seen.raw), err
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
// goes (removalOrder), and says whether any of it was written within a
// lease. A key listed but not found is being written. Where the folder
// lists nothing (an older build deleted the folder on Redis, whose
// module then kept the keys in it unlisted), the later segments are
// looked for by name.
func (js *Journals) leftoverKeys(ctx context.Context, saga string) (keys []string, fresh bool, err error) {
	dir := journalDir(saga)
	names, err := listNames(ctx, js.storage, dir)
	if err != nil {
		return nil, false, err
	}
	keys = removalOrder(saga, names, mayBeUnlisted(saga))
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

// lostBeginning tells of a journal whose segment 0 is gone although its
// removal never began (no end marker): the storage lost it (Redis
// restarted without persistence, a key evicted or deleted by hand).
// What is left says which items were written, not how to undo them,
// so it is neither finished nor deleted: once nothing was written to it
// for a lease, it is marked stuck with what its remains record, for a
// listing to show until an operator resolves it, and an ERROR line says
// so, once.
func (js *Journals) lostBeginning(ctx context.Context, saga string, names []string, failed func(saga, doing string, err error)) {
	if slices.Contains(names, stuckName) {
		return
	}
	_, fresh, err := js.leftoverKeys(ctx, saga)
	if err != nil {
		failed(saga, "reading a saga's journal whose beginning is gone", err)
		return
	}
	if fresh {
		return
	}
	remains := js.remains(ctx, saga, names)
	reason := "its journal's beginning (segment 0: what the batch was, and how to undo it) is gone from storage, though the saga never ended: the storage lost it (restarted without persistence, evicted, or deleted by hand); " +
		remains + "; check those items on the legacy API, then resolve the saga"
	b, _ := json.Marshal(stuck{Reason: reason, At: now()})
	if err := js.storage.Store(ctx, stuckKey(saga), b); err != nil {
		failed(saga, "recording that a saga's journal lost its beginning", err)
		return
	}
	js.logger.Error("a saga's journal lost its beginning in storage: it stays, listed stuck, until an operator resolves it",
		zap.String("saga", saga), zap.String("remains", remains), zap.String("command", "caddy batch saga "+saga))
}

// remains says what the segments of a journal without its beginning
// record: each item's index, id, phase and outcome, the last record
// of each winning.
func (js *Journals) remains(ctx context.Context, saga string, names []string) string {
	items := map[int]batch.ItemSnapshot{}
	for _, sn := range segmentsOf(names) {
		var seg segment
		if found, err := loadJSON(ctx, js.storage, segmentKeyAt(saga, sn), &seg); err != nil || !found {
			continue
		}
		for _, it := range seg.Items {
			items[it.Index] = it.Item
		}
	}
	if len(items) == 0 {
		return "what is left records no item"
	}
	var parts []string
	for _, i := range slices.Sorted(maps.Keys(items)) {
		it := items[i]
		parts = append(parts, fmt.Sprintf("item %d (id %q, %s, %s)", i, it.ID, it.Phase, it.Outcome))
	}
	return "what is left records " + strings.Join(parts, ", ")
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
