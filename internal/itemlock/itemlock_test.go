package itemlock

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A held lock is not taken again, by a waiter that gives up or by one
// that waits (in a bubble: the waiter is seen blocked, not guessed so
// after a while), another item's is, and the entries go once unused.
func TestLocalLocks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var l Local
		unlock, err := l.Lock(context.Background(), "/widgets/1")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := l.Lock(ctx, "/widgets/1"); !errors.Is(err, ErrLocked) || time.Since(start) != 20*time.Millisecond {
			t.Fatalf("a held lock was taken again, or not waited for until the context ended: %v after %s", err, time.Since(start))
		}
		other, err := l.Lock(context.Background(), "/widgets/2")
		if err != nil {
			t.Fatalf("another item's lock: %v", err)
		}
		other()
		got, released := make(chan struct{}), make(chan struct{})
		go func() {
			u, _ := l.Lock(context.Background(), "/widgets/1")
			close(got)
			u()
			close(released)
		}()
		synctest.Wait() // the waiter is blocked
		select {
		case <-got:
			t.Fatal("a waiter got a held lock")
		default:
		}
		unlock()
		unlock() // releasing twice does no harm
		<-got
		<-released
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.held) != 0 {
			t.Errorf("%d lock entries left behind", len(l.held))
		}
	})
}

// A Held keeps what it takes until Release: its own second take of a
// key is free, another holder waits, and Release lets every one go.
func TestHeldKeepsItsLocksUntilRelease(t *testing.T) {
	var table Local
	var h Held
	through := h.Through(&table)
	ctx := context.Background()
	for range 2 {
		unlock, err := through.Lock(ctx, "/widgets/1")
		if err != nil {
			t.Fatal(err)
		}
		unlock() // nothing: the Held keeps it
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := table.Lock(short, "/widgets/1"); !errors.Is(err, ErrLocked) {
		t.Fatalf("another writer's lock while held: %v, want ErrLocked", err)
	}
	h.Release()
	unlock, err := table.Lock(ctx, "/widgets/1")
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	unlock()
}

// groupTable is a Local that takes several locks in one call, and
// counts its calls.
type groupTable struct {
	Local
	groups [][]string
	locks  int
}

func (g *groupTable) Lock(ctx context.Context, key string) (func(), error) {
	g.locks++
	return g.Local.Lock(ctx, key)
}

func (g *groupTable) LockAll(ctx context.Context, keys []string) ([]func(), int, error) {
	g.groups = append(g.groups, keys)
	var unlocks []func()
	for i, key := range keys {
		unlock, err := g.Local.Lock(ctx, key)
		if err != nil {
			Release(unlocks)
			return nil, i, err
		}
		unlocks = append(unlocks, unlock)
	}
	return unlocks, -1, nil
}

// A window of an all-or-nothing job takes its locks through Held in one
// call of a storage that takes several at once, asking only for those
// the job does not hold yet; a refusal names the key refused, and takes
// none.
func TestHeldTakesItsLocksTogether(t *testing.T) {
	table := &groupTable{}
	var h Held
	through := h.Through(table)
	ctx := context.Background()
	if _, _, err := LockAll(ctx, through, []string{"/w/1", "/w/2"}); err != nil {
		t.Fatal(err)
	}
	unlocks, failed, err := LockAll(ctx, through, []string{"/w/1", "/w/2", "/w/3", "/w/4"})
	if err != nil || failed != -1 || len(unlocks) != 4 {
		t.Fatalf("LockAll: %d unlocks, failed %d, %v", len(unlocks), failed, err)
	}
	Release(unlocks) // nothing: the Held keeps them
	if table.locks != 0 || len(table.groups) != 2 || len(table.groups[1]) != 2 || table.groups[1][0] != "/w/3" {
		t.Fatalf("%d single locks and groups %v, want two groups, the second only of /w/3 and /w/4", table.locks, table.groups)
	}

	other, err := table.Local.Lock(ctx, "/w/6")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, failed, err := LockAll(short, through, []string{"/w/1", "/w/5", "/w/6"}); !errors.Is(err, ErrLocked) || failed != 2 {
		t.Fatalf("LockAll past another's lock: failed %d, %v; want 2 (/w/6), ErrLocked", failed, err)
	}
	other()
	free, cancelFree := context.WithTimeout(ctx, time.Second)
	defer cancelFree()
	if unlock, err := table.Local.Lock(free, "/w/5"); err != nil {
		t.Fatalf("/w/5 is held after a refused LockAll: %v", err)
	} else {
		unlock()
	}
	h.Release()
	for _, key := range []string{"/w/1", "/w/2", "/w/3", "/w/4"} {
		free, cancel := context.WithTimeout(ctx, time.Second)
		unlock, err := table.Local.Lock(free, key)
		cancel()
		if err != nil {
			t.Fatalf("%s after Release: %v", key, err)
		}
		unlock()
	}
}
