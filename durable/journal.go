package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// The saga journal (docs/durability.md) lives in the storage, one
// directory per saga:
//
//	batch/v1/journal/<saga>/seg.00000000   segment 0: the intent, and any items
//	batch/v1/journal/<saga>/seg.00000001   the items changed since segment 0
//	...
//	batch/v1/journal/<saga>/lease          the owner's renewed lease
//
// <saga> is random hex, so no storage mangles it, and nothing the client
// sent (an id, a path) is ever part of a key. Each segment is stored
// once (again only where a store failed, or was cut short by a kill:
// Journals.load): a storage write costs the same for a small
// value as for a large one (the file system syncs every file it stores),
// so the journal writes as few as the write-ahead rule allows, each
// holding every item that changed since the last one, rather than a key
// per item or the whole snapshot again.
const (
	journalPrefix = "batch/v1/journal"
	// journalVersion is the version of the segment format; the snapshot
	// inside has its own (batch.SnapshotVersion).
	journalVersion = 1
	leaseName      = "lease"
)

func journalDir(saga string) string { return path.Join(journalPrefix, saga) }

// segmentKey names segment seq. The prefix keeps segments apart from
// anything else a storage leaves in the directory: the file system's
// half-written temporary files are named with digits only.
func segmentKey(saga string, seq int) string {
	return path.Join(journalPrefix, saga, fmt.Sprintf("seg.%08d", seq))
}

// segmentSeq is the number of the segment named base.
func segmentSeq(base string) (int, bool) {
	digits, ok := strings.CutPrefix(base, "seg.")
	if !ok || len(digits) != 8 {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 0
}

func leaseKey(saga string) string { return path.Join(journalPrefix, saga, leaseName) }

// lockName is the storage lock an instance holds while it takes over a
// saga; storages strip lock names to a few characters, and a saga's name
// is hex.
func lockName(saga string) string { return "batch_journal_" + saga }

// segment is one storage write of a journal.
type segment struct {
	Version int `json:"v"`
	Seq     int `json:"seq"`
	// Intent is in segment 0 only.
	Intent *intent `json:"intent,omitempty"`
	// Items are the items that changed since the previous segment, each
	// with its whole state (a later segment's wins).
	Items []itemRecord `json:"items,omitempty"`
}

type itemRecord struct {
	Index int                `json:"i"`
	Item  batch.ItemSnapshot `json:"item"`
}

// intent is what a saga is about to do, and where it came from.
type intent struct {
	Saga    string    `json:"saga"`
	Owner   string    `json:"owner"`
	Expires time.Time `json:"expires"`
	Started time.Time `json:"started"`
	Origin
	Snapshot *batch.Snapshot `json:"snapshot"`
	// Revived marks the journal of an operator's retry of a kept saga:
	// its end removes the kept copy, or keeps it again.
	Revived bool `json:"revived,omitempty"`
}

// Origin is where a saga's batch came from, as the caller (the gateway)
// fills it: enough for another process to send the saga's requests
// through the same server, as the client's request would have gone.
// durable only keeps it; its members are stored in the intent as they
// always were.
type Origin struct {
	// Server is the name of the server the batch came in on.
	Server string `json:"server"`
	// Method, URI, Host, RemoteAddr and TLS are the client's request as
	// it reached the server, before any rewrite, so that a recovery's
	// request takes the same route to the batch handler.
	Method     string `json:"method"`
	URI        string `json:"uri"`
	Host       string `json:"host"`
	RemoteAddr string `json:"remote_addr,omitempty"`
	TLS        bool   `json:"tls,omitempty"`
	// Resource names the batch's resource, as its log line does, and
	// ScopeQuery the query parameters whose values are shown redacted
	// wherever the saga's URI is shown (docs/durability.md, "Kept sagas").
	Resource   string   `json:"resource,omitempty"`
	ScopeQuery []string `json:"scope_query,omitempty"`
}

// Lease is an owner's claim on a saga, renewed while the saga runs.
type Lease struct {
	Owner   string    `json:"owner"`
	Expires time.Time `json:"expires"`
}

// Journals is where the saga journals live: a storage, and the
// process's leases, which keep the journals of its sagas its own.
type Journals struct{ leased }

// NewJournals keeps journals in storage, held under leases; logger hears
// of what fails after the saga that caused it has moved on.
func NewJournals(storage Storage, leases *Leases, logger *zap.Logger) *Journals {
	return &Journals{leased{storage, leases, logger}}
}

// Storage is where the journals are.
func (js *Journals) Storage() Storage { return js.storage }

// owned are the sagas this process runs or is finishing, so that its own
// recovery never takes them over, and a process that exits waits for
// them (Wait).
var owned = newOwnedSagas()

type ownedSagas struct {
	mu      sync.Mutex
	ids     map[string]bool
	running sync.WaitGroup
}

func newOwnedSagas() *ownedSagas { return &ownedSagas{ids: map[string]bool{}} }

// add claims saga for this process; false if it already has it.
func (o *ownedSagas) add(saga string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ids[saga] {
		return false
	}
	o.ids[saga] = true
	o.running.Add(1)
	return true
}

func (o *ownedSagas) has(saga string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[saga]
}

// done ends a saga; its journal may still be kept (see remove).
func (o *ownedSagas) done() { o.running.Done() }

// Pending is how many sagas this process has a journal for.
func Pending() int { return owned.count() }

func (o *ownedSagas) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ids)
}

