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
	"sync/atomic"
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
//	batch/v1/journal/<saga>/lease          the owner's renewed lease (epoch 0)
//	batch/v1/journal/<saga>/seg.00000001.00000003  a segment of the saga's
//	                                       owner of epoch 1 (fence.go)
//	batch/v1/journal/<saga>/lease.00000001.<tag>   the lease of epoch 1
//	batch/v1/journal/<saga>/end            the saga ended: its removal began
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
	endName        = "end"
)

func journalDir(saga string) string { return path.Join(journalPrefix, saga) }

// segmentKey names segment seq of epoch 0. The prefix keeps segments
// apart from anything else a storage leaves in the directory: the file
// system's half-written temporary files are named with digits only.
func segmentKey(saga string, seq int) string { return segmentKeyAt(saga, segmentName{0, seq}) }

// segmentName is where a segment comes in its journal: the epoch of the
// owner that stored it (fence.go), and its number. Epoch 0's segments
// keep the names older builds read; a later owner's carry its epoch, so
// that no owner ever writes over another's.
type segmentName struct{ epoch, seq int }

func segmentKeyAt(saga string, n segmentName) string {
	if n.epoch == 0 {
		return path.Join(journalPrefix, saga, fmt.Sprintf("seg.%08d", n.seq))
	}
	return path.Join(journalPrefix, saga, fmt.Sprintf("seg.%08d.%08d", n.epoch, n.seq))
}

// parseSegment is the segment named base, if it is one.
func parseSegment(base string) (segmentName, bool) {
	rest, ok := strings.CutPrefix(base, "seg.")
	if !ok {
		return segmentName{}, false
	}
	epoch, seq, twoParts := strings.Cut(rest, ".")
	if !twoParts {
		epoch, seq = "00000000", rest
	}
	e, err1 := strconv.Atoi(epoch)
	n, err2 := strconv.Atoi(seq)
	ok = len(epoch) == 8 && len(seq) == 8 && err1 == nil && err2 == nil && e >= 0 && n >= 0 && (e > 0 || !twoParts)
	return segmentName{e, n}, ok
}

func (a segmentName) before(b segmentName) bool {
	return a.epoch < b.epoch || a.epoch == b.epoch && a.seq < b.seq
}

func leaseKey(saga string) string { return path.Join(journalPrefix, saga, leaseName) }

func endKey(saga string) string { return path.Join(journalPrefix, saga, endName) }

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
// Expires is by the owner's clock: a listing shows it, and no other
// instance decides by it (fence.go).
type Lease struct {
	Owner   string    `json:"owner"`
	Epoch   int       `json:"epoch,omitempty"`
	Expires time.Time `json:"expires"`
	// Renewal counts the owner's writes of this lease (fence.go).
	Renewal int `json:"renewal,omitempty"`
	// Released says the owner gave the lease up (a job put in the queue,
	// or its process stopping): another instance may claim it at once,
	// without waiting for it to lapse (joblease.go).
	Released bool `json:"released,omitempty"`
}

// Journals is where the saga journals live: a storage, and the
// process's leases, which keep the journals of its sagas its own.
type Journals struct {
	leased
	// watch is what the recovery scans saw of other owners' leases.
	watch *watched
	// maxStores is how many stores of one journal may run at once.
	maxStores int
}

