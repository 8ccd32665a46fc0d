package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The kill tests run the repository's cmd/caddy as a separate process,
// built once per test run, in front of a slow fake legacy API served by
// the test process, and kill it (SIGKILL: no deferred function, no
// graceful stop) in the middle of an all-or-nothing batch. Another Caddy
// on the same storage must then put the API back as it was.

// caddyProcess is a running cmd/caddy.
type caddyProcess struct {
	cmd *exec.Cmd
	log string // its stderr, where it logs as JSON
}

// killConfig is the Caddyfile of a gateway at addr in front of upstream,
// keeping its storage in dir.
func killConfig(addr, upstream, dir, options string) string {
	return fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https off
	grace_period 1s
	storage file_system %[3]s
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
		concurrency 2
		%[4]s
		resource /api/widgets {
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE
		}
	}
	reverse_proxy %[2]s
}
`, addr, upstream, dir, options)
}

// startCaddyProcess runs the binary with config until it serves addr.
func startCaddyProcess(t testing.TB, bin, config, addr string) *caddyProcess {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &caddyProcess{log: filepath.Join(dir, "caddy.log")}
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	p.cmd = exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// Caddy's own files (autosaves, certificates) stay out of the home
	// directory.
	p.cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir, "HOME="+dir)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("log of caddy (pid %d):\n%s", p.cmd.Process.Pid, p.tail(40))
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// The process itself listens there: what answers at addr may be
		// another program's, when this one could not bind it. (Its log
		// cannot say: a quiet config discards it.)
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			if listens(p.cmd.Process.Pid, addr) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy did not serve %s within 30s:\n%s", addr, p.tail(40))
		}
	}
}

// listens reports whether process pid holds a socket listening on
// addr's port (on any address: a site may bind every interface): the
// inode of a listening socket of that port in /proc/net/tcp or tcp6
// among the process's open files. Where there is no /proc, it takes
// what answers at addr for the process.
func listens(pid int, addr string) bool {
	_, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	suffix := fmt.Sprintf(":%04X", n)
	inodes := map[string]bool{}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		table, err := os.ReadFile(name)
		if err != nil {
			return true
		}
		for _, line := range strings.Split(string(table), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], suffix) && f[3] == "0A" {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && inodes[target] {
			return true
		}
	}
	return false
}

// kill sends SIGKILL and reaps the process.
func (p *caddyProcess) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

func (p *caddyProcess) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// entries returns the log entries of the batch app's logger.
func (p *caddyProcess) entries(t *testing.T) []map[string]any {
	t.Helper()
	return p.entriesOf(t, "batch")
}

// entriesOf returns the log entries of the named logger
// ("http.handlers.batch" is the handler's), or of every logger for "".
func (p *caddyProcess) entriesOf(t *testing.T, logger string) []map[string]any {
	t.Helper()
	f, err := os.Open(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) == nil && (logger == "" || e["logger"] == logger) {
			out = append(out, e)
		}
	}
	return out
}

// killCase is an all-or-nothing batch of 20 items at concurrency 2
// against an API whose writes take 250 ms, killed after 6 writes.
type killCase struct {
	name    string
	method  string
	target  string
	body    string
	options string // handler options
	keys    bool   // the API honours Idempotency-Key
	// orphans says that creates in flight at the kill may be left (their
	// ids cannot be learned), each named in the recovery's ERROR line.
	orphans bool
	// fault, if set, fails one item, so that the saga is compensating
	// when it is killed after killAfter writes (default killAfterWrites).
	fault     *legacyapi.Fault
	killAfter int
}

func killCases() []killCase {
	var creates, updates []string
	var ids []string
	for i := range 20 {
		creates = append(creates, fmt.Sprintf(`{"name":"new %d"}`, i))
		updates = append(updates, fmt.Sprintf(`{"id":%d,"name":"renamed %d"}`, i+1, i+1))
		ids = append(ids, fmt.Sprint(i+1))
	}
	create := "[" + strings.Join(creates, ",") + "]"
	return []killCase{
		{name: "create", method: "POST", target: "/api/widgets", body: create, orphans: true},
		{name: "create, idempotent upstream", method: "POST", target: "/api/widgets", body: create, options: "idempotent_upstream", keys: true},
		{name: "update", method: "PATCH", target: "/api/widgets", body: "[" + strings.Join(updates, ",") + "]"},
		{name: "delete", method: "DELETE", target: "/api/widgets?ids=" + strings.Join(ids, ",")},
		// Items 1-7 are written, item 8 fails, and the saga is killed
		// with its undos half sent: those recorded as being sent are read
		// before anything is sent again.
		{name: "update, killed while undoing", method: "PATCH", target: "/api/widgets", body: "[" + strings.Join(updates, ",") + "]",
			fault: &legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/8", Status: 500, Body: htmlError}, killAfter: 7 + 3},
	}
}

// killCaseNamed is the case of killCases with that name.
func killCaseNamed(name string) killCase {
	for _, tc := range killCases() {
		if tc.name == name {
			return tc
		}
	}
	panic("no kill case named " + name)
}

const (
	killConcurrency = 2
	killAfterWrites = 6
)

func killAPI(keys bool) *legacyapi.API {
	return legacyapi.New(legacyapi.Collection{
		Path: "/api/widgets", PutCreates: true, HonorKeys: keys,
		WriteDelay: 250 * time.Millisecond, Seed: records("w", 1, 20),
	})
}

// sendAndKill sends the batch to the gateway at addr and kills p once
// the API applied killAfterWrites writes, mid-batch. It returns when p
// was killed.
func sendAndKill(t *testing.T, p *caddyProcess, addr string, api *legacyapi.API, tc killCase) time.Time {
	t.Helper()
	go func() {
		req, _ := http.NewRequest(tc.method, "http://"+addr+tc.target, strings.NewReader(tc.body))
		if tc.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer kill-test")
		if resp, err := (&http.Client{Timeout: time.Minute}).Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the batch was answered %d before the gateway was killed", resp.StatusCode)
		}
	}()
	after := killAfterWrites
	if tc.killAfter > 0 {
		after = tc.killAfter
	}
	for deadline := time.Now().Add(20 * time.Second); api.Writes().Applied < after; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the batch did not get to %d writes: %v", after, api.Writes())
		}
	}
	p.kill()
	return time.Now()
}

// awaitRecovery waits until the API's items (as state reads them) are
// as before the batch (or, where orphans may be left, no longer
// changing) and the journal is gone from storage. It returns the time of
// the API's last change: the last undo.
func awaitRecovery(t *testing.T, api *legacyapi.API, state func() any, before any, dir string, orphans bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	last, lastChange := state(), time.Now()
	for {
		time.Sleep(20 * time.Millisecond)
		now := state()
		if !reflect.DeepEqual(now, last) {
			last, lastChange = now, time.Now()
		}
		if len(journalKeys(t, dir)) == 0 && api.InFlight() == 0 && (reflect.DeepEqual(now, before) || orphans && time.Since(lastChange) > time.Second) {
			return lastChange
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered within a minute: journal %v\n got %v\nwant %v", journalKeys(t, dir), now, before)
		}
	}
}

// widgetsOf is the state a kill test of widget batches compares.
func widgetsOf(api *legacyapi.API) func() any {
	return func() any { return api.Items("/api/widgets") }
}

// recoveryLine waits for the recovery's log line in recoverer's log,
// which comes just after it removed the journal, and returns it; there
// must be one.
func recoveryLine(t *testing.T, recoverer *caddyProcess) map[string]any {
	t.Helper()
	var logs, recovered []map[string]any
	for deadline := time.Now().Add(5 * time.Second); len(recovered) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		logs = recoverer.entries(t)
		for _, e := range logs {
			if msg, _ := e["msg"].(string); strings.HasPrefix(msg, "recovered a batch") {
				recovered = append(recovered, e)
			}
		}
	}
	if len(recovered) != 1 {
		t.Fatalf("%d recovery log lines, want 1: %v", len(recovered), logs)
	}
	return recovered[0]
}

// checkRecovered checks the API's final state against the one before the
// batch: equal, or, where creates in flight may be orphaned, at most
// concurrency more items, each named in the recovery's ERROR line.
func checkRecovered(t *testing.T, api *legacyapi.API, before map[string]map[string]any, tc killCase, recoverer *caddyProcess) {
	t.Helper()
	after := api.Items("/api/widgets")
	line := recoveryLine(t, recoverer)
	if !tc.orphans {
		if !reflect.DeepEqual(after, before) {
			t.Fatalf("the API was not put back:\n got %v\nwant %v", after, before)
		}
		if line["outcome"] != "rolled_back" {
			t.Errorf("recovery logged %v, want rolled_back", line)
		}
		return
	}
	var orphans []string
	for id, rec := range after {
		if _, ok := before[id]; !ok {
			orphans = append(orphans, fmt.Sprint(rec["name"]))
		} else if !reflect.DeepEqual(rec, before[id]) {
			t.Errorf("item %s changed: %v, was %v", id, rec, before[id])
		}
	}
	if len(orphans) > killConcurrency {
		t.Fatalf("%d items left behind (%v), want at most %d (the creates in flight)", len(orphans), orphans, killConcurrency)
	}
	// A create recorded as about to be sent, whose id is unknown, is
	// reported as maybe left behind: the kill may have come before it
	// left, or after it was applied.
	reported, _ := line["left_behind"].([]any)
	left, _ := json.Marshal(reported)
	t.Logf("%d creates in flight at the kill left behind: %v; the recovery's left_behind: %s", len(orphans), orphans, left)
	switch {
	case len(reported) > killConcurrency:
		t.Errorf("the recovery reports %d items left behind, want at most %d (the creates in flight): %s", len(reported), killConcurrency, left)
	case len(reported) == 0 && line["outcome"] != "rolled_back":
		t.Errorf("recovery logged %v, want rolled_back", line)
	case len(reported) > 0 && (line["level"] != "error" || line["outcome"] != "rollback_failed"):
		t.Errorf("recovery logged %v, want rollback_failed at ERROR", line)
	}
	for _, name := range orphans {
		var index int
		if _, err := fmt.Sscanf(name, "new %d", &index); err != nil {
			t.Fatalf("an item the batch did not send: %q", name)
		}
		if !regexp.MustCompile(fmt.Sprintf(`"item %d[: ]`, index)).Match(left) {
			t.Errorf("left behind: %q (item %d), not named in the ERROR line's left_behind %s", name, index, left)
		}
	}
}

