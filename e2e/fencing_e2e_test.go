package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/tcprelay"
)

// The fencing tests (docs/durability.md, "Clusters"): two Caddy
// processes on one redis-server of the test's own, instance A reaching
// it through a relay the test controls (internal/tcprelay), B directly.
// A runs a 12-item all-or-nothing PATCH one item at a time against an
// API whose writes are slow, so that the batch spans several leases; the
// test then partitions A from Redis, cuts it off, pauses it, or restarts
// Redis empty under it, for longer than a lease, while B's recovery
// scan looks on. What they assert is what a client and an operator can
// see once the dust settles: the legacy API's final state, A's answer,
// the admin API's listing, the logs and the keys left in Redis — never
// how the instances got there, so that they hold for any implementation
// of the rule that a saga never writes after it lost its lease.

const (
	fencingLease = 3 * time.Second
	fencingItems = 12
	// fencingWriteDelay makes the batch last three leases, its undos
	// about as long again.
	fencingWriteDelay = 750 * time.Millisecond
	// fencingFault is how long a fault lasts: past the lease, so that B
	// may take the saga over, and short of the Redis client's timeout
	// (fencingRedisTimeout), so that a held call completes, late.
	fencingFault = fencingLease * 3 / 2
	// fencingFaultMax is how long a fault lasts at most, while no undo
	// has been seen: B's takeover must come before A wakes for the test
	// to show anything, and a slow machine delays it. It stays short of
	// the Redis client's timeout.
	fencingFaultMax     = fencingLease * 5 / 2
	fencingRedisTimeout = "10"
	fencingPrefix       = "batchtest-fencing"
	// faultAfter is how many of the batch's writes are applied before
	// the fault.
	faultAfter = 3
)

// fencingCluster is the two instances, their Redis and A's relay.
type fencingCluster struct {
	api    *legacyapi.API
	redis  *redisProcess
	relay  *tcprelay.Relay
	a, b   *caddyProcess
	addrA  string
	adminB *gateway // the admin endpoint of B, which reaches Redis directly
}

