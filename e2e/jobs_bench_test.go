package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// BenchmarkJobsProcess measures bulk jobs against the goals of
// docs/performance.md ("Bulk jobs"), with Caddy as a process of its own
// (its RSS is then Caddy's alone) in front of the demo's users API, the
// API and the clients in the test process. The handler runs the default
// max_in_flight (auto). Each sub-benchmark starts its own job, so each
// runs alone with -bench:
//
//   - accept: a 50,000-element CREATE job sent as JSON Lines; the time
//     from the body's last byte to the 202 (accept-ms).
//
//   - throughput/storage=file_system, throughput/storage=redis: the
//     job's items a second from its creation to its end (job-items/s),
//     those of 8 clients sending the same 50,000 elements as 100-item
//     synchronous partial batches (sync-items/s), and their ratio
//     (job/sync), and Caddy's CPU time per item of each
//     (job-cpu-us/item, sync-cpu-us/item), and, from Caddy's slot
//     gauges, the sub-requests in flight, the limit, and the time a
//     sub-request holds its slot (job-in-flight, job-limit, job-slot-us,
//     and sync-…); with Caddy's storage the file system, or a
//     redis-server of the benchmark's own.
//     throughput/sync=all_or_nothing: the same, the synchronous batches
//     all-or-nothing, as the demo's users are.
//
//   - latency: single GETs' median before the job (idle-ms) and while it
//     runs (job-ms), and their ratio (job/idle).
//
//   - rss/items=50000, rss/items=100000: a fresh Caddy each, its RSS
//     before the job and its peak over it (VmHWM, reset before the job),
//     the growth in MiB (rss-growth-MiB).
//
//     go build -o /tmp/caddy-batch ./cmd/caddy
//     BATCH_TEST_CADDY=/tmp/caddy-batch go test -run '^$' -bench JobsProcess -benchtime 1x ./e2e
func BenchmarkJobsProcess(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads the Caddy process's memory from /proc")
	}
	bin := caddyBinary(b)
	client := &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	// One Caddy for the sub-benchmarks that measure time; the rss ones
	// start their own. It is the parent's, so that it outlives each
	// sub-benchmark (idle while only rss runs).
	shared := startJobsBenchCaddy(b, bin, "", "")
	gatewayForTime := func(*testing.B) string { return shared.base }
	var runs atomic.Int64
	identity := func(name string) string {
		// Each job its own client: the quota of jobs per client never
		// refuses a benchmark's start.
		return fmt.Sprintf("Bearer bench-%s-%d", name, runs.Add(1))
	}

	b.Run("accept", func(b *testing.B) {
		base := gatewayForTime(b)
		for range b.N {
			job := startBenchJob(b, client, base, identity("accept"), 50000)
			b.ReportMetric(ms(job.accept), "accept-ms")
			// What it does after the 202 is the other sub-benchmarks'
			// to measure: cancelled, it leaves the gateway to them.
			cancelBenchJob(b, client, base, job)
		}
	})
	// The file system syncs a file per store, one at a time; a cluster's
	// Redis takes several stores at once, each a round trip.
	// Caddy's own CPU time per item, for the job and for the
	// synchronous batches (cpu-us/item): what each item costs the
	// gateway, whatever bounds the rate.
	throughputAgainst := func(b *testing.B, c jobsBenchCaddy, syncPrefer string) {
		for range b.N {
			const items = 50000
			cpu := processCPUOf(b, c.pid)
			slots := sampleSlots(b, client, c.admin)
			job := startBenchJob(b, client, c.base, identity("throughput"), items)
			status := waitBenchJob(b, client, c.base, job, 10*time.Minute)
			jobRate := float64(items) / status.Ended.Sub(status.Created).Seconds()
			jobCPU := processCPUOf(b, c.pid) - cpu
			jobInFlight, jobLimit := slots()
			cpu = processCPUOf(b, c.pid)
			slots = sampleSlots(b, client, c.admin)
			syncRate := syncBatchesRate(b, client, c.base, identity("sync"), syncPrefer, items, 8, 100)
			syncCPU := processCPUOf(b, c.pid) - cpu
			syncInFlight, syncLimit := slots()
			// Little's law: the time a sub-request holds its slot is what
			// is in flight over the rate; equal times mean the rates differ
			// by the slots each had.
			b.ReportMetric(jobInFlight, "job-in-flight")
			b.ReportMetric(jobLimit, "job-limit")
			b.ReportMetric(syncInFlight, "sync-in-flight")
			b.ReportMetric(syncLimit, "sync-limit")
			b.ReportMetric(1e6*jobInFlight/jobRate, "job-slot-us")
			b.ReportMetric(1e6*syncInFlight/syncRate, "sync-slot-us")
			b.ReportMetric(jobRate, "job-items/s")
			b.ReportMetric(syncRate, "sync-items/s")
			b.ReportMetric(jobRate/syncRate, "job/sync")
			b.ReportMetric(float64(jobCPU.Microseconds())/items, "job-cpu-us/item")
			b.ReportMetric(float64(syncCPU.Microseconds())/items, "sync-cpu-us/item")
		}
	}
	throughput := func(b *testing.B, c jobsBenchCaddy) { throughputAgainst(b, c, "") }
	b.Run("throughput/storage=file_system", func(b *testing.B) { throughput(b, shared) })
	// Where the limit has room beyond twice what the API needs, a job's
	// half of the slots is not what bounds it.
	b.Run("throughput/max_in_flight=32", func(b *testing.B) {
		throughput(b, startJobsBenchCaddy(b, bin, "", "\n\t\tmax_in_flight 32"))
	})
	b.Run("throughput/max_in_flight=32/job_concurrency=16", func(b *testing.B) {
		throughput(b, startJobsBenchCaddy(b, bin, "", "\n\t\tmax_in_flight 32\n\t\tjob_concurrency 16"))
	})
	// The demo's users are all-or-nothing: a client that chunks an
	// import into synchronous batches there sends sagas, each kept in
	// the journal, where the job (past max_atomic_job_items) runs
	// partial.
	b.Run("throughput/sync=all_or_nothing", func(b *testing.B) {
		throughputAgainst(b, shared, "atomicity=all-or-nothing")
	})
	b.Run("throughput/storage=redis", func(b *testing.B) {
		if !hasRedisServer() {
			b.Skip("no redis-server here: apt-get install redis-server")
		}
		host, port, _ := strings.Cut(startRedisServer(b), ":")
		throughput(b, startJobsBenchCaddy(b, bin, redisOption(host, port, "jobsbench"), ""))
	})
	// An all-or-nothing job locks and reads each item before it writes
	// it, and keeps its windows' logs: what that costs, against a
	// partial job of the same 5,000 creates (max_atomic_job_items) in
	// the same run.
	b.Run("throughput/atomicity=all_or_nothing", func(b *testing.B) {
		base := gatewayForTime(b)
		for range b.N {
			const items = 5000
			rate := func(prefer string) float64 {
				job := startBenchJobAs(b, client, base, identity("atomic"), items, prefer)
				status := waitBenchJob(b, client, base, job, 10*time.Minute)
				return float64(items) / status.Ended.Sub(status.Created).Seconds()
			}
			partial := rate("respond-async")
			atomic := rate("respond-async, atomicity=all-or-nothing")
			b.ReportMetric(atomic, "atomic-items/s")
			b.ReportMetric(partial, "partial-items/s")
			b.ReportMetric(atomic/partial, "atomic/partial")
		}
	})
	b.Run("latency", func(b *testing.B) {
		base := gatewayForTime(b)
		for range b.N {
			idle := median(singleGets(b, client, base, func(begun time.Time) bool { return time.Since(begun) < 2*time.Second }))
			job := startBenchJob(b, client, base, identity("latency"), 50000)
			var ended atomic.Bool
			var during []time.Duration
			done := make(chan struct{})
			go func() {
				defer close(done)
				during = singleGets(b, client, base, func(time.Time) bool { return !ended.Load() })
			}()
			waitBenchJob(b, client, base, job, 10*time.Minute)
			ended.Store(true)
			<-done
			b.ReportMetric(ms(idle), "idle-ms")
			b.ReportMetric(ms(median(during)), "job-ms")
			b.ReportMetric(float64(median(during))/float64(idle), "job/idle")
		}
	})
	for _, items := range []int{50000, 100000} {
		b.Run("rss/items="+strconv.Itoa(items), func(b *testing.B) {
			for range b.N {
				// A fresh Caddy: the peak measured is this job's, not
				// another sub-benchmark's.
				c := startJobsBenchCaddy(b, bin, "", "")
				// One small job first, so that what every job needs once
				// (the storage's folders, the pools) is in the baseline.
				warm := startBenchJob(b, client, c.base, identity("warm"), 100)
				waitBenchJob(b, client, c.base, warm, time.Minute)
				before := procStatusKiB(b, c.pid, "VmRSS")
				resetPeakRSS(b, c.pid)
				job := startBenchJob(b, client, c.base, identity("rss"), items)
				waitBenchJob(b, client, c.base, job, 15*time.Minute)
				peak := procStatusKiB(b, c.pid, "VmHWM")
				b.ReportMetric(float64(before)/1024, "rss-before-MiB")
				b.ReportMetric(float64(peak)/1024, "rss-peak-MiB")
				b.ReportMetric(float64(peak-before)/1024, "rss-growth-MiB")
				c.stop()
			}
		})
	}
}

