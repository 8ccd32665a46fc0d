package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
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
//	go test -run '^$' -bench Get100 -benchmem -count 10 ./caddymodule | tee bench.txt
//	benchstat -col /path bench.txt
//
// Client, Caddy and upstream share the process; their goroutines carry the
// profiler label role=client, gateway or upstream, so that a CPU profile can
// be cut to what a Caddy process of its own would spend, and the module's
// share of it read: the README's Performance section has the commands.
// BenchmarkGet100Process runs the same cases with Caddy as a process of its
// own.
func BenchmarkGet100(b *testing.B) {
	upstream := httptest.NewUnstartedServer(widgetUpstream)
	asRole("upstream", upstream.Start)
	defer upstream.Close()
	batchAddr, plainAddr := freeAddr(b), freeAddr(b)
	asRole("gateway", func() {
		loadCaddyfile(b, quietGlobalOptions+get100Sites(batchAddr, plainAddr, upstream.Listener.Addr().String()))
	})
	defer caddy.Stop()
	get100Cases(b, batchAddr, plainAddr, "cpu-ns/item", processCPU)
}

// widgetUpstream is the upstream of the Get100 benchmarks: an instant
// answer of a small JSON object per item.
var widgetUpstream = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%s,"name":"widget %s","price":12.5}`, id, id)
})

// get100Sites is the Caddyfile of the Get100 benchmarks' two sites in
// front of upstream: one with the batch handler, one with a plain
// reverse_proxy.
func get100Sites(batchAddr, plainAddr, upstream string) string {
	return fmt.Sprintf(`http://%[1]s {
	batch {
		resource /api/widgets {
			collection GET
			item GET
		}
	}
	reverse_proxy %[3]s
}
http://%[2]s {
	reverse_proxy %[3]s
}
`, batchAddr, plainAddr, upstream)
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

// get100Cases runs the Get100 cases against the two sites of
// get100Sites: a 100-id batch GET, and the same GETs one by one and 8 at
// a time. Besides ns/item it reports, as cpuMetric, the CPU time that
// cpuClock counts per item.
func get100Cases(b *testing.B, batchAddr, plainAddr, cpuMetric string, cpuClock func(testing.TB) time.Duration) {
	ids := get100IDs()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	get := func(b *testing.B, url string) {
		var resp *http.Response
		var err error
		asRole("client", func() { resp, err = client.Get(url) })
		drain(b, resp, err, http.StatusOK)
	}
	var cpuStart time.Duration
	perItem := func(b *testing.B) {
		items := float64(b.N * len(ids))
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/items, "ns/item")
		b.ReportMetric(float64((cpuClock(b)-cpuStart).Nanoseconds())/items, cpuMetric)
	}

	b.Run("path=batch", func(b *testing.B) {
		url := get100BatchURL(batchAddr)
		b.ReportAllocs()
		cpuStart = cpuClock(b)
		for b.Loop() {
			get(b, url)
		}
		perItem(b)
	})
	singles := func(addr string) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			cpuStart = cpuClock(b)
			for b.Loop() {
				for _, id := range ids {
					get(b, "http://"+addr+"/api/widgets/"+id)
				}
			}
			perItem(b)
		}
	}
	b.Run("path=single-sequential", singles(plainAddr))
	// What the module costs a request it only passes through: the same
	// single GETs, through a route that has the batch handler in front.
	b.Run("path=single-through-module", singles(batchAddr))
	// The fairer rival: a client that sends the 100 GETs itself, as many
	// at once as the batch does (concurrency 8).
	b.Run("path=single-parallel8", func(b *testing.B) {
		b.ReportAllocs()
		cpuStart = cpuClock(b)
		for b.Loop() {
			var wg sync.WaitGroup
			next := make(chan string)
			for range 8 {
				wg.Go(func() {
					for id := range next {
						get(b, "http://"+plainAddr+"/api/widgets/"+id)
					}
				})
			}
			for _, id := range ids {
				next <- id
			}
			close(next)
			wg.Wait()
		}
		perItem(b)
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
//	go test -run '^$' -bench Get100Latency -count 5 ./caddymodule
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
