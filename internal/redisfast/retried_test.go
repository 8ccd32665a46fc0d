package redisfast_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/caddy-batch/caddy-batch/durable"
)

// replyDropper relays to a Redis, and once armed, lets the next
// command through but closes the connection before its reply comes
// back: the command ran, and the client sees EOF, which go-redis
// retries (MaxRetries, 3 by default) on a new connection.
type replyDropper struct {
	ln    net.Listener
	armed atomic.Bool
}

func newReplyDropper(t *testing.T, to string) *replyDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	d := &replyDropper{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						if d.armed.CompareAndSwap(true, false) {
							c.Close()
							s.Close()
							return
						}
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return d
}

// A renewal whose reply is lost (the connection closed after the script
// ran) is sent again by go-redis itself; the second run finds the bytes
// the first stored, which are this renewal's own: it is a renewal, not
// another instance's write (it answered ErrKeyChanged, and durable took
// the lease for lost to a takeover that never was).
func TestRenewalRunAgainByTheClient(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	d := newReplyDropper(t, mr.Addr())
	f := fastAt(t, mr, d.ln.Addr().String())
	const key = "batch/v1/journal/s/lease"
	if err := f.Store(ctx, "batch/v1/journal/s/seg.00000000", []byte("intent")); err != nil {
		t.Fatal(err)
	}
	// The scripts are loaded: the one that follows goes by EVALSHA.
	if _, err := f.RenewLease(ctx, key, nil, "batch/v1/journal/s/seg.00000000", []byte("renewal 1")); err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	_, err := f.RenewLease(ctx, key, []byte("renewal 1"), "", []byte("renewal 2"))
	if errors.Is(err, durable.ErrKeyChanged) {
		t.Fatalf("renewal 2, whose first reply was lost: %v (the lease counts as taken over; it was this process's own write)", err)
	}
	if err != nil {
		t.Fatalf("renewal 2, whose first reply was lost: %v", err)
	}
}

// An Idempotency-Key's claim (one StoreIf) whose reply is lost is sent
// again by go-redis; the second run finds the record the first stored,
// its own: it is claimed (it answered ErrKeyChanged, and the batch was
// refused 409 for a batch in flight that was itself, the key then
// abandoned).
func TestClaimRunAgainByTheClient(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	d := newReplyDropper(t, mr.Addr())
	f := fastAt(t, mr, d.ln.Addr().String())
	// Load the script.
	if _, err := f.StoreIf(ctx, "batch_idem_x", "batch/v1/idem/x", nil, []durable.KeyValue{{Key: "batch/v1/idem/x", Value: []byte("warm")}}); err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	held, err := f.StoreIf(ctx, "batch_idem_y", "batch/v1/idem/y", nil, []durable.KeyValue{{Key: "batch/v1/idem/y", Value: []byte("my claim")}})
	if err != nil {
		t.Fatalf("claim whose first reply was lost: %v, the key holds %q (its own claim)", err, held)
	}
}