// jobsBenchCaddy is a Caddy process of the benchmark: where it serves,
// its pid, and how to stop it.
type jobsBenchCaddy struct {
	base, admin string
	pid         int
	stop        func()
}

// sampleSlots reads the gateway's slots from its admin endpoint's
// metrics every 50ms until the returned function is called, which
// answers their means: the sub-requests holding one, and the limit.
func sampleSlots(b *testing.B, client *http.Client, admin string) func() (inFlight, limit float64) {
	b.Helper()
	done, ended := make(chan struct{}), make(chan struct{})
	var sum [2]float64
	var n int
	go func() {
		defer close(ended)
		for tick := time.NewTicker(50 * time.Millisecond); ; {
			select {
			case <-done:
				tick.Stop()
				return
			case <-tick.C:
			}
			resp, err := client.Get("http://" + admin + "/metrics")
			if err != nil {
				continue
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var got [2]float64
			for line := range strings.Lines(string(raw)) {
				for i, name := range []string{"caddy_http_batch_subrequests_in_flight ", "caddy_http_batch_in_flight_limit "} {
					if v, ok := strings.CutPrefix(line, name); ok {
						f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
						got[i] += f
					}
				}
			}
			sum[0], sum[1], n = sum[0]+got[0], sum[1]+got[1], n+1
		}
	}()
	return func() (float64, float64) {
		close(done)
		<-ended
		if n == 0 {
			b.Fatal("no sample of the gateway's metrics")
		}
		return sum[0] / float64(n), sum[1] / float64(n)
	}
}

// startJobsBenchCaddy starts cmd/caddy before a users API as the demo's
// (users need a name; no service time), whose users are partial and
// whose jobs live at /api/jobs; storage, if not empty, is its storage
// global option (the file system's otherwise), and maxInFlight, if not
// empty, lines of the batch block (its max_in_flight: auto otherwise).
func startJobsBenchCaddy(b *testing.B, bin, storage, maxInFlight string) jobsBenchCaddy {
	b.Helper()
	api := legacyapi.New(legacyapi.Collection{Path: "/api/users", FilterParam: "id", Seed: records("user", 1, 3)})
	upstream := httptest.NewServer(api)
	addr, admin := freeAddr(b), freeAddr(b)
	// Its admin endpoint serves the slots' metrics (sampleSlots).
	global := strings.Replace(quietGlobalOptions, "\tadmin off\n", "\tadmin "+admin+"\n", 1)
	if storage != "" {
		global = strings.Replace(global, "\tauto_https off\n", "\tauto_https off\n\t"+storage+"\n", 1)
	}
	config := global + fmt.Sprintf(`http://%s {
	batch /api/* {
		atomicity partial
		allow_override
		jobs /api/jobs%s
		resource /api/users {
			collection GET POST PATCH DELETE
			item GET PUT PATCH DELETE
		}
	}
	reverse_proxy %s
}
`, addr, maxInFlight, upstream.Listener.Addr())
	p := startCaddyProcess(b, bin, config, addr)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			p.kill()
			upstream.Close()
			api.Close()
		})
	}
	b.Cleanup(stop)
	return jobsBenchCaddy{base: "http://" + addr, admin: admin, pid: p.cmd.Process.Pid, stop: stop}
}