// TestJournalKillAndRestart kills a Caddy mid all-or-nothing CREATE,
// UPDATE and DELETE and restarts it on the same storage: the restarted
// Caddy finishes the dead one's saga and puts the API back as it was
// before the batch — all of it, writes in flight at the kill included,
// except a plain create in flight, whose id no one can learn (at most
// concurrency of them, each named in the ERROR line).
func TestJournalKillAndRestart(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	for _, tc := range killCases() {
		// Each case has its own API, processes, ports and storage.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := killAPI(tc.keys)
			if tc.fault != nil {
				api.Inject(*tc.fault)
			}
			upstream := httptest.NewServer(api)
			defer upstream.Close()
			defer api.Close()
			before := api.Items("/api/widgets")
			dir, addr := t.TempDir(), freeAddr(t)
			config := killConfig(addr, upstream.Listener.Addr().String(), dir, tc.options)

			first := startCaddyProcess(t, bin, config, addr)
			killed := sendAndKill(t, first, addr, api, tc)
			if len(journalKeys(t, dir)) == 0 {
				t.Fatal("the killed Caddy left no journal")
			}
			second := startCaddyProcess(t, bin, config, addr)
			lastUndo := awaitRecovery(t, api, widgetsOf(api), before, dir, tc.orphans)
			t.Logf("recovered: kill to last undo %v", lastUndo.Sub(killed).Round(time.Millisecond))
			checkRecovered(t, api, before, tc, second)
		})
	}
}

