package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// SnapshotVersion is the version of the Snapshot format. A journal keeps
// it with every record, so that a newer gateway can refuse (or convert) a
// record it does not know.
const SnapshotVersion = 1

// Snapshot is an all-or-nothing saga as a journal keeps it: enough for
// another process to finish it (Resume) exactly as the saga would have.
type Snapshot struct {
	Version int `json:"v"`
	// Op is the batch's operation, or "envelope".
	Op string `json:"op"`
	// Path is the escaped collection path the batch came on, its
	// variables bound; the resource is found again by looking it up. An
	// envelope's is the envelope's path, and each item has its own.
	Path   string      `json:"path"`
	Query  string      `json:"query,omitempty"`
	Header http.Header `json:"header,omitempty"`
	// Key is the batch's Idempotency-Key, from which every write's is
	// derived: a resent write must carry the same.
	Key       string `json:"key"`
	KeyQuoted bool   `json:"key_quoted,omitempty"`
	// Base is, for a window of a bulk job, the job index of its first
	// item (ExecuteWindow); zero for a saga.
	Base  int            `json:"base,omitempty"`
	Items []ItemSnapshot `json:"items"`
}

// ItemSnapshot is one item of a saga, with what the saga knows of it.
type ItemSnapshot struct {
	ID       string          `json:"id,omitempty"`
	Element  json.RawMessage `json:"element,omitempty"`
	Fields   []string        `json:"fields,omitempty"`
	Phase    Phase           `json:"phase,omitempty"`
	Outcome  Outcome         `json:"outcome,omitempty"`
	Status   int             `json:"status,omitempty"`
	Error    string          `json:"error,omitempty"`
	Preimage json.RawMessage `json:"preimage,omitempty"`
	PreETag  string          `json:"pre_etag,omitempty"`
	Applied  bool            `json:"applied,omitempty"`
	Failure  bool            `json:"failure,omitempty"`
	Settled  bool            `json:"settled,omitempty"`
	Sent     *SubRequest     `json:"sent,omitempty"`
	// SentTimeout is the item_timeout the write was sent under: a saga
	// taken over resolves a write recorded in flight only once it is
	// over (docs/durability.md, "A saga never writes after it lost its lease").
	SentTimeout time.Duration `json:"sent_timeout,omitempty"`
	Undo        *Undo         `json:"undo,omitempty"`
	NoUndo      string        `json:"no_undo,omitempty"`
	CreatedFrom string        `json:"created_from,omitempty"`
	// Unsent marks a write failed by the gateway's own storage (its
	// record not stored, or its lease not proven): nothing was sent, and
	// a job's window that runs again sends it.
	Unsent bool `json:"unsent,omitempty"`
	// Answer is, in a job's window's log, the JSON body of the item's
	// answer as the window keeps it: what its result says, and what an
	// envelope's later operations reference, once another owner carries
	// the window on. A saga's journal keeps no answers.
	Answer json.RawMessage `json:"answer,omitempty"`
	// The rest are an envelope's: the operation's id (kept as "name"),
	// method and url (as sent, once filled), the operations it depends
	// on, and where its requests go, once its references are filled.
	OperationID string          `json:"name,omitempty"`
	Method      string          `json:"method,omitempty"`
	URL         string          `json:"url,omitempty"`
	Deps        []int           `json:"deps,omitempty"`
	Target      *TargetSnapshot `json:"target,omitempty"`
}

// TargetSnapshot is where an envelope's item's requests go, as a journal
// keeps it.
type TargetSnapshot struct {
	Op     string `json:"op"`
	Method string `json:"method"`
	// Path is the escaped path of the item's collection, its variables
	// bound.
	Path  string `json:"path"`
	Query string `json:"query,omitempty"`
}

// Snapshot is the plan as a journal keeps it before anything is written.
func (p *Plan) Snapshot() *Snapshot {
	s := &Snapshot{
		Version:   SnapshotVersion,
		Op:        p.Op.String(),
		Path:      p.Match.Path(),
		Header:    p.header,
		Key:       p.key.base,
		KeyQuoted: p.key.quoted,
		Items:     make([]ItemSnapshot, len(p.Items)),
	}
	if p.envelope() {
		s.Path = p.Envelope
	} else {
		s.Query = p.Items[0].tgt.query
	}
	for i, it := range p.Items {
		s.Items[i] = it.plannedSnapshot()
		snapshotOperation(&s.Items[i], it.operation, it.tgt, it.ID)
	}
	return s
}

// plannedSnapshot is an item of a batch as a journal keeps it before
// anything is sent: what it is, not yet attempted.
func (it Item) plannedSnapshot() ItemSnapshot {
	return ItemSnapshot{ID: it.ID, Element: it.Body, Fields: it.fields, Outcome: NotAttempted}
}

