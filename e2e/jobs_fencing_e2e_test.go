package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/tcprelay"
)

// A bulk job under the faults of the fencing tests (docs/durability.md,
// "A job at each fault"), end to end: two Caddy processes on a
// redis-server of the test's own, A reaching it through the test's
// relay, B directly, both with jobsProcessConfig's short lease. A runs a
// partial create job of jobFaultItems widgets; once a quarter of them is
// made, A is partitioned from Redis or paused for 1.5 × lease, long
// enough for B to take the job over. What the tests judge is what an
// operator sees once the dust settles: the job's status through B, the
// legacy API's widgets and the creates it applied, and A's log.

const (
	jobFaultItems = 3000
	// jobFaultLease is the lease of jobsProcessConfig.
	jobFaultLease = 2 * time.Second
	// jobFaultWriteDelay makes the job last several leases at
	// jobsProcessConfig's concurrency, so that the fault comes mid-job
	// and B has a good part of it left to carry on.
	jobFaultWriteDelay = 10 * time.Millisecond
	// jobFault is how long a fault lasts at least: past the lease.
	jobFault = jobFaultLease * 3 / 2
	// jobFaultMax is how long it lasts at most while B has not taken the
	// job over (a slow machine delays B's scan), short of the Redis
	// client's timeout (fencingRedisTimeout), so that a held call
	// completes, late, as over a healed partition.
	jobFaultMax = jobFaultLease * 5 / 2
	// senderHeader tags, in the API's log, the requests A sent.
	senderHeader = "X-Test-Sender"
)

// jobFaultCluster is the two instances, their Redis and A's relay.
type jobFaultCluster struct {
	api          *legacyapi.API
	relay        *tcprelay.Relay
	a, b         *caddyProcess
	addrA, addrB string
}

// startJobFaultCluster starts the API, Redis, the relay and the two
// instances; it skips the test where redis-server is not installed.
func startJobFaultCluster(t *testing.T) *jobFaultCluster {
	t.Helper()
	bin := caddyBinary(t)
	if !hasRedisServer() {
		t.Skip("the job fencing tests start a redis-server of their own: install redis-server")
	}
	c := &jobFaultCluster{api: legacyapi.NewRecording(legacyapi.Collection{
		Path: "/api/widgets", HonorKeys: true, WriteDelay: jobFaultWriteDelay})}
	upstream := newUpstream(t, c.api)
	// A reaches the API at an address of its own, which tags what A
	// sends, for the API's log to tell A's creates from B's.
	upstreamA := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set(senderHeader, "A")
		c.api.ServeHTTP(w, r)
	}))
	redis := startRedisProcess(t)
	relay, err := tcprelay.New(redis.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	c.relay = relay
	c.addrA, c.addrB = freeAddr(t), freeAddr(t)
	c.a = startCaddyProcess(t, bin, jobsProcessConfig(c.addrA, upstreamA, fencingStorage(relay.Addr())), c.addrA)
	c.b = startCaddyProcess(t, bin, jobsProcessConfig(c.addrB, upstream, fencingStorage(redis.addr)), c.addrB)
	return c
}