// startFencingCluster starts the API, Redis, the relay and the two
// instances; it skips the test where redis-server is not installed (the
// test restarts its own, so miniredis or a shared server cannot stand in).
func startFencingCluster(t *testing.T) *fencingCluster {
	t.Helper()
	bin := caddyBinary(t)
	if !hasRedisServer() {
		t.Skip("the fencing tests start (and restart) a redis-server of their own: install redis-server")
	}
	c := &fencingCluster{api: legacyapi.NewRecording(legacyapi.Collection{
		Path: "/api/widgets", WriteDelay: fencingWriteDelay, Seed: records("w", 1, fencingItems)})}
	upstream := newUpstream(t, c.api)
	c.redis = startRedisProcess(t)
	relay, err := tcprelay.New(c.redis.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	c.relay = relay
	resource := "item_locks storage\n\t\tjournal on\n\t\titem_timeout 5s\n\t\t" + widgetsResource("put")
	lease := fencingLease.String()
	c.addrA = freeAddr(t)
	c.a = startCaddyProcess(t, bin, operatedConfig(c.addrA, "off", upstream, fencingStorage(relay.Addr()), lease, resource), c.addrA)
	addrB, adminB := freeAddr(t), freeAddr(t)
	c.b = startCaddyProcess(t, bin, operatedConfig(addrB, adminB, upstream, fencingStorage(c.redis.addr), lease, resource), addrB)
	c.adminB = processAdmin(adminB)
	return c
}

// fencingStorage is the Redis storage option for the server at addr,
// with a client timeout longer than a fault: the Redis client's default
// (3s) would fail a held call instead of letting it complete late, as a
// healed partition does.
func fencingStorage(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	return strings.Replace(redisOption(host, port, fencingPrefix), "\n\t}", "\n\t\ttimeout "+fencingRedisTimeout+"\n\t}", 1)
}

// fencingIDs are the batch's items' ids.
func fencingIDs() []string {
	var ids []string
	for i := 1; i <= fencingItems; i++ {
		ids = append(ids, fmt.Sprint(i))
	}
	return ids
}

// sendBatch sends A the batch that renames every widget, and returns
// where its answer will come: a response, or one with Status 0 and the
// error in its body. The client waits longer than the test does.
func (c *fencingCluster) sendBatch() <-chan response {
	var items []string
	for _, id := range fencingIDs() {
		items = append(items, fmt.Sprintf(`{"id": %s, "name": "renamed %s"}`, id, id))
	}
	answer := make(chan response, 1)
	go func() {
		r, err := send(&http.Client{Timeout: 2 * time.Minute}, "http://"+c.addrA, "PATCH", "/api/widgets", "["+strings.Join(items, ", ")+"]")
		if err != nil {
			r = response{Body: []byte(err.Error())}
		}
		answer <- r
	}()
	return answer
}

// awaitWrites waits until the API applied n of the batch's writes, and
// returns the saga's id as its journal's keys in Redis name it.
func (c *fencingCluster) awaitWrites(t *testing.T, n int) string {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%d writes applied", n), func() bool { return c.api.Writes().Applied >= n })
	sagas := journalSagas(t, c.redis.addr)
	if len(sagas) != 1 {
		t.Fatalf("journals in Redis after %d writes: %v, want the batch's one", n, sagas)
	}
	for saga := range sagas {
		return saga
	}
	return ""
}

// journalSagas lists the journals in Redis: each saga's keys, by saga.
func journalSagas(t *testing.T, addr string) map[string][]string {
	t.Helper()
	out, err := redisCommand(addr, "KEYS", fencingPrefix+"/batch/v1/journal/*")
	if err != nil {
		t.Fatalf("listing the journals' keys: %v", err)
	}
	sagas := map[string][]string{}
	for key := range strings.FieldsSeq(out) {
		rest := strings.TrimPrefix(key, fencingPrefix+"/batch/v1/journal/")
		saga, _, _ := strings.Cut(rest, "/")
		sagas[saga] = append(sagas[saga], key)
	}
	return sagas
}

// indexed reports whether the Redis module's folder index of the
// journals names saga, as its List reads it.
func indexed(t *testing.T, addr, saga string) bool {
	t.Helper()
	out, err := redisCommand(addr, "ZRANGE", fencingPrefix+"/batch/v1/journal", "0", "-1")
	if err != nil {
		t.Fatalf("reading the journals' folder index: %v", err)
	}
	return slices.Contains(strings.Fields(out), saga+"/")
}

// TestFencingFaults runs the batch on A and, once three of its items are
// written, gives A one fault for 1.5 × lease: B may take the saga over
// meanwhile. Once the dust settles the API holds every item as it was or
// every item renamed, A's answer says which, a 500 is backed by a saga
// the admin API lists, and no journal is left in Redis.
func TestFencingFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		start, lift func(*testing.T, *fencingCluster)
		partitionsA bool
	}{
		// A's storage calls hang, then complete: a partition that heals.
		{"partition", func(_ *testing.T, c *fencingCluster) { c.relay.Hold() }, func(_ *testing.T, c *fencingCluster) { c.relay.Release() }, true},
		// A's storage calls fail at once: a network that is down.
		{"cut", func(_ *testing.T, c *fencingCluster) { c.relay.Cut() }, func(_ *testing.T, c *fencingCluster) { c.relay.Restore() }, true},
		// A stops altogether: a long GC pause, SIGSTOP, a VM migrated.
		{"pause", func(t *testing.T, c *fencingCluster) { c.a.signal(t, syscall.SIGSTOP) }, func(t *testing.T, c *fencingCluster) { c.a.signal(t, syscall.SIGCONT) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := startFencingCluster(t)
			answers := c.sendBatch()
			saga := c.awaitWrites(t, faultAfter)
			tc.start(t, c)
			lasted := c.awaitUndo()
			tc.lift(t, c)
			t.Logf("the fault lasted %v", lasted.Round(10*time.Millisecond))
			answer := c.settle(t, answers)
			t.Logf("A answered %d %q (Retry-After %q); the API ends %s", answer.Status, outcomeOf(answer), answer.Header.Get("Retry-After"), describeWidgets(c.api))
			assertAllOrNothing(t, c.api, fencingIDs(), answer)
			c.checkAnswerBacked(t, answer, saga)
			c.checkNoJournalLeft(t)
		})
	}
}