func (o *ownedSagas) forget(saga string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.ids, saga)
}

// Journal is one saga's journal: a batch.Journal over the storage.
//
// Write-ahead: the record that an item's write is about to be sent
// (PhaseSending), and that an undo is (PhaseUndoing), is stored before
// Record returns, and the saga sends nothing before that. Every other
// transition (a preflight read, an answer, a settled item) is kept in
// memory and goes with the next stored segment: losing it to a crash
// makes the recovery know less (an answered item looks unanswered, and is
// resolved as unknown), never believe something false. So a batch costs
// about one storage write per item written, not one per transition; and
// the intent waits for the first segment, since nothing before the first
// write needs undoing.
type Journal struct {
	js   *Journals
	saga string

	mu sync.Mutex
	// committed is signalled when a store of the records ends: writes of
	// several items that want their records stored together wait for one
	// store (group commit).
	committed      *sync.Cond
	flushing       bool
	started, ended uint64           // stores begun and ended, counted
	failed         map[uint64]error // the stores that failed, by number
	intent         *intent          // until it is stored, with the first segment
	seq            int              // the next segment's number
	items          []itemRecord
	at             map[int]int // position in items, by item index
	// stored is set once anything may be in storage, and written is
	// one past the highest segment that may be (a store that failed may
	// have written it all the same).
	stored     bool
	written    int
	leaseUntil time.Time
	// release stops the renewal of the saga's lease.
	release func()
	// revived: see intent.Revived.
	revived bool
}

// New is the journal of a batch that came from origin.
func (js *Journals) New(origin Origin) *Journal {
	in := &intent{Saga: NewID(), Owner: Owner(), Origin: origin}
	return newJournalOf(&Journal{js: js, saga: in.Saga, intent: in})
}

// Saga names the journal's saga.
func (j *Journal) Saga() string { return j.saga }

func newJournalOf(j *Journal) *Journal {
	j.at, j.failed = map[int]int{}, map[uint64]error{}
	j.committed = sync.NewCond(&j.mu)
	return j
}

// Begin keeps the intent; it is stored with the first write's record.
func (j *Journal) Begin(_ context.Context, p *batch.Plan) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.intent.Snapshot = p.Snapshot()
	j.intent.Started = now()
	owned.add(j.saga)
	return nil
}

