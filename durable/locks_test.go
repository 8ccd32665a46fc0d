package durable

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// memLocks is an in-memory storage's locks, as several instances sharing
// one storage see them: one table, whoever asks.
type memLocks struct {
	mu       sync.Mutex
	held     map[string]chan struct{} // closed when released
	failTry  error                    // what TryLock answers, when set
	unlocked []string
}

func newMemLocks() *memLocks { return &memLocks{held: map[string]chan struct{}{}} }

func (m *memLocks) TryLock(_ context.Context, name string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failTry != nil {
		return false, m.failTry
	}
	if _, taken := m.held[name]; taken {
		return false, nil
	}
	m.held[name] = make(chan struct{})
	return true, nil
}

func (m *memLocks) Lock(ctx context.Context, name string) error {
	for {
		m.mu.Lock()
		released, taken := m.held[name]
		if !taken {
			m.held[name] = make(chan struct{})
			m.mu.Unlock()
			return nil
		}
		m.mu.Unlock()
		select {
		case <-released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// heldNow is how many locks are held.
func (m *memLocks) heldNow() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.held)
}

func (m *memLocks) Unlock(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	released, taken := m.held[name]
	if !taken {
		return errors.New("not locked")
	}
	close(released)
	delete(m.held, name)
	m.unlocked = append(m.unlocked, name)
	return nil
}

// groupLocks is memLocks that tries and lets go of several locks in one
// call (the Redis fast path), counting its calls.
type groupLocks struct {
	*memLocks
	tries, unlocks atomic.Int32
	freed          chan []string // each UnlockAll's names, when set
}

func (g *groupLocks) TryLockAll(ctx context.Context, names []string) ([]bool, error) {
	g.tries.Add(1)
	got := make([]bool, len(names))
	for i, n := range names {
		ok, err := g.TryLock(ctx, n)
		if err != nil {
			return nil, err
		}
		got[i] = ok
	}
	return got, nil
}

func (g *groupLocks) UnlockAll(ctx context.Context, names []string) error {
	g.unlocks.Add(1)
	for _, n := range names {
		if err := g.Unlock(ctx, n); err != nil {
			return err
		}
	}
	if g.freed != nil {
		g.freed <- names
	}
	return nil
}

// lockOnly is a storage that can only wait in Lock: no TryLock.
type lockOnly struct{ m *memLocks }

func (l lockOnly) Lock(ctx context.Context, name string) error   { return l.m.Lock(ctx, name) }
func (l lockOnly) Unlock(ctx context.Context, name string) error { return l.m.Unlock(ctx, name) }

func TestLock(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		s    func(*memLocks) Locker
	}{
		{"TryLock", func(m *memLocks) Locker { return m }},
		{"Lock", func(m *memLocks) Locker { return lockOnly{m} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				m := newMemLocks()
				s := tt.s(m)
				unlock, err := Lock(context.Background(), s, "a", time.Millisecond, nil)
				if err != nil {
					t.Fatal(err)
				}
				// Held: a wait ends with its context, with ErrLocked.
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				start := time.Now()
				_, err = Lock(ctx, s, "a", time.Millisecond, nil)
				cancel()
				if !errors.Is(err, itemlock.ErrLocked) || time.Since(start) < 40*time.Millisecond {
					t.Errorf("a held lock: %v after %s, want ErrLocked after the context's 50ms", err, time.Since(start))
				}
				// Another name is another lock.
				other, err := Lock(context.Background(), s, "b", time.Millisecond, nil)
				if err != nil {
					t.Fatalf("b: %v", err)
				}
				other()
				// Released once, however often unlock is called; a waiter
				// then has it.
				go func() {
					time.Sleep(20 * time.Millisecond)
					unlock()
					unlock()
				}()
				ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				again, err := Lock(ctx, s, "a", time.Millisecond, nil)
				if err != nil {
					t.Fatalf("after the release: %v", err)
				}
				again()
				if n := strings.Count(strings.Join(m.unlocked, ","), "a"); n != 2 {
					t.Errorf("a released %d times, want once per holder (2)", n)
				}
			})
		})
	}
	t.Run("no wait: one try", func(t *testing.T) {
		m := newMemLocks()
		unlock, _ := Lock(context.Background(), m, "a", 0, nil)
		defer unlock()
		start := time.Now()
		_, err := Lock(context.Background(), m, "a", 0, nil)
		if !errors.Is(err, itemlock.ErrLocked) || time.Since(start) > time.Second {
			t.Errorf("%v after %s, want ErrLocked at once", err, time.Since(start))
		}
	})
	t.Run("a storage error is not ErrLocked", func(t *testing.T) {
		m := newMemLocks()
		m.failTry = errors.New("redis: connection refused")
		_, err := Lock(context.Background(), m, "a", time.Millisecond, nil)
		if err == nil || errors.Is(err, itemlock.ErrLocked) {
			t.Errorf("%v, want the storage's error", err)
		}
	})
	t.Run("a failed release is told", func(t *testing.T) {
		m := newMemLocks()
		var told error
		unlock, _ := Lock(context.Background(), m, "c", 0, func(err error) { told = err })
		_ = m.Unlock(context.Background(), "c") // someone else released it
		unlock()
		if told == nil {
			t.Error("the failed release was not told")
		}
	})
}

// Two instances (each its own local table) over one storage exclude each
// other on one item, and not on others; keys that a storage would fold
// into one lock name stay apart.
func TestItemLocks(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		m := newMemLocks()
		one := NewItemLocks(new(itemlock.Local), m, nil)
		two := NewItemLocks(new(itemlock.Local), m, nil)
		unlock, err := one.Lock(context.Background(), "/api/widgets/1")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err = two.Lock(ctx, "/api/widgets/1")
		cancel()
		if !errors.Is(err, itemlock.ErrLocked) || !strings.Contains(err.Error(), "/api/widgets/1") {
			t.Errorf("the other instance: %v, want ErrLocked naming the item", err)
		}
		for _, other := range []string{"/api/widgets/2", "/api/Widgets/1", "/api/widgets/1 "} {
			u, err := two.Lock(context.Background(), other)
			if err != nil {
				t.Errorf("%q: %v", other, err)
				continue
			}
			u()
		}
		unlock()
		u, err := two.Lock(context.Background(), "/api/widgets/1")
		if err != nil {
			t.Fatalf("after the release: %v", err)
		}
		u()
		// The same process's second writer waits in memory, not in storage.
		u1, _ := one.Lock(context.Background(), "/k")
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err = one.Lock(ctx, "/k")
		cancel()
		if !errors.Is(err, itemlock.ErrLocked) {
			t.Errorf("a second writer of one process: %v", err)
		}
		u1()
	})
}

func TestItemLockName(t *testing.T) {
	t.Parallel()
	name := ItemLockName("/api/Widgets/1")
	if !regexp.MustCompile(`^batch_item_[0-9a-f]{64}$`).MatchString(name) || name == ItemLockName("/api/widgets/1") {
		t.Errorf("%q: want a hash that keeps /api/Widgets/1 apart from /api/widgets/1", name)
	}
}

func TestOwnerAndIDs(t *testing.T) {
	t.Parallel()
	if Owner() != Owner() || !strings.Contains(Owner(), "/") {
		t.Errorf("owner %q, %q: want one owner per process, host/pid/random", Owner(), Owner())
	}
	a, b := NewID(), NewID()
	if a == b || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Errorf("ids %q, %q", a, b)
	}
}
