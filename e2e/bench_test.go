package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// BenchmarkGet100 compares a 100-id batch GET through the module with the
// same 100 GETs sent one by one through a plain reverse_proxy, in one
// Caddy, in one run, against the same upstream. Each op is 100 items;
// ns/item is ns/op divided by 100. Compare with benchstat:
//
//	go test -run '^$' -bench Get100 -benchmem -count 10 ./e2e | tee bench.txt
//	benchstat -col /path bench.txt
//
// Client, Caddy and upstream share the process; their goroutines carry the
// profiler label role=client, gateway or upstream, so that a CPU profile can
// be cut to what a Caddy process of its own would spend, and the module's
// share of it read: docs/performance.md has the commands.
// BenchmarkGet100Process runs the same cases with Caddy as a process of its
// own.
func BenchmarkGet100(b *testing.B) {
	upstream := httptest.NewUnstartedServer(widgetUpstream)
	asRole("upstream", upstream.Start)
	defer upstream.Close()
	addrs := newGet100Addrs(b)
	asRole("gateway", func() {
		loadCaddyfile(b, quietGlobalOptions+get100Sites(addrs, upstream.Listener.Addr().String()))
	})
	defer caddy.Stop()
	get100Cases(b, addrs, "cpu-ns/item", processCPU)
}

// widgetUpstream is the upstream of the Get100 benchmarks: an instant
// answer of a small JSON object per item, and a LIST filtered by id as
// json-server filters it (?id=1&id=2). It counts the requests it serves.
var widgetUpstream = countedUpstream{served: new(atomic.Int64), handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/api/widgets" {
		var list []byte
		list = append(list, '[')
		for i, id := range r.URL.Query()["id"] {
			if i > 0 {
				list = append(list, ',')
			}
			list = fmt.Appendf(list, `{"id":%s,"name":"widget %s","price":12.5}`, id, id)
		}
		w.Write(append(list, ']'))
		return
	}
	id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	fmt.Fprintf(w, `{"id":%s,"name":"widget %s","price":12.5}`, id, id)
})}

// countedUpstream is an upstream that counts the requests it serves, for
// the upstream-req/item metric: what a batch costs the legacy API.
type countedUpstream struct {
	handler http.Handler
	served  *atomic.Int64
}

func (u countedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.served.Add(1)
	u.handler.ServeHTTP(w, r)
}

// get100Sites is the Caddyfile of the Get100 benchmarks' three sites in
// front of upstream: the batch handler fanning out one GET per id, the
// batch handler reading through the upstream's list filter, and a plain
// reverse_proxy. max_in_flight is pinned, so that a change of its
// default does not move what builds compared by these benchmarks show.
func get100Sites(a get100Addrs, upstream string) string {
	return fmt.Sprintf(`http://%[1]s {
	batch {
		max_in_flight 32
		resource /api/widgets {
			collection GET
			item GET
		}
	}
	reverse_proxy %[4]s
}
http://%[2]s {
	batch {
		max_in_flight 32
		resource /api/widgets {
			collection GET
			item GET
			list_filter "id={id}"
		}
	}
	reverse_proxy %[4]s
}
http://%[3]s {
	reverse_proxy %[4]s
}
`, a.batch, a.list, a.plain, upstream)
}

// get100Addrs are the addresses of get100Sites' sites.
type get100Addrs struct{ batch, list, plain string }

func newGet100Addrs(b testing.TB) get100Addrs {
	return get100Addrs{freeAddr(b), freeAddr(b), freeAddr(b)}
}

// get100IDs are the ids of a Get100 batch.
func get100IDs() []string {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	return ids
}

// get100BatchURL is the 100-id batch GET of the batch site at addr.
func get100BatchURL(addr string) string {
	return "http://" + addr + "/api/widgets?ids=" + strings.Join(get100IDs(), ",")
}

// get100Cases runs the Get100 cases against the sites of get100Sites: a
// 100-id batch GET fanned out, the same through the list filter, and the
// same GETs one by one and 8 at a time. Besides ns/item it reports, as
// cpuMetric, the CPU time that cpuClock counts per item, and the requests
// the upstream served per item.
func get100Cases(b *testing.B, addrs get100Addrs, cpuMetric string, cpuClock func(testing.TB) time.Duration) {
	ids := get100IDs()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	fetch := func(url string) error {
		var resp *http.Response
		var err error
		asRole("client", func() { resp, err = client.Get(url) })
		return drained(resp, err, http.StatusOK)
	}
	get := func(b *testing.B, url string) {
		if err := fetch(url); err != nil {
			b.Fatal(err)
		}
	}
	meter := &itemMeter{items: len(ids), cpuMetric: cpuMetric, cpuClock: cpuClock, served: widgetUpstream.served}

	b.Run("path=batch", func(b *testing.B) {
		url := get100BatchURL(addrs.batch)
		meter.start(b)
		for b.Loop() {
			get(b, url)
		}
		meter.report(b)
	})
	b.Run("path=batch-list", func(b *testing.B) {
		url := get100BatchURL(addrs.list)
		meter.start(b)
		for b.Loop() {
			get(b, url)
		}
		meter.report(b)
	})
	singles := func(addr string) func(b *testing.B) {
		return func(b *testing.B) {
			meter.start(b)
			for b.Loop() {
				for _, id := range ids {
					get(b, "http://"+addr+"/api/widgets/"+id)
				}
			}
			meter.report(b)
		}
	}
	b.Run("path=single-sequential", singles(addrs.plain))
	// What the module costs a request it only passes through: the same
	// single GETs, through a route that has the batch handler in front.
	b.Run("path=single-through-module", singles(addrs.batch))
	// The fairer rival: a client that sends the 100 GETs itself, as many
	// at once as the batch does (concurrency 8).
	b.Run("path=single-parallel8", func(b *testing.B) {
		meter.start(b)
		for b.Loop() {
			var wg sync.WaitGroup
			next := make(chan string)
			errs := make([]error, 8)
			for w := range 8 {
				wg.Go(func() {
					for id := range next {
						if err := fetch("http://" + addrs.plain + "/api/widgets/" + id); err != nil && errs[w] == nil {
							errs[w] = err
						}
					}
				})
			}
			for _, id := range ids {
				next <- id
			}
			close(next)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
		}
		meter.report(b)
	})
}

