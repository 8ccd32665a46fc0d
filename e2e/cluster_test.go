package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestCluster runs two Caddy processes built from cmd/caddy, sharing one
// storage, in front of one legacy API: a cluster of gateways
// (docs/durability.md, "Clusters"), on the file system storage and on
// Redis. It builds cmd/caddy once, so it is skipped under -short.
func TestCluster(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)

	storages := []struct{ name, option string }{
		{"file_system", "storage file_system " + t.TempDir()},
	}
	host, port, prefix := redisServer(t)
	storages = append(storages, struct{ name, option string }{"redis", redisOption(host, port, prefix)})
	for _, s := range storages {
		// Each storage has its own API and instances.
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 500 * time.Millisecond, Seed: records("w", 1, 10)})
			upstream := newUpstream(t, api)
			site := clusterSite(upstream)
			a := startInstance(t, bin, s.option, site)
			b := startInstance(t, bin, s.option, site)
			t.Run("a key used on one instance is replayed by the other", func(t *testing.T) {
				testClusterReplay(t, api, a, b)
			})
			t.Run("a single write to one instance waits for a batch on the other", func(t *testing.T) {
				testClusterLocks(t, api, a, b)
			})
		})
	}
}

// clusterSite is the site of TestCluster's instances in front of the
// legacy API at upstream: storage item locks, one write at a time.
func clusterSite(upstream string) string {
	return `
	batch {
		item_locks storage
		item_timeout 15s
		concurrency 1
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy ` + upstream
}

// TestClusterOverlappingWritersSerialize runs the overlapping writers of
// TestOverlappingWritersSerialize against two Caddy processes that share
// a Redis storage with item_locks storage, each client sent to one or
// the other: writers on different instances must not interleave with a
// saga either.
func TestClusterOverlappingWritersSerialize(t *testing.T) {
	t.Parallel()
	const clients, nIDs = 16, 6
	bin := caddyBinary(t)
	host, port, prefix := redisServer(t)
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, Seed: records("w", 1, nIDs)})
	upstream := newUpstream(t, api)
	site := `
	batch {
		envelope /api/batch
		item_locks storage
		concurrency 3
		item_timeout 30s
		batch_timeout 60s
		allow_override
		scope_query by
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy ` + upstream
	a := startInstance(t, bin, redisOption(host, port, prefix), site)
	b := startInstance(t, bin, redisOption(host, port, prefix), site)
	overlappingWriters(t, 0, api, upstream, []string{a.URL, b.URL}, clients, nIDs, overlap{})
}

