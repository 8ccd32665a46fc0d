package redisfast_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/caddyserver/caddy/v2"
	storageredis "github.com/pberkel/caddy-storage-redis"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/redisfast"
	"github.com/caddy-batch/caddy-batch/internal/tcprelay"
)

// module is the Redis module's storage on mr, as Caddy provisions it.
func module(t *testing.T, mr *miniredis.Miniredis, prefix string, set func(*storageredis.RedisStorage)) *storageredis.RedisStorage {
	t.Helper()
	rs := storageredis.New()
	rs.Host, rs.Port, rs.KeyPrefix = []string{mr.Host()}, []string{mr.Port()}, prefix
	if set != nil {
		set(rs)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := rs.Provision(ctx); err != nil {
		t.Fatalf("provisioning the Redis storage: %v", err)
	}
	t.Cleanup(func() { _ = rs.Cleanup() })
	return rs
}

// fast is the fast path over rs.
// fastThroughRelay is the fast path on mr through a relay of the test's
// own, which can delay and count what goes by.
func fastThroughRelay(t *testing.T, mr *miniredis.Miniredis) (*redisfast.Store, *tcprelay.Relay) {
	t.Helper()
	relay, err := tcprelay.New(mr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	return fastAt(t, mr, relay.Addr()), relay
}

// fastAt is the fast path on mr, its module reaching Redis at addr (a
// relay, or a listener of the test's own in front of mr).
func fastAt(t *testing.T, mr *miniredis.Miniredis, addr string) *redisfast.Store {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	return fast(t, module(t, mr, "caddy", func(rs *storageredis.RedisStorage) { rs.Host, rs.Port = []string{host}, []string{port} }))
}

func fast(t *testing.T, rs *storageredis.RedisStorage) *redisfast.Store {
	t.Helper()
	s, ok := batchapp.DurableStorage(rs).(*redisfast.Store)
	if !ok {
		_, why := batchapp.StoragePath(rs)
		t.Fatalf("no fast path: %s", why)
	}
	return s
}

// dump is everything mr holds, with what a clock decides (an envelope's
// modified, a folder entry's score) left out.
func dump(t *testing.T, mr *miniredis.Miniredis) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range mr.Keys() {
		switch mr.Type(k) {
		case "zset":
			members, err := mr.ZMembers(k)
			if err != nil {
				t.Fatal(err)
			}
			// By name: a member's score is the second its store ran, which
			// orders the members differently when a second ends between
			// the module's stores and the fast path's.
			slices.Sort(members)
			out[k] = "zset " + strings.Join(members, ",")
		case "string":
			v, _ := mr.Get(k)
			var env map[string]any
			if err := json.Unmarshal([]byte(v), &env); err != nil {
				t.Fatalf("%s holds no envelope: %q", k, v)
			}
			if _, err := time.Parse(time.RFC3339Nano, env["modified"].(string)); err != nil {
				t.Errorf("%s: modified %v", k, env["modified"])
			}
			env["modified"] = "(a time)"
			b, _ := json.Marshal(env)
			out[k] = string(b)
		default:
			out[k] = mr.Type(k)
		}
	}
	return out
}

// TestStoreIsTheModules: what the fast path stores and deletes leaves
// Redis holding what the module's own Store and Delete leave, key for
// key and byte for byte (but for the time of the store), with the
// default prefix, a nested one and none; and the module reads it back.
func TestStoreIsTheModules(t *testing.T) {
	ctx := context.Background()
	for _, prefix := range []string{"caddy", "one/two", ""} {
		t.Run(fmt.Sprintf("prefix %q", prefix), func(t *testing.T) {
			byModule, byFast := miniredis.RunT(t), miniredis.RunT(t)
			m, f := module(t, byModule, prefix, nil), fast(t, module(t, byFast, prefix, nil))
			ops := []struct {
				del   bool
				key   string
				value string
			}{
				{false, "batch/v1/journal/s1/seg.00000000", `{"v":1,"intent":{}}`},
				{false, "batch/v1/journal/s1/seg.00000001", "\x00binary\xff"},
				{false, "batch/v1/journal/s2/seg.00000000", ""},
				{false, "batch/v1/journal/s1/seg.00000001", "again"},
				{false, "top", "x"},
				{true, "batch/v1/journal/s1/seg.00000000", ""},
				{true, "batch/v1/journal/s1/seg.00000001", ""},
				{true, "never/was", ""},
				{true, "batch/v1/journal/s2/seg.00000000", ""},
			}
			for _, op := range ops {
				var errM, errF error
				if op.del {
					errM, errF = m.Delete(ctx, op.key), f.Delete(ctx, op.key)
				} else {
					errM, errF = m.Store(ctx, op.key, []byte(op.value)), f.Store(ctx, op.key, []byte(op.value))
				}
				if errM != nil || errF != nil {
					t.Fatalf("%+v: module %v, fast path %v", op, errM, errF)
				}
				if a, b := dump(t, byModule), dump(t, byFast); fmt.Sprint(a) != fmt.Sprint(b) {
					t.Fatalf("after %+v:\nmodule    %v\nfast path %v", op, a, b)
				}
			}
			// Several keys deleted at once, as the module deletes them in
			// turn.
			many := []string{"batch/v1/journal/s3/seg.00000000", "batch/v1/journal/s3/seg.00000001", "batch/v1/journal/s3/lease", "batch/v1/other"}
			for _, k := range many {
				if err := errors.Join(m.Store(ctx, k, []byte(k)), f.Store(ctx, k, []byte(k))); err != nil {
					t.Fatal(err)
				}
			}
			for _, k := range many[:3] {
				if err := m.Delete(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.DeleteAll(ctx, many[:3]); err != nil {
				t.Fatal(err)
			}
			if a, b := dump(t, byModule), dump(t, byFast); fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatalf("after deleting %v:\nmodule    %v\nfast path %v", many[:3], a, b)
			}
			got, err := module(t, byFast, prefix, nil).Load(ctx, "top")
			if err != nil || string(got) != "x" {
				t.Errorf("the module reads %q, %v", got, err)
			}
		})
	}
}

// TestLockIsTheModules: a lock taken by the fast path and one taken by
// the module's Lock (another instance, of this build off the fast path
// or an older one) exclude each other, under the module's key; locks
// tried together are had together; Unlock lets go only of this
// instance's.
func TestLockIsTheModules(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	m, f := module(t, mr, "caddy", nil), fast(t, module(t, mr, "caddy", nil))
	if err := m.Lock(ctx, "batch_item_a"); err != nil {
		t.Fatal(err)
	}
	if !mr.Exists("caddy/locks/batch_item_a") {
		t.Fatal("the module's lock key is not where the fast path looks")
	}
	if ok, err := f.TryLock(ctx, "batch_item_a"); ok || err != nil {
		t.Fatalf("the fast path took a lock the module holds: %v, %v", ok, err)
	}
	if err := f.Unlock(ctx, "batch_item_a"); err != nil || !mr.Exists("caddy/locks/batch_item_a") {
		t.Fatalf("the fast path let go of the module's lock: %v", err)
	}
	if err := m.Unlock(ctx, "batch_item_a"); err != nil {
		t.Fatal(err)
	}
	names := []string{"batch_item_a", "batch_item_b", "batch_item_c"}
	for _, n := range names {
		if ok, err := f.TryLock(ctx, n); !ok || err != nil {
			t.Fatalf("%s: %v, %v", n, ok, err)
		}
	}
	if ttl := mr.TTL("caddy/locks/batch_item_b"); ttl <= 0 || ttl > 5*time.Second {
		t.Errorf("a lock lives %s, want the module's 5s", ttl)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if err := m.Lock(short, "batch_item_b"); err == nil {
		t.Fatal("the module took a lock the fast path holds")
	}
	for _, n := range names {
		if err := f.Unlock(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if keys := slices.DeleteFunc(mr.Keys(), func(k string) bool { return !strings.HasPrefix(k, "caddy/locks/") }); len(keys) > 0 {
		t.Errorf("locks left: %v", keys)
	}
}

// TestLocksTakenTogetherAreTheModules: TryLockAll takes, in one script,
// each free lock as the module's Lock would, and answers which; the
// module then cannot take them, nor the fast path those the module
// holds; UnlockAll lets go of this instance's, never the module's, and
// forgets them (a lock let go is never lost).
func TestLocksTakenTogetherAreTheModules(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	m, f := module(t, mr, "caddy", nil), fast(t, module(t, mr, "caddy", nil))
	if err := m.Lock(ctx, "batch_item_b"); err != nil {
		t.Fatal(err)
	}
	names := []string{"batch_item_a", "batch_item_b", "batch_item_c"}
	got, err := f.TryLockAll(ctx, names)
	if err != nil || !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("TryLockAll: %v, %v; want the free ones taken", got, err)
	}
	if ttl := mr.TTL("caddy/locks/batch_item_c"); ttl <= 0 || ttl > 5*time.Second {
		t.Errorf("a lock lives %s, want the module's 5s", ttl)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if err := m.Lock(short, "batch_item_a"); err == nil {
		t.Fatal("the module took a lock the fast path holds")
	}
	mr.Del("caddy/locks/batch_item_c") // lapsed, and taken by the module
	if err := m.Lock(ctx, "batch_item_c"); err != nil {
		t.Fatal(err)
	}
	if err := f.UnlockAll(ctx, names); err != nil {
		t.Fatal(err)
	}
	if mr.Exists("caddy/locks/batch_item_a") || !mr.Exists("caddy/locks/batch_item_b") || !mr.Exists("caddy/locks/batch_item_c") {
		t.Errorf("UnlockAll left %v: want this instance's let go, the module's kept", mr.Keys())
	}
	redisfast.Refresh(f)
	for _, n := range names {
		if err := f.LockLost(n); err != nil {
			t.Errorf("%s, let go, is lost: %v", n, err)
		}
	}
}

// TestLockLost: a lock the fast path holds is lost once Redis no longer
// holds it for this instance (it lapsed, or was deleted), as a refresh
// finds, or once no refresh proved it for all but a sixth of its life
// (the margin a lease's fence keeps); a refresh that
// finds it extends it. NoneLost says, in one look, whether any is.
func TestLockLost(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	f := fast(t, module(t, mr, "caddy", nil))
	for _, n := range []string{"kept", "deleted", "lapsed"} {
		if ok, err := f.TryLock(ctx, n); !ok || err != nil {
			t.Fatal(n, ok, err)
		}
	}
	if !f.NoneLost() {
		t.Error("NoneLost is false with every lock just taken")
	}
	redisfast.Age(f, 4500*time.Millisecond) // a write now could land as it lapses
	if f.NoneLost() || f.LockLost("kept") == nil {
		t.Error("a lock unproven for all but a sixth of its life is not lost")
	}
	redisfast.Refresh(f)
	if !f.NoneLost() || f.LockLost("kept") != nil {
		t.Error("a lock proven again is still lost")
	}
	mr.Del("caddy/locks/deleted")
	mr.SetTTL("caddy/locks/lapsed", time.Millisecond)
	mr.FastForward(time.Second)
	redisfast.Refresh(f)
	if err := f.LockLost("kept"); err != nil {
		t.Errorf("kept: %v", err)
	}
	if ttl := mr.TTL("caddy/locks/kept"); ttl != 5*time.Second {
		t.Errorf("a refreshed lock lives %s more, want 5s", ttl)
	}
	for _, n := range []string{"deleted", "lapsed"} {
		if err := f.LockLost(n); err == nil {
			t.Errorf("%s: not lost", n)
		}
	}
	if f.NoneLost() {
		t.Error("NoneLost with two locks lost")
	}
	for _, n := range []string{"deleted", "lapsed"} {
		if err := f.Unlock(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if !f.NoneLost() {
		t.Error("NoneLost is false once the lost locks were let go")
	}
}

// TestLockLostAcrossASuspend: a VM suspended for longer than a lock
// lives stops the monotonic clock, not the wall clock nor Redis's,
// which let the lock lapse: the lock is lost on waking, though the
// monotonic clock says it was proven a moment ago.
func TestLockLostAcrossASuspend(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	f := fast(t, module(t, mr, "caddy", nil))
	if ok, err := f.TryLock(ctx, "item"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	resume := redisfast.Suspend(10 * time.Second)
	defer resume()
	if f.NoneLost() || f.LockLost("item") == nil {
		t.Error("a lock held across a 10 s suspend is not lost")
	}
}

// TestLockTakenAgainDuringARefresh: a lock let go and taken again by
// the process while a refresh was out is not marked lost by what that
// refresh found (the lock absent, between the two): the new lock is
// this instance's, and the saga holding it goes on.
func TestLockTakenAgainDuringARefresh(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	f := fast(t, module(t, mr, "caddy", nil))
	if ok, err := f.TryLock(ctx, "item"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	redisfast.RefreshAround(f, func() {
		if err := f.Unlock(ctx, "item"); err != nil {
			t.Fatal(err)
		}
	}, func() {
		if ok, err := f.TryLock(ctx, "item"); !ok || err != nil {
			t.Fatal(ok, err)
		}
	})
	if err := f.LockLost("item"); err != nil || !f.NoneLost() {
		t.Errorf("the lock taken again is lost: %v", err)
	}
	redisfast.Refresh(f)
	if err := f.LockLost("item"); err != nil {
		t.Errorf("the lock taken again, refreshed: %v", err)
	}
}

// TestForRefuses: the fast path stays off wherever it could not store
// what the module would, or reach every key through one connection.
func TestForRefuses(t *testing.T) {
	mr := miniredis.RunT(t)
	for _, tc := range []struct {
		name string
		set  func(*storageredis.RedisStorage)
	}{
		{"compression", func(rs *storageredis.RedisStorage) { rs.Compression = storageredis.CompressionFlate }},
		{"encryption", func(rs *storageredis.RedisStorage) { rs.EncryptionKey = strings.Repeat("k", 32) }},
	} {
		rs := module(t, mr, "caddy", tc.set)
		if path, why := batchapp.StoragePath(rs); path != "generic" || why == "" {
			t.Errorf("%s: %s (%s)", tc.name, path, why)
		}
	}
	if path, _ := batchapp.StoragePath(module(t, mr, "caddy", nil)); path != "redis" {
		t.Errorf("the default configuration: %s", path)
	}
	var nothing fs.FS
	if fast, why := redisfast.For(nothing, nil); fast != nil || why == "" {
		t.Error("a storage that is not the module got a fast path")
	}
}

// TestRenewLease: a lease is renewed in one script only while its key
// holds what this instance last stored (or, for its first renewal,
// while segment 0 is there), and then holds the module's bytes for the
// new value, with its folder's names answered; a value another instance
// compressed cannot be compared, and says so.
func TestRenewLease(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	m, f := module(t, mr, "caddy", nil), fast(t, module(t, mr, "caddy", nil))
	dir := "batch/v1/journal/s1"
	lease, seg0 := dir+"/lease", dir+"/seg.00000000"
	if _, err := f.RenewLease(ctx, lease, nil, seg0, []byte(`{"renewal":1}`)); !errors.Is(err, durable.ErrKeyGone) {
		t.Fatalf("no segment 0: %v, want ErrKeyGone", err)
	}
	if err := f.Store(ctx, seg0, []byte("intent")); err != nil {
		t.Fatal(err)
	}
	names, err := f.RenewLease(ctx, lease, nil, seg0, []byte(`{"renewal":1}`))
	// In the folder index's order: by the second each was stored in, so
	// the lease comes first only when both were stored in the same one.
	slices.Sort(names)
	if err != nil || !slices.Equal(names, []string{"lease", "seg.00000000"}) {
		t.Fatalf("first renewal: %v, %v", names, err)
	}
	if got, err := m.Load(ctx, lease); err != nil || string(got) != `{"renewal":1}` {
		t.Fatalf("the module reads %q, %v", got, err)
	}
	if _, err := f.RenewLease(ctx, lease, []byte(`{"renewal":1}`), "", []byte(`{"renewal":2}`)); err != nil {
		t.Fatalf("second renewal: %v", err)
	}
	if _, err := f.RenewLease(ctx, lease, []byte(`{"renewal":1}`), "", []byte(`{"renewal":3}`)); !errors.Is(err, durable.ErrKeyChanged) {
		t.Fatalf("a renewal over another value: %v, want ErrKeyChanged", err)
	}
	if got, _ := m.Load(ctx, lease); string(got) != `{"renewal":2}` {
		t.Errorf("a refused renewal wrote %q", got)
	}
	compressing := module(t, mr, "caddy", func(rs *storageredis.RedisStorage) { rs.Compression = storageredis.CompressionFlate })
	if err := compressing.Store(ctx, lease, []byte(strings.Repeat(`{"renewal":4}`, 20))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.RenewLease(ctx, lease, []byte(`{"renewal":4}`), "", []byte(`{"renewal":5}`)); !errors.Is(err, durable.ErrUndecidable) {
		t.Errorf("a compressed value: %v, want ErrUndecidable", err)
	}
	if err := f.Delete(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := f.RenewLease(ctx, lease, []byte(`{"renewal":2}`), "", []byte(`{"renewal":3}`)); !errors.Is(err, durable.ErrKeyGone) {
		t.Errorf("a lease gone: %v, want ErrKeyGone", err)
	}
}

// TestLockNotLostWhileSlowRefreshesSucceed: a lock the fast path holds,
// refreshed by its own loop on a Redis a second away (each refresh
// succeeds, and Redis keeps the lock the whole time), is never reported
// lost: a proof dates from when its refresh began, and the loop waits
// between refreshes, so the refreshes come often enough for a proof to
// stay within lockProven while each takes that long.
func TestLockNotLostWhileSlowRefreshesSucceed(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	f, relay := fastThroughRelay(t, mr)
	if ok, err := f.TryLock(ctx, "item"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	redisfast.Refresh(f) // the refresh script loaded: each refresh is one round trip
	relay.SetDelay(time.Second)
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if err := f.LockLost("item"); err != nil {
			var held []string
			for _, k := range mr.Keys() {
				held = append(held, k+" ttl "+mr.TTL(k).String())
			}
			t.Fatalf("a lock every refresh of which succeeded is lost while Redis holds %v: %v", held, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
