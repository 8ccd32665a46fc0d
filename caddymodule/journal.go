package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
)

// The saga journal (docs/durability.md) lives in Caddy's storage, one
// directory per saga:
//
//	batch/v1/journal/<saga>/seg.00000000   segment 0: the intent, and any items
//	batch/v1/journal/<saga>/seg.00000001   the items changed since segment 0
//	...
//	batch/v1/journal/<saga>/lease          the owner's renewed lease
//
// <saga> is random hex, so no storage mangles it, and nothing the client
// sent (an id, a path) is ever part of a key. Each segment is written
// once and never rewritten: a storage write costs the same for a small
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
	// storageTimeout bounds one storage operation of the journal. The
	// saga waits for the write-ahead ones, so a storage that hangs must
	// fail the item (not sent) rather than hold the batch forever.
	storageTimeout = 10 * time.Second
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

// intent is what a saga is about to do, and where it came from: enough
// for another process to send its requests through the same server, as
// the client's request would have gone.
type intent struct {
	Saga    string    `json:"saga"`
	Owner   string    `json:"owner"`
	Expires time.Time `json:"expires"`
	Started time.Time `json:"started"`
	// Server is the name of the Caddy server the batch came in on.
	Server string `json:"server"`
	// Method, URI, Host, RemoteAddr and TLS are the client's request as
	// it reached the server, before any rewrite, so that a recovery's
	// request takes the same route to the batch handler.
	Method     string          `json:"method"`
	URI        string          `json:"uri"`
	Host       string          `json:"host"`
	RemoteAddr string          `json:"remote_addr,omitempty"`
	TLS        bool            `json:"tls,omitempty"`
	Snapshot   *batch.Snapshot `json:"snapshot"`
}

// lease is an owner's claim on a saga, renewed while the saga runs.
type lease struct {
	Owner   string    `json:"owner"`
	Expires time.Time `json:"expires"`
}

// journalStore is where the journals of one config live.
type journalStore struct {
	storage certmagic.Storage
	lease   time.Duration
	logger  *zap.Logger
}

// owned are the sagas this process runs or is finishing, so that its own
// recovery never takes them over, and a process that exits waits for
// them (see App.Provision).
var owned = &ownedSagas{ids: map[string]bool{}}

type ownedSagas struct {
	mu      sync.Mutex
	ids     map[string]bool
	running sync.WaitGroup
}

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

// count is how many sagas this process has a journal for.
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

// journal is one saga's journal: a batch.Journal over Caddy's storage.
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
type journal struct {
	js   *journalStore
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
	// stored is set once anything may be in storage.
	stored     bool
	leaseUntil time.Time
	stopRenew  chan struct{}
	renewed    chan struct{} // closed when the renewal goroutine is gone
}

// newJournal is the journal of a batch that came in as r.
func (js *journalStore) newJournal(r *http.Request) *journal {
	in := &intent{
		Saga:       durable.NewID(),
		Owner:      durable.Owner(),
		Method:     r.Method,
		URI:        r.RequestURI,
		Host:       r.Host,
		RemoteAddr: r.RemoteAddr,
		TLS:        r.TLS != nil,
	}
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		in.Method, in.URI = orig.Method, orig.RequestURI
		if in.URI == "" && orig.URL != nil {
			in.URI = orig.URL.RequestURI()
		}
	}
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		in.Server = srv.Name()
	}
	return newJournalOf(&journal{js: js, saga: in.Saga, intent: in})
}

func newJournalOf(j *journal) *journal {
	j.at, j.failed = map[int]int{}, map[uint64]error{}
	j.committed = sync.NewCond(&j.mu)
	return j
}

// takeOver is the journal of a dead owner's saga, which this process now
// owns until leaseUntil (renewed): it goes on after the last segment.
func (js *journalStore) takeOver(saga string, next int, leaseUntil time.Time) *journal {
	j := newJournalOf(&journal{js: js, saga: saga, seq: next, stored: true, leaseUntil: leaseUntil})
	j.startRenewal()
	return j
}

// Begin keeps the intent; it is stored with the first write's record.
func (j *journal) Begin(_ context.Context, p *batch.Plan) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.intent.Snapshot = p.Snapshot()
	j.intent.Started = time.Now()
	owned.add(j.saga)
	return nil
}