// TestJournalKillOneOfTwo runs two Caddy processes on one storage, as a
// cluster, and kills the one running a batch: the other, never
// restarted, finishes the saga once the dead one's lease lapses.
func TestJournalKillOneOfTwo(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	tc := killCaseNamed("update")
	api := killAPI(false)
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	before := api.Items("/api/widgets")
	dir := t.TempDir()
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := startCaddyProcess(t, bin, killConfig(addrA, upstream.Listener.Addr().String(), dir, ""), addrA)
	b := startCaddyProcess(t, bin, killConfig(addrB, upstream.Listener.Addr().String(), dir, ""), addrB)
	killed := sendAndKill(t, a, addrA, api, tc)
	lastUndo := awaitRecovery(t, api, widgetsOf(api), before, dir, false)
	t.Logf("recovered by the other instance: kill to last undo %v", lastUndo.Sub(killed).Round(time.Millisecond))
	checkRecovered(t, api, before, tc, b)
}

// TestJournalGracefulStop stops a Caddy (SIGTERM) in the middle of an
// all-or-nothing UPDATE. Its servers close the client's connection after
// grace_period, which stops the batch, but the process waits for the
// saga to finish before it exits: the API ends as before the batch or
// with every item updated, never half, and no journal is left for a
// recovery to find.
func TestJournalGracefulStop(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	tc := killCaseNamed("update")
	api := killAPI(false)
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	before := api.Items("/api/widgets")
	dir, addr := t.TempDir(), freeAddr(t)
	p := startCaddyProcess(t, bin, killConfig(addr, upstream.Listener.Addr().String(), dir, ""), addr)
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(tc.method, "http://"+addr+tc.target, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	for deadline := time.Now().Add(20 * time.Second); api.Writes().Applied < killAfterWrites; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the batch did not get to %d writes", killAfterWrites)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("caddy exited with %v:\n%s", err, p.tail(20))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("caddy did not exit within 30s of SIGTERM")
	}
	t.Logf("the client got %d (0: the connection was closed)", <-answered)
	if left := journalKeys(t, dir); len(left) != 0 {
		t.Errorf("the stopped Caddy left its saga unfinished: %v", left)
	}
	after := api.Items("/api/widgets")
	if reflect.DeepEqual(after, before) {
		return
	}
	for id, rec := range after {
		if rec["name"] != "renamed "+id {
			t.Fatalf("half of the batch was left: item %s is %v\n got %v\nwant %v or every item renamed", id, rec, after, before)
		}
	}
}