// itemMeter reports what a benchmark's ops cost per item, each op being
// items items: the time (ns/item), the CPU time cpuClock counts (as
// cpuMetric) and the requests the upstream served (upstream-req/item).
type itemMeter struct {
	items     int
	cpuMetric string
	cpuClock  func(testing.TB) time.Duration
	served    *atomic.Int64

	cpuStart    time.Duration
	servedStart int64
}

// start begins the count of a (sub-)benchmark, and reports its
// allocations.
func (m *itemMeter) start(b *testing.B) {
	b.ReportAllocs()
	m.cpuStart, m.servedStart = m.cpuClock(b), m.served.Load()
}

// report reports the costs per item since start.
func (m *itemMeter) report(b *testing.B) {
	items := float64(b.N * m.items)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/items, "ns/item")
	b.ReportMetric(float64((m.cpuClock(b)-m.cpuStart).Nanoseconds())/items, m.cpuMetric)
	b.ReportMetric(float64(m.served.Load()-m.servedStart)/items, "upstream-req/item")
}

// BenchmarkGet10Throughput is what 16 clients get from the gateway at
// once: 10-id batch GETs read through the upstream's list filter, against
// single GETs through a plain reverse_proxy, in one Caddy, in one run.
// items/s is what the clients received in all, per second.
//
//	go test -run '^$' -bench Get10Throughput -count 8 ./e2e | tee throughput.txt
//	benchstat -col /path throughput.txt
func BenchmarkGet10Throughput(b *testing.B) {
	const clients, batchSize = 16, 10
	upstream := httptest.NewServer(widgetUpstream)
	defer upstream.Close()
	addrs := newGet100Addrs(b)
	loadCaddyfile(b, quietGlobalOptions+get100Sites(addrs, upstream.Listener.Addr().String()))
	defer caddy.Stop()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	parallel := func(b *testing.B, itemsPerRequest int, url func(n int) string) {
		b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := client.Get(url(int(next.Add(1))))
				drain(b, resp, err, http.StatusOK)
			}
		})
		b.ReportMetric(float64(b.N*itemsPerRequest)/b.Elapsed().Seconds(), "items/s")
	}
	b.Run("path=batch-list", func(b *testing.B) {
		parallel(b, batchSize, func(n int) string {
			ids := make([]string, batchSize)
			for i := range ids {
				ids[i] = strconv.Itoa((n*batchSize+i)%1000 + 1)
			}
			return "http://" + addrs.list + "/api/widgets?ids=" + strings.Join(ids, ",")
		})
	})
	b.Run("path=single", func(b *testing.B) {
		parallel(b, 1, func(n int) string { return "http://" + addrs.plain + "/api/widgets/" + strconv.Itoa(n%1000+1) })
	})
}

// asRole runs f, and every goroutine it starts, under the profiler label
// role=name.
func asRole(name string, f func()) {
	pprof.Do(context.Background(), pprof.Labels("role", name), func(context.Context) { f() })
}

// processCPU is the CPU time (user and system) the test process has used:
// client, Caddy and upstream together, since they share the process.
func processCPU(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGet100Latency is the client's wait for a 100-id batch GET at
// concurrency 10 against an upstream that takes 20 ms per GET: its floor
// is 100 / 10 × 20 ms = 200 ms, and the metric x-floor says how far above
// it the gateway's own work puts the answer.
//
//	go test -run '^$' -bench Get100Latency -count 5 ./e2e
func BenchmarkGet100Latency(b *testing.B) {
	const delay, concurrency, n = 20 * time.Millisecond, 10, 100 // n: the ids of get100BatchURL
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(delay)
		id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%s,"name":"widget %s"}`, id, id)
	}))
	defer upstream.Close()
	addr := freeAddr(b)
	loadCaddyfile(b, fmt.Sprintf(quietGlobalOptions+`http://%[1]s {
	batch {
		concurrency %[3]d
		resource /api/widgets {
			collection GET
			item GET
		}
	}
	reverse_proxy %[2]s
}
`, addr, upstream.Listener.Addr(), concurrency))
	defer caddy.Stop()
	url := get100BatchURL(addr)
	for b.Loop() {
		resp, err := http.Get(url)
		drain(b, resp, err, http.StatusOK)
	}
	floor := time.Duration(n/concurrency) * delay
	b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(floor), "x-floor")
}