// Record keeps t, and stores it (with everything kept before it) when
// the saga is about to send a request that changes the upstream.
func (j *journal) Record(ctx context.Context, t batch.Transition) error {
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
func (j *journal) commit(ctx context.Context) error {
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
func (j *journal) flush(ctx context.Context) error {
	now := time.Now()
	if j.intent == nil && now.After(j.leaseUntil.Add(-j.js.lease/6)) {
		// The lease could not be renewed: another instance may be
		// finishing this saga already, and must not find writes it was
		// never told about.
		return fmt.Errorf("the saga's lease in storage lapsed at %s (it could not be renewed)", j.leaseUntil.Format(time.RFC3339))
	}
	in, items := j.intent, j.items
	j.items = nil
	clear(j.at)
	expires := now.Add(j.js.lease)
	if in != nil {
		in.Expires = expires
	}
	b, err := json.Marshal(segment{Version: journalVersion, Seq: j.seq, Intent: in, Items: items})
	if err != nil {
		j.keepAgain(items)
		return fmt.Errorf("encoding the saga's journal: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageTimeout)
	defer cancel()
	j.stored = true
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
func (j *journal) keepAgain(items []itemRecord) {
	for _, it := range items {
		if _, newer := j.at[it.Index]; !newer {
			j.at[it.Index] = len(j.items)
			j.items = append(j.items, it)
		}
	}
}

// End removes the journal: the saga is over, whatever its outcome.
func (j *journal) End(ctx context.Context, _ *batch.Result) {
	j.stopRenewal()
	j.mu.Lock()
	stored := j.stored
	j.mu.Unlock()
	defer owned.done()
	if !stored {
		owned.forget(j.saga)
		return
	}
	if err := j.remove(ctx); err != nil {
		// A journal left in storage would be taken for a saga cut
		// short, and undone, once its lease lapsed: keep the lease and
		// try again.
		j.js.logger.Error("the saga's journal could not be removed from storage; retrying while this process runs",
			zap.String("saga", j.saga), zap.Error(err))
		go j.removeLater()
		return
	}
	owned.forget(j.saga)
}

// remove deletes segment 0 first: without its intent, what is left of a
// journal is no saga, only garbage for the recovery to sweep.
func (j *journal) remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageTimeout)
	defer cancel()
	if err := j.js.storage.Delete(ctx, segmentKey(j.saga, 0)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := j.js.storage.Delete(ctx, journalDir(j.saga)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		j.js.logger.Warn("the rest of a finished saga's journal could not be removed; recovery will sweep it",
			zap.String("saga", j.saga), zap.Error(err))
	}
	return nil
}

func (j *journal) removeLater() {
	defer owned.forget(j.saga)
	for {
		time.Sleep(j.js.lease / 3)
		j.renew()
		if j.remove(context.Background()) == nil {
			return
		}
	}
}

func (j *journal) startRenewal() {
	stop, renewed := make(chan struct{}), make(chan struct{})
	j.stopRenew, j.renewed = stop, renewed
	go func() {
		defer close(renewed)
		tick := time.NewTicker(j.js.lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				j.renew()
			}
		}
	}()
}

// stopRenewal waits for the renewal goroutine to be gone, so that no
// renewal writes the lease again after the journal is removed.
func (j *journal) stopRenewal() {
	j.mu.Lock()
	stop, renewed := j.stopRenew, j.renewed
	j.stopRenew = nil
	j.mu.Unlock()
	if stop != nil {
		close(stop)
		<-renewed
	}
}

func (j *journal) renew() {
	until := time.Now().Add(j.js.lease)
	b, _ := json.Marshal(lease{Owner: durable.Owner(), Expires: until})
	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
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
}

// errNoIntent marks a journal directory without its segment 0: a saga
// whose removal was cut short.
var errNoIntent = errors.New("the journal has no intent (segment 0)")

// sagas lists the sagas that have a journal in storage.
func (js *journalStore) sagas(ctx context.Context) ([]string, error) {
	keys, err := js.storage.List(ctx, journalPrefix, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		// A storage may list keys under the prefix, or its "directories".
		rest, ok := strings.CutPrefix(k, journalPrefix+"/")
		if !ok {
			continue
		}
		saga, _, _ := strings.Cut(rest, "/")
		if saga != "" && !slices.Contains(out, saga) {
			out = append(out, saga)
		}
	}
	return out, nil
}

// leaseOf returns who holds saga and until when: the lease key if it was
// renewed, else the intent's.
func (js *journalStore) leaseOf(ctx context.Context, saga string) (lease, error) {
	var l lease
	if b, err := js.storage.Load(ctx, leaseKey(saga)); err == nil {
		if err := json.Unmarshal(b, &l); err != nil {
			return l, fmt.Errorf("decoding %s: %w", leaseKey(saga), err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return l, err
	}
	if time.Now().Before(l.Expires) {
		return l, nil
	}
	b, err := js.storage.Load(ctx, segmentKey(saga, 0))
	if errors.Is(err, fs.ErrNotExist) {
		return l, errNoIntent
	}
	if err != nil {
		return l, err
	}
	var seg segment
	if err := json.Unmarshal(b, &seg); err != nil || seg.Intent == nil {
		return l, fmt.Errorf("decoding %s: not a journal's intent (%v)", segmentKey(saga, 0), err)
	}
	if seg.Intent.Expires.After(l.Expires) {
		l = lease{Owner: seg.Intent.Owner, Expires: seg.Intent.Expires}
	}
	return l, nil
}

// load reads a saga's whole journal: the intent, with every later
// segment's items laid over its snapshot in order.
func (js *journalStore) load(ctx context.Context, saga string) (*storedSaga, error) {
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
	st := &storedSaga{}
	for _, n := range seqs {
		b, err := js.storage.Load(ctx, segmentKey(saga, n))
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
var _ batch.Journal = (*journal)(nil)