// NewJournals keeps journals in storage, held under leases; logger hears
// of what fails after the saga that caused it has moved on.
func NewJournals(storage Storage, leases *Leases, logger *zap.Logger) *Journals {
	return &Journals{leased: leased{storage, leases, logger}, watch: newWatched(), maxStores: maxStores(storage)}
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
// about one storage write per wave of writes, not one per transition; the
// intent waits for the first segment, since nothing before the first
// write needs undoing, unless the preflight reads meanwhile; and an
// update's records may be stored ahead of their writes (RecordAhead).
type Journal struct {
	js   *Journals
	saga string
	// epoch is this process's lease epoch on the saga (fence.go): 0 for
	// the instance that began it.
	epoch int

	mu sync.Mutex
	// groupCommit stores the records kept in groups (commit.go); the
	// intent's store goes alone: no later segment may land before the
	// beginning it belongs to.
	groupCommit
	intent *intent // until it is stored, with the first segment
	seq    int     // the next segment's number
	items  []itemRecord
	at     map[int]int // position in items, by item index
	// lastIn is the store that took each item's latest record, so that
	// a store that failed keeps again only what no later store took.
	lastIn map[int]uint64
	// ahead are the items whose write's record went ahead of the write
	// (RecordAhead), aheadKept how many such records no store took yet,
	// intentAhead whether the intent is to be stored with no write
	// waiting, and storingAhead whether a store runs for them; ending
	// stops those stores once the saga ends.
	ahead map[int]bool
	// out are the writes sent, or about to be, whose answer is not
	// recorded yet (groupCommit.outstanding).
	out                               map[int]bool
	aheadKept                         int
	intentAhead, storingAhead, ending bool
	// removing is set once a removal of the journal began: a later one
	// lists what is left, where the first knows what was stored.
	removing bool
	// ended is set once the saga's end is recorded (endRecordedIf).
	ended bool
	// stored is set once anything may be in storage (a store that failed
	// may have written it all the same), and landed once a store
	// returned without an error.
	stored, landed bool
	// lease is what this process knows of its lease on the saga, and
	// leaseBytes what it last stored as its lease key (nil: nothing yet),
	// and maybeLease what a renewal after it wrote that answered an
	// error, which may have landed (nil: none in doubt).
	lease      *holder
	leaseBytes []byte
	maybeLease []byte
	renewals   int
	// also are other leases the saga's writes stand on (its
	// Idempotency-Key claim): one lost is the saga's lease lost.
	also []*holder
	// locksLost says why an item lock of the saga in storage is lost
	// (WatchLocks); nil while they stand.
	locksLost func() error
	// release stops the renewal of the saga's lease.
	release func()
	// revived: see intent.Revived.
	revived bool
	// origin and started are the intent's, for the saga of its own
	// that a saga that lost its lease may keep (KeepLost), as began; takenOver is
	// set once another instance's lease shows.
	origin    Origin
	began     time.Time
	takenOver atomic.Bool
}

// New is the journal of a batch that came from origin.
func (js *Journals) New(origin Origin) *Journal {
	in := &intent{Saga: NewID(), Owner: Owner(), Origin: origin}
	return newJournalOf(&Journal{js: js, saga: in.Saga, intent: in})
}

// Saga names the journal's saga.
func (j *Journal) Saga() string { return j.saga }

// Began is when the saga began, as its intent says (zero where the
// journal holds none).
func (j *Journal) Began() time.Time { return j.began }

func newJournalOf(j *Journal) *Journal {
	j.at, j.lastIn, j.ahead, j.out = map[int]int{}, map[int]uint64{}, map[int]bool{}, map[int]bool{}
	j.groupCommit = newGroupCommit(&j.mu, j.js.maxStores, j.flush, func() bool { return j.intent != nil })
	j.outstanding = func() int { return len(j.out) }
	if j.lease == nil {
		j.lease = newHolder(j.js.leases.Length)
	}
	return j
}

// Begin keeps the intent; it is stored with the first write's record.
func (j *Journal) Begin(_ context.Context, p *batch.Plan) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.intent.Snapshot = p.Snapshot()
	j.intent.Started = now()
	j.origin, j.began = j.intent.Origin, j.intent.Started
	owned.add(j.saga)
	return nil
}

