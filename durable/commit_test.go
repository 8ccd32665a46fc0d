package durable

import (
	"context"
	"errors"
	"path"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// heldStores is a storage whose segment stores each wait until the test
// lets them end (with an error or without), and that tells in which
// order they started.
type heldStores struct {
	*faulty
	mu      sync.Mutex
	started []string
	release map[string]chan error
}

func newHeldStores() *heldStores {
	h := &heldStores{faulty: newFaulty(), release: map[string]chan error{}}
	h.setHook(func(_ context.Context, op, key string) error {
		if _, seg := parseSegment(path.Base(key)); op != "store" || !seg {
			return nil
		}
		h.mu.Lock()
		h.started = append(h.started, path.Base(key))
		ch := make(chan error)
		h.release[path.Base(key)] = ch
		h.mu.Unlock()
		return <-ch
	})
	return h
}

// end lets the store of segment name end with err.
func (h *heldStores) end(t *testing.T, name string, err error) {
	t.Helper()
	h.mu.Lock()
	ch := h.release[name]
	h.mu.Unlock()
	if ch == nil {
		t.Fatalf("%s was never stored (started: %v)", name, h.startedNow())
	}
	ch <- err
	synctest.Wait()
}

func (h *heldStores) startedNow() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.started)
}

// sending records that item i is about to be sent, with status as a mark
// of which of its states it is, in the background; done hears when the
// record is stored. A store it starts has taken its records when it
// returns: the join window has passed.
func sending(j *Journal, i, status int, done chan<- error) {
	go func() {
		done <- j.Record(context.Background(), batch.Transition{Index: i, Phase: batch.PhaseSending,
			Item: batch.ItemSnapshot{Phase: batch.PhaseSending, Status: status}})
	}()
	synctest.Wait()
	time.Sleep(maxJoin)
	synctest.Wait()
}

func begun(t *testing.T, s Storage, n int) (*Journals, *Journal) {
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	j := js.New(Origin{})
	if err := j.Begin(context.Background(), updatePlan(t, widgets(t), n)); err != nil {
		t.Fatal(err)
	}
	return js, j
}

func expect(t *testing.T, what string, done <-chan error, want bool) {
	t.Helper()
	select {
	case err := <-done:
		if !want {
			t.Fatalf("%s returned (%v) before its own store ended", what, err)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	default:
		if want {
			t.Fatalf("%s still waits", what)
		}
	}
}

// TestStoresOverlap: the intent's store goes alone, and no other starts
// before it landed; after it, up to storesInFlight stores run at once,
// and a write waits only for the store that took its own record, not
// for those started before it.
func TestStoresOverlap(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newHeldStores()
		_, j := begun(t, s, 6)
		done := make([]chan error, 6)
		for i := range done {
			done[i] = make(chan error, 1)
		}
		sending(j, 0, 1, done[0])
		sending(j, 1, 1, done[1])
		if got := s.startedNow(); !slices.Equal(got, []string{"seg.00000000"}) {
			t.Fatalf("stores started before the intent landed: %v", got)
		}
		s.end(t, "seg.00000000", nil)
		expect(t, "item 0", done[0], true)
		time.Sleep(maxJoin) // item 1's store takes its record
		synctest.Wait()
		for i := 2; i < 6; i++ {
			sending(j, i, 1, done[i])
		}
		// Item 1's store started once the intent landed, with item 1
		// only; items 2, 3 and 4 each got one of their own; item 5 waits
		// for a store to end.
		if got := s.startedNow(); len(got) != 1+storesInFlight {
			t.Fatalf("started %v, want the intent and %d in flight", got, storesInFlight)
		}
		s.end(t, "seg.00000003", nil)
		expect(t, "item 3, whose store landed", done[3], true)
		expect(t, "item 1, whose store is held", done[1], false)
		time.Sleep(maxJoin) // item 5's store takes its record
		synctest.Wait()
		if got := s.startedNow(); len(got) != 2+storesInFlight {
			t.Fatalf("started %v: item 5's store did not start as one ended", got)
		}
		for _, seg := range []string{"seg.00000001", "seg.00000002", "seg.00000004", "seg.00000005"} {
			s.end(t, seg, nil)
		}
		for i := range done {
			if i != 0 && i != 3 {
				expect(t, "item", done[i], true)
			}
		}
		j.Abandon()
	})
}

// TestIntentStoreTakesTheFirstWave: the writers of the first wave
// record together, and the intent's store, which every other store
// waits for, takes all their records: the wave waits for one store, not
// two in a row.
func TestIntentStoreTakesTheFirstWave(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newHeldStores()
		_, j := begun(t, s, 8)
		done := make(chan error, 8)
		for i := range 8 {
			go func() {
				done <- j.Record(context.Background(), batch.Transition{Index: i, Phase: batch.PhaseSending,
					Item: batch.ItemSnapshot{Phase: batch.PhaseSending}})
			}()
		}
		synctest.Wait()
		time.Sleep(maxJoin)
		synctest.Wait()
		s.end(t, "seg.00000000", nil)
		for range 8 {
			expect(t, "a write of the first wave", done, true)
		}
		j.Abandon()
	})
}

