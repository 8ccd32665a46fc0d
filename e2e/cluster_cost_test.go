package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// costSite serves /api/widgets and /api/slow, whose writes take half a
// second: a batch of three there, two at a time, runs past a renewal of
// a one-second lease.
const costSite = `
	batch {
		concurrency 2
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/slow {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`

// costAPI is the legacy API of costSite, with the records of n batches
// (three each) in each collection.
func costAPI(n int) *legacyapi.API {
	return legacyapi.New(
		legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 3*n)},
		legacyapi.Collection{Path: "/api/slow", WriteDelay: 500 * time.Millisecond, Seed: records("s", 1, 3*n)},
	)
}

// sendCostBatches sends n all-or-nothing batch updates of three items
// each (more than concurrency), 16 at a time: a third succeed, a third
// are rolled back (the write of their last item fails), a third are held
// past a lease renewal. Each batch names items of its own.
func sendCostBatches(t *testing.T, g *gateway, n int) {
	t.Helper()
	for i := 1; i < n; i += 3 {
		g.API.Inject(legacyapi.Fault{Method: "PATCH", Path: fmt.Sprintf("/api/widgets/%d", 3*i+3), Status: 500})
	}
	var failures atomic.Int32
	var wg sync.WaitGroup
	var next atomic.Int32
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				first := 3*i + 1
				path, want, third := "/api/widgets", "succeeded", first+2
				switch i % 3 {
				case 1:
					want = "rolled_back"
				case 2:
					path = "/api/slow"
				}
				body := fmt.Sprintf(`[{"id": %d, "name": "x"}, {"id": %d, "name": "x"}, {"id": %d, "name": "x"}]`, first, first+1, third)
				r, err := g.try("PATCH", path, body, "Prefer", "atomic")
				var b batchAnswer
				if err == nil {
					err = json.Unmarshal(r.Body, &b)
				}
				if (err != nil || b.Outcome != want) && failures.Add(1) <= 3 {
					t.Errorf("batch %d: %s %v, want %s: %v", i, b.Outcome, err, want, r)
				}
			}
		})
	}
	wg.Wait()
}

// TestNoJournalKeyLeft: after 300 all-or-nothing batches have ended (100
// rolled back, 100 held past a renewal of their lease), nothing of their
// journals is left in storage: no key and no folder, on the file system
// and on Redis, whose module keeps a folder's keys when the folder is
// deleted.
func TestNoJournalKeyLeft(t *testing.T) {
	const batches = 300
	t.Run("file_system", func(t *testing.T) {
		dir := t.TempDir()
		api := costAPI(batches)
		g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+dir+"\n\tbatch {\n\t\tlease 1s\n\t}", costSite)
		journals := filepath.Join(dir, filepath.FromSlash("batch/v1/journal"))
		var renewed atomic.Bool
		stop := make(chan struct{})
		go func() { // a held saga's lease key, renewed while it runs
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				leases, _ := filepath.Glob(filepath.Join(journals, "*", "lease"))
				if len(leases) > 0 {
					renewed.Store(true)
				}
			}
		}()
		sendCostBatches(t, g, batches)
		close(stop)
		if !renewed.Load() {
			t.Error("no saga's lease was renewed while it ran")
		}
		// A saga that left nothing behind is answered once its end
		// marker is stored; the rest goes after the answer.
		eventually(t, 5*time.Second, "the journals' removals to end", func() bool {
			entries, err := os.ReadDir(journals)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			return len(entries) == 0
		})
	})
	t.Run("redis", func(t *testing.T) {
		host, port, prefix := redisServer(t)
		addr := host + ":" + port
		api := costAPI(batches)
		g := startGatewayStorage(t, api, newUpstream(t, api), redisOption(host, port, prefix)+"\n\tbatch {\n\t\tlease 1s\n\t}", costSite)
		var renewed atomic.Bool
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if keys, _ := redisCommand(addr, "KEYS", prefix+"/batch/v1/journal/*/lease"); keys != "" {
					renewed.Store(true)
				}
			}
		}()
		sendCostBatches(t, g, batches)
		close(stop)
		if !renewed.Load() {
			t.Error("no saga's lease was renewed while it ran")
		}
		keys, err := redisCommand(addr, "KEYS", prefix+"/batch/v1/journal*")
		if err != nil || keys != "" {
			t.Errorf("journal keys left in Redis (%v): %s", err, tail(keys, 5))
		}
		folders, err := redisCommand(addr, "ZRANGE", prefix+"/batch/v1", "0", "-1")
		if err != nil || strings.Contains(folders, "journal") {
			t.Errorf("the journal folder is still listed in Redis (%v): %q", err, folders)
		}
	})
}

// commandCalls is how many commands the Redis server at addr served
// since its stats were reset (INFO commandstats), by command.
func commandCalls(t testing.TB, addr string) (total int, by map[string]int) {
	t.Helper()
	info, err := redisCommand(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	by = map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_get:calls=12,usec=...
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.Atoi(calls)
		by[strings.TrimPrefix(name, "cmdstat_")] = n
		total += n
	}
	return total, by
}