// Record keeps t, and stores it (with everything kept before it) when
// the saga is about to send a request that changes the upstream. Once
// the lease is lost, nothing more is stored (the journal is the new
// owner's): what the saga does then is kept in memory, for the saga of
// its own it may keep (KeepLost).
//
// A preflight's read is not kept: a saga cut short undoes only what it
// sent, and the record of a write carries the pre-image its read found.
// Kept, the reads of a 100-item batch rode with the store its first
// writes waited for, and made it several times larger (measured:
// docs/performance.md, "Round trips per batch").
func (j *Journal) Record(ctx context.Context, t batch.Transition) error {
	if t.Phase == batch.PhaseRead {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if t.Phase != batch.PhaseSending {
		delete(j.out, t.Index)
	}
	if t.Phase == batch.PhaseSending && j.ahead[t.Index] {
		delete(j.ahead, t.Index)
		if _, kept := j.at[t.Index]; !kept && j.lostErr() == nil {
			return j.leaving(t, j.landedAhead(ctx, t))
		}
	}
	j.keep(t)
	if j.lostErr() != nil {
		return nil
	}
	switch t.Phase {
	case batch.PhaseSending:
		return j.leaving(t, j.commit(ctx))
	case batch.PhaseUndoing:
		// An undo leaves once the stores before its own landed too:
		// they carry the records of the writes that went ahead and were
		// never sent, settled as the batch stopped, which a recovery
		// must find once anything is undone (docs/durability.md,
		// "Records stored ahead").
		return j.commitAll(ctx)
	}
	return nil
}

// leaving notes the write of t, about to be sent, as one whose answer
// is to come (outstanding), unless its record could not be stored (err).
// j.mu is held.
func (j *Journal) leaving(t batch.Transition, err error) error {
	if err == nil && t.Phase == batch.PhaseSending {
		j.out[t.Index] = true
	}
	return err
}

// keep keeps t's record for the next store, over any record of the same
// item that no store took yet. j.mu is held.
func (j *Journal) keep(t batch.Transition) {
	if k, ok := j.at[t.Index]; ok {
		j.items[k].Item = t.Item
	} else {
		j.at[t.Index] = len(j.items)
		j.items = append(j.items, itemRecord{Index: t.Index, Item: t.Item})
	}
	j.stores.kept++
}

// RecordAhead keeps the records that items' writes are about to be sent
// before their turn comes, and starts storing them at once, with the
// intent while it is not stored, so that the write, when its turn comes,
// finds its record in storage and waits for no store
// (batch.AheadJournal; docs/durability.md, "Records stored ahead"). The
// saga calls it only for writes whose outcome a recovery reads back when
// no answer was recorded, and then Records the same PhaseSending
// transition when the write leaves; and with no record, to store the
// intent while the preflight reads.
func (j *Journal) RecordAhead(ctx context.Context, ts ...batch.Transition) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.lostErr() != nil || j.ending {
		return
	}
	for _, t := range ts {
		j.keep(t)
		j.ahead[t.Index] = true
		j.aheadKept++
	}
	j.intentAhead = j.intent != nil
	if !j.storingAhead && (j.aheadKept > 0 || j.intentAhead) {
		j.storingAhead = true
		go j.storeAhead(context.WithoutCancel(ctx))
	}
}

// storeAhead stores the intent, and the records kept ahead of their
// writes, while any wait, as stores may start, until the saga ends.
func (j *Journal) storeAhead(ctx context.Context) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for (j.aheadKept > 0 || j.intentAhead) && !j.ending && j.lostErr() == nil {
		if j.mayStart() {
			j.store(ctx)
			continue
		}
		j.committed.Wait()
	}
	j.storingAhead = false
	j.committed.Broadcast() // End may be waiting for this to stop
}

// landedAhead returns once the store that took t's record, kept ahead
// of its write, has ended: at once when it has. A store that failed
// kept the record again, and the write waits for the next. j.mu is held.
func (j *Journal) landedAhead(ctx context.Context, t batch.Transition) error {
	for {
		if _, kept := j.at[t.Index]; kept {
			j.keep(t)
			return j.commit(ctx)
		}
		n := j.lastIn[t.Index]
		if j.stores.done(n) {
			return j.stores.failed[n]
		}
		j.committed.Wait()
	}
}

// Fence returns once the saga may send a write (batch.Journal): its
// lease, and every lease its writes stand on, proven with a sixth of it
// to spare.
func (j *Journal) Fence(ctx context.Context) error {
	j.mu.Lock()
	landed := j.landed
	j.mu.Unlock()
	if !landed {
		// Nothing in storage: no other instance can know of the saga,
		// and no write was sent (each goes after its record landed).
		return nil
	}
	for _, h := range j.also {
		// Proven as the saga's own lease is, with a sixth to spare: a
		// claim whose renewals fail is no more a proof than a lease.
		err := h.fence(ctx)
		if lost, ok := errors.AsType[*batch.LeaseLost](err); ok {
			j.lease.lose(lost.Why)
		} else if err != nil {
			return err
		}
	}
	if err := j.lockLoss(); err != nil {
		j.lease.lose("an item lock in storage was lost: " + err.Error())
	}
	return j.lease.fence(ctx)
}

