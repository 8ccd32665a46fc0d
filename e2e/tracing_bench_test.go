package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
)

// BenchmarkGet100TracingProcess is what Caddy's tracing costs a 100-id
// batch GET (docs/performance.md, "Tracing"), with Caddy as a process of
// its own whose CPU time per item (caddy-cpu-ns/item) is measured apart
// from the client's and the upstream's. Each Caddy serves four sites: a
// batch without and with tracing, and a plain reverse_proxy without and
// with it, whose cost per request is what Caddy's own server span costs.
// The process's OTEL_TRACES_EXPORTER is none (TestMain): spans are made,
// queued and dropped.
//
// BATCH_BENCH_BASE_CADDY names a Caddy built from another revision, run
// as build=base beside this one's (build=head), in the same run:
//
//	git archive main | tar -x -C /tmp/base && (cd /tmp/base && go build -o /tmp/caddy-base ./cmd/caddy)
//	BATCH_BENCH_BASE_CADDY=/tmp/caddy-base go test -run '^$' -bench Get100TracingProcess -count 6 ./e2e | tee tracing.txt
//	benchstat -col /build tracing.txt
func BenchmarkGet100TracingProcess(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads the Caddy process's CPU time from /proc")
	}
	type build struct {
		name  string
		proc  *caddyProcess
		sites map[string]string // by "tracing/path", the site's address
	}
	bins := [][2]string{{"head", caddyBinary(b)}}
	if base := os.Getenv("BATCH_BENCH_BASE_CADDY"); base != "" {
		bins = append([][2]string{{"base", base}}, bins...)
	}
	upstream := httptest.NewServer(widgetUpstream)
	defer upstream.Close()
	var builds []build
	for _, bin := range bins {
		bd := build{name: bin[0], sites: map[string]string{}}
		config := quietGlobalOptions
		for _, key := range []string{"off/batch", "on/batch", "off/plain", "on/plain"} {
			addr := freeAddr(b)
			bd.sites[key] = addr
			config += tracingBenchSite(addr, upstream.Listener.Addr().String(), strings.HasPrefix(key, "on/"), strings.HasSuffix(key, "/batch"))
		}
		bd.proc = startCaddyProcess(b, bin[1], config, bd.sites["on/plain"])
		builds = append(builds, bd)
	}
	ids := get100IDs()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	get := func(b *testing.B, url string) {
		var resp *http.Response
		var err error
		asRole("client", func() { resp, err = client.Get(url) })
		drain(b, resp, err, http.StatusOK)
	}
	for _, tracing := range []string{"off", "on"} {
		for _, path := range []string{"batch", "plain"} {
			for _, bd := range builds {
				b.Run(fmt.Sprintf("tracing=%s/path=%s/build=%s", tracing, path, bd.name), func(b *testing.B) {
					addr := bd.sites[tracing+"/"+path]
					meter := &itemMeter{items: len(ids), cpuMetric: "caddy-cpu-ns/item", cpuClock: bd.proc.cpu, served: widgetUpstream.served}
					meter.start(b)
					for b.Loop() {
						if path == "batch" {
							get(b, get100BatchURL(addr))
							continue
						}
						for _, id := range ids {
							get(b, "http://"+addr+"/api/widgets/"+id)
						}
					}
					meter.report(b)
				})
			}
		}
	}
}

// tracingBenchSite is one site of BenchmarkGet100TracingProcess: batch
// or a plain reverse_proxy, with or without tracing.
func tracingBenchSite(addr, upstream string, traced, batch bool) string {
	site := "http://" + addr + " {\n"
	if traced {
		site += "\ttracing\n"
	}
	if batch {
		site += "\tbatch {\n\t\tmax_in_flight 32\n\t\tresource /api/widgets {\n\t\t\tcollection GET\n\t\t\titem GET\n\t\t}\n\t}\n"
	}
	return site + "\treverse_proxy " + upstream + "\n}\n"
}
