package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddy-batch/caddy-batch/policy"
)

// SnapshotVersion is the version of the Snapshot format. A journal keeps
// it with every record, so that a newer gateway can refuse (or convert) a
// record it does not know.
const SnapshotVersion = 1

// Snapshot is an all-or-nothing saga as a journal keeps it: enough for
// another process to finish it (Resume) exactly as the saga would have.
type Snapshot struct {
	Version int    `json:"v"`
	Op      string `json:"op"`
	// Path is the escaped collection path the batch came on, its
	// variables bound; the resource is found again by looking it up.
	Path   string      `json:"path"`
	Query  string      `json:"query,omitempty"`
	Header http.Header `json:"header,omitempty"`
	// Key is the batch's Idempotency-Key, from which every write's is
	// derived: a resent write must carry the same.
	Key       string         `json:"key"`
	KeyQuoted bool           `json:"key_quoted,omitempty"`
	Items     []ItemSnapshot `json:"items"`
}

// ItemSnapshot is one item of a saga, with what the saga knows of it.
type ItemSnapshot struct {
	ID          string          `json:"id,omitempty"`
	Element     json.RawMessage `json:"element,omitempty"`
	Fields      []string        `json:"fields,omitempty"`
	Phase       Phase           `json:"phase,omitempty"`
	Outcome     Outcome         `json:"outcome,omitempty"`
	Status      int             `json:"status,omitempty"`
	Error       string          `json:"error,omitempty"`
	Preimage    json.RawMessage `json:"preimage,omitempty"`
	PreETag     string          `json:"pre_etag,omitempty"`
	Applied     bool            `json:"applied,omitempty"`
	Failure     bool            `json:"failure,omitempty"`
	Settled     bool            `json:"settled,omitempty"`
	Sent        *SubRequest     `json:"sent,omitempty"`
	Undo        *Undo           `json:"undo,omitempty"`
	NoUndo      string          `json:"no_undo,omitempty"`
	CreatedFrom string          `json:"created_from,omitempty"`
}

// Snapshot is the plan as a journal keeps it before anything is written.
func (p *Plan) Snapshot() *Snapshot {
	s := &Snapshot{
		Version:   SnapshotVersion,
		Op:        p.Op.String(),
		Path:      p.Match.Path(),
		Query:     p.query,
		Header:    p.header,
		Key:       p.key.base,
		KeyQuoted: p.key.quoted,
		Items:     make([]ItemSnapshot, len(p.Items)),
	}
	for i, it := range p.Items {
		s.Items[i] = ItemSnapshot{ID: it.ID, Element: it.Body, Fields: it.fields, Outcome: NotAttempted}
	}
	return s
}

// snapshotItem is item i as a journal keeps it: the whole of it, so that
// a journal can replace what it kept with each transition.
func (sg *saga) snapshotItem(i int) ItemSnapshot {
	it, st, planned := &sg.items[i], &sg.state[i], &sg.plan.Items[i]
	return ItemSnapshot{
		ID: it.ID, Element: planned.Body, Fields: planned.fields, Phase: st.phase, Outcome: it.Outcome, Status: it.Status, Error: it.Error,
		Preimage: st.preimage, PreETag: st.preETag, Applied: st.applied, Failure: st.failure, Settled: st.settled,
		Sent: st.sent, Undo: st.undo, NoUndo: st.noUndo, CreatedFrom: st.createdFrom,
	}
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
// record; Begin is not called again. lookup finds the resource again.
func Resume(ctx context.Context, snap *Snapshot, lookup func(path string) (policy.Match, bool), rt Runtime) (*Result, error) {
	if snap.Version != SnapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, this gateway knows %d", ErrNotResumable, snap.Version, SnapshotVersion)
	}
	op, err := policy.ParseOp(snap.Op)
	if err != nil || !op.Writes() {
		return nil, fmt.Errorf("%w: operation %q", ErrNotResumable, snap.Op)
	}
	m, ok := lookup(snap.Path)
	if !ok || m.Item {
		return nil, fmt.Errorf("%w: no resource is configured for %s", ErrNotResumable, snap.Path)
	}
	p := &Plan{
		Op:             op,
		Match:          m,
		Atomicity:      policy.AllOrNothing,
		Items:          make([]Item, len(snap.Items)),
		collectionPath: m.CollectionPath(),
		query:          snap.Query,
		header:         snap.Header,
		key:            idempotencyKey{base: snap.Key, quoted: snap.KeyQuoted},
	}
	if p.header == nil {
		p.header = http.Header{}
	}
	for i, it := range snap.Items {
		p.Items[i] = Item{ID: it.ID, Body: it.Element, fields: it.Fields, first: i}
	}
	sg := newSaga(p, rt, compensationBackoff)
	for i, it := range snap.Items {
		sg.items[i] = ItemResult{Index: i, ID: it.ID, Outcome: it.Outcome, Status: it.Status, Error: it.Error}
		sg.state[i] = itemState{
			preimage: it.Preimage, preETag: it.PreETag, applied: it.Applied, failure: it.Failure, settled: it.Settled,
			sent: it.Sent, undo: it.Undo, noUndo: it.NoUndo, createdFrom: it.CreatedFrom, phase: it.Phase,
		}
		switch it.Phase {
		case PhaseSending:
			// Recorded as about to be sent, and no answer recorded: it may
			// have been applied.
			sg.items[i].Outcome, sg.items[i].Status = Unknown, http.StatusBadGateway
			sg.items[i].Error = "the gateway that sent it stopped before its answer was recorded"
			sg.state[i].applied, sg.state[i].failure = true, true
		case PhaseUndoing:
			// An undo may have been sent. An item still unknown was being
			// resent (idempotent_upstream) instead: it is resolved again.
			sg.state[i].resumed = sg.items[i].Outcome != Unknown
		}
		if it.Phase >= PhaseSending {
			sg.started = append(sg.started, i)
		}
	}
	lockCtx, cancel := context.WithTimeout(ctx, sg.s.BatchTimeout)
	defer cancel()
	if !sg.lock(lockCtx) {
		return nil, fmt.Errorf("the saga's items are locked by another write: %s", sg.refusal.detail)
	}
	defer sg.locks.release()
	for _, i := range sg.started {
		if id := sg.items[i].ID; op == policy.OpCreate && id != "" && sg.state[i].applied {
			sg.lockCreated(ctx, id)
		}
	}
	toUndo := false
	for i := range sg.items {
		if sg.state[i].applied && !sg.undone(i) {
			toUndo = true
		}
	}
	if toUndo {
		sg.compensate(context.WithoutCancel(ctx))
	}
	res := sg.report(ctx, ctx)
	if res.Outcome == Succeeded {
		// Every item had succeeded, but the client never heard it: the
		// batch is undone whole, which is the only outcome the saga can
		// still promise. (Reached only when nothing was applied.)
		res.Outcome = RolledBack
	}
	sg.rt.Journal.End(context.WithoutCancel(ctx), res)
	return res, nil
}
