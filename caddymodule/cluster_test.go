package caddymodule

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	bin := caddyBinary(t)

	storages := []struct{ name, option string }{
		{"file_system", "storage file_system " + t.TempDir()},
	}
	host, port, prefix := redisServer(t)
	storages = append(storages, struct{ name, option string }{"redis", redisOption(host, port, prefix)})
	for _, s := range storages {
		t.Run(s.name, func(t *testing.T) {
			api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 500 * time.Millisecond, Seed: records("w", 1, 10)})
			upstream := newUpstream(t, api)
			site := `
	batch {
		item_locks storage
		item_timeout 15s
		concurrency 1
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy ` + upstream
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

// TestClusterOverlappingWritersSerialize runs the overlapping writers of
// TestOverlappingWritersSerialize against two Caddy processes that share
// a Redis storage with item_locks storage, each client sent to one or
// the other: writers on different instances must not interleave with a
// saga either.
func TestClusterOverlappingWritersSerialize(t *testing.T) {
	const clients, nIDs = 16, 6
	bin := caddyBinary(t)
	host, port, prefix := redisServer(t)
	api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, Seed: records("w", 1, nIDs)})
	upstream := newUpstream(t, api)
	site := `
	batch {
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
	wg.Go(func() {
		batch = a.do(t, "PATCH", "/api/widgets", `[{"id": 3, "name": "batch"}, {"id": 4, "name": ""}]`)
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
	g := &gateway{client: &http.Client{Timeout: 60 * time.Second}, addr: freeAddr(t)}
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
