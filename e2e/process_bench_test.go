package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkGet100Process runs BenchmarkGet100's cases with Caddy as a
// process of its own (cmd/caddy, from caddyBinary), as the issue that set
// the module's CPU targets measured it: caddy-cpu-ns/item is the Caddy
// process's CPU time (user and system, read from /proc) per item, apart
// from the client's and the upstream's, which stay in the test process.
//
//	go test -run '^$' -bench Get100Process -count 8 ./e2e | tee process.txt
//	benchstat -col /path process.txt
//
// With BATCH_BENCH_CADDY_PROFILE=<file>, it first profiles Caddy through
// its admin endpoint, as an operator would, for 10 s of sustained batch
// GETs, and writes the profile there; BATCH_TEST_CADDY names another
// build of Caddy to measure.
func BenchmarkGet100Process(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads the Caddy process's CPU time from /proc")
	}
	bin := caddyBinary(b)
	upstream := httptest.NewServer(widgetUpstream)
	defer upstream.Close()
	addrs, adminAddr := newGet100Addrs(b), freeAddr(b)
	config := `{
	admin ` + adminAddr + `
	auto_https off
	persist_config off
	log {
		output discard
	}
}
` + get100Sites(addrs, upstream.Listener.Addr().String())
	p := startCaddyProcess(b, bin, config, addrs.batch)

	if file := os.Getenv("BATCH_BENCH_CADDY_PROFILE"); file != "" {
		profileCaddy(b, "http://"+adminAddr+"/debug/pprof/profile?seconds=10", file, get100BatchURL(addrs.batch))
	}
	get100Cases(b, addrs, "caddy-cpu-ns/item", p.cpu)
}

// profileCaddy writes to file the CPU profile that profileURL takes,
// while batch GETs of batchURL are sent one after another.
func profileCaddy(b *testing.B, profileURL, file, batchURL string) {
	b.Helper()
	type result struct {
		profile []byte
		err     error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Get(profileURL)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		profile, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s: %s", profileURL, resp.Status, profile)
		}
		done <- result{profile, err}
	}()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				b.Fatalf("profiling caddy: %v", r.err)
			}
			if err := os.WriteFile(file, r.profile, 0o644); err != nil {
				b.Fatal(err)
			}
			return
		default:
			resp, err := http.Get(batchURL)
			drain(b, resp, err, http.StatusOK)
		}
	}
}

// cpu is the CPU time the Caddy process has used, as processCPUOf counts
// it.
func (p *caddyProcess) cpu(tb testing.TB) time.Duration {
	return processCPUOf(tb, p.cmd.Process.Pid)
}

// processCPUOf is the CPU time (user and system, all threads) that the
// process pid has used, from /proc/<pid>/stat, to the kernel's clock tick.
func processCPUOf(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	// The command's name, in parentheses, may hold spaces; fields are
	// counted after it: state is field 3, utime 14 and stime 15.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 13 {
		tb.Fatalf("/proc/%d/stat: too few fields: %q", pid, stat)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	// USER_HZ, the unit of utime and stime, is 100 on every Linux
	// architecture Go supports.
	return time.Duration(ticks) * (time.Second / 100)
}

// TestProcessCPUOf holds /proc's count of this process's CPU time to
// getrusage's, after enough work to move both.
func TestProcessCPUOf(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	// The work is counted in CPU time, not on the wall clock: on a busy
	// machine 200 ms of wall clock can be far less work.
	start, worked := processCPUOf(t, os.Getpid()), processCPU(t)
	for processCPU(t)-worked < 200*time.Millisecond {
	}
	fromProc, fromRusage := processCPUOf(t, os.Getpid()), processCPU(t)
	if fromProc-start < 100*time.Millisecond {
		t.Errorf("200 ms of work moved /proc's CPU time by %v", fromProc-start)
	}
	// Both count the same process; they differ by the clock tick and by
	// the work between the two reads.
	if diff := (fromProc - fromRusage).Abs(); diff > 100*time.Millisecond {
		t.Errorf("/proc says %v, getrusage %v", fromProc, fromRusage)
	}
}
