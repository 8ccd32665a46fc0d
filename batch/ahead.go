package batch

import (
	"context"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Records stored ahead (docs/durability.md, "Records stored ahead"). A
// saga's write is sent only once the record that it is about to be sent
// is in storage. Stored as each write's turn comes, those records cost
// every wave of writes a storage round trip of its own, one after
// another. So the first four waves' records are stored while the
// preflight reads, and, while a wave is in flight, the saga records the
// wave four after it: a write finds its record stored. Four, because
// a store may take as long as several waves of writes (a Redis 1 ms
// away, an upstream that answers in less): fewer left writes waiting
// for their stores, measured (docs/performance.md, "Round trips per
// batch").
//
// A record stored ahead of a write that is then never sent (the batch
// stopped first) reads to a recovery as a write sent and never
// answered: unknown, resolved by reading the item back. That is harmless
// only where the read decides it: an update, whose item still holds its
// pre-image when the write never left. Not a create, whose item cannot
// be found without its answer; not a delete, whose absence does not say
// who deleted it; and not under idempotent_upstream, whose recovery sends
// an unknown write again to learn its outcome, which would send one that
// never left. Those keep a store per wave.

// aheadRecords records writes ahead of their turn; a nil one records
// nothing ahead.
type aheadRecords struct {
	run     *batchRun
	ctx     context.Context
	journal AheadJournal
	pending []int
	// first are the writes whose records go before the batch's first
	// write: as the preflight reads their pre-images, or as the execute
	// starts. after maps an item to the one whose record goes ahead when
	// its worker takes it: the item four waves later.
	first map[int]bool
	after map[int]int
}

// recordsAhead returns what records the writes of pending ahead of their
// turn; nil when they must wait for their turn (see above).
func (run *batchRun) recordsAhead(ctx context.Context, pending []int) *aheadRecords {
	aj, ok := run.rt.Journal.(AheadJournal)
	if !ok || !run.saga || run.plan.Op != policy.OpUpdate || run.batchSettings.IdempotentUpstream {
		return nil
	}
	ahead := 4 * run.batchSettings.Concurrency
	a := &aheadRecords{run: run, ctx: ctx, journal: aj, pending: pending,
		first: make(map[int]bool, ahead), after: make(map[int]int, len(pending))}
	for p, i := range pending {
		if p < ahead {
			a.first[i] = true
		}
		if p+ahead < len(pending) {
			a.after[i] = pending[p+ahead]
		}
	}
	return a
}

// read records item i ahead once the preflight read its pre-image, if
// it is among the first writes.
func (a *aheadRecords) read(i int) {
	if a != nil && a.first[i] {
		a.record(i)
	}
}

// start records the first writes (the first of pending) the preflight
// did not.
func (a *aheadRecords) start() {
	if a != nil {
		a.record(a.pending[:len(a.first)]...)
	}
}

// next records ahead the write four waves after item i, whose worker
// is about to send it.
func (a *aheadRecords) next(i int) {
	if a == nil {
		return
	}
	if j, ok := a.after[i]; ok {
		a.record(j)
	}
}

// record stores the PhaseSending records of items ahead of their
// writes, except those whose write started. Under run.mu, so that a
// record goes to the journal before the write's own (executeItem takes
// the item's request under it): a record kept ahead never lands over a
// later one.
func (a *aheadRecords) record(items ...int) {
	run := a.run
	run.mu.Lock()
	defer run.mu.Unlock()
	ts := make([]Transition, 0, len(items))
	for _, i := range items {
		st := &run.state[i]
		if st.request != nil || st.settled {
			continue
		}
		sending := *st
		sending.sent, sending.phase = run.request(i), PhaseSending
		ts = append(ts, Transition{Index: i, Phase: PhaseSending, Request: sending.sent,
			Item: snapshotItem(&run.items[i], &sending, &run.plan.Items[i])})
	}
	if len(ts) > 0 {
		a.journal.RecordAhead(a.ctx, ts...)
	}
}

// settleUnsent records the items whose record went ahead and whose write
// never started (the batch stopped first) as settled, not attempted: a
// recovery then knows, once that record is stored, that they were never
// sent.
func (a *aheadRecords) settleUnsent(ctx context.Context) {
	if a == nil {
		return
	}
	run := a.run
	started := make(map[int]bool, len(run.started))
	for _, i := range run.started {
		started[i] = true
	}
	for _, i := range a.pending {
		run.mu.Lock()
		recorded := run.state[i].request != nil
		run.mu.Unlock()
		if recorded && !started[i] {
			_ = run.transition(ctx, i, PhaseSettled, nil, nil)
		}
	}
}