// awaitUndo waits while a fault lasts: fencingFault, and on until an
// undo of the batch (a write putting an item's original name back) has
// reached the API, for fencingFaultMax at most. It returns how long the
// fault lasted.
func (c *fencingCluster) awaitUndo() time.Duration {
	start := time.Now()
	time.Sleep(fencingFault)
	for time.Since(start) < fencingFaultMax && !undoSeen(c.api) {
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// undoSeen reports whether a write that puts a widget's original name
// back has reached the API.
func undoSeen(api *legacyapi.API) bool {
	for _, r := range writes(api.Requests()) {
		if originalName.Match(r.Body) {
			return true
		}
	}
	return false
}

var originalName = regexp.MustCompile(`"name":\s*"w\d+"`)

// signal sends sig to the process.
func (p *caddyProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("sending %v to caddy (pid %d): %v", sig, p.cmd.Process.Pid, err)
	}
}

// settle waits for A's answer, then until B's admin API lists no saga
// running or orphaned, the API serves no write and its items have not
// changed for a second: the dust has settled. A cluster that does not
// settle within 30s fails the test, which then goes on to check what it
// left.
func (c *fencingCluster) settle(t *testing.T, answers <-chan response) response {
	t.Helper()
	var answer response
	select {
	case answer = <-answers:
	case <-time.After(60 * time.Second):
		t.Fatalf("A did not answer within a minute; the API holds %s", describeWidgets(c.api))
	}
	if answer.Status == 0 {
		t.Errorf("A's client got no answer: %s", answer.Body)
	}
	c.awaitQuiet(t, 30*time.Second, func() bool { return true })
	return answer
}

// awaitQuiet waits until done holds, B's admin API lists no saga
// running or orphaned, the API serves no write and its items have not
// changed for a second; after within, it fails the test and returns.
func (c *fencingCluster) awaitQuiet(t *testing.T, within time.Duration, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	last, since := c.api.Items("/api/widgets"), time.Now()
	var busy []summaryJSON
	for ; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if now := c.api.Items("/api/widgets"); !reflect.DeepEqual(now, last) {
			last, since = now, time.Now()
		}
		busy = busy[:0]
		for _, s := range listSagas(t, c.adminB, "") {
			if s.State == "running" || s.State == "orphaned" {
				busy = append(busy, s)
			}
		}
		if len(busy) == 0 && c.api.InFlight() == 0 && time.Since(since) > time.Second && done() {
			return
		}
	}
	t.Errorf("the cluster did not settle within %v: sagas %+v, API in flight %d, items %s", within, busy, c.api.InFlight(), describeWidgets(c.api))
}

