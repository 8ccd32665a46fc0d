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
	m := newMemLocks()
	m.failTry = errors.New("the storage is down")
	l := NewItemLocks(new(itemlock.Local), m, nil)
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
