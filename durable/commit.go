package durable

import (
	"context"
	"sync"
	"time"
)

// Group commit with overlapping stores (docs/durability.md, "Round trips
// per batch"). A write-ahead record is stored by the first store that
// takes it, and the write waits for that store only: up to
// storesInFlight stores of one journal run at once, each taking every
// record kept since the one before took its own. The order recovery
// reads stays the order of the segments' numbers, given as each store
// starts, whatever order they land in: a write is sent only once its own
// store landed, so a segment that never landed holds nothing that was
// sent. The intent's store goes alone: no later segment may land before
// the beginning it belongs to (recovery takes a journal without its
// segment 0 for one whose beginning the storage lost).

// storesInFlight bounds the stores of one journal running at once. A
// handful keeps the writers of a wave from queueing behind each other's
// stores, while the stores stay far fewer than the items. Recovery reads
// with this bound whatever the storage (SerialStorer).
const storesInFlight = 4

// SerialStorer is a storage whose stores are best made one at a time:
// the file system's, whose every store is a synced file, and a disk syncs
// one after another, so that overlapping stores only add syncs. A
// journal on it keeps one store in flight, and the records that come
// meanwhile go together in the next, which waits for the writes sent
// as the last one landed to come back (join), not for a join window.
type SerialStorer interface {
	SerialStores()
}

// maxStores is how many stores of one journal may run at once on s.
func maxStores(s Storage) int {
	if _, ok := s.(SerialStorer); ok {
		return 1
	}
	return storesInFlight
}

// joinWindow is how long a store about to start waits for more records
// to come, as long as they keep coming, up to maxJoin or an eighth of
// what a store takes, whichever is less: the records of writers answered
// at the same moment (a wave) go into one store. A storage that answers
// in less than eight windows gets no wait, nor one that stores one at a
// time (the records that come during a store go into the next anyway).
const (
	joinWindow = 25 * time.Microsecond
	maxJoin    = 200 * time.Microsecond
)

// storeLog is what a journal knows of its stores, under its mutex.
type storeLog struct {
	// kept counts the records kept; taken counts the stores that took
	// records (the nth took those kept before it started).
	kept, taken uint64
	inFlight    int
	joining     bool
	// ended are the stores that ended above low, every store up to low
	// having ended; failed are the errors of those that failed.
	low    uint64
	ended  map[uint64]bool
	failed map[uint64]error
	// ewma is a moving average of how long a store takes.
	ewma time.Duration
}

func (l *storeLog) done(n uint64) bool { return n <= l.low || l.ended[n] }

func (l *storeLog) end(n uint64, err error) {
	if err != nil {
		l.failed[n] = err
	}
	l.ended[n] = true
	for l.ended[l.low+1] {
		delete(l.ended, l.low+1)
		l.low++
	}
}

func (l *storeLog) took(d time.Duration) {
	if l.ewma == 0 {
		l.ewma = d
		return
	}
	l.ewma += (d - l.ewma) / 8
}

// groupCommit is the group commit of one writer of records (a saga's
// journal, a job window's log), under its owner's mutex, which
// committed waits on.
type groupCommit struct {
	// committed is signalled when a store ends, or one takes its
	// records: every record waits for the store that takes it, and up to
	// max stores run at once (overlap).
	committed *sync.Cond
	stores    storeLog
	max       int
	// storeKept stores what is kept as store n: the mutex is held, and
	// let go while the storage works, so that records keep coming.
	storeKept func(ctx context.Context, n uint64) error
	// alone reports whether the next store must run with no other in
	// flight (a journal's intent, until it landed).
	alone func() bool
	// outstanding, if set, counts the writes sent, or about to be,
	// whose answer is not recorded yet: their writers record their next
	// writes once it came (a saga's journal).
	outstanding func() int
	// gather says the records are a bulk job's window's: on a storage
	// that stores one at a time, each store first waits what a store
	// takes (at most maxGather), so that it takes the records of more of
	// the window's writers. A job runs in the background, and what
	// bounds it there is what its stores cost the process (a synced
	// file each: measured, a 50,000-create job spent 409 to 474 µs of
	// Caddy's CPU an item without the wait, 292 to 368 with it, and went
	// 10 to 20 % faster), not how long one write waits.
	gather bool
}