// assertAllOrNothing fails the test unless the batch that renamed ids
// left every one of them as it was, or every one renamed, and answer
// (the client's) tells no outcome the API's items belie: succeeded only
// when every item is renamed, rolled_back only when none is.
func assertAllOrNothing(t *testing.T, api *legacyapi.API, ids []string, answer response) {
	t.Helper()
	var original, renamed, other []string
	for _, id := range ids {
		w, _ := api.Item("/api/widgets", id)
		switch w["name"] {
		case "w" + id:
			original = append(original, id)
		case "renamed " + id:
			renamed = append(renamed, id)
		default:
			other = append(other, fmt.Sprintf("%s=%v", id, w))
		}
	}
	state := fmt.Sprintf("original %v, renamed %v, other %v", original, renamed, other)
	if len(original) != len(ids) && len(renamed) != len(ids) {
		t.Errorf("the batch was left half done: %s (A answered %d %q)", state, answer.Status, outcomeOf(answer))
	}
	outcome := outcomeOf(answer)
	switch {
	case (answer.Status == 200 || outcome == "succeeded") && len(renamed) != len(ids):
		t.Errorf("A told its client %d %q, but the API holds %s", answer.Status, outcome, state)
	case outcome == "rolled_back" && len(original) != len(ids):
		t.Errorf("A told its client %d rolled_back, but the API holds %s", answer.Status, state)
	}
}

// outcomeOf is a batch answer's outcome; "" for an answer that is no
// batch answer.
func outcomeOf(r response) string {
	var b struct {
		Outcome string `json:"outcome"`
	}
	_ = json.Unmarshal(r.Body, &b)
	return b.Outcome
}

// checkAnswerBacked fails the test unless A's answer is one the promise
// allows: succeeded or rolled_back (assertAllOrNothing checks them
// against the API); 500 rollback_failed naming, in A's log line, a saga
// the admin API shows; or 503 with Retry-After, naming the saga.
func (c *fencingCluster) checkAnswerBacked(t *testing.T, answer response, saga string) {
	t.Helper()
	switch outcome := outcomeOf(answer); {
	case answer.Status == 200 && outcome == "succeeded", outcome == "rolled_back":
	case answer.Status == 500 && outcome == "rollback_failed":
		var kept string
		for _, e := range c.a.entriesOf(t, "http.handlers.batch") {
			if e["outcome"] == "rollback_failed" {
				kept, _ = e["saga"].(string)
			}
		}
		if kept == "" {
			t.Errorf("A answered rollback_failed and its log line names no kept saga: %v", c.a.entriesOf(t, "http.handlers.batch"))
		} else if r := c.adminB.adminDo(t, "GET", "/batch/sagas/"+kept, nil); r.Status != 200 {
			t.Errorf("A answered rollback_failed and logged saga %s, which the admin API answers %s", kept, r)
		}
	case answer.Status == 503 && answer.Header.Get("Retry-After") != "" && strings.Contains(string(answer.Body), saga):
	default:
		t.Errorf("A answered %s: not an answer the promise allows (succeeded, rolled_back, a rollback_failed kept, or 503 with Retry-After naming saga %s)", answer, saga)
	}
}