// TestFailedStoreNeverOverwritesNewer: a store that fails keeps its
// records again for the next store only if no later store took a newer
// record of the same item: recovery never lays an older state over a
// newer one.
func TestFailedStoreNeverOverwritesNewer(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newHeldStores()
		js, j := begun(t, s, 3)
		first, older, newer, last := make(chan error, 1), make(chan error, 1), make(chan error, 1), make(chan error, 1)
		sending(j, 2, 1, first)
		s.end(t, "seg.00000000", nil)
		sending(j, 0, 1, older) // seg 1, held
		sending(j, 0, 2, newer) // seg 2
		s.end(t, "seg.00000002", nil)
		expect(t, "the newer record", newer, true)
		s.end(t, "seg.00000001", errors.New("the disk is full"))
		if err := <-older; err == nil {
			t.Fatal("a failed store's write was let go")
		}
		sending(j, 1, 1, last) // seg 3
		s.end(t, "seg.00000003", nil)
		expect(t, "the last record", last, true)
		st, err := js.load(context.Background(), j.Saga())
		if err != nil {
			t.Fatal(err)
		}
		if got := st.snap.Items[0].Status; got != 2 {
			t.Errorf("item 0 reads as state %d, want the newer, 2", got)
		}
		j.Abandon()
	})
}

// TestRecoveryWithAnEarlierSegmentListedOnly: with stores overlapping,
// the store a writer died in need not be the last listed: a segment
// listed with nothing under it among the last storesInFlight is read
// past (nothing that waited for it was sent); one further back is not a
// store in flight, and the journal does not read.
func TestRecoveryWithAnEarlierSegmentListedOnly(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newMemStorage()
		js, j := begun(t, s, 8)
		for i := range 8 {
			if err := j.Record(context.Background(), batch.Transition{Index: i, Phase: batch.PhaseSending,
				Item: batch.ItemSnapshot{Phase: batch.PhaseSending, Status: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		// Segments 0 to 8: segment 6 was being stored.
		s.mu.Lock()
		delete(s.keys, segmentKey(j.Saga(), 6))
		s.mu.Unlock()
		s.listOnly(segmentKey(j.Saga(), 6))
		st, err := js.load(context.Background(), j.Saga())
		if err != nil {
			t.Fatalf("a listed-only segment among the last %d: %v", storesInFlight, err)
		}
		if st.snap.Items[5].Phase != batch.PhaseSending || st.snap.Items[6].Phase == batch.PhaseSending {
			t.Errorf("items 5 and 6 read as %s and %s", st.snap.Items[5].Phase, st.snap.Items[6].Phase)
		}
		s.mu.Lock()
		delete(s.keys, segmentKey(j.Saga(), 2))
		s.mu.Unlock()
		s.listOnly(segmentKey(j.Saga(), 2))
		if _, err := js.load(context.Background(), j.Saga()); err == nil {
			t.Error("a segment lost far from the end was read past")
		}
		j.Abandon()
	})
}

// serialSegments is a storage whose stores take delay each, one at a
// time, as the file system's synced files do; it counts the journal's
// segments stored.
type serialSegments struct {
	*memStorage
	delay time.Duration

	mu       chanMutex
	segments int
}

func (s *serialSegments) SerialStores() {}

func (s *serialSegments) Store(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	time.Sleep(s.delay)
	if _, seg := parseSegment(path.Base(key)); seg {
		s.segments++
	}
	return s.memStorage.Store(ctx, key, value)
}

// staggered is an upstream whose creates answer after 200µs to 900µs,
// by their order: eight writes sent together come back one by one.
type staggered struct {
	upstream
	mu sync.Mutex
	n  int
}

func (u *staggered) Send(ctx context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	u.mu.Lock()
	u.n++
	n := u.n
	u.mu.Unlock()
	time.Sleep(200*time.Microsecond + time.Duration(n%8)*100*time.Microsecond)
	return u.upstream.Send(ctx, sr)
}

// On a storage that stores one at a time, the writes sent as a store
// lands come back while the next store syncs. Were that store to start
// at once, they would wait for one of their own after it, and the
// writers would take turns, half of them a store: a 96-item create made
// 24 stores of four records. The store about to start waits, up to half
// of what a store takes, for the writes whose answers are to come.
func TestSerialStoresTakeEveryWriter(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := &serialSegments{memStorage: newMemStorage(), delay: 2 * time.Millisecond}
		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		res := batch.Run(context.Background(), createPlan(t, 96), batch.Runtime{Send: &staggered{}, Journal: js.New(Origin{})})
		if res.Outcome != batch.Succeeded {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
		}
		// One store a wave of eight (the intent's with the first), with
		// a few to spare where a straggler misses its wave's.
		if want := 96/8 + 3; s.segments > want {
			t.Errorf("%d segments stored for 96 writes sent eight at a time, want at most %d", s.segments, want)
		}
	})
}