// WatchLocks makes the saga's lease stand on its item locks too
// (batch.LockWatcher): an item lock in storage lost is the lease lost.
func (j *Journal) WatchLocks(lost func() error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.locksLost = lost
}

func (j *Journal) lockLoss() error {
	j.mu.Lock()
	lost := j.locksLost
	j.mu.Unlock()
	if lost == nil {
		return nil
	}
	return lost()
}

// Also makes the saga's writes stand on another lease too (its
// Idempotency-Key claim): once that is lost, so is the saga's.
func (j *Journal) Also(h *Held) {
	if j != nil && h != nil {
		j.also = append(j.also, h.lease)
	}
}

// lostErr is the saga's lease's loss, if it is lost.
func (j *Journal) lostErr() *batch.LeaseLost { return j.lease.lostErr() }

// LostAtEnd is the saga's lease's loss, if End found it lost
// (batch.EndLoser): its journal is then another instance's to finish.
func (j *Journal) LostAtEnd() *batch.LeaseLost { return j.lostErr() }

// flush stores what is kept as segment seq (the intent's, 0, while it
// is not stored). j.mu is held, and let go while the storage works, so
// that records keep coming meanwhile. The first segment, with the
// intent, proves the saga's lease from the moment its store began.
func (j *Journal) flush(ctx context.Context, n uint64) error {
	if lost := j.lostErr(); lost != nil {
		// Another instance may be finishing this saga already, and must
		// not find writes it was never told about.
		return lost
	}
	at := now()
	in, items := j.intent, j.items
	j.items, j.aheadKept, j.intentAhead = nil, 0, false
	clear(j.at)
	seq := 0
	if in == nil {
		// Numbered as the store starts: a store that fails leaves a gap,
		// which recovery reads past.
		seq = j.seq
		j.seq++
	} else {
		// A copy, encoded with the mutex let go (below), its expiry
		// this store's.
		c := *in
		c.Expires = at.Add(j.js.leases.Length)
		in = &c
	}
	for _, it := range items {
		j.lastIn[it.Index] = n
	}
	j.stored = true
	key := segmentKeyAt(j.saga, segmentName{j.epoch, seq})
	// Encoded with the mutex let go, as the storage works: the saga's
	// writers record their answers and their next writes meanwhile
	// (measured: they waited for it about as long as for the stores).
	j.mu.Unlock()
	err := j.storeSegment(ctx, key, segment{Version: journalVersion, Seq: seq, Intent: in, Items: items})
	j.mu.Lock()
	if err != nil {
		j.keepAgain(items, n)
		return err
	}
	j.landed = true
	if in != nil {
		j.intent, j.seq = nil, max(j.seq, 1)
		j.lease.prove(at)
		j.startRenewal()
	}
	return nil
}

