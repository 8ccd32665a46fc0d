package caddymodule

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	storageredis "github.com/pberkel/caddy-storage-redis"

	"github.com/caddy-batch/caddy-batch/durable"
)

// The cluster storage (docs/durability.md, "Clusters") is the Redis storage module. Its
// tests run against a real redis-server when BATCH_TEST_REDIS_ADDR names
// one (host:port; .ci/run starts one when it is installed), and otherwise
// against miniredis, a Redis server in Go that the test starts, so that
// go test needs nothing but Go.

// redisServer returns the address of the Redis server the test uses, and
// a key prefix of its own, so that runs against one real server never
// see each other's records or locks.
func redisServer(t *testing.T) (host, port, prefix string) {
	t.Helper()
	addr := os.Getenv("BATCH_TEST_REDIS_ADDR")
	if addr == "" {
		addr = miniredis.RunT(t).Addr()
	} else {
		t.Logf("using the Redis server at %s (BATCH_TEST_REDIS_ADDR)", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("BATCH_TEST_REDIS_ADDR %q: %v", addr, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host, port, "batchtest-" + hex.EncodeToString(b[:])
}

// redisOption is the storage global option for the server.
func redisOption(host, port, prefix string) string {
	return "storage redis {\n\t\thost " + host + "\n\t\tport " + port + "\n\t\tkey_prefix " + prefix + "\n\t}"
}

// newRedisStorage is another instance's Redis storage: its own client
// and its own locks, as in another Caddy process.
func newRedisStorage(t *testing.T, host, port, prefix string) certmagic.Storage {
	t.Helper()
	rs := storageredis.New()
	rs.Host, rs.Port, rs.KeyPrefix = []string{host}, []string{port}, prefix
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := rs.Provision(ctx); err != nil {
		t.Fatalf("provisioning the Redis storage: %v", err)
	}
	t.Cleanup(func() { _ = rs.Cleanup() })
	s, err := rs.CertMagicStorage()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRedisIdempotency: on the Redis storage, a keyed batch is replayed
// (nothing upstream), its record can be read by another instance, and a
// sweep deletes it once expired.
func TestRedisIdempotency(t *testing.T) {
	host, port, prefix := redisServer(t)
	api := seededAPI()
	upstream := newUpstream(t, api)
	g := startGatewayStorage(t, api, upstream, redisOption(host, port, prefix), idemSite)

	body := `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]`
	key := []string{"Idempotency-Key", "on-redis"}
	first := g.do(t, "PATCH", "/api/widgets", body, key...)
	if first.Status != 200 {
		t.Fatalf("%v", first)
	}
	api.ResetLog()
	checkReplay(t, api, first, g.do(t, "PATCH", "/api/widgets", body, key...))
	checkIdemProblem(t, g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "z"}]`, key...), 422, "idempotency-key-reused")

	other := newRedisStorage(t, host, port, prefix)
	ctx := context.Background()
	keys, err := other.List(ctx, durable.IdempotencyPrefix, false)
	if err != nil || len(keys) != 1 {
		t.Fatalf("records seen by another instance: %v (%v), want 1", keys, err)
	}
	if n, err := sweepAt(ctx, other, time.Now()); n != 0 || err != nil {
		t.Errorf("a sweep within the ttl deleted %d (%v)", n, err)
	}
	if n, err := sweepAt(ctx, other, time.Now().Add(25*time.Hour)); n != 1 || err != nil {
		t.Errorf("a sweep after the ttl deleted %d (%v), want 1", n, err)
	}
	if keys, _ := other.List(ctx, durable.IdempotencyPrefix, false); len(keys) != 0 {
		t.Errorf("records left after the sweep: %v", keys)
	}
	api.ResetLog()
	if r := g.do(t, "PATCH", "/api/widgets", body, key...); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" || len(writes(api.Requests())) != 2 {
		t.Errorf("a swept key did not run anew: %v", r)
	}
}

// TestRedisStorageLocks: storage item locks over Redis exclude, release
// and time out between two instances, and the gateway's writes and
// batches take them.
func TestRedisStorageLocks(t *testing.T) {
	host, port, prefix := redisServer(t)
	t.Run("lockers", func(t *testing.T) {
		testStorageLocksExclude(t, newRedisStorage(t, host, port, prefix), newRedisStorage(t, host, port, prefix))
	})
	t.Run("gateway", func(t *testing.T) {
		testStorageLocksGateway(t, redisOption(host, port, prefix), newRedisStorage(t, host, port, prefix))
	})
}

// sweepAt sweeps the expired Idempotency-Key records of s as of at, as
// a new app's first sweep does, and returns how many it deleted.
func sweepAt(ctx context.Context, s certmagic.Storage, at time.Time) (int, error) {
	swept, err := durable.NewSweeper(durableStorage(s)).Sweep(ctx, at)
	return swept.Deleted, err
}