func testClusterReplay(t *testing.T, api *legacyapi.API, a, b *gateway) {
	key := []string{"Idempotency-Key", "cluster-key", "Authorization", "Bearer alice"}
	body := `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]`
	api.ResetLog()
	first := a.do(t, "PATCH", "/api/widgets", body, key...)
	if first.Status != 200 {
		t.Fatalf("%v", first)
	}
	api.ResetLog()
	checkReplay(t, api, first, b.do(t, "PATCH", "/api/widgets", body, key...))
	checkIdemProblem(t, b.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "z"}]`, key...), 422, "idempotency-key-reused")
}

// testClusterLocks: a batch on a updates widget 3, then fails on widget
// 4 and puts 3 back; a single write of widget 3 sent to b meanwhile
// waits for the batch's storage lock, so it lands after the undo instead
// of being undone by it, or making the undo fail.
func testClusterLocks(t *testing.T, api *legacyapi.API, a, b *gateway) {
	api.ResetLog()
	var wg sync.WaitGroup
	var batch response
	var batchErr error
	wg.Go(func() {
		batch, batchErr = a.try("PATCH", "/api/widgets", `[{"id": 3, "name": "batch"}, {"id": 4, "name": ""}]`)
	})
	eventually(t, 5*time.Second, "the batch's write of widget 3", func() bool {
		for _, r := range api.Requests() {
			if r.Method == "PATCH" && r.Path == "/api/widgets/3" {
				return true
			}
		}
		return false
	})
	single := b.do(t, "PATCH", "/api/widgets/3", `{"name": "single"}`)
	wg.Wait()
	if batchErr != nil {
		t.Fatal(batchErr)
	}
	if single.Status != 200 {
		t.Errorf("the single write: %v", single)
	}
	if bb := batch.batch(t); batch.Status != 422 || bb.Outcome != "rolled_back" {
		t.Errorf("the batch: %v", batch)
	}
	if w, _ := api.Item("/api/widgets", "3"); w["name"] != "single" {
		t.Errorf("widget 3 is %v, want the single write's", w)
	}
	var order []string
	for _, r := range writes(api.Requests()) {
		order = append(order, r.Method+" "+r.Path+" "+string(r.Body))
	}
	if len(order) == 0 || !strings.Contains(order[len(order)-1], `"single"`) {
		t.Errorf("the single write did not land last:\n%s", strings.Join(order, "\n"))
	}
}

// startInstance runs a Caddy process from bin serving site with the
// storage global option, and stops it when the test ends.
func startInstance(t *testing.T, bin, storage, site string) *gateway {
	t.Helper()
	home := t.TempDir()
	g := &gateway{client: gatewayClient(t, 60*time.Second), addr: freeAddr(t)}
	g.URL = "http://" + g.addr
	config := "{\n\tadmin off\n\tpersist_config off\n\tauto_https off\n\t" + storage + "\n}\n" +
		g.URL + " {" + site + "\n}\n"
	file := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "run", "--config", file, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
	logs := new(syncBuffer)
	g.logs = logs
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
		if t.Failed() {
			t.Logf("logs of the instance at %s:\n%s", g.addr, tail(logs.String(), 4000))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := g.client.Get(g.URL + "/")
		if err == nil {
			resp.Body.Close()
			return g
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the instance exited: %v\n%s", err, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the instance did not listen on %s within 30s\n%s", g.addr, logs.String())
		}
	}
}

// syncBuffer is a process's output, written by exec's goroutine and read
// by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return fmt.Sprintf("…%s", s[len(s)-n:])
	}
	return s
}

// TestClusterEnvelope runs the envelope (docs/envelope.md, "As for
// batches") on two Caddy processes that share a Redis storage, with
// item_locks storage: an Idempotency-Key used on one is replayed by the
// other, and two envelopes that share an item, one on each, never
// interleave.
func TestClusterEnvelope(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	host, port, prefix := redisServer(t)
	api := shopAPI()
	upstream := newUpstream(t, api)
	site := `
	batch /api/* {
		envelope /api/batch
		item_locks storage
		item_timeout 15s` + shopResources + `
	}
	reverse_proxy ` + upstream
	a := startInstance(t, bin, redisOption(host, port, prefix), site)
	b := startInstance(t, bin, redisOption(host, port, prefix), site)
	t.Run("a key used on one instance is replayed by the other", func(t *testing.T) {
		key := []string{"Idempotency-Key", "cluster-envelope", "Authorization", "Bearer alice"}
		first := a.do(t, "POST", "/api/batch", userWithPostsEnvelope, key...)
		checkEnvelope(t, first, 200, "succeeded")
		api.ResetLog()
		checkReplay(t, api, first, b.do(t, "POST", "/api/batch", userWithPostsEnvelope, key...))
	})
	t.Run("overlapping envelopes on the two instances serialize", func(t *testing.T) {
		testClusterEnvelopeLocks(t, api, a, b)
	})
}

// testClusterEnvelopeLocks: an envelope on a patches user 3, held at the
// API once applied, then fails on user 2 and undoes user 3. An envelope
// on b that patches users 1 and 3, sent meanwhile, waits for a's storage
// lock of user 3, sending nothing, and lands after the undo: the API
// ends as a serial order of the two leaves it.
func testClusterEnvelopeLocks(t *testing.T, api *legacyapi.API, a, b *gateway) {
	held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: "/api/users/3", AfterApply: true, Times: 1})
	defer release()
	api.Inject(held)
	api.ResetLog()
	users := api.Items("/api/users")
	var wg sync.WaitGroup
	var first, second response
	var firstErr, secondErr error
	wg.Go(func() {
		first, firstErr = a.try("POST", "/api/batch", `{"operations": [
			{"id": "m3", "method": "PATCH", "url": "/api/users/3", "body": {"name": "first"}},
			{"id": "m2", "method": "PATCH", "url": "/api/users/2", "body": {"name": ""}, "depends_on": ["m3"]}
		]}`)
	})
	eventually(t, 5*time.Second, "the first envelope's write of user 3", func() bool { return len(api.AppliedWrites()) == 1 })
	wg.Go(func() {
		second, secondErr = b.try("POST", "/api/batch", `{"operations": [
			{"id": "m1", "method": "PATCH", "url": "/api/users/1", "body": {"name": "second"}},
			{"id": "m3", "method": "PATCH", "url": "/api/users/3", "body": {"name": "second"}}
		]}`)
	})
	// The second envelope is on b by now, waiting for the lock.
	time.Sleep(500 * time.Millisecond)
	for _, r := range api.Requests() {
		if r.Path == "/api/users/1" {
			t.Errorf("while the first envelope held user 3, the API received:%s", describeRequests(api.Requests()))
			break
		}
	}
	release()
	wg.Wait()
	if firstErr != nil || secondErr != nil {
		t.Fatalf("the first envelope: %v; the second: %v", firstErr, secondErr)
	}
	if bb := checkProblem(t, first, 422); bb.Outcome != "rolled_back" {
		t.Errorf("the first envelope: %s %s", bb.Outcome, bb.Detail)
	}
	checkEnvelope(t, second, 200, "succeeded")
	users["1"]["name"], users["3"]["name"] = "second", "second"
	sameState(t, api, "/api/users", users)
	// The second envelope's two writes go out together, in either order.
	got := appliedWrites(api)
	if len(got) == 4 {
		slices.Sort(got[2:])
	}
	equalWrites(t, got, []string{"PATCH /api/users/3", "PUT /api/users/3", "PATCH /api/users/1", "PATCH /api/users/3"})
}
