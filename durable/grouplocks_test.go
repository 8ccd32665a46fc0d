package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// TestLockAll: a batch's locks are had together when free, and in order
// when another writer holds one of them, until it lets go, on a storage that can try a lock and on one that
// can only wait for it; two batches that share keys both end; and a
// storage that fails leaves nothing held and names the key.
func TestLockAll(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		storage func(*memLocks) Locker
	}{
		{"try", func(m *memLocks) Locker { return m }},
		{"wait only", func(m *memLocks) Locker { return lockOnly{m} }},
		{"together", func(m *memLocks) Locker { return &groupLocks{memLocks: m} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bubble(t, func(t *testing.T) { lockAll(t, tc.storage) })
		})
	}
}

func lockAll(t *testing.T, storage func(*memLocks) Locker) {
	m := newMemLocks()
	one := NewItemLocks(new(itemlock.Local), storage(m), nil)
	two := NewItemLocks(new(itemlock.Local), storage(m), nil)
	keys := []string{"/w/1", "/w/2", "/w/3"}
	unlocks, _, err := one.LockAll(context.Background(), keys)
	if err != nil || len(unlocks) != 3 {
		t.Fatalf("free locks: %d, %v", len(unlocks), err)
	}
	itemlock.Release(unlocks)

	// Another instance holds /w/3: the batch waits for it in order,
	// holding the keys before it only.
	held, _ := two.Lock(context.Background(), "/w/3")
	got := make(chan error)
	go func() {
		unlocks, _, err := one.LockAll(context.Background(), keys)
		itemlock.Release(unlocks)
		got <- err
	}()
	time.Sleep(time.Second)
	synctest.Wait()
	select {
	case err := <-got:
		t.Fatalf("the batch had its locks while /w/3 was held: %v", err)
	default:
	}
	held()
	if err := <-got; err != nil {
		t.Fatalf("once /w/3 was let go: %v", err)
	}

	// Two batches sharing keys, each in its own process, both end.
	done := make(chan error, 2)
	for _, l := range []*ItemLocks{one, two} {
		go func() {
			unlocks, _, err := l.LockAll(context.Background(), []string{"/w/1", "/w/2", "/w/3", "/w/4"})
			time.Sleep(10 * time.Millisecond)
			itemlock.Release(unlocks)
			done <- err
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if len(m.held) != 0 {
		t.Errorf("locks left held: %v", m.held)
	}
}

// TestLockAllStorageFails: a storage that fails refuses the batch with
// an error that is no ErrLocked (503, not 409), naming the key, and
// nothing held.
func TestLockAllStorageFails(t *testing.T) {
	t.Parallel()
	t.Run("one at a time", func(t *testing.T) { lockAllStorageFails(t, func(m *memLocks) Locker { return m }) })
	t.Run("together", func(t *testing.T) {
		lockAllStorageFails(t, func(m *memLocks) Locker { return &groupLocks{memLocks: m} })
	})
}

func lockAllStorageFails(t *testing.T, storage func(*memLocks) Locker) {
	m := newMemLocks()
	m.failTry = errors.New("the storage is down")
	l := NewItemLocks(new(itemlock.Local), storage(m), nil)
	_, failed, err := l.LockAll(context.Background(), []string{"/w/1", "/w/2"})
	if err == nil || errors.Is(err, itemlock.ErrLocked) || failed < 0 {
		t.Fatalf("failed %d, %v; want a storage error naming the key", failed, err)
	}
	if want := fmt.Sprintf("/w/%d", failed+1); !strings.Contains(err.Error(), want) {
		t.Errorf("%v does not name %s", err, want)
	}
	if len(m.held) != 0 {
		t.Errorf("locks left held: %v", m.held)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if u, err := l.local.Lock(ctx, "/w/1"); err != nil {
		t.Errorf("a local lock left held: %v", err)
	} else {
		u()
	}
}

// TestLocksTakenTogetherGoInOneCall: on a storage that tries several
// locks in one call (the Redis fast path), a batch's locks are taken in
// one call and let go in one, however many (more than a goroutine bound
// once split them); one let go alone goes in a call of its own, once
// the others had their moment to join it; and a batch that found one
// held lets go of the others it took in one call, then takes them in
// order.
func TestLocksTakenTogetherGoInOneCall(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		g := &groupLocks{memLocks: newMemLocks(), freed: make(chan []string, 10)}
		l := NewItemLocks(new(itemlock.Local), g, nil)
		keys := make([]string, 300)
		for i := range keys {
			keys[i] = fmt.Sprintf("/w/%03d", i)
		}
		unlocks, _, err := l.LockAll(context.Background(), keys)
		if err != nil || g.tries.Load() != 1 {
			t.Fatalf("%d calls to take 300 locks, %v; want 1", g.tries.Load(), err)
		}
		start := time.Now()
		unlocks[0]()
		if names := <-g.freed; len(names) != 1 || time.Since(start) != groupUnlockWait {
			t.Errorf("a lock let go alone went with %v after %s, want alone after %s", names, time.Since(start), groupUnlockWait)
		}
		itemlock.Release(unlocks[1:])
		if names := <-g.freed; len(names) != 299 || g.unlocks.Load() != 2 {
			t.Errorf("the other 299 went in a call of %d, %d calls in all; want one call", len(names), g.unlocks.Load())
		}
		if n := g.heldNow(); n != 0 {
			t.Errorf("locks left held: %d", n)
		}

		held, _ := NewItemLocks(new(itemlock.Local), g, nil).Lock(context.Background(), keys[150])
		got := make(chan error)
		go func() {
			unlocks, _, err := l.LockAll(context.Background(), keys)
			itemlock.Release(unlocks)
			got <- err
		}()
		if names := <-g.freed; len(names) != 299 {
			t.Errorf("with one held, %d of the 299 taken were let go in one call", len(names))
		}
		time.Sleep(time.Second)
		if n := g.heldNow(); n != 151 {
			t.Errorf("%d locks held, want the 150 before the held one and it", n)
		}
		held()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	})
}

// losingLocks is a storage whose locks are all lost once lose is set,
// as the Redis fast path finds a lock that lapsed.
type losingLocks struct {
	*memStorage
	lose atomic.Bool
}

func (l *losingLocks) NoneLost() bool { return !l.lose.Load() }

func (l *losingLocks) LockLost(name string) error {
	if l.lose.Load() {
		return errors.New("lapsed")
	}
	return nil
}

// TestItemLockLostIsLeaseLost: a saga whose item lock in storage is lost
// while it runs has lost its lease: it sends no new write, and never
// answers succeeded.
func TestItemLockLostIsLeaseLost(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := &losingLocks{memStorage: newMemStorage()}
		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		up := &slowWrites{d: time.Millisecond, during: func(n int) {
			if n == 2 {
				s.lose.Store(true)
			}
		}}
		res := batch.Run(context.Background(), oneAtATime(t, 5), batch.Runtime{Send: up, Journal: js.New(Origin{}), Locks: NewItemLocks(new(itemlock.Local), s, nil)})
		checkNeverSucceededAfterLoss(t, res)
		for _, w := range up.writes() {
			if w == "PATCH /widgets/3" {
				t.Errorf("wrote %v after the lock was lost", up.writes())
			}
		}
	})
}
