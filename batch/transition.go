package batch

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Journal records a saga's transitions, so that a saga cut short (its
// gateway killed) can be finished by another. The saga calls it
// synchronously: an item's write is sent only after Record returned nil
// for its PhaseSending transition. One item's transitions come in order;
// different items' may come at once (Record must be safe for that, and
// may store several in one write).
type Journal interface {
	// Begin records the batch's intent, before anything is written.
	Begin(ctx context.Context, p *Plan) error
	// Record records one transition of one item.
	Record(ctx context.Context, t Transition) error
	// End records that the saga is over, whatever its outcome.
	End(ctx context.Context, r *Result)
	// Fence returns once the saga may send a write: its lease is proven,
	// with time to spare. It waits while the lease is unproven (a storage
	// call failed or hangs), returns an error wrapping ErrLeaseUnproven
	// when ctx ends first, and a *LeaseLost once another instance may
	// act on the saga (docs/durability.md, "A saga never writes after it lost its lease").
	Fence(ctx context.Context) error
}

// LockWatcher is a Journal whose saga's lease stands on its item locks
// too (docs/durability.md, "A saga never writes after it lost its
// lease"): once lost returns an error, a lock in storage is lost, and so
// is the saga's lease.
type LockWatcher interface {
	WatchLocks(lost func() error)
}

// AheadJournal is a Journal that can store the record of a write before
// the write's turn comes (docs/durability.md, "Records stored ahead"):
// the saga records the writes of the next waves while this one is in
// flight, so that a write waits for no store of its own. The saga still
// Records the PhaseSending transition when the write leaves, which
// returns once the record it kept ahead is stored. With no transition,
// RecordAhead stores the intent while the preflight reads.
type AheadJournal interface {
	RecordAhead(ctx context.Context, ts ...Transition)
}

// ErrLeaseUnproven marks a write not sent because the saga's lease could
// not be proven in time: the storage did not answer.
var ErrLeaseUnproven = errors.New("the saga's lease in storage could not be proven (the storage did not answer in time), so nothing more was sent")

// LeaseLost is the error of a saga whose lease is lost: another instance
// took it over, or may have. The saga sends no new write; what it wrote
// since Proven, another instance may not know of.
type LeaseLost struct {
	Why string
	// Proven is when the last call that proved the lease began.
	Proven time.Time
}

func (e *LeaseLost) Error() string { return "the lease is lost: " + e.Why }

// NoJournal records nothing: a saga that dies with its process is lost.
type NoJournal struct{}

func (NoJournal) Begin(context.Context, *Plan) error       { return nil }
func (NoJournal) Record(context.Context, Transition) error { return nil }
func (NoJournal) End(context.Context, *Result)             {}
func (NoJournal) Fence(context.Context) error              { return nil }

// Phase is the step of the saga an item has reached.
type Phase uint8

const (
	// PhaseRead: the preflight read the item (its pre-image and ETag).
	PhaseRead Phase = iota + 1
	// PhaseSending: the item's write is about to be sent.
	PhaseSending
	// PhaseAnswered: the write was answered, or it is known that no
	// answer will come; the item's undo, if any, is computed.
	PhaseAnswered
	// PhaseUndoing: a request that resolves or undoes the item is about
	// to be sent.
	PhaseUndoing
	// PhaseSettled: the item's outcome is final.
	PhaseSettled
)

var phaseNames = [...]string{PhaseRead: "read", PhaseSending: "sending", PhaseAnswered: "answered", PhaseUndoing: "undoing", PhaseSettled: "settled"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) && phaseNames[p] != "" {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", p)
}

// Transition is one change of one item's state, as a journal records it.
type Transition struct {
	// Index is the item's place in the run: in a job's window, counted
	// from the window's first item (Snapshot.Base is its job index).
	Index int
	Phase Phase
	// Request is the request about to be sent (PhaseSending,
	// PhaseUndoing).
	Request *SubRequest
	// Item is the item's whole state after the change: what a journal
	// keeps, so that the saga can be finished from it (Resume).
	Item ItemSnapshot
}
