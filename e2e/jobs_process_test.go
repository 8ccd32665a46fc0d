package e2e

import (
	"fmt"
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
			job := startWidgetJob(t, addrA, n, "nightly-import-"+prefix)
			awaitWidgets(t, api, n/3)
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

			st := awaitJobEnd(t, addrB, job, 2*time.Minute, b)
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