// maxGather bounds the wait of a job's store for more records.
const maxGather = 2 * time.Millisecond

func newGroupCommit(mu *sync.Mutex, max int, storeKept func(context.Context, uint64) error, alone func() bool) groupCommit {
	return groupCommit{
		committed: sync.NewCond(mu), max: max, storeKept: storeKept, alone: alone,
		stores: storeLog{failed: map[uint64]error{}, ended: map[uint64]bool{}},
	}
}

// commit returns once the store that takes the records kept so far has
// ended, and returns its error: with concurrency 8, eight writes about to
// be sent together cost one storage write, not eight in a row, and none
// is sent before its own record is stored. The mutex is held.
func (g *groupCommit) commit(ctx context.Context) error {
	want := g.stores.taken + 1 // the store that takes this record
	for !g.stores.done(want) {
		if g.stores.taken < want && g.mayStart() {
			g.store(ctx)
			continue
		}
		g.committed.Wait()
	}
	return g.stores.failed[want]
}

// commitAll is commit, and returns once every store before that one
// has ended too: a later, smaller store may land first, and what the
// earlier ones carry (answers, the records of writes never sent) is
// then not yet in storage. A store that failed leaves its records for
// the next. The mutex is held.
func (g *groupCommit) commitAll(ctx context.Context) error {
	want := g.stores.taken + 1
	err := g.commit(ctx)
	for g.stores.low < want {
		g.committed.Wait()
	}
	return err
}

// mayStart says whether a store may start now: fewer running than the
// storage takes at once (maxStores), none gathering its records, and
// one that must go alone, alone.
func (g *groupCommit) mayStart() bool {
	l := &g.stores
	return !l.joining && l.inFlight < g.max && (l.inFlight == 0 || !g.alone())
}

// store runs the next store: it gathers the records that come within
// the join window, takes them, and stores them. The mutex is held, and
// let go meanwhile.
func (g *groupCommit) store(ctx context.Context) {
	l := &g.stores
	l.inFlight++
	l.joining = true
	g.join()
	l.joining = false
	l.taken++
	n := l.taken
	g.committed.Broadcast() // the next store may start once this one takes its records
	began := time.Now()
	err := g.storeKept(ctx, n)
	l.took(time.Since(began))
	l.inFlight--
	l.end(n, err)
	g.committed.Broadcast()
}

// join waits while records keep coming, within the join window. The
// mutex is held, and let go while it waits.
func (g *groupCommit) join() {
	if g.max == 1 && g.gather {
		g.committed.L.Unlock()
		time.Sleep(min(maxGather, g.stores.ewma))
		g.committed.L.Lock()
		return
	}
	if g.alone() {
		// The store that must go alone (a journal's intent) holds up
		// every other: the writers of the first wave record together,
		// and a store that went with the first of them made the rest
		// wait for one of their own after it, two stores in a row before
		// the wave was sent (measured: a 100-item create's segment 0 held
		// one record). No store of this journal has been timed yet, so
		// the window is the longest.
		g.whileComing(maxJoin)
		return
	}
	if g.max == 1 && g.outstanding != nil {
		// One store at a time: the writes sent as the last store landed
		// come back while the next one syncs, and their writers' next
		// records would wait for a store of their own after it, so that
		// the writers take turns, half of them a store (measured: 27
		// stores for a 100-item create where 14 do). This store waits for
		// them instead, up to half of what a store takes, or a
		// millisecond: a slower upstream's writes are not waited for
		// long.
		deadline := time.Now().Add(min(time.Millisecond, g.stores.ewma/2))
		for g.outstanding() > 0 && time.Now().Before(deadline) {
			g.committed.L.Unlock()
			time.Sleep(joinWindow)
			g.committed.L.Lock()
		}
		return
	}
	limit := min(maxJoin, g.stores.ewma/8)
	if limit < joinWindow || g.max == 1 {
		return
	}
	g.whileComing(limit)
}

// whileComing waits, up to limit, until a join window passes with no
// record kept. The mutex is held, and let go while it waits.
func (g *groupCommit) whileComing(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		kept := g.stores.kept
		g.committed.L.Unlock()
		time.Sleep(joinWindow)
		g.committed.L.Lock()
		if g.stores.kept == kept {
			return
		}
	}
}
