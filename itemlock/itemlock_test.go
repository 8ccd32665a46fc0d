package itemlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLocalLocks(t *testing.T) {
	var l Local
	unlock, err := l.Lock(context.Background(), "/widgets/1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "/widgets/1"); !errors.Is(err, ErrLocked) {
		t.Fatalf("a held lock was taken again: %v", err)
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
	select {
	case <-got:
		t.Fatal("a waiter got a held lock")
	case <-time.After(20 * time.Millisecond):
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
}
