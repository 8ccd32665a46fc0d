package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/tcprelay"
)

// A cluster's batch on Redis (docs/performance.md, "Round trips per
// batch"): an in-process Caddy whose storage is a real redis-server,
// directly or through a relay of the test's own that makes it a
// millisecond away, serving two sites in front of one fake legacy API:
// "on" (journal on, item_locks storage: what a cluster runs) and "off"
// (journal off, item_locks local: what one instance with nothing to
// recover runs).

// clusterBatchSites is the Caddyfile of the two sites, with ON, OFF,
// REDIS and UPSTREAM standing for their addresses.
const clusterBatchSites = `{
	admin off
	auto_https off
	persist_config off
	storage redis CLIENT {
		address REDIS
		key_prefix bench
		COMPRESSION
	}
	log {
		output discard
	}
}
http://ON {
	batch {
		journal on
		item_locks storage
		max_items 100
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
}
http://OFF {
	batch {
		journal off
		item_locks local
		max_items 100
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
}
`

// clusterBatch is the two sites running.
type clusterBatch struct {
	on, off string // base URLs
	client  *http.Client
	// relay is between Caddy and Redis: it adds the distance
	// (SetDelay), and counts the round trips (rt).
	relay *tcprelay.Relay
	rt    *roundTrips
}

// startClusterBatch serves the two sites with Redis at redisAddr,
// through a relay, and 100 widgets seeded.
func startClusterBatch(t testing.TB, redisAddr string) *clusterBatch {
	return startClusterBatchWith(t, redisAddr, "")
}

// startClusterBatchWith is startClusterBatch with a compression option
// for the storage (e.g. "compression flate"; "" for none).
func startClusterBatchWith(t testing.TB, redisAddr, compression string) *clusterBatch {
	t.Helper()
	return startClusterBatchVia(t, redisAddr, func(relayed string) (string, string, string) { return "", relayed, compression })
}

// startClusterBatchVia is startClusterBatch with the storage's client
// type, address and further options given by storage, from the relay's
// address.
func startClusterBatchVia(t testing.TB, redisAddr string, storage func(relayed string) (client, address, options string)) *clusterBatch {
	t.Helper()
	api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", AssignIDs: true, Seed: records("w", 1, 100)})
	srv := httptest.NewServer(api)
	relay, err := tcprelay.New(redisAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		api.Close()
		_ = relay.Close()
	})
	cb := &clusterBatch{client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}, relay: relay, rt: &roundTrips{by: map[string]int{}}}
	relay.Observe(cb.rt.observe)
	on, off := freeAddr(t), freeAddr(t)
	cb.on, cb.off = "http://"+on, "http://"+off
	client, address, options := storage(relay.Addr())
	config := strings.NewReplacer("ON", on, "OFF", off, "CLIENT", client, "REDIS", address, "UPSTREAM", srv.Listener.Addr().String(), "COMPRESSION", options).Replace(clusterBatchSites)
	loadCaddyfile(t, config)
	t.Cleanup(func() { _ = caddy.Stop() })
	return cb
}

// fastPath says whether the running Caddy uses the Redis fast path.
func fastPath() (string, string) { return batchapp.StoragePath(caddy.ActiveContext().Storage()) }

// batchBody is an all-or-nothing batch of n items: a PATCH of widgets 1
// to n ("patch", or "keyed-patch"), or a CREATE of n new ones.
func batchBody(op string, n int) (method string, body []byte) {
	elems := make([]string, n)
	for i := range elems {
		if strings.HasSuffix(op, "patch") {
			elems[i] = fmt.Sprintf(`{"id":%d,"name":"n%d"}`, i+1, time.Now().UnixNano()%1000)
		} else {
			elems[i] = fmt.Sprintf(`{"name":"c%d"}`, i)
		}
	}
	method = "PATCH"
	if op == "create" {
		method = "POST"
	}
	return method, []byte("[" + strings.Join(elems, ",") + "]")
}

// send sends one batch to the site at base, and returns how long it took.
func (cb *clusterBatch) send(t testing.TB, base, op string, n int) time.Duration {
	t.Helper()
	return cb.sendKeyed(t, base, op, n, "")
}

