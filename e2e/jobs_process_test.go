package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// jobsProcessConfig is the Caddyfile of one of two gateways at addr on
// one storage, in front of upstream, running partial bulk jobs.
func jobsProcessConfig(addr, upstream, storage string) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	grace_period 1s
	%[3]s
	batch {
		lease 2s
		recovery_interval 250ms
	}
	log {
		output stderr
		format json
		level INFO
	}
}
http://%[1]s {
	batch {
		atomicity partial
		concurrency 4
		idempotent_upstream
		jobs /api/jobs
		resource /api/widgets {
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE
		}
	}
	reverse_proxy %[2]s
}
`, addr, upstream, storage)
}

// TestJobsCarriedOnByAnotherInstance runs a partial create job on one of
// two Caddy processes sharing a real redis-server, and stops that process
// half-way: killed (SIGKILL), the other takes the job over once its lease
// lapsed; stopped gracefully (SIGTERM), the stopping one hands it over
// and the other takes it at its next scan. Either way the job ends
// succeeded, read from the other instance, and the legacy API (which
// honours Idempotency-Key: the items in flight at a kill are sent again
// with their keys) holds every element exactly once: nothing undone,
// nothing made twice.
func TestJobsCarriedOnByAnotherInstance(t *testing.T) {
	for _, c := range []struct {
		name   string
		signal syscall.Signal
	}{
		{"killed", syscall.SIGKILL},
		{"stopped gracefully", syscall.SIGTERM},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			bin := caddyBinary(t)
			host, port, prefix := redisServer(t)
			storage := redisOption(host, port, prefix)
			api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", HonorKeys: true, WriteDelay: 3 * time.Millisecond})
			upstream := httptest.NewServer(api)
			defer upstream.Close()
			defer api.Close()
			addrA, addrB := freeAddr(t), freeAddr(t)
			a := startCaddyProcess(t, bin, jobsProcessConfig(addrA, upstream.Listener.Addr().String(), storage), addrA)
			b := startCaddyProcess(t, bin, jobsProcessConfig(addrB, upstream.Listener.Addr().String(), storage), addrB)

			const n = 3000
			req, _ := http.NewRequest("POST", "http://"+addrA+"/api/widgets", strings.NewReader(widgetLines(n)))
			req.Header.Set("Content-Type", "application/x-ndjson")
			req.Header.Set("Prefer", "respond-async")
			req.Header.Set("Authorization", "Bearer client-a")
			req.Header.Set("Idempotency-Key", "nightly-import-"+prefix)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var job jobAnswer
			err = json.NewDecoder(resp.Body).Decode(&job)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 202 {
				t.Fatalf("start: %d %v", resp.StatusCode, err)
			}

			for deadline := time.Now().Add(time.Minute); len(api.Items("/api/widgets")) < n/3; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the job made %d widgets in a minute, want %d before the stop", len(api.Items("/api/widgets")), n/3)
				}
			}
			if err := a.cmd.Process.Signal(c.signal); err != nil {
				t.Fatal(err)
			}
			_ = a.cmd.Wait()
			if made := len(api.Items("/api/widgets")); made >= n {
				t.Fatalf("the job ended (%d widgets) before its instance stopped: the test needs it half-way", made)
			}
			if c.signal == syscall.SIGTERM && !strings.Contains(a.tail(200), "bulk job handed over") {
				t.Errorf("the stopped instance did not log the hand-over:\n%s", a.tail(20))
			}

			var st struct {
				jobAnswer
				Takeovers int `json:"takeovers"`
			}
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
				r, err := http.NewRequest("GET", "http://"+addrB+"/api/jobs/"+job.ID, nil)
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
					t.Fatalf("status from the other instance: %d %v", resp.StatusCode, err)
				}
				if st.State != "running" && st.State != "queued" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the job is still %s (%d of %d done) two minutes after its instance stopped:\n%s", st.State, st.Done, n, b.tail(20))
				}
			}
			if st.State != "succeeded" || st.Done != n || st.Succeeded != n || st.Takeovers != 1 {
				t.Errorf("the job ended %s, %d done, %d succeeded, %d takeovers; want succeeded, %d, %d, 1", st.State, st.Done, st.Succeeded, st.Takeovers, n, n)
			}
			made := map[string]int{}
			for _, w := range api.Items("/api/widgets") {
				made[fmt.Sprint(w["name"])]++
			}
			for i := range n {
				if got := made[fmt.Sprintf("job-%d", i)]; got != 1 {
					t.Errorf("job-%d made %d times, want exactly once", i, got)
				}
			}
			if len(made) != n {
				t.Errorf("the legacy API holds %d names, want %d", len(made), n)
			}
		})
	}
}