// TestJobsFencingFaults partitions A from Redis (its storage calls hang,
// then complete) or pauses it (SIGSTOP, then SIGCONT) while it runs a
// job, for 1.5 × lease and until B has taken the job over. Once the job
// ended, through B: it succeeded, taken over at least once; the legacy
// API made every widget exactly once (the creates A had in flight are
// resolved by B with their Idempotency-Keys, never made again); A sent
// no create once a lease had passed since the fault began, when its
// lease had surely lapsed by its own clock (but for the few a pause may
// catch on their way out); and A logged that its lease on the job was
// lost.
func TestJobsFencingFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		start, lift func(*testing.T, *jobFaultCluster)
		// late is how many creates A may send once a lease has passed
		// since the fault began: none when only its storage is cut off,
		// since it checks its lease immediately before each send; one a
		// concurrency slot (jobsProcessConfig's 4) when it is paused,
		// which may stop it between that check and the send
		// (docs/durability.md, "A job at each fault": clocks and calls).
		late int
	}{
		{"partition", func(_ *testing.T, c *jobFaultCluster) { c.relay.Hold() }, func(_ *testing.T, c *jobFaultCluster) { c.relay.Release() }, 0},
		{"paused", func(t *testing.T, c *jobFaultCluster) { c.a.signal(t, syscall.SIGSTOP) }, func(t *testing.T, c *jobFaultCluster) { c.a.signal(t, syscall.SIGCONT) }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := startJobFaultCluster(t)
			job := startWidgetJob(t, c.addrA, jobFaultItems, "nightly-import")
			awaitWidgets(t, c.api, jobFaultItems/4)
			faultAt := time.Now()
			tc.start(t, c)
			atFault := len(c.api.Items("/api/widgets"))
			lasted, taken := c.awaitTakeover(t, job.ID)
			tc.lift(t, c)
			t.Logf("the fault came at %d widgets made and lasted %v; B took the job over: %v", atFault, lasted.Round(10*time.Millisecond), taken)
			if atFault >= jobFaultItems {
				t.Fatalf("the job ended (%d widgets) before the fault: the test needs it mid-job", atFault)
			}

			st := awaitJobEnd(t, c.addrB, job, 2*time.Minute, c.b)
			if st.State != "succeeded" || st.Done != jobFaultItems || st.Succeeded != jobFaultItems || st.Takeovers < 1 {
				t.Errorf("the job ended %s, %d done, %d succeeded, %d takeovers; want succeeded, %d, %d, at least 1",
					st.State, st.Done, st.Succeeded, st.Takeovers, jobFaultItems, jobFaultItems)
			}
			checkMadeOnce(t, c.api, jobFaultItems)
			checkCreatedOnce(t, c.api)
			if sent := c.createsFromAAfter(faultAt); len(sent) > 0 {
				t.Logf("A sent %d creates after the fault began, the last %s", len(sent), sent[len(sent)-1])
			}
			if late := c.createsFromAAfter(faultAt.Add(jobFaultLease)); len(late) > tc.late {
				t.Errorf("A sent %d creates more than a lease after the fault began, when its lease had lapsed, want %d at most: %v", len(late), tc.late, late)
			}
			c.checkALostTheJob(t, job.ID)
		})
	}
}

// awaitTakeover waits while a fault lasts: jobFault, and on until B
// logged that it runs the job, for jobFaultMax at most. It returns how
// long the fault lasted, and whether B took the job meanwhile.
func (c *jobFaultCluster) awaitTakeover(t *testing.T, id string) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	time.Sleep(jobFault)
	for ; time.Since(start) < jobFaultMax; time.Sleep(50 * time.Millisecond) {
		if runs(t, c.b, id) {
			return time.Since(start), true
		}
	}
	return time.Since(start), runs(t, c.b, id)
}

// runs reports whether p logged that it runs the job id.
func runs(t *testing.T, p *caddyProcess, id string) bool {
	t.Helper()
	for _, e := range p.entries(t) {
		if e["msg"] == "bulk job running" && e["job"] == id {
			return true
		}
	}
	return false
}

// checkCreatedOnce fails the test if the legacy API applied two creates
// of one widget: a resend the API answered from its Idempotency-Key
// record is no create, one it applied again is.
func checkCreatedOnce(t *testing.T, api *legacyapi.API) {
	t.Helper()
	created := map[string]int{}
	for _, w := range api.AppliedWrites() {
		var body struct {
			Name string `json:"name"`
		}
		if w.Method != "POST" || w.Path != "/api/widgets" || json.Unmarshal(w.Body, &body) != nil {
			t.Errorf("the API applied a write the job did not ask for: %s %s %s", w.Method, w.Path, w.Body)
			continue
		}
		created[body.Name]++
	}
	var twice []string
	for name, n := range created {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s ×%d", name, n))
		}
	}
	if len(twice) > 0 {
		t.Errorf("the API applied %d widgets' creates more than once: %v", len(twice), twice)
	}
	var sent int
	for _, r := range api.Requests() {
		if r.Method == "POST" {
			sent++
		}
	}
	t.Logf("the API received %d creates, applied %d, answered %d from their Idempotency-Key", sent, len(api.AppliedWrites()), api.Writes().Replayed)
}

