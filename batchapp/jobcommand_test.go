package batchapp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-batch/caddy-batch/durable"
)

const testJobID = "0123456789abcdef0123456789abcdef"

// jobAt is a status of a 10-item job that has done done items; ended
// says it ended in state.
func jobAt(state string, done int, ended bool) *durable.JobStatus {
	st := &durable.JobStatus{ID: testJobID, State: state, Op: "create", Resource: "/api/widgets", Atomicity: "partial",
		Items: 10, Done: done, Succeeded: done, Results: "/api/jobs/" + testJobID + "/results"}
	if ended {
		at := time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC)
		st.Ended, st.Outcome = &at, state
	}
	return st
}

// fakeClock starts at a fixed time, and a sleep moves it on.
func fakeClock() (clock, *[]time.Duration) {
	at := time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC)
	var slept []time.Duration
	return clock{now: func() time.Time { return at }, sleep: func(d time.Duration) { slept = append(slept, d); at = at.Add(d) }}, &slept
}

// A watch on a pipe writes a line a poll, with the time, state, done of
// items and counts, items a second from the second poll on, and the
// outcome at the end, where it stops.
func TestWatchPlainLines(t *testing.T) {
	seq := []*durable.JobStatus{jobAt(durable.JobQueued, 0, false), jobAt(durable.JobRunning, 4, false), jobAt(durable.JobRunning, 8, false), jobAt(durable.JobSucceeded, 10, true)}
	polls := 0
	poll := func() (*durable.JobStatus, []byte, error) {
		st := seq[polls]
		polls++
		return st, nil, nil
	}
	var out bytes.Buffer
	c, slept := fakeClock()
	d := displayFor(&out, false)
	if _, ok := d.(*plainLines); !ok {
		t.Fatalf("a buffer's display is %T, want plain lines", d)
	}
	st, err := watchJob(poll, d, 2*time.Second, c)
	if err != nil || st.State != durable.JobSucceeded {
		t.Fatalf("watch ended %+v, %v", st, err)
	}
	want := []string{
		"2026-11-28T22:00:00Z queued 0/10 done, 0 succeeded, 0 failed",
		"2026-11-28T22:00:02Z running 4/10 done, 4 succeeded, 0 failed, 2 items/s",
		"2026-11-28T22:00:04Z running 8/10 done, 8 succeeded, 0 failed, 2 items/s",
		"2026-11-28T22:00:06Z succeeded 10/10 done, 10 succeeded, 0 failed, ended: outcome succeeded",
	}
	if got := strings.Split(strings.TrimSpace(out.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines\n%s\nwant\n%s", out.String(), strings.Join(want, "\n"))
	}
	if len(*slept) != 3 || (*slept)[0] != 2*time.Second {
		t.Errorf("slept %v, want 2s between each of the 4 polls", *slept)
	}
}

// The bar's text: the state, then items a second and time left once two
// polls tell them; the rate counts only what was done while watching.
func TestWatchRateAndTimeLeft(t *testing.T) {
	var m rateMeter
	at := time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC)
	st := &durable.JobStatus{State: durable.JobRunning, Items: 1000, Done: 500}
	m.add(at, 500)
	if got := m.describe(st); got != "running" {
		t.Errorf("after one poll: %q", got)
	}
	st.Done = 520
	m.add(at.Add(time.Second), 520)
	if got := m.describe(st); got != "running, 20 items/s, 24s left" {
		t.Errorf("after two polls: %q", got)
	}
	// Past the window, the old polls are forgotten.
	st.Done = 620
	m.add(at.Add(20*time.Second), 600)
	m.add(at.Add(21*time.Second), 620)
	if r, _ := m.perSecond(); r != 20 {
		t.Errorf("rate %v over the last polls, want 20", r)
	}
}

// A watch's exit status: 0 for a job that succeeded, 3 for one that left
// items behind, 4 for any other end.
func TestJobExit(t *testing.T) {
	for state, want := range map[string]int{
		durable.JobSucceeded: 0, durable.JobRollbackFailed: 3, durable.JobPartial: 4, durable.JobFailed: 4,
		durable.JobRolledBack: 4, durable.JobCancelled: 4,
	} {
		if got := jobExit(&durable.JobStatus{State: state}); got != want {
			t.Errorf("%s: exit %d, want %d", state, got, want)
		}
	}
}

func jobCommand(t *testing.T, name string) *cobra.Command {
	t.Helper()
	for _, c := range jobCommands() {
		if c.Name() == name {
			return c
		}
	}
	t.Fatalf("no subcommand %s", name)
	return nil
}

// Each job subcommand takes the admin endpoint's flags and --json, and
// its own.
func TestJobCommandFlags(t *testing.T) {
	for name, flags := range map[string][]string{
		"jobs":   {"state", "limit", "after"},
		"job":    {"watch", "interval"},
		"cancel": nil,
	} {
		c := jobCommand(t, name)
		for _, f := range append([]string{"address", "config", "adapter", "json"}, flags...) {
			if c.Flags().Lookup(f) == nil {
				t.Errorf("%s has no --%s", name, f)
			}
		}
	}
	if f := jobCommand(t, "job").Flags().Lookup("interval"); f.DefValue != "1s" {
		t.Errorf("--interval defaults to %s, want 1s", f.DefValue)
	}
	if f := jobCommand(t, "jobs").Flags().Lookup("limit"); f.DefValue != "100" {
		t.Errorf("--limit defaults to %s, want 100", f.DefValue)
	}
}