// sendKeyed is send with an Idempotency-Key ("" for none; a new one
// for each "keyed-patch").
func (cb *clusterBatch) sendKeyed(t testing.TB, base, op string, n int, key string) time.Duration {
	t.Helper()
	method, body := batchBody(op, n)
	if key == "" && strings.HasPrefix(op, "keyed-") {
		key = "bench-" + strconv.FormatInt(keysSent.Add(1), 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	want := http.StatusOK
	if op == "create" {
		want = http.StatusCreated
	}
	req, _ := http.NewRequest(method, base+"/api/widgets", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	start := time.Now()
	resp, err := cb.client.Do(req)
	drain(t, resp, err, want)
	return time.Since(start)
}

// keysSent numbers the Idempotency-Keys of "keyed-patch" batches.
var keysSent atomic.Int64

// roundTrips counts what the process sends Redis, as the relay sees it:
// one request per read (a Redis client waits for each answer before it
// sends the next on a connection; a pipeline is one write), by purpose
// (the command, and for a script whether it names locks).
type roundTrips struct {
	mu    sync.Mutex
	total int
	by    map[string]int
}

func (r *roundTrips) observe(b []byte) {
	purpose := purposeOf(b)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	r.by[purpose]++
}

func (r *roundTrips) reset() (total int, by map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	total, by = r.total, r.by
	r.total, r.by = 0, map[string]int{}
	return total, by
}

// purposeOf is what the request b (RESP: *n, then $len and each
// argument) is for: its command, and a script's first key; ":idem" is
// added to a request that names an Idempotency-Key's record, its lock
// or its expiry entry.
func purposeOf(b []byte) string {
	parts := strings.Split(string(b), "\r\n")
	if len(parts) < 3 {
		return "?"
	}
	if s := string(b); strings.Contains(s, "batch/v1/idem") || strings.Contains(s, "batch_idem_") {
		return commandOf(parts) + ":idem"
	}
	return commandOf(parts)
}

// commandOf is purposeOf for the request's parts, without the key.
func commandOf(parts []string) string {
	name := strings.ToLower(parts[2])
	if (name == "evalsha" || name == "eval") && len(parts) > 8 {
		if strings.Contains(parts[8], "/locks/") {
			return "script:locks"
		}
		return "script:keys"
	}
	return name
}

// warmFastPath starts the two sites on a redis-server of the test's
// own, on the fast path, sends one 100-item batch of op (the scripts
// loaded, the connections made), and resets Redis's and the relay's
// counts; it answers the sites and Redis's address.
func warmFastPath(t *testing.T, op string) (*clusterBatch, string) {
	t.Helper()
	if !hasRedisServer() {
		t.Skip("redis-server is not installed (INFO commandstats needs a real Redis)")
	}
	addr := startRedisServer(t)
	cb := startClusterBatch(t, addr)
	if path, why := fastPath(); path != "redis" {
		t.Fatalf("the fast path is off: %s", why)
	}
	cb.send(t, cb.on, op, 100)
	if _, err := redisCommand(addr, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	cb.rt.reset()
	return cb, addr
}

// TestRedisRoundTripsPerBatch: on a real Redis, on the fast path, a
// 100-item all-or-nothing PATCH with the journal and storage item locks
// sends no command of the module's folder index from the client (every
// store and delete is one script), takes and lets go of its hundred
// locks in a few scripts, not one per item, and asks Redis for nothing
// else but one listing.
func TestRedisRoundTripsPerBatch(t *testing.T) {
	cb, addr := warmFastPath(t, "patch")
	cb.send(t, cb.on, "patch", 100)
	time.Sleep(100 * time.Millisecond) // the removal, after the answer
	total, by := cb.rt.reset()
	cmds, byCmd := commandCalls(t, addr)
	t.Logf("%d round trips %v; %d commands %v", total, by, cmds, byCmd)
	checkPerWave(t, total, by)
}

// checkPerWave checks the round trips of a 100-item PATCH on the fast
// path, counted by purpose: no folder-index command sent by the client,
// the locks taken in one script and let go in one, nothing but stores,
// deletes, one listing and the locks.
func checkPerWave(t *testing.T, total int, by map[string]int) {
	t.Helper()
	for _, c := range []string{"zadd", "zrem", "exists", "del", "set"} {
		if by[c] > 0 {
			t.Errorf("%d %s sent by the client: the fast path's scripts should hold them", by[c], c)
		}
	}
	// One script per lock taken or let go would be 200: they are taken
	// in one, and let go in one (two when a goroutine comes late).
	if by["script:locks"] > 3 {
		t.Errorf("%d lock scripts for 100 items, want them taken in one and let go in one", by["script:locks"])
	}
	// A store per wave of writes (8 at a time, up to 4 stores in flight:
	// at most one per item) and its delete, the end marker's store and
	// delete, a listing, the locks.
	total -= by["hello"] // a new connection's handshake
	if keys := by["script:keys"]; keys > 2*(1+100)+2 || total > keys+1+by["script:locks"] {
		t.Errorf("%d round trips, %d of them stores and deletes", total, keys)
	}
}

// TestRedisRoundTripsPerKeyedBatch: on a real Redis, on the fast path,
// a 100-item all-or-nothing PATCH with an Idempotency-Key pays two
// round trips for its key (docs/performance.md, "Round trips per
// batch"): one script claims it (the lock found free, the record
// absent, the expiry entry and the record stored), one stores the
// answer over the claim; the same key again is one round trip, and
// replayed. Nothing else names the key: no lock taken, no record read.
func TestRedisRoundTripsPerKeyedBatch(t *testing.T) {
	cb, addr := warmFastPath(t, "keyed-patch")
	_, body := batchBody("patch", 100)
	if status := cb.patchKeyed(t, body, "key-1"); status != http.StatusOK {
		t.Fatalf("the keyed batch: %d", status)
	}
	time.Sleep(100 * time.Millisecond) // the removal, after the answer
	total, by := cb.rt.reset()
	cmds, byCmd := commandCalls(t, addr)
	t.Logf("%d round trips %v; %d commands %v", total, by, cmds, byCmd)
	// The claim's script names the record's lock first, the answer's
	// the record. The process's lease loop may renew the claim while
	// the batch runs, once (its tick is every third of a lease, shared
	// by every test in the process): a third script on the record.
	if key := keyRoundTrips(by); key < 2 || key > 3 || by["script:locks:idem"] != 1 || by["script:keys:idem"] != key-1 {
		t.Errorf("%d round trips name the key (%v), want 2 scripts: the claim and the answer", key, by)
	}
	// The same request again is replayed, after one round trip.
	if status := cb.patchKeyed(t, body, "key-1"); status != http.StatusOK {
		t.Errorf("the keyed batch again: %d, want its answer replayed", status)
	}
	if total, by := cb.rt.reset(); keyRoundTrips(by) != 1 || total != 1 {
		t.Errorf("the key used again: %v, want one round trip, for the key", by)
	}
}

// patchKeyed sends body as a PATCH with an Idempotency-Key to the "on"
// site, and answers its status.
func (cb *clusterBatch) patchKeyed(t *testing.T, body []byte, key string) int {
	t.Helper()
	req, _ := http.NewRequest("PATCH", cb.on+"/api/widgets", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := cb.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// keyRoundTrips is how many of the round trips counted by purpose name
// an Idempotency-Key.
func keyRoundTrips(by map[string]int) int {
	n := 0
	for purpose, c := range by {
		if strings.HasSuffix(purpose, ":idem") {
			n += c
		}
	}
	return n
}

// TestRedisGenericPathPerWave: with compression on, the Redis module
// stays off the fast path, and a 100-item all-or-nothing PATCH and
// CREATE with storage item locks succeed on the generic path, its locks
// taken by the module's Lock all at once, and leave no key of the
// journal and no lock behind.
func TestRedisGenericPathPerWave(t *testing.T) {
	if !hasRedisServer() {
		t.Skip("redis-server is not installed")
	}
	addr := startRedisServer(t)
	cb := startClusterBatchWith(t, addr, "compression flate")
	if path, why := fastPath(); path != "generic" || why != "compression is on" {
		t.Fatalf("storage path %s (%s), want generic: compression is on", path, why)
	}
	cb.send(t, cb.on, "patch", 100)
	cb.send(t, cb.on, "create", 100)
	eventually(t, 5*time.Second, "the journals and locks gone from Redis", func() bool {
		keys, err := redisCommand(addr, "KEYS", "bench/*")
		return err == nil && !strings.Contains(keys, "journal") && !strings.Contains(keys, "locks/")
	})
}

// BenchmarkClusterBatch is a cluster's all-or-nothing batch on Redis
// (docs/performance.md, "Round trips per batch"), directly and a
// millisecond away, on the fast path and on the generic one (the module
// with compression on): each op (a PATCH, a PATCH with a new
// Idempotency-Key each time, a CREATE) is one batch on the "on" site and
// one on the "off" site, alternated. It reports the medians of both (on-ms,
// off-ms), their ratio, Redis's commands and the process's round trips
// per item (INFO commandstats, and, a millisecond away, the relay
// between them: directly, Caddy talks to Redis itself), and, a millisecond
// away, the sequential round trips per batch: the time added by the
// distance, over what the relay adds to one round trip (measured in the
// same run). It needs redis-server:
//
//	go test -run '^$' -bench ClusterBatch -benchtime 40x ./e2e
func BenchmarkClusterBatch(b *testing.B) {
	if !hasRedisServer() {
		b.Skip("redis-server is not installed")
	}
	direct := map[string]time.Duration{}
	for _, path := range []struct{ name, compression string }{{"fast", ""}, {"generic", "compression flate"}} {
		for _, dist := range []time.Duration{0, time.Millisecond} {
			addr := startRedisServer(b)
			// Direct is direct: the relay, which copies and parses every
			// command in this process, would add its own work to each
			// round trip of the "on" site, and to none of "off"'s.
			cb := startClusterBatchVia(b, addr, func(relayed string) (string, string, string) {
				if dist == 0 {
					return "", addr, path.compression
				}
				return "", relayed, path.compression
			})
			cb.relay.SetDelay(dist)
			added := relayAdds(b, addr, cb.relay.Addr())
			for _, op := range []string{"patch", "keyed-patch", "create"} {
				for _, n := range []int{20, 100} {
					key := fmt.Sprintf("path=%s/%s/items=%d", path.name, op, n)
					b.Run(fmt.Sprintf("redis=+%s/%s", dist, key), func(b *testing.B) {
						on, off := cb.alternate(b, addr, op, n)
						report(b, on, off, n)
						if dist > 0 {
							// The relay counts what the process sends.
							b.ReportMetric(on.rts/float64(n), "redis-rt/item")
						}
						if dist == 0 {
							direct[key] = on.median
						} else if d, ok := direct[key]; ok {
							b.ReportMetric(float64(on.median-d)/float64(added), "seq-rt/batch")
						}
					})
				}
			}
			_ = caddy.Stop()
		}
	}
}

// report reports what alternate measured of a batch of n items.
func report(b *testing.B, on, off measured, n int) {
	b.ReportMetric(ms(on.median), "on-ms")
	b.ReportMetric(ms(off.median), "off-ms")
	b.ReportMetric(float64(on.median)/float64(off.median), "on/off")
	b.ReportMetric(on.cmds/float64(n), "redis-cmds/item")
}

// measured is what alternate measured of one site.
type measured struct {
	median    time.Duration
	cmds, rts float64 // per batch
}

// alternate sends b.N batches to each site, alternated, and measures.
func (cb *clusterBatch) alternate(b *testing.B, addr, op string, n int) (on, off measured) {
	cb.send(b, cb.on, op, n)
	cb.send(b, cb.off, op, n)
	var onTook, offTook []time.Duration
	var cmds, rts int
	for b.Loop() {
		_, _ = redisCommand(addr, "CONFIG", "RESETSTAT")
		cb.rt.reset()
		onTook = append(onTook, cb.send(b, cb.on, op, n))
		time.Sleep(20 * time.Millisecond) // the removal, after the answer
		c, _ := commandCalls(b, addr)
		r, _ := cb.rt.reset()
		cmds, rts = cmds+c-1, rts+r // less RESETSTAT
		offTook = append(offTook, cb.send(b, cb.off, op, n))
	}
	k := float64(len(onTook))
	return measured{median(onTook), float64(cmds) / k, float64(rts) / k}, measured{median: median(offTook)}
}

// relayAdds is what the relay adds to one round trip to Redis: the
// median of 100 PINGs through it less that of 100 directly.
func relayAdds(b *testing.B, direct, relayed string) time.Duration {
	ping := func(addr string) time.Duration {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		var took []time.Duration
		for range 100 {
			start := time.Now()
			if err := c.Ping(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		return median(took)
	}
	return max(ping(relayed)-ping(direct), time.Microsecond)
}