// snapshotOperation adds to an envelope's item what makes it an
// operation (eo; nil in a batch), and where its requests go (t, and the
// item's id) once that is known.
func snapshotOperation(snap *ItemSnapshot, eo *envelopeOperation, t *target, id string) {
	if eo == nil {
		return
	}
	snap.OperationID, snap.Method, snap.URL, snap.Deps = eo.id, eo.method, eo.sentURL(t, id), eo.deps
	if t != nil {
		snap.Target = &TargetSnapshot{Op: t.kind.String(), Method: t.method, Path: t.collectionPath, Query: t.query}
	}
}

// snapshotItem is an item as a journal keeps it: the whole of it (what
// the client is told, what the run knows, what the plan has), so that a
// journal can replace what it kept with each transition.
func snapshotItem(it *ItemResult, st *itemState, planned *Item) ItemSnapshot {
	snap := ItemSnapshot{
		ID: it.ID, Element: st.body, Fields: planned.fields, Phase: st.phase, Outcome: it.Outcome, Status: it.Status, Error: it.Error,
		Preimage: st.preimage, PreETag: st.preETag, Applied: st.applied, Failure: st.failure, Settled: st.settled,
		Sent: st.sent, Undo: st.undo, NoUndo: st.noUndo, CreatedFrom: st.createdFrom, Unsent: st.byGateway,
	}
	if st.sent != nil {
		snap.SentTimeout = st.tgt.settings.ItemTimeout
	}
	snapshotOperation(&snap, planned.operation, st.tgt, it.ID)
	return snap
}

// ErrNotResumable is the error of a snapshot that names what this gateway
// does not have (another format, a resource no longer configured).
var ErrNotResumable = errors.New("the saga cannot be resumed here")

// Resume finishes a saga that a journal kept, as its own process would
// have if it had not died: every item whose write took effect, or may
// have, is undone with the same proofs; a write recorded as about to be
// sent with no answer recorded is unknown. A batch that died before its
// report had not told its client it succeeded, so it is undone whole.
// The saga's journal (rt.Journal) goes on recording into the same
// record; Begin is not called again. lookup finds the resource again,
// and env the envelope (nil where the handler has none).
func Resume(ctx context.Context, snap *Snapshot, lookup func(path string) (policy.Match, bool), env *Envelope, rt Runtime) (*Result, error) {
	return resume(ctx, snap, lookup, env, rt, nil)
}

// resume is Resume, with reopen called on the saga once its items have
// their recorded state back, before they are locked.
func resume(ctx context.Context, snap *Snapshot, lookup func(path string) (policy.Match, bool), env *Envelope, rt Runtime, reopen func(*batchRun)) (*Result, error) {
	p, err := resumedPlan(snap, lookup, env)
	if err != nil {
		return nil, err
	}
	run := newBatchRun(p, rt, compensationBackoff)
	run.recorded(snap.Items)
	if reopen != nil {
		reopen(run)
	}
	lockCtx, cancel := context.WithTimeout(ctx, run.batchSettings.BatchTimeout)
	defer cancel()
	if !run.lock(ctx, lockCtx) {
		return nil, fmt.Errorf("the saga's items are locked by another write: %s", run.refusal.detail)
	}
	defer run.locks.release()
	res := run.end(ctx, ctx, run.lockRecordedCreates(ctx))
	if res.Outcome == Succeeded {
		// Every item had succeeded, but the client never heard it: the
		// batch is undone whole, which is the only outcome the saga can
		// still promise. (Reached only when nothing was applied.)
		res.Outcome = RolledBack
	}
	run.trace.finish(ctx, p, res)
	return res, nil
}

// recorded gives the run's items what a saga's journal, or a job's
// window's log, recorded of them (items, by index), and takes those
// recorded as sent, or past that, as started, in the order of their
// index (compensation undoes them backwards); an item with no record
// stays as the plan admitted it.
func (run *batchRun) recorded(items []ItemSnapshot) {
	for i, it := range items {
		if it.Phase == 0 {
			continue
		}
		run.items[i], run.state[i] = resumedItem(i, it, run.state[i])
		run.items[i].Index = run.plan.base() + i
		if it.Phase >= PhaseSending {
			run.started = append(run.started, i)
		}
	}
}

// lockRecordedCreates locks each item a recorded create made (an
// envelope's operation that failed before its target was known made
// none), and reports whether a started item took effect, or may have,
// and is not undone: whether there is anything to undo.
func (run *batchRun) lockRecordedCreates(ctx context.Context) (toUndo bool) {
	for _, i := range run.started {
		st := &run.state[i]
		if id := run.items[i].ID; st.tgt != nil && st.tgt.kind == policy.OpCreate && id != "" && st.applied {
			run.lockCreated(ctx, i, id)
		}
		toUndo = toUndo || st.applied && !run.items[i].undone()
	}
	return toUndo
}