// keepRecords stores n answered Idempotency-Key records in s, as n keyed
// batches would have, 32 at a time.
func keepRecords(t testing.TB, s durable.Storage, n int) {
	t.Helper()
	keys := durable.NewKeys(s, durable.NewLeases(time.Minute), zap.NewNop())
	var wg sync.WaitGroup
	var next atomic.Int32
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				record, lock := durable.IdempotencyRecord(strconv.Itoa(i), "", "/api/widgets", "/api/widgets", "update")
				d, err := keys.Claim(context.Background(), durable.Claim{Record: record, Lock: lock, Fingerprint: "fp",
					Wait: 10 * time.Second, TTL: 24 * time.Hour, MaxRun: time.Minute})
				if err != nil || d.Verdict != durable.Proceed {
					t.Errorf("claiming record %d: %v %v", i, d.Verdict, err)
					return
				}
				answer := &durable.Answer{Status: 200, Body: []byte(strings.Repeat("x", 800))}
				if err := d.Held.Answered(context.Background(), answer, "succeeded", 24*time.Hour, 1<<20); err != nil {
					t.Errorf("storing answer %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestClusterWithRecordsKept: on a real Redis holding 20,000
// Idempotency-Key records, an idle instance asks the same few commands
// per recovery_interval as on one holding none (counted by Redis's INFO
// commandstats over the same number of intervals, its sweep included),
// and a saga whose instance was killed is undone by another in time
// (takeover). The two share the records, which take a while to store.
func TestClusterWithRecordsKept(t *testing.T) {
	if !hasRedisServer() {
		t.Skip("redis-server is not installed (INFO commandstats needs a real Redis)")
	}
	bin := caddyBinary(t) // skipped under -short
	none := idleCommands(t, startRedisServer(t))
	addr := startRedisServer(t)
	host, port, _ := strings.Cut(addr, ":")
	keepRecords(t, batchapp.DurableStorage(newRedisStorage(t, host, port, costPrefix)), 20000)
	kept := idleCommands(t, addr)
	if kept > 2*none+10 || none == 0 {
		t.Errorf("an idle instance asked Redis %d commands with 20,000 records kept, %d with none: want within 2x", kept, none)
	}
	t.Run("takeover", func(t *testing.T) { testTakeoverWithRecordsKept(t, bin, host, port, costPrefix) })
}

// costPrefix is the key prefix of the Redis servers the cost tests start.
const costPrefix = "cost"

// idleCommands is how many commands an idle in-process Caddy asks of the
// Redis server at addr in 2 s, with recovery_interval and sweep_interval
// at 100ms, once its first scan and sweep are done.
func idleCommands(t *testing.T, addr string) int {
	host, port, _ := strings.Cut(addr, ":")
	api := costAPI(1)
	option := redisOption(host, port, costPrefix) + "\n\tbatch {\n\t\trecovery_interval 100ms\n\t\tsweep_interval 100ms\n\t}"
	startGatewayStorage(t, api, newUpstream(t, api), option, costSite)
	defer caddy.Stop()
	time.Sleep(time.Second)
	if _, err := redisCommand(addr, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // about 20 intervals of the scan and of the sweep
	total, by := commandCalls(t, addr)
	t.Logf("%d commands in 2s idle: %v", total, by)
	return total
}

// testTakeoverWithRecordsKept: two Caddy processes on a Redis holding
// 20,000 Idempotency-Key records; the one running an all-or-nothing
// batch is killed (SIGKILL), and the other undoes the saga within lease +
// 3 × recovery_interval + item_timeout + 2 s of the kill, however much is
// kept, leaving no journal key: it takes the saga over once it saw the
// lease unchanged for a lease, and resolves the write the dead instance
// had in flight only once that write's item_timeout is over
// (docs/durability.md, "A saga never writes after it lost its lease").
func testTakeoverWithRecordsKept(t *testing.T, bin, host, port, prefix string) {
	tc := killCaseNamed("update")
	api := killAPI(false)
	upstream := newUpstream(t, api)
	before := api.Items("/api/widgets")
	config := func(addr string) string {
		c := killConfig(addr, upstream, "DIR", "")
		return strings.Replace(c, "storage file_system DIR", redisOption(host, port, prefix), 1)
	}
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := startCaddyProcess(t, bin, config(addrA), addrA)
	b := startCaddyProcess(t, bin, config(addrB), addrB)
	killed := sendAndKill(t, a, addrA, api, tc)
	redisAddr := host + ":" + port
	deadline := time.Now().Add(60 * time.Second)
	last, lastChange := api.Items("/api/widgets"), time.Now()
	for {
		time.Sleep(20 * time.Millisecond)
		now := api.Items("/api/widgets")
		if !sameJSON(t, now, last) {
			last, lastChange = now, time.Now()
		}
		keys, err := redisCommand(redisAddr, "KEYS", prefix+"/batch/v1/journal*")
		if err == nil && keys == "" && api.InFlight() == 0 && sameJSON(t, now, before) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered within a minute: journal keys %q (%v)", keys, err)
		}
	}
	took := lastChange.Sub(killed)
	t.Logf("20,000 records kept: kill to last undo %v", took.Round(time.Millisecond))
	if limit := 2*time.Second + 3*250*time.Millisecond + 10*time.Second + 2*time.Second; took > limit {
		t.Errorf("the saga was undone %v after the kill, want within %v (lease + 3 × recovery_interval + item_timeout + 2s)", took, limit)
	}
	checkRecovered(t, api, before, tc, b)
}
