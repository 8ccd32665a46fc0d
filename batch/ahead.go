package batch

import (
	"context"
	"sync"

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
// nothing ahead. Records go a wave (concurrency writes) at a time: a
// store each, not one per write, and never more than four waves beyond
// the writes in flight.
type aheadRecords struct {
	run     *batchRun
	ctx     context.Context
	journal AheadJournal
	pending []int

	mu sync.Mutex
	// first are the first four waves, whose records go before the
	// batch's first write: each once the preflight read its
	// pre-images, or as the execute starts. unread counts what the
	// preflight has still to read of each, and waveOf maps an item to
	// its wave.
	first  [][]int
	unread []int
	waveOf map[int]int
	// after maps the first write of a wave to the wave four after it,
	// whose records go ahead as that write's worker takes it.
	after map[int][]int
}

// recordsAhead returns what records the writes of pending ahead of their
// turn; nil when they must wait for their turn (see above).
func (run *batchRun) recordsAhead(ctx context.Context, pending []int) *aheadRecords {
	aj, ok := run.rt.Journal.(AheadJournal)
	if !ok || !run.saga || run.plan.Op != policy.OpUpdate || run.batchSettings.IdempotentUpstream {
		return nil
	}
	wave := max(run.batchSettings.Concurrency, 1)
	a := &aheadRecords{run: run, ctx: ctx, journal: aj, pending: pending,
		waveOf: make(map[int]int, 4*wave), after: make(map[int][]int, len(pending)/wave)}
	for p := 0; p < len(pending); p += wave {
		w := pending[p:min(p+wave, len(pending))]
		if p < 4*wave {
			for _, i := range w {
				a.waveOf[i] = len(a.first)
			}
			a.first = append(a.first, w)
			a.unread = append(a.unread, len(w))
		} else {
			a.after[pending[p-4*wave]] = w
		}
	}
	return a
}

// read records, once the preflight read item i's pre-image, the wave of
// the first four whose pre-images are now all read.
func (a *aheadRecords) read(i int) {
	if a == nil {
		return
	}
	w, ok := a.waveOf[i]
	if !ok {
		return
	}
	a.mu.Lock()
	a.unread[w]--
	read := a.unread[w] == 0
	a.mu.Unlock()
	if read {
		a.record(a.first[w]...)
	}
}

// start records the first four waves the preflight did not.
func (a *aheadRecords) start() {
	if a != nil {
		a.record(a.pending[:len(a.waveOf)]...)
	}
}

// next records ahead the wave four after item i's, when i is the first
// write of its wave and its worker is about to send it.
func (a *aheadRecords) next(i int) {
	if a == nil {
		return
	}
	if w, ok := a.after[i]; ok {
		a.record(w...)
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