// storeSegment encodes seg and stores it under key.
func (j *Journal) storeSegment(ctx context.Context, key string, seg segment) error {
	b, err := json.Marshal(seg)
	if err != nil {
		return fmt.Errorf("encoding the saga's journal: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	if err := j.js.storage.Store(ctx, key, b); err != nil {
		return fmt.Errorf("storing the saga's journal: %w", err)
	}
	return nil
}

// keepAgain keeps the records a failed store n did not store, unless a
// newer record of the same item came meanwhile, kept or taken by a later
// store: recovery must never lay an older state over a newer one.
func (j *Journal) keepAgain(items []itemRecord, n uint64) {
	for _, it := range items {
		if _, newer := j.at[it.Index]; !newer && j.lastIn[it.Index] == n {
			j.at[it.Index] = len(j.items)
			j.items = append(j.items, it)
		}
	}
}

// End removes the journal: the saga is over, whatever its outcome. A
// saga that left items behind is kept first (keepOrForget); a removal
// that fails is retried by the process (removals) under the saga's
// lease, and logged. A saga whose lease is lost removes nothing: the
// journal is the new owner's.
func (j *Journal) End(ctx context.Context, res *batch.Result) {
	j.mu.Lock()
	j.ending = true
	for j.stores.inFlight > 0 || j.storingAhead {
		// Every write waits for its store, so none should be left but
		// those of records kept ahead of writes never sent; a removal
		// must never race one.
		j.committed.Wait()
	}
	stored, landed := j.stored, j.landed
	j.mu.Unlock()
	defer owned.done()
	if !stored || j.lostErr() != nil || j.fenceEnd(ctx) != nil {
		j.stopRenewal()
		owned.forget(j.saga)
		return
	}
	j.stopRenewal()
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
	if j.markedEnd(ctx, res) {
		// Its end recorded, the saga is over to whoever looks: its
		// client is answered now, and what is left goes after.
		removals.finish(j, j.removeJournal)
		return
	}
	err := j.removeJournal(ctx)
	if _, lost := errors.AsType[*lostLease](err); lost {
		// The journal is the new owner's (removeJournal said so).
		owned.forget(j.saga)
		return
	}
	if err != nil && landed && !j.endRecorded() {
		// The batch has not succeeded until its end is recorded: a
		// journal left in storage past the lease is taken for a saga
		// cut short, and undone. So the answer waits, trying again under
		// the lease (a blip costs a moment), until the end is recorded or
		// the lease is lost; then the saga is another instance's to end,
		// and its client is told so (batch.EndLoser), never succeeded.
		j.js.logger.Warn("the saga's end could not be recorded in storage; its answer waits while it is tried again under the lease",
			zap.String("saga", j.saga), zap.Error(err))
		if j.endLater(removals.hurry, j.removeJournal, endRetryWait, j.endRecorded) {
			owned.forget(j.saga)
		} else {
			removals.retry(j, j.removeJournal)
		}
		return
	}
	if err != nil {
		// A journal left in storage would be taken for a saga cut
		// short, and undone, once its lease lapsed, but for its end
		// marker: keep the lease and try again. One whose every store
		// failed may never have been stored: there is nothing to tell an
		// operator yet.
		log := j.js.logger.Error
		if !landed {
			log = j.js.logger.Info
		}
		log("the saga's journal could not be removed from storage; retrying while this process runs",
			zap.String("saga", j.saga), zap.Bool("ever_stored", landed), zap.Error(err))
		removals.retry(j, j.removeJournal)
		return
	}
	owned.forget(j.saga)
}

// endRetryWait is the first wait of a removal tried again as its
// client waits: a blip passes in a moment.
const endRetryWait = 250 * time.Millisecond

// fenceEnd waits, within a lease, for the saga's lease to be proven
// before its journal is removed: a saga whose lease another instance
// may have taken must not delete that instance's journal.
func (j *Journal) fenceEnd(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), j.js.leases.Length)
	defer cancel()
	return j.Fence(ctx)
}

// Abandon lets the saga go without ending it, as a process that dies
// does: its lease is no longer renewed, and a recovery, this process's
// included, takes it over once the lease lapses. The saga's run must not
// end the journal after that (a dead gateway does nothing).
func (j *Journal) Abandon() {
	j.mu.Lock()
	j.ending = true
	j.mu.Unlock()
	j.stopRenewal()
	owned.forget(j.saga)
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

// renew proves the saga's lease again (renewLease): a renewal that
// finds it lost stops for good; one whose storage calls fail leaves it
// unproven until the next.
func (j *Journal) renew() {
	if j.lostErr() != nil {
		return
	}
	start := now()
	j.mu.Lock()
	prev, maybe := j.leaseBytes, j.maybeLease
	j.renewals++
	next := leaseRecord(j.epoch, start.Add(j.js.leases.Length), j.renewals)
	j.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), j.js.leases.Length/3)
	defer cancel()
	err := j.js.renewLease(ctx, j.saga, j.epoch, prev, maybe, next)
	var lost *lostLease
	switch {
	case errors.As(err, &lost):
		j.lease.lose(lost.why)
		j.takenOver.Store(lost.takenOver)
		j.logLost(lost.why)
	case err != nil:
		j.mu.Lock()
		j.maybeLease = next
		j.mu.Unlock()
		j.js.logger.Warn("renewing a saga's lease in storage; it sends nothing until a renewal proves it", zap.String("saga", j.saga), zap.Error(err))
	default:
		j.mu.Lock()
		j.leaseBytes, j.maybeLease = next, nil
		j.mu.Unlock()
		if j.lease.prove(start) {
			return
		}
		if lost := j.lostErr(); lost != nil {
			j.logLost(lost.Why) // it lapsed while the renewal ran
			return
		}
		j.js.logger.Warn("a renewal of a saga's lease took longer than a third of it, and proves nothing", zap.String("saga", j.saga), zap.Duration("took", now().Sub(start)))
	}
}