// resumedPlan is the plan of a saga that a journal kept.
func resumedPlan(snap *Snapshot, lookup func(path string) (policy.Match, bool), env *Envelope) (*Plan, error) {
	if snap.Version != SnapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, this gateway knows %d", ErrNotResumable, snap.Version, SnapshotVersion)
	}
	p := &Plan{
		Atomicity: policy.AllOrNothing,
		Items:     make([]Item, len(snap.Items)),
		header:    snap.Header,
		key:       idempotencyKey{base: snap.Key, quoted: snap.KeyQuoted},
	}
	if p.header == nil {
		p.header = http.Header{}
	}
	var shared *target
	if snap.Op == policy.OpEnvelope.String() {
		if env == nil || env.Path != snap.Path {
			return nil, fmt.Errorf("%w: no envelope is configured at %s", ErrNotResumable, snap.Path)
		}
		p.Op, p.Envelope, p.settings, p.lookup = policy.OpEnvelope, env.Path, env.Settings, env.Lookup
		lookup = env.Lookup
	} else {
		op, err := policy.ParseOp(snap.Op)
		if err != nil || !op.Writes() {
			return nil, fmt.Errorf("%w: operation %q", ErrNotResumable, snap.Op)
		}
		m, ok := lookup(snap.Path)
		if !ok || m.Item {
			return nil, fmt.Errorf("%w: no resource is configured for %s", ErrNotResumable, snap.Path)
		}
		p.Op, p.Match, p.settings = op, m, m.Resource.Settings
		shared = newTarget(op, batchMethods[op], m, snap.Query)
	}
	for i, it := range snap.Items {
		p.Items[i] = Item{ID: it.ID, Body: it.Element, fields: it.Fields, firstWithID: i, tgt: shared}
		if p.envelope() {
			if err := p.Items[i].resumeOperation(it, lookup); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// resumeOperation gives an envelope's item back what it was as an
// operation, and where its requests went if it had started.
func (it *Item) resumeOperation(snap ItemSnapshot, lookup func(path string) (policy.Match, bool)) error {
	it.operation = &envelopeOperation{id: snap.OperationID, method: snap.Method, url: snap.URL, deps: snap.Deps}
	t := snap.Target
	if t == nil {
		return nil
	}
	op, err := policy.ParseOp(t.Op)
	m, ok := lookup(t.Path)
	if err != nil || !ok || m.Item {
		return fmt.Errorf("%w: operation %q's %s %s names no resource configured here", ErrNotResumable, snap.OperationID, t.Method, t.Path)
	}
	it.operation.kind = op
	it.tgt = newTarget(op, t.Method, m, t.Query)
	return nil
}

// resumedItem is item i as its journal recorded it (it), with its
// requests as the resumed plan has them (admitted).
func resumedItem(i int, it ItemSnapshot, admitted itemState) (ItemResult, itemState) {
	res := ItemResult{Index: i, ID: it.ID, Outcome: it.Outcome, Status: it.Status, Error: it.Error, Body: it.Answer}
	if it.OperationID != "" {
		res.OperationID, res.Method, res.URL = it.OperationID, it.Method, it.URL
	}
	st := itemState{
		tgt: admitted.tgt, body: admitted.body, fields: admitted.fields, elementID: admitted.elementID,
		preimage: it.Preimage, preETag: it.PreETag, applied: it.Applied, failure: it.Failure, settled: it.Settled,
		sent: it.Sent, undo: it.Undo, noUndo: it.NoUndo, createdFrom: it.CreatedFrom, phase: it.Phase,
	}
	switch it.Phase {
	case PhaseSending:
		// Recorded as about to be sent, and no answer recorded: it may
		// have been applied.
		res.Outcome, res.Status = Unknown, http.StatusBadGateway
		res.Error = "the gateway that sent it stopped before its answer was recorded"
		st.applied, st.failure = true, true
		// The write may still be inside the old owner's next (a paused
		// process, a partition): it is over, one way or the other, the
		// item_timeout it was sent under after this process took the
		// saga over, by this process's clock (docs/durability.md, "A saga never writes after it lost its lease").
		st.inFlightUntil = time.Now().Add(max(it.SentTimeout, admitted.tgt.settings.ItemTimeout))
	case PhaseUndoing:
		// An undo may have been sent. An item still unknown was being
		// resent (idempotent_upstream) instead: it is resolved again.
		st.resumed = res.Outcome != Unknown
	}
	return res, st
}
