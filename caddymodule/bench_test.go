package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// BenchmarkGet100 compares a 100-id batch GET through the module with the
// same 100 GETs sent one by one through a plain reverse_proxy, in one
// Caddy, in one run, against the same upstream. Each op is 100 items;
// ns/item is ns/op divided by 100. Compare with benchstat:
//
//	go test -run '^$' -bench Get100 -benchmem -count 10 ./caddymodule | tee bench.txt
//	benchstat -col /path bench.txt
func BenchmarkGet100(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%s,"name":"widget %s","price":12.5}`, id, id)
	}))
	defer upstream.Close()
	batchAddr, plainAddr := freeAddr(b), freeAddr(b)
	// Logging stays off: reverse_proxy's debug lines would be most of the
	// cost of either path.
	loadCaddyfile(b, fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
}
http://%[1]s {
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
`, batchAddr, plainAddr, upstream.Listener.Addr()))
	defer caddy.Stop()

	ids := make([]string, 100)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	get := func(b *testing.B, url string) {
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
	}
	perItem := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/item")
	}

	b.Run("path=batch", func(b *testing.B) {
		url := "http://" + batchAddr + "/api/widgets?ids=" + strings.Join(ids, ",")
		b.ReportAllocs()
		for b.Loop() {
			get(b, url)
		}
		perItem(b)
	})
	singles := func(addr string) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
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