// logLost tells the operator, once a renewal finds it, that the saga's
// lease is lost.
func (j *Journal) logLost(why string) {
	j.js.logger.Error("a saga's lease is lost: it sends nothing more, and another instance finishes it",
		zap.String("saga", j.saga), zap.Int("epoch", j.epoch), zap.String("why", why))
}

// storedSaga is a journal as read back from storage.
type storedSaga struct {
	intent *intent
	snap   *batch.Snapshot
	next   int // the next segment's number, whatever its epoch
}

// errNoIntent marks a journal directory without its segment 0: a saga
// whose removal was cut short, or whose beginning the storage lost.
var errNoIntent = errors.New("the journal has no intent (segment 0)")

// sagas lists the sagas that have a journal in storage.
// A storage may list the keys under the prefix, or its "directories":
// either way, each saga once.
func (js *Journals) sagas(ctx context.Context) ([]string, error) {
	return listNames(ctx, js.storage, journalPrefix)
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

// segmentsOf are the segments among a journal folder's names, in the
// order they were written: by epoch, then number.
func segmentsOf(names []string) []segmentName {
	var segs []segmentName
	for _, n := range names {
		if sn, ok := parseSegment(n); ok {
			segs = append(segs, sn)
		}
	}
	slices.SortFunc(segs, compareSegments)
	return segs
}

func compareSegments(a, b segmentName) int {
	switch {
	case a.before(b):
		return -1
	case b.before(a):
		return 1
	}
	return 0
}

// load reads a saga's whole journal: the intent, with every later
// segment's items laid over its snapshot in order (a later epoch's
// after an earlier one's, so that the newest owner's records win).
func (js *Journals) load(ctx context.Context, saga string) (*storedSaga, error) {
	names, err := listNames(ctx, js.storage, journalDir(saga))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	segs := segmentsOf(names)
	if len(segs) == 0 || segs[0] != (segmentName{}) {
		return nil, errNoIntent
	}
	st := &storedSaga{}
	for i, sn := range segs {
		key := segmentKeyAt(saga, sn)
		b, err := js.storage.Load(ctx, key)
		if errors.Is(err, fs.ErrNotExist) && sn.seq > 0 && inFlightAtTheEnd(segs, i) {
			// Up to storesInFlight stores run at once, each before what
			// it records is sent: one of the last listed with nothing
			// under it is a store its writer died in (the Redis module
			// lists a key before it sets it). Nothing that waited for it
			// was sent, so the journal is read without it.
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := st.add(sn, key, b); err != nil {
			return nil, err
		}
		st.next = max(st.next, sn.seq+1)
	}
	return st, nil
}

// inFlightAtTheEnd says whether segs[i] is among the last
// storesInFlight of the newest epoch: a store that may have been running
// when its writer died.
func inFlightAtTheEnd(segs []segmentName, i int) bool {
	last := segs[len(segs)-1]
	return segs[i].epoch == last.epoch && i >= len(segs)-storesInFlight
}

// add lays segment sn, stored under key as b, over what st holds.
func (st *storedSaga) add(sn segmentName, key string, b []byte) error {
	var seg segment
	if err := json.Unmarshal(b, &seg); err != nil {
		return fmt.Errorf("decoding %s: %w", key, err)
	}
	if seg.Version != journalVersion {
		return fmt.Errorf("%w: %s is in journal format %d, this gateway knows %d", batch.ErrNotResumable, key, seg.Version, journalVersion)
	}
	if sn == (segmentName{}) {
		if seg.Intent == nil || seg.Intent.Snapshot == nil {
			return fmt.Errorf("decoding %s: %w", key, errNoIntent)
		}
		st.intent, st.snap = seg.Intent, seg.Intent.Snapshot
	}
	for _, it := range seg.Items {
		if it.Index < 0 || it.Index >= len(st.snap.Items) {
			return fmt.Errorf("%s: item %d of a batch of %d", key, it.Index, len(st.snap.Items))
		}
		st.snap.Items[it.Index] = it.Item
	}
	return nil
}

// Interface guards
var (
	_ batch.Journal     = (*Journal)(nil)
	_ batch.LockWatcher = (*Journal)(nil)
	_ batch.EndLoser    = (*Journal)(nil)
)