// benchJob is a started job: its id, token, and how long its 202 took
// after the body's last byte.
type benchJob struct {
	id, token string
	accept    time.Duration
}

// benchJobStatus is what the benchmark reads of a job's status.
type benchJobStatus struct {
	State     string    `json:"state"`
	Done      int       `json:"done"`
	Succeeded int       `json:"succeeded"`
	Failed    int       `json:"failed"`
	Created   time.Time `json:"created"`
	Ended     time.Time `json:"ended"`
}

// lastByteReader is a request body that notes when it gave its last
// byte to the transport.
type lastByteReader struct {
	r    io.Reader
	last time.Time
}

func (l *lastByteReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if err == io.EOF && l.last.IsZero() {
		l.last = time.Now()
	}
	return n, err
}

// startBenchJob sends a CREATE job of n users as JSON Lines, streamed
// (no Content-Length), and returns it once answered 202.
func startBenchJob(b *testing.B, client *http.Client, base, authorization string, n int) benchJob {
	b.Helper()
	return startBenchJobAs(b, client, base, authorization, n, "respond-async")
}

// startBenchJobAs is startBenchJob with the Prefer header given.
func startBenchJobAs(b *testing.B, client *http.Client, base, authorization string, n int, prefer string) benchJob {
	b.Helper()
	var lines bytes.Buffer
	for i := range n {
		fmt.Fprintf(&lines, "{\"name\":\"bulk-%d\",\"email\":\"bulk-%d@example.com\"}\n", i, i)
	}
	body := &lastByteReader{r: io.MultiReader(&lines)} // hides the length: sent chunked, as a stream is
	req, err := http.NewRequest("POST", base+"/api/users", body)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Prefer", prefer)
	req.Header.Set("Authorization", authorization)
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	answered := time.Now()
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b.Fatalf("starting a job of %d: %d %s", n, resp.StatusCode, raw)
	}
	var started struct{ ID, Token string }
	if err := json.Unmarshal(raw, &started); err != nil || started.ID == "" || started.Token == "" {
		b.Fatalf("the 202 of a job: %s (%v)", raw, err)
	}
	return benchJob{id: started.ID, token: started.Token, accept: answered.Sub(body.last)}
}

