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

// atomicProcessConfig is jobsProcessConfig running all-or-nothing jobs,
// with an item_timeout short enough that a takeover's wait for the
// writes the dead owner had in flight stays short.
func atomicProcessConfig(addr, upstream, storage string) string {
	return strings.Replace(jobsProcessConfig(addr, upstream, storage), "atomicity partial", "atomicity all_or_nothing\n\t\titem_timeout 2s", 1)
}

// TestJobsAllOrNothingKilled runs an all-or-nothing create job on one of
// two Caddy processes sharing a real redis-server, and kills (SIGKILL)
// that process: going forward, the other carries the job on to
// succeeded, each element made once; while it undoes the job (a create
// refused in its last windows), the other goes on with the undo, and
// the legacy API ends as it began: nothing half done either way.
func TestJobsAllOrNothingKilled(t *testing.T) {
	for _, c := range []struct {
		name string
		undo bool
	}{
		{"going forward", false},
		{"while undoing", true},
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
			a := startCaddyProcess(t, bin, atomicProcessConfig(addrA, upstream.Listener.Addr().String(), storage), addrA)
			b := startCaddyProcess(t, bin, atomicProcessConfig(addrB, upstream.Listener.Addr().String(), storage), addrB)

			const n = 1500
			job := startWidgetJob(t, addrA, n, "atomic-import-"+prefix)
			if c.undo {
				awaitWidgets(t, api, 1100)
				api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 422, Body: "<p>name taken</p>", Times: 1})
				awaitUndoing(t, api, 100)
			} else {
				awaitWidgets(t, api, n/3)
			}
			if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = a.cmd.Wait()
			left := len(api.Items("/api/widgets"))
			if c.undo && left == 0 || !c.undo && left >= n {
				t.Fatalf("the job had got past where the test kills it (%d widgets) before its instance died", left)
			}

			st := awaitJobEnd(t, addrB, job, 2*time.Minute, b)
			made := map[string]int{}
			for _, w := range api.Items("/api/widgets") {
				made[fmt.Sprint(w["name"])]++
			}
			if c.undo {
				if st.State != "rolled_back" || st.Takeovers < 1 || len(made) != 0 {
					t.Errorf("the job ended %s with %d takeovers, the API holding %d widgets; want rolled_back by the other instance, nothing left", st.State, st.Takeovers, len(made))
				}
				return
			}
			if st.State != "succeeded" || st.Succeeded != n || st.Takeovers != 1 {
				t.Errorf("the job ended %s, %d succeeded, %d takeovers; want succeeded, %d, 1", st.State, st.Succeeded, st.Takeovers, n)
			}
			for i := range n {
				if got := made[fmt.Sprintf("job-%d", i)]; got != 1 {
					t.Errorf("job-%d made %d times, want exactly once", i, got)
				}
			}
		})
	}
}

// awaitUndoing waits, a minute at most, until the API holds k widgets
// fewer than the most it held: the job's undo is under way.
func awaitUndoing(t *testing.T, api *legacyapi.API, k int) {
	t.Helper()
	most := 0
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		held := len(api.Items("/api/widgets"))
		most = max(most, held)
		if held <= most-k {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API holds %d widgets, at most %d: the undo did not begin in a minute", held, most)
		}
	}
}