// fakeAdmin answers a job's status from seq, one a request (the last
// one again after), and a listing and a cancel; it records what it was
// asked.
func fakeAdmin(t *testing.T, seq ...*durable.JobStatus) (string, func() []string) {
	var mu sync.Mutex
	var asked []string
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, r.Method+" "+r.URL.RequestURI())
		var v any
		switch {
		case r.URL.Path == "/batch/jobs":
			v = []*durable.JobStatus{seq[len(seq)-1]}
		case r.Method == http.MethodPost:
			v = jobAt(durable.JobCancelling, 3, false)
			w.WriteHeader(http.StatusAccepted)
		default:
			v = seq[min(n, len(seq)-1)]
			n++
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), asked...)
	}
}

// run runs a job subcommand with args against the admin endpoint at
// addr, as caddy would: its exit status and what it printed.
func run(t *testing.T, addr, name string, args ...string) (int, string) {
	t.Helper()
	c := jobCommand(t, name)
	if err := c.Flags().Parse(append(args, "--address", addr)); err != nil {
		t.Fatal(err)
	}
	fl := caddycmd.Flags{FlagSet: c.Flags()}
	var out bytes.Buffer
	run := map[string]func(caddycmd.Flags, string, *bytes.Buffer) (int, error){
		"jobs":   func(fl caddycmd.Flags, id string, w *bytes.Buffer) (int, error) { return cmdJobs(fl, id, w) },
		"job":    func(fl caddycmd.Flags, id string, w *bytes.Buffer) (int, error) { return cmdJob(fl, id, w) },
		"cancel": func(fl caddycmd.Flags, id string, w *bytes.Buffer) (int, error) { return cmdCancel(fl, id, w) },
	}[name]
	code, err := run(fl, fl.Arg(0), &out)
	if err != nil {
		out.WriteString("error: " + err.Error())
		if code == 0 {
			t.Fatalf("an error with exit 0: %v", err)
		}
	}
	return code, out.String()
}

// The subcommands against an admin endpoint: a watch polls until the
// job ends, a line a poll, and exits as the job ended; --json writes
// the statuses as they came, a line each; the list and the cancel call
// their routes.
func TestJobCommandsAgainstAdmin(t *testing.T) {
	addr, asked := fakeAdmin(t, jobAt(durable.JobRunning, 2, false), jobAt(durable.JobRunning, 6, false), jobAt(durable.JobPartial, 10, true))
	code, out := run(t, addr, "job", testJobID, "--watch", "--interval", "10ms")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitJobNotAll || len(lines) != 3 || !regexp.MustCompile(`Z partial 10/10 done, 10 succeeded, 0 failed, ended: outcome partial$`).MatchString(lines[2]) {
		t.Errorf("watch of a job that ends partial: exit %d\n%s", code, out)
	}
	if !regexp.MustCompile(`^\S+Z running 2/10 done`).MatchString(lines[0]) {
		t.Errorf("first line %q", lines[0])
	}
	for _, a := range asked() {
		if a != "GET /batch/jobs/"+testJobID {
			t.Errorf("a watch asked %s", a)
		}
	}

	addr, _ = fakeAdmin(t, jobAt(durable.JobRunning, 2, false), jobAt(durable.JobSucceeded, 10, true))
	code, out = run(t, addr, "job", testJobID, "--watch", "--interval", "10ms", "--json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	var last durable.JobStatus
	if code != 0 || len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &last) != nil || last.State != durable.JobSucceeded {
		t.Errorf("watch --json of a job that succeeds: exit %d\n%s", code, out)
	}

	addr, asked = fakeAdmin(t, jobAt(durable.JobRunning, 2, false))
	if code, out = run(t, addr, "job", testJobID); code != 0 || !strings.Contains(out, "2 done of 10") || !strings.Contains(out, "running") {
		t.Errorf("job without --watch: exit %d\n%s", code, out)
	}
	if code, out = run(t, addr, "jobs", "--state", "running", "--limit", "5"); code != 0 || !strings.Contains(out, testJobID) || !strings.Contains(out, "2/10") {
		t.Errorf("jobs: exit %d\n%s", code, out)
	}
	if code, out = run(t, addr, "cancel", testJobID); code != 0 || !strings.Contains(out, "cancelling "+testJobID) {
		t.Errorf("cancel: exit %d\n%s", code, out)
	}
	got := asked()
	if len(got) != 3 || got[1] != "GET /batch/jobs?limit=5&state=running" || got[2] != "POST /batch/jobs/"+testJobID+"/cancel" {
		t.Errorf("asked %v", got)
	}

	if code, out = run(t, addr, "job", testJobID, "--watch", "--interval", "0s"); code != 1 || !strings.Contains(out, "--interval") {
		t.Errorf("--interval 0s: exit %d\n%s", code, out)
	}
}
