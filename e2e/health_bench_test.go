package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// BenchmarkHealthProcess measures how the gateway keeps a legacy API
// healthy (docs/security.md, "Sizing the limits"), with Caddy as a process of its
// own as BenchmarkGet100Process runs it, the API and the clients in the
// test process:
//
//   - storm/max_in_flight=…: an API of 8 workers, 10ms a request, with a
//     queue; 16 clients send 100-id batch GETs (one GET per id) for 5s
//     while another sends a single GET through the gateway every 20ms.
//     It reports the single GETs' median before the storm (idle-ms) and
//     during it (storm-ms), their ratio (storm/idle), and the storm's
//     items a second, for max_in_flight auto and 4, 8, 16, 32 and 64.
//
//   - throttled/max_throttle_wait=…: an API that takes 200 requests a
//     second (a token bucket answering 429 with Retry-After beyond it);
//     20 all-or-nothing batch UPDATEs of 10 items each at once. It
//     reports the share that succeeded and the share undone, with
//     max_throttle_wait 0 (the gateway before throttling was honoured)
//     and the default, 5s.
//
//     go test -run '^$' -bench HealthProcess -benchtime 1x ./e2e
func BenchmarkHealthProcess(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("runs cmd/caddy as a process of its own")
	}
	bin := caddyBinary(b)
	workers := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", Workers: 8, ServiceTime: 10 * time.Millisecond, Seed: records("w", 1, 100)})
	stormUpstream := httptest.NewServer(workers)
	defer stormUpstream.Close()
	defer workers.Close()
	limits := []string{"auto", "4", "8", "16", "32", "64"}
	addrs := map[string]string{}
	var sites strings.Builder
	for _, l := range limits {
		addrs[l] = freeAddr(b)
		fmt.Fprintf(&sites, "http://%s {\n\tbatch {\n\t\tmax_in_flight %s\n\t\tresource /api/widgets {\n\t\t\tcollection GET\n\t\t\titem GET\n\t\t}\n\t}\n\treverse_proxy %s\n}\n",
			addrs[l], l, stormUpstream.Listener.Addr())
	}
	for _, wait := range []string{"0", "5s"} {
		api := legacyapi.New(legacyapi.Collection{Path: "/api/limited", RateLimit: 200, Seed: records("l", 1, 200)})
		up := httptest.NewServer(api)
		defer up.Close()
		defer api.Close()
		addrs["wait "+wait] = freeAddr(b)
		fmt.Fprintf(&sites, "http://%s {\n\tbatch {\n\t\tmax_throttle_wait %s\n\t\tresource /api/limited {\n\t\t\tcollection GET PATCH\n\t\t\titem GET PUT PATCH\n\t\t}\n\t}\n\treverse_proxy %s\n}\n",
			addrs["wait "+wait], wait, up.Listener.Addr())
	}
	config := quietGlobalOptions + sites.String()
	startCaddyProcess(b, bin, config, addrs[limits[0]])
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	for _, l := range limits {
		b.Run("storm/max_in_flight="+l, func(b *testing.B) {
			for range b.N {
				f := healthStorm(b, client, "http://"+addrs[l])
				b.ReportMetric(ms(f.idle), "idle-ms")
				b.ReportMetric(ms(f.storm), "storm-ms")
				b.ReportMetric(float64(f.storm)/float64(f.idle), "storm/idle")
				b.ReportMetric(f.itemsPerSecond, "items/s")
			}
		})
	}
	for _, wait := range []string{"0", "5s"} {
		b.Run("throttled/max_throttle_wait="+wait, func(b *testing.B) {
			for range b.N {
				shares := throttledStorm(b, client, "http://"+addrs["wait "+wait])
				b.ReportMetric(shares["succeeded"], "succeeded-share")
				b.ReportMetric(shares["failed"], "failed-share")
				b.ReportMetric(shares["rolled_back"], "undone-share")
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// healthFigures are what one storm measured.
type healthFigures struct {
	idle, storm    time.Duration // single GETs' median
	itemsPerSecond float64
}

// healthStorm measures single GETs through the gateway at base, idle for
// a second, then during a 5s storm of 16 clients' 100-id batch GETs.
func healthStorm(b *testing.B, client *http.Client, base string) healthFigures {
	b.Helper()
	const clients, stormFor, every = 16, 5 * time.Second, 20 * time.Millisecond
	single := func(until time.Time) []time.Duration {
		var ds []time.Duration
		for tick := time.NewTicker(every); time.Now().Before(until); <-tick.C {
			start := time.Now()
			resp, err := client.Get(base + "/api/widgets/1")
			drain(b, resp, err, http.StatusOK)
			ds = append(ds, time.Since(start))
		}
		return ds
	}
	idle := median(single(time.Now().Add(time.Second)))

	var items atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(stormFor)
	batchURL := base + "/api/widgets?ids=" + idList(1, 100)
	for range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				resp, err := client.Get(batchURL)
				drain(b, resp, err, http.StatusOK)
				items.Add(100)
			}
		})
	}
	during := single(end)
	wg.Wait()
	return healthFigures{idle: idle, storm: median(during), itemsPerSecond: float64(items.Load()) / time.Since(start).Seconds()}
}

// throttledStorm sends 20 all-or-nothing batch UPDATEs of 10 items each
// at once to the throttling API behind base, and returns the share of
// the batches of each outcome: succeeded, failed (nothing written), or
// rolled_back (undone).
func throttledStorm(b *testing.B, client *http.Client, base string) map[string]float64 {
	b.Helper()
	const batches, items = 20, 10
	var mu sync.Mutex
	outcomes := map[string]int{}
	var wg sync.WaitGroup
	for n := range batches {
		wg.Go(func() {
			var body []string
			for i := range items {
				body = append(body, fmt.Sprintf(`{"id":%d,"name":"storm"}`, n*items+i+1))
			}
			req, _ := http.NewRequest("PATCH", base+"/api/limited", strings.NewReader("["+strings.Join(body, ",")+"]"))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var answer struct {
				Outcome string `json:"outcome"`
			}
			_ = json.Unmarshal(raw, &answer)
			mu.Lock()
			outcomes[answer.Outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	shares := map[string]float64{}
	for outcome, n := range outcomes {
		shares[outcome] = float64(n) / batches
	}
	return shares
}
