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