// waitBenchJob reads the job's status until it ended, and fails unless
// every item succeeded (or the job was cancelled).
func waitBenchJob(b *testing.B, client *http.Client, base string, job benchJob, within time.Duration) benchJobStatus {
	b.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest("GET", base+"/api/jobs/"+job.id, nil)
		req.Header.Set("Authorization", "Bearer "+job.token)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var s benchJobStatus
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &s) != nil {
			b.Fatalf("status of job %s: %d %s", job.id, resp.StatusCode, raw)
		}
		switch s.State {
		case "queued", "running", "cancelling":
		case "succeeded", "cancelled":
			return s
		default:
			b.Fatalf("job %s ended %s: %s", job.id, s.State, raw)
		}
		if time.Now().After(deadline) {
			b.Fatalf("job %s not ended within %v: %s", job.id, within, raw)
		}
	}
}

// cancelBenchJob cancels a job and waits until it ended cancelled.
func cancelBenchJob(b *testing.B, client *http.Client, base string, job benchJob) {
	b.Helper()
	req, _ := http.NewRequest("DELETE", base+"/api/jobs/"+job.id, nil)
	req.Header.Set("Authorization", "Bearer "+job.token)
	resp, err := client.Do(req)
	drain(b, resp, err, http.StatusAccepted)
	// A job small enough may have ended before the cancel: succeeded.
	waitBenchJob(b, client, base, job, time.Minute)
}

// syncBatchesRate sends n users to create as 100-item synchronous
// batches from clients at once, partial but where prefer (a Prefer
// header) asks otherwise, and returns the items a second.
func syncBatchesRate(b *testing.B, client *http.Client, base, authorization, prefer string, n, clients, size int) float64 {
	b.Helper()
	batches := make(chan []byte, n/size+1)
	for from := 0; from < n; from += size {
		var body bytes.Buffer
		body.WriteByte('[')
		for i := from; i < min(from+size, n); i++ {
			if i > from {
				body.WriteByte(',')
			}
			fmt.Fprintf(&body, "{\"name\":\"sync-%d\",\"email\":\"sync-%d@example.com\"}", i, i)
		}
		body.WriteByte(']')
		batches <- body.Bytes()
	}
	close(batches)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range batches {
				req, _ := http.NewRequest("POST", base+"/api/users", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", authorization)
				if prefer != "" {
					req.Header.Set("Prefer", prefer)
				}
				resp, err := client.Do(req)
				if err := drained(resp, err, http.StatusCreated); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(n) / took.Seconds()
}

// singleGets sends a single GET of a user through the gateway every
// 20ms while more says so, and returns their latencies.
func singleGets(b *testing.B, client *http.Client, base string, more func(begun time.Time) bool) []time.Duration {
	var ds []time.Duration
	begun := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; more(begun); <-tick.C {
		start := time.Now()
		resp, err := client.Get(base + "/api/users/1")
		if err := drained(resp, err, http.StatusOK); err != nil {
			b.Error(err) // not Fatal: this runs on a goroutine of its own
			return ds
		}
		ds = append(ds, time.Since(start))
	}
	return ds
}

// procStatusKiB reads a field of /proc/<pid>/status, in KiB.
func procStatusKiB(b *testing.B, pid int, field string) int64 {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if value, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("%s of %d: %q", field, pid, line)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// resetPeakRSS sets the process's VmHWM back to its RSS now (Linux's
// clear_refs 5), so that the peak read after the job is the job's.
func resetPeakRSS(b *testing.B, pid int) {
	b.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		b.Fatalf("resetting the peak RSS of %d: %v", pid, err)
	}
}
