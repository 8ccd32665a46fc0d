package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	storageredis "github.com/pberkel/caddy-storage-redis"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
)

// The cluster storage (docs/durability.md, "Clusters") is the Redis storage module. Its
// tests run against a real redis-server: the one BATCH_TEST_REDIS_ADDR
// names (host:port; .ci/run starts one, installing Debian's when it is
// missing), else one the test starts when redis-server is installed, and
// otherwise against miniredis, a Redis server in Go that the test starts,
// so that go test needs nothing but Go.

// redisServer returns the address of the Redis server the test uses, and
// a key prefix of its own, so that runs against one real server never
// see each other's records or locks.
func redisServer(t *testing.T) (host, port, prefix string) {
	t.Helper()
	addr := os.Getenv("BATCH_TEST_REDIS_ADDR")
	switch {
	case addr != "":
		t.Logf("using the Redis server at %s (BATCH_TEST_REDIS_ADDR)", addr)
	case hasRedisServer():
		addr = startRedisServer(t)
	default:
		addr = miniredis.RunT(t).Addr()
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
func newRedisStorage(t testing.TB, host, port, prefix string) certmagic.Storage {
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
	swept, err := durable.NewSweeper(batchapp.DurableStorage(s), zap.NewNop()).Sweep(ctx, at)
	return swept.Deleted, err
}

// hasRedisServer reports whether redis-server is installed.
func hasRedisServer() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

// startRedisServer starts a redis-server of the test's own on a free
// loopback port, keeping nothing on disk, and stops it when the test
// ends; it returns its address once it answers.
func startRedisServer(t testing.TB) string {
	t.Helper()
	return startRedisProcess(t).addr
}

// redisProcess is a redis-server of the test's own, which a fault test
// may kill and start again, empty, on the same port: a Redis restarted
// without persistence.
type redisProcess struct {
	addr, dir string
	cmd       *exec.Cmd
	exited    chan struct{}
}

// startRedisProcess is startRedisServer, returning the process.
func startRedisProcess(t testing.TB) *redisProcess {
	t.Helper()
	dir := t.TempDir()
	for range 5 {
		if r := launchRedis(t, freeAddr(t), dir); r != nil {
			t.Cleanup(r.stop)
			return r
		}
	}
	t.Fatal("redis-server did not start")
	return nil
}

// launchRedis starts redis-server on addr and returns it once it
// answers; nil if it exited first (the port was taken meanwhile).
func launchRedis(t testing.TB, addr, dir string) *redisProcess {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	r := &redisProcess{addr: addr, dir: dir, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(r.exited)
	}()
	for range 100 {
		if _, err := redisCommand(addr, "PING"); err == nil {
			return r
		}
		select {
		case <-r.exited:
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	r.stop()
	return nil
}

// stop kills the server (SIGKILL: nothing saved, as in a crash) and
// waits for it to exit.
func (r *redisProcess) stop() {
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// restart kills the server and starts an empty one on the same port,
// returning once it answers. The one it replaces is stopped.
func (r *redisProcess) restart(t testing.TB) {
	t.Helper()
	r.stop()
	for range 20 {
		if again := launchRedis(t, r.addr, r.dir); again != nil {
			r.cmd, r.exited = again.cmd, again.exited
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redis-server did not start again on %s", r.addr)
}

// redisCommand sends one command to the Redis server at addr and reads
// its answer: a status or bulk string, an integer, or an array of bulk
// strings, joined by newlines.
func redisCommand(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		req += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(req)); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("an empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		var items []string
		for range n {
			item, err := readReply(r)
			if err != nil {
				return "", err
			}
			items = append(items, item)
		}
		return strings.Join(items, "\n"), nil
	}
	return "", fmt.Errorf("an unknown reply %q", line)
}

// TestRedisLeftoversCleared: what an older build left of finished
// journals on Redis (it deleted segment 0 and then the journal's folder,
// which the module does not delete recursively: the lease and the later
// segments stayed, unlisted, and the folder's entry too) is cleared by
// the recovery scan once it is a lease old, down to the last key.
func TestRedisLeftoversCleared(t *testing.T) {
	host, port, prefix := redisServer(t)
	s := newRedisStorage(t, host, port, prefix)
	ctx := context.Background()
	saga := "0123456789abcdef0123456789abcdef"
	for _, k := range []string{"seg.00000000", "seg.00000001", "seg.00000002", "lease"} {
		if err := s.Store(ctx, "batch/v1/journal/"+saga+"/"+k, []byte(`{"owner":"gone","expires":"2000-01-01T00:00:00Z"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// The older build's removal.
	if err := s.Delete(ctx, "batch/v1/journal/"+saga+"/seg.00000000"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "batch/v1/journal/"+saga); err != nil {
		t.Fatal(err)
	}
	addr := host + ":" + port
	if keys, _ := redisCommand(addr, "KEYS", prefix+"/batch/v1/journal*"); keys == "" {
		t.Fatal("the older build's removal left nothing: the test no longer shows the leak")
	}
	restore := durable.SetClock(func() time.Time { return time.Now().Add(time.Minute) })
	defer restore()
	js := durable.NewJournals(batchapp.DurableStorage(s), durable.NewLeases(30*time.Second), zap.NewNop())
	finish := func(*durable.Recovered) error { t.Error("a leftover was taken over"); return nil }
	failed := func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
	if err := js.Scan(ctx, finish, failed); err != nil {
		t.Fatal(err)
	}
	if keys, err := redisCommand(addr, "KEYS", prefix+"/batch/v1/journal*"); keys != "" || err != nil {
		t.Errorf("left after the scan (%v): %q", err, keys)
	}
	if folders, _ := redisCommand(addr, "ZRANGE", prefix+"/batch/v1", "0", "-1"); strings.Contains(folders, "journal") {
		t.Errorf("the journal folder is still listed: %q", folders)
	}
}