// Record keeps t, and stores it (with everything kept before it) when
// the saga is about to send a request that changes the upstream.
func (j *Journal) Record(ctx context.Context, t batch.Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if k, ok := j.at[t.Index]; ok {
		j.items[k].Item = t.Item
	} else {
		j.at[t.Index] = len(j.items)
		j.items = append(j.items, itemRecord{Index: t.Index, Item: t.Item})
	}
	if t.Phase == batch.PhaseSending || t.Phase == batch.PhaseUndoing {
		return j.commit(ctx)
	}
	return nil
}

// commit returns once every record kept so far is stored. The first
// caller stores; callers that come while a store is in flight wait, and
// the next store takes all their records at once: with concurrency 8,
// eight writes about to be sent cost one storage write, not eight in a
// row, and none is sent before its own record is stored. j.mu is held.
func (j *Journal) commit(ctx context.Context) error {
	want := j.started + 1 // the first store to begin after this record was kept
	for j.ended < want {
		if j.flushing {
			j.committed.Wait()
			continue
		}
		j.flushing = true
		j.started++
		n := j.started
		if err := j.flush(ctx); err != nil {
			j.failed[n] = err
		}
		j.ended, j.flushing = n, false
		j.committed.Broadcast()
	}
	return j.failed[want]
}

// flush stores what is kept as the next segment. j.mu is held, and let
// go while the storage works, so that records keep coming meanwhile.
func (j *Journal) flush(ctx context.Context) error {
	at := now()
	if j.intent == nil && at.After(j.leaseUntil.Add(-j.js.leases.Length/6)) {
		// The lease could not be renewed: another instance may be
		// finishing this saga already, and must not find writes it was
		// never told about.
		return fmt.Errorf("the saga's lease in storage lapsed at %s (it could not be renewed)", j.leaseUntil.Format(time.RFC3339))
	}
	in, items := j.intent, j.items
	j.items = nil
	clear(j.at)
	expires := at.Add(j.js.leases.Length)
	if in != nil {
		in.Expires = expires
	}
	b, err := json.Marshal(segment{Version: journalVersion, Seq: j.seq, Intent: in, Items: items})
	if err != nil {
		j.keepAgain(items)
		return fmt.Errorf("encoding the saga's journal: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	j.stored, j.written = true, max(j.written, j.seq+1)
	key := segmentKey(j.saga, j.seq)
	j.mu.Unlock()
	err = j.js.storage.Store(ctx, key, b)
	j.mu.Lock()
	if err != nil {
		j.keepAgain(items)
		return fmt.Errorf("storing the saga's journal: %w", err)
	}
	j.seq++
	if in != nil {
		j.intent, j.leaseUntil = nil, expires
		j.startRenewal()
	}
	return nil
}

// keepAgain keeps the records a failed store did not store, unless a
// newer record of the same item came meanwhile.
func (j *Journal) keepAgain(items []itemRecord) {
	for _, it := range items {
		if _, newer := j.at[it.Index]; !newer {
			j.at[it.Index] = len(j.items)
			j.items = append(j.items, it)
		}
	}
}

// End removes the journal: the saga is over, whatever its outcome. A
// saga that left items behind is kept first (keepOrForget); a removal
// that fails is retried by the process (removals) under the saga's
// lease, and logged.
func (j *Journal) End(ctx context.Context, res *batch.Result) {
	j.stopRenewal()
	j.mu.Lock()
	stored := j.stored
	j.mu.Unlock()
	defer owned.done()
	if !stored {
		owned.forget(j.saga)
		return
	}
	if err := j.keepOrForget(ctx, res); err != nil {
		// Never both lost: the journal and its lease stay until the
		// kept copy is stored.
		j.js.logger.Error("the saga that left items behind could not be kept in storage; its journal stays, and keeping it is retried while this process runs",
			zap.String("saga", j.saga), zap.Error(err))
		removals.retry(j, func(ctx context.Context) error {
			if err := j.keepOrForget(ctx, res); err != nil {
				return err
			}
			return j.removeJournal(ctx)
		})
		return
	}
	if err := j.removeJournal(ctx); err != nil {
		// A journal left in storage would be taken for a saga cut
		// short, and undone, once its lease lapsed: keep the lease and
		// try again.
		j.js.logger.Error("the saga's journal could not be removed from storage; retrying while this process runs",
			zap.String("saga", j.saga), zap.Error(err))
		removals.retry(j, j.removeJournal)
		return
	}
	owned.forget(j.saga)
}

// Abandon lets the saga go without ending it, as a process that dies
// does: its lease is no longer renewed, and a recovery, this process's
// included, takes it over once the lease lapses. The saga's run must not
// end the journal after that (a dead gateway does nothing).
func (j *Journal) Abandon() {
	j.stopRenewal()
	owned.forget(j.saga)
}

// removeJournal deletes every key the saga wrote, each by its own name
// (a storage's Delete of a folder may leave the keys in it: Redis's
// does): segment 0 first, since without its intent what is left is no
// saga, only garbage for the scan to clear; then the later segments;
// the lease last, so that a journal half removed is never taken for a
// saga whose owner died; then the emptied folder, where the storage
// keeps folders.
func (j *Journal) removeJournal(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	j.mu.Lock()
	written := j.written
	j.mu.Unlock()
	return j.js.removeKeys(ctx, j.saga, written)
}

// removeKeys deletes segments 0 to segments-1 of saga, its stuck mark,
// its lease, and its folder.
func (js *Journals) removeKeys(ctx context.Context, saga string, segments int) error {
	for seq := range segments {
		if err := deleteKey(ctx, js.storage, segmentKey(saga, seq)); err != nil {
			return fmt.Errorf("deleting %s: %w", segmentKey(saga, seq), err)
		}
	}
	if err := deleteKey(ctx, js.storage, stuckKey(saga)); err != nil {
		return fmt.Errorf("deleting %s: %w", stuckKey(saga), err)
	}
	if err := deleteKey(ctx, js.storage, leaseKey(saga)); err != nil {
		return fmt.Errorf("deleting %s: %w", leaseKey(saga), err)
	}
	if err := removeEmptyFolder(ctx, js.storage, journalDir(saga)); err != nil {
		return fmt.Errorf("removing the folder %s: %w", journalDir(saga), err)
	}
	return nil
}

// startRenewal holds the saga's lease with the process's others. j.mu
// is held, or j is not shared yet.
func (j *Journal) startRenewal() {
	j.release = j.js.leases.Hold(j.renew, 0)
}

// stopRenewal lets the lease go, waiting for a renewal being written, so
// that none writes the lease again after the journal is removed.
func (j *Journal) stopRenewal() {
	j.mu.Lock()
	release := j.release
	j.release = nil
	j.mu.Unlock()
	if release != nil {
		release()
	}
}

func (j *Journal) renew() {
	until := now().Add(j.js.leases.Length)
	b, _ := json.Marshal(Lease{Owner: Owner(), Expires: until})
	ctx, cancel := context.WithTimeout(context.Background(), StorageTimeout)
	defer cancel()
	if err := j.js.storage.Store(ctx, leaseKey(j.saga), b); err != nil {
		j.js.logger.Warn("renewing a saga's lease in storage", zap.String("saga", j.saga), zap.Error(err))
		return
	}
	j.mu.Lock()
	if until.After(j.leaseUntil) {
		j.leaseUntil = until
	}
	j.mu.Unlock()
}

// storedSaga is a journal as read back from storage.
type storedSaga struct {
	intent *intent
	snap   *batch.Snapshot
	next   int // the next segment's number
	// listed is one past the last segment listed, stored or not: what
	// the journal's removal deletes up to.
	listed int
}

// errNoIntent marks a journal directory without its segment 0: a saga
// whose removal was cut short.
var errNoIntent = errors.New("the journal has no intent (segment 0)")

// sagas lists the sagas that have a journal in storage.
// A storage may list the keys under the prefix, or its "directories":
// either way, each saga once.
func (js *Journals) sagas(ctx context.Context) ([]string, error) {
	return listNames(ctx, js.storage, journalPrefix)
}

// leaseOf returns who holds saga and until when: the lease key if it was
// renewed, else the intent's.
func (js *Journals) leaseOf(ctx context.Context, saga string) (Lease, error) {
	l, err := js.renewedLease(ctx, saga)
	if err != nil || now().Before(l.Expires) {
		return l, err
	}
	in, err := js.loadIntent(ctx, saga)
	if err != nil {
		return l, err
	}
	return in.heldBy(l), nil
}

// renewedLease is saga's lease key as its owner last wrote it; the zero
// Lease if it never renewed it.
func (js *Journals) renewedLease(ctx context.Context, saga string) (Lease, error) {
	var l Lease
	_, err := loadJSON(ctx, js.storage, leaseKey(saga), &l)
	return l, err
}

// heldBy is who holds the saga whose renewed lease is l: l while it
// stands, else the later of it and the lease the intent was stored with.
func (in *intent) heldBy(l Lease) Lease {
	if now().Before(l.Expires) || !in.Expires.After(l.Expires) {
		return l
	}
	return Lease{Owner: in.Owner, Expires: in.Expires}
}

// loadIntent reads saga's intent (segment 0); errNoIntent if there is
// none.
func (js *Journals) loadIntent(ctx context.Context, saga string) (*intent, error) {
	b, err := js.storage.Load(ctx, segmentKey(saga, 0))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoIntent
	}
	if err != nil {
		return nil, err
	}
	var seg segment
	if err := json.Unmarshal(b, &seg); err != nil || seg.Intent == nil || seg.Intent.Snapshot == nil {
		return nil, fmt.Errorf("decoding %s: not a journal's intent (%v)", segmentKey(saga, 0), err)
	}
	return seg.Intent, nil
}

// load reads a saga's whole journal: the intent, with every later
// segment's items laid over its snapshot in order.
func (js *Journals) load(ctx context.Context, saga string) (*storedSaga, error) {
	keys, err := js.storage.List(ctx, journalDir(saga), false)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var seqs []int
	for _, k := range keys {
		if n, ok := segmentSeq(path.Base(k)); ok {
			seqs = append(seqs, n)
		}
	}
	slices.Sort(seqs)
	if len(seqs) == 0 || seqs[0] != 0 {
		return nil, errNoIntent
	}
	st := &storedSaga{listed: seqs[len(seqs)-1] + 1}
	for i, n := range seqs {
		b, err := js.storage.Load(ctx, segmentKey(saga, n))
		if errors.Is(err, fs.ErrNotExist) && n > 0 && i == len(seqs)-1 {
			// Segments are stored one at a time, each before what it
			// records is sent: a last one listed with nothing under it
			// is a store its writer died in (the Redis module lists a
			// key before it sets it). Nothing it preceded was sent, so
			// the journal ends before it, and the next segment takes
			// its name.
			break
		}
		if err != nil {
			return nil, err
		}
		var seg segment
		if err := json.Unmarshal(b, &seg); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", segmentKey(saga, n), err)
		}
		if seg.Version != journalVersion {
			return nil, fmt.Errorf("%w: %s is in journal format %d, this gateway knows %d", batch.ErrNotResumable, segmentKey(saga, n), seg.Version, journalVersion)
		}
		if n == 0 {
			if seg.Intent == nil || seg.Intent.Snapshot == nil {
				return nil, fmt.Errorf("decoding %s: %w", segmentKey(saga, 0), errNoIntent)
			}
			st.intent, st.snap = seg.Intent, seg.Intent.Snapshot
		}
		for _, it := range seg.Items {
			if it.Index < 0 || it.Index >= len(st.snap.Items) {
				return nil, fmt.Errorf("%s: item %d of a batch of %d", segmentKey(saga, n), it.Index, len(st.snap.Items))
			}
			st.snap.Items[it.Index] = it.Item
		}
		st.next = n + 1
	}
	return st, nil
}

// Interface guard
var _ batch.Journal = (*Journal)(nil)