// checkNoJournalLeft fails the test if a journal is left in Redis for a
// saga the admin API does not list as stuck or left behind: an ended
// saga's keys leaked.
// A saga taken over keeps its end marker a lease after its end, for the
// owner that lost it to learn how it ended; a scan then clears it.
func (c *fencingCluster) checkNoJournalLeft(t *testing.T) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(3*fencingLease + 2*time.Second); ; time.Sleep(100 * time.Millisecond) {
		listed := map[string]string{}
		for _, s := range listSagas(t, c.adminB, "") {
			listed[s.ID] = s.State
		}
		left = nil
		for saga, keys := range journalSagas(t, c.redis.addr) {
			if !indexed(t, c.redis.addr, saga) {
				// The Redis module stores a key as two commands, the folder
				// index's ZADD and the SET: a Redis restarted between them
				// keeps a key no listing shows, nobody reads, and nothing
				// can find to delete (docs/durability.md, "Durability:
				// the saga journal": what cannot survive). What it recorded is in the saga the lost owner
				// kept, which checkNotDeletedInSilence asks for.
				t.Logf("saga %s: keys the Redis module never indexed, after the restart: %v", saga, keys)
				continue
			}
			if st := listed[saga]; st != "stuck" && st != "left_behind" {
				left = append(left, fmt.Sprintf("saga %s (listed %q) left its journal's keys in Redis: %v", saga, st, keys))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, l := range left {
		t.Error(l)
	}
}

// describeWidgets is the API's widgets, by id, as the tests read them.
func describeWidgets(api *legacyapi.API) string {
	var b strings.Builder
	for _, id := range fencingIDs() {
		w, ok := api.Item("/api/widgets", id)
		switch {
		case !ok:
			fmt.Fprintf(&b, " %s:absent", id)
		case w["name"] == "w"+id:
			fmt.Fprintf(&b, " %s:original", id)
		case w["name"] == "renamed "+id:
			fmt.Fprintf(&b, " %s:renamed", id)
		default:
			fmt.Fprintf(&b, " %s:%v", id, w["name"])
		}
	}
	return "[" + strings.TrimSpace(b.String()) + "]"
}

// TestFencingRedisRestartedEmpty restarts Redis, without persistence,
// under the batch once three items are written (A's calls wait in the
// relay meanwhile, so none fails), lets A write up to two more items
// into the empty Redis, and kills A. What A wrote there is a journal
// without its beginning: B's recovery must undo it, or list it stuck
// with a reason and log an ERROR naming it — never delete it in silence,
// leaving the items renamed with nothing listed and nothing logged.
func TestFencingRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	c := startFencingCluster(t)
	c.sendBatch() // A is killed: its client gets no answer
	saga := c.awaitWrites(t, faultAfter)
	c.relay.Hold()
	c.redis.restart(t)
	c.relay.Release()
	// A fenced instance may stop writing once it finds its lease gone.
	for deadline := time.Now().Add(2 * fencingLease); c.api.Writes().Applied < faultAfter+2 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	c.a.kill()
	t.Logf("A was killed after %d writes; Redis holds %v", c.api.Writes().Applied, journalSagas(t, c.redis.addr))
	c.awaitQuiet(t, 30*time.Second, func() bool {
		_, left := journalSagas(t, c.redis.addr)[saga]
		return !left || len(listSagas(t, c.adminB, "")) > 0
	})
	t.Logf("the API ends %s; B lists %+v", describeWidgets(c.api), listSagas(t, c.adminB, ""))
	c.checkNotDeletedInSilence(t, saga)
	c.checkNoJournalLeft(t)
}

// checkNotDeletedInSilence fails the test unless the batch's items are
// all as they were (undone), or what is left of them is listed: a saga
// stuck with a reason, which B logged at ERROR, or one left behind
// (kept by either instance, which logged it).
func (c *fencingCluster) checkNotDeletedInSilence(t *testing.T, saga string) {
	t.Helper()
	if !strings.Contains(describeWidgets(c.api), "renamed") {
		return
	}
	var listed bool
	for _, s := range listSagas(t, c.adminB, "") {
		switch {
		case s.State == "stuck" && s.Reason != "":
			listed = true
			if !loggedError(t, c.b, s.ID) {
				t.Errorf("saga %s is listed stuck (%s), and B logged no ERROR line naming it", s.ID, s.Reason)
			}
		case s.State == "left_behind" && s.LeftBehind > 0:
			listed = true
			if !loggedError(t, c.a, s.ID) && !loggedError(t, c.b, s.ID) {
				t.Errorf("saga %s is listed left behind, and no instance logged an ERROR line naming it", s.ID)
			}
		}
	}
	if !listed {
		t.Errorf("the API holds %s, and the admin API lists nothing: saga %s, which A wrote into the restarted Redis, was deleted in silence (ERROR lines of B naming it: %v)",
			describeWidgets(c.api), saga, loggedError(t, c.b, saga))
	}
}

// loggedError reports whether p logged an ERROR line naming saga.
func loggedError(t *testing.T, p *caddyProcess, saga string) bool {
	t.Helper()
	for _, e := range p.entriesOf(t, "") {
		raw, _ := json.Marshal(e)
		if e["level"] == "error" && strings.Contains(string(raw), saga) {
			return true
		}
	}
	return false
}
