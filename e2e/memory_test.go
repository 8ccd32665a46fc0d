package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// The memory a batch holds, measured through a real Caddy in this process.
// Client, Caddy and upstream share the process, so what is measured
// includes the upstream's and the client's own work; the upstreams here
// serve prebuilt bodies, so that nearly all of it is the gateway's.

// BenchmarkAnswerAlloc is a 1000-id batch GET of 1 KiB items: it reports
// the bytes the whole process allocated per byte of the batch's answer
// (B/answer-B), the figure that holding every body a second time (to
// marshal the answer) shows up in.
//
//	go test -run '^$' -bench AnswerAlloc -benchmem -count 6 ./e2e
func BenchmarkAnswerAlloc(b *testing.B) {
	const items, size = 1000, 1 << 10
	bodies := make(map[string][]byte, items)
	ids := make([]string, items)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
		bodies[ids[i]] = paddedBody(ids[i], size)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := bodies[r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	}))
	defer upstream.Close()
	addr := freeAddr(b)
	loadCaddyfile(b, memoryConfig(addr, upstream.Listener.Addr().String(), "max_items 1000"))
	defer caddy.Stop()

	client := &http.Client{Timeout: time.Minute}
	url := "http://" + addr + "/api/blobs?ids=" + strings.Join(ids, ",")
	var answer int64
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		answer = getAnswer(b, client, url)
	}
	runtime.ReadMemStats(&after)
	perOp := float64(after.TotalAlloc-before.TotalAlloc) / float64(b.N)
	b.ReportMetric(perOp/float64(answer), "B/answer-B")
	b.ReportMetric(float64(answer), "answer-B")
}

// TestLargeBatchGetHeap sends a 100-id batch GET of 1 MiB items and
// samples the heap while it runs: above what the process held before, the
// batch may take about twice its answer (every body once, plus garbage the
// collector has not reached yet), and less than three times it.
func TestLargeBatchGetHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a few hundred MiB")
	}
	const items, size = 100, 1 << 20
	pad := strings.Repeat("x", size)
	for _, tt := range []struct {
		name string
		// chunked: the upstream sends no Content-Length, so the gateway
		// cannot size a body's buffer before it comes.
		chunked bool
	}{{name: "content-length"}, {name: "chunked", chunked: true}} {
		t.Run(tt.name, func(t *testing.T) {
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
				head := `{"id":"` + id + `","pad":"`
				w.Header().Set("Content-Type", "application/json")
				if !tt.chunked {
					w.Header().Set("Content-Length", strconv.Itoa(size))
				}
				// Written in pieces from one shared pad, so the upstream
				// allocates nothing the size of a body.
				_, _ = io.WriteString(w, head)
				_, _ = io.WriteString(w, pad[:size-len(head)-2])
				_, _ = io.WriteString(w, `"}`)
			}))
			defer upstream.Close()
			addr := freeAddr(t)
			loadCaddyfile(t, memoryConfig(addr, upstream.Listener.Addr().String(), "max_body_size 2MiB\n\t\tmax_response_size 200MiB"))
			defer func() {
				if err := caddy.Stop(); err != nil {
					t.Errorf("stopping caddy: %v", err)
				}
			}()
			ids := make([]string, items)
			for i := range ids {
				ids[i] = strconv.Itoa(i + 1)
			}
			client := &http.Client{Timeout: time.Minute}
			url := "http://" + addr + "/api/blobs?ids=" + strings.Join(ids, ",")

			// Twice: the first only moves sync.Pool contents to the
			// victim cache.
			runtime.GC()
			runtime.GC()
			baseline := heapInUse()
			stop := make(chan struct{})
			var peak atomic.Uint64
			var wg sync.WaitGroup
			wg.Go(func() {
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for {
					peak.Store(max(peak.Load(), heapInUse()))
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			})
			answer := getAnswer(t, client, url)
			close(stop)
			wg.Wait()

			grew := float64(peak.Load()) - float64(baseline)
			ratio := grew / float64(answer)
			t.Logf("answer %.1f MiB; heap in use %.1f MiB before, %.1f MiB at the peak: %.1f MiB more, %.2f× the answer",
				mib(answer), mib(int64(baseline)), mib(int64(peak.Load())), grew/(1<<20), ratio)
			if answer < items*size {
				t.Fatalf("the answer is %d bytes, want at least %d: were items left out?", answer, items*size)
			}
			if ratio >= 3 {
				t.Errorf("the heap grew %.2f× the answer during the batch, want under 3×", ratio)
			}
		})
	}
}

// memoryConfig serves /api/blobs (batch GET only) at addr in front of
// upstream, with the batch options given, and logs nothing: log lines
// would be most of what the process allocates.
func memoryConfig(addr, upstream, options string) string {
	return fmt.Sprintf(quietGlobalOptions+`http://%s {
	batch {
		%s
		resource /api/blobs {
			collection GET
			item GET
		}
	}
	reverse_proxy %s
}
`, addr, options, upstream)
}

// paddedBody is a JSON object of exactly size bytes that names id.
func paddedBody(id string, size int) []byte {
	head := `{"id":"` + id + `","pad":"`
	return []byte(head + strings.Repeat("x", size-len(head)-2) + `"}`)
}

// getAnswer sends a batch GET that must succeed and returns the size of
// its answer, read and dropped as it comes.
func getAnswer(t testing.TB, client *http.Client, url string) int64 {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s…: %d", url[:min(len(url), 60)], resp.StatusCode)
	}
	return n
}

// heapInUse is MemStats.HeapInuse, read without stopping the world.
func heapInUse() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64() + s[1].Value.Uint64()
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