// createsFromAAfter names the creates A sent that reached the API after
// at, with when they came.
func (c *jobFaultCluster) createsFromAAfter(at time.Time) []string {
	var late []string
	for _, r := range c.api.Requests() {
		if r.Method == "POST" && r.Header.Get(senderHeader) == "A" && r.At.After(at) {
			late = append(late, fmt.Sprintf("%s at +%v", bytes.TrimSpace(r.Body), r.At.Sub(at).Round(time.Millisecond)))
		}
	}
	return late
}

// checkALostTheJob fails the test unless A logged, within two leases
// of the job's end, that its run of job id stopped with its lease lost:
// renewed too late, lapsed by its own clock, or found taken over.
func (c *jobFaultCluster) checkALostTheJob(t *testing.T, id string) {
	t.Helper()
	var stops []string
	for deadline := time.Now().Add(2 * jobFaultLease); ; time.Sleep(100 * time.Millisecond) {
		stops = stops[:0]
		for _, e := range c.a.entries(t) {
			msg, _ := e["msg"].(string)
			if !strings.HasPrefix(msg, "bulk job stopped") || e["job"] != id {
				continue
			}
			why, _ := e["why"].(string)
			if strings.HasPrefix(msg, "bulk job stopped: its lease is lost") && why != "" {
				t.Logf("A logged: %s (%s)", msg, why)
				return
			}
			err, _ := e["error"].(string)
			stops = append(stops, msg+": "+err)
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("A did not log that it lost job %s's lease (its stops: %q):\n%s", id, stops, c.a.tail(20))
}

// startWidgetJob starts, on the instance at addr, a partial job that
// creates the widgets job-0 to job-<n-1> (widgetLines), keyed by key.
func startWidgetJob(t *testing.T, addr string, n int, key string) jobAnswer {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+"/api/widgets", strings.NewReader(widgetLines(n)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Prefer", "respond-async")
	req.Header.Set("Authorization", "Bearer client-a")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var job jobAnswer
	err = json.NewDecoder(resp.Body).Decode(&job)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("starting the job: %d %v", resp.StatusCode, err)
	}
	return job
}

// awaitWidgets waits, a minute at most, until the API holds n widgets.
func awaitWidgets(t *testing.T, api *legacyapi.API, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); len(api.Items("/api/widgets")) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the job made %d widgets in a minute, want %d", len(api.Items("/api/widgets")), n)
		}
	}
}

// takenOverJob is a job's status with its count of takeovers.
type takenOverJob struct {
	jobAnswer
	Takeovers int `json:"takeovers"`
}

// awaitJobEnd polls the job's status, with its token, from the instance
// at addr (p) until the job is neither queued nor running; a job still
// going after within fails the test, with p's log.
func awaitJobEnd(t *testing.T, addr string, job jobAnswer, within time.Duration, p *caddyProcess) takenOverJob {
	t.Helper()
	var st takenOverJob
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		r, err := http.NewRequest("GET", "http://"+addr+"/api/jobs/"+job.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Authorization", "Bearer "+job.Token)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("the job's status from %s: %d %v", addr, resp.StatusCode, err)
		}
		if st.State != "running" && st.State != "queued" {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job is still %s (%d of %d done) after %v:\n%s", st.State, st.Done, st.Items, within, p.tail(20))
		}
	}
}
