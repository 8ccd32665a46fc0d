package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestRedisSentinelFastPath: with the Redis module's failover client (a
// master found through Redis Sentinel), the fast path is taken, through
// the master: a 100-item all-or-nothing PATCH pays its storage round
// trips per wave (checkPerWave), and a keyed one two round trips for its
// key (docs/durability.md, "The Redis fast path"). The master is a
// redis-server of the test's own behind the relay that counts, and the
// Sentinel (redis-server --sentinel) knows it by the relay's address, so
// that Caddy, asking the Sentinel, reaches the master through the relay.
func TestRedisSentinelFastPath(t *testing.T) {
	cb, addr := warmSentinel(t)
	cb.send(t, cb.on, "patch", 100)
	time.Sleep(100 * time.Millisecond) // the removal, after the answer
	total, by := cb.rt.reset()
	cmds, byCmd := commandCalls(t, addr)
	t.Logf("%d round trips %v; %d commands %v", total, by, cmds, byCmd)
	checkPerWave(t, total-sentinelOwn(by), by)

	_, body := batchBody("patch", 100)
	if status := cb.patchKeyed(t, body, "sentinel-key"); status != http.StatusOK {
		t.Fatalf("the keyed batch: %d", status)
	}
	if _, by := cb.rt.reset(); keyRoundTrips(by) != 2 {
		t.Errorf("the key: %v, want 2 round trips naming it", by)
	}
}

// warmSentinel starts the two sites on a master and a Sentinel of the
// test's own, checks that the fast path is taken, sends one 100-item
// batch (the scripts loaded, the connections made) and resets the
// counts; it answers the sites and the master's address.
func warmSentinel(t *testing.T) (*clusterBatch, string) {
	t.Helper()
	if !hasRedisServer() {
		t.Skip("redis-server is not installed")
	}
	addr := startRedisServer(t)
	cb := startClusterBatchVia(t, addr, func(relayed string) (string, string, string) {
		return "failover", startSentinel(t, relayed), "master_name batchtest"
	})
	if raw, _ := json.Marshal(caddy.ActiveContext().Storage()); !strings.Contains(string(raw), `"client_type":"failover"`) {
		t.Fatalf("the storage is not the module's failover client: %s", raw)
	}
	if path, why := fastPath(); path != "redis" {
		t.Fatalf("the fast path is off with Sentinel: %s", why)
	}
	cb.send(t, cb.on, "keyed-patch", 100)
	if _, err := redisCommand(addr, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	cb.rt.reset()
	return cb, addr
}

// sentinelOwn is how many of the requests counted are the Sentinel's
// own, to the master it watches (its pings, INFO and hello messages),
// not Caddy's.
func sentinelOwn(by map[string]int) int {
	n := 0
	for _, c := range []string{"ping", "info", "publish", "subscribe", "client", "role"} {
		n += by[c]
	}
	return n
}

// startSentinel starts a Redis Sentinel of the test's own on a free
// loopback port, watching the master at masterAddr as "batchtest", and
// returns its address once it knows the master.
func startSentinel(t testing.TB, masterAddr string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(masterAddr)
	for range 5 {
		addr := freeAddr(t)
		_, own, _ := net.SplitHostPort(addr)
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := "bind 127.0.0.1\nport " + own + "\ndir " + dir + "\nsentinel monitor batchtest " + host + " " + port + " 1\n"
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("redis-server", conf, "--sentinel")
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server --sentinel: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		for range 100 {
			got, err := redisCommand(addr, "SENTINEL", "get-master-addr-by-name", "batchtest")
			if err == nil && strings.Contains(got, port) {
				return addr
			}
			select {
			case <-exited:
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
	}
	t.Fatal("redis-server --sentinel did not start")
	return ""
}