// TestEnvelopeKilled kills a Caddy in the middle of an all-or-nothing
// envelope that creates a user and two posts of theirs, then patches
// another user, held at the legacy API once that patch is applied; a
// restarted Caddy, or the other of two on the same storage, must put the
// API back as it was, undoing dependents before what they depend on
// (docs/envelope.md, "As for batches"), and log the recovery as the
// envelope's.
func TestEnvelopeKilled(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	envelope := strings.TrimSuffix(userWithPostsEnvelope, "\n]}") + `,
	{"id": "m", "method": "PATCH", "url": "/api/users/2", "body": {"name": "renamed"}, "depends_on": ["p1", "p2"]}
]}`
	for _, restart := range []bool{true, false} {
		t.Run(map[bool]string{true: "restarted", false: "the other of two"}[restart], func(t *testing.T) {
			api := shopAPI()
			held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: "/api/users/2", AfterApply: true, Times: 1})
			defer release()
			api.Inject(held)
			upstream := httptest.NewServer(api)
			defer upstream.Close()
			defer api.Close()
			state := func() any {
				return []any{api.Items("/api/users"), api.Items("/api/users/1/posts"), len(api.Items("/api/users/1000/posts"))}
			}
			before := state()
			dir, addr := t.TempDir(), freeAddr(t)
			options := "envelope /api/batch" + shopResources
			first := startCaddyProcess(t, bin, killConfig(addr, upstream.Listener.Addr().String(), dir, options), addr)
			var recoverer *caddyProcess
			if !restart {
				other := freeAddr(t)
				recoverer = startCaddyProcess(t, bin, killConfig(other, upstream.Listener.Addr().String(), dir, options), other)
			}
			// The kill comes once the user, the posts and the patch are applied.
			sendAndKill(t, first, addr, api, killCase{method: "POST", target: "/api/batch", body: envelope, killAfter: 4})
			if len(journalKeys(t, dir)) == 0 {
				t.Fatal("the killed Caddy left no journal")
			}
			if restart {
				recoverer = startCaddyProcess(t, bin, killConfig(addr, upstream.Listener.Addr().String(), dir, options), addr)
			}
			awaitRecovery(t, api, state, before, dir, false)
			line := recoveryLine(t, recoverer)
			if line["op"] != "envelope" || line["path"] != "/api/batch" || line["items"] != float64(4) || line["outcome"] != "rolled_back" {
				t.Errorf("the recovery's log line does not name the envelope rolled back: %v", line)
			}
			checkUndoOrder(t, appliedWrites(api))
		})
	}
}

// checkUndoOrder checks the writes of TestEnvelopeKilled: the envelope's
// four, then their undos, each dependent's before what it depends on.
func checkUndoOrder(t *testing.T, writes []string) {
	t.Helper()
	at := map[string]int{}
	for i, w := range writes {
		at[w] = i
	}
	const (
		user, post1, post2 = "DELETE /api/users/1000", "DELETE /api/users/1000/posts/1000", "DELETE /api/users/1000/posts/1001"
		restore            = "PUT /api/users/2"
	)
	undos := []string{restore, post1, post2, user}
	if len(writes) != 8 || len(at) != 7 || !slices.Equal(writes[:4:4], []string{"POST /api/users", writes[1], writes[2], "PATCH /api/users/2"}) {
		t.Fatalf("writes carried out:\n\t%s\nwant the envelope's four, then %v", strings.Join(writes, "\n\t"), undos)
	}
	for _, w := range undos {
		if _, ok := at[w]; !ok || at[w] < 4 {
			t.Fatalf("no undo %s after the envelope's writes:\n\t%s", w, strings.Join(writes, "\n\t"))
		}
	}
	if at[restore] > at[post1] || at[restore] > at[post2] || at[post1] > at[user] || at[post2] > at[user] {
		t.Errorf("undos out of dependency order (the patch, which depends on the posts, first; the user last):\n\t%s", strings.Join(writes, "\n\t"))
	}
}
