package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// dyingUpstream serves the legacy API to a gateway that dies at its nth
// write: it applies that write and never answers it, until the gateway's
// connection is gone.
type dyingUpstream struct {
	api   *legacyapi.API
	nth   int
	dying chan struct{} // closed once the nth write was applied

	mu     sync.Mutex
	writes int
}

func (u *dyingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		u.api.ServeHTTP(w, r)
		return
	}
	u.mu.Lock()
	u.writes++
	n := u.writes
	u.mu.Unlock()
	if n != u.nth {
		u.api.ServeHTTP(w, r)
		return
	}
	u.api.ServeHTTP(httptest.NewRecorder(), r)
	close(u.dying)
	<-r.Context().Done()
}

// deadSagaCase is an all-or-nothing batch whose gateway dies while its
// nth write is in flight (applied at the upstream, never answered).
type deadSagaCase struct {
	name       string
	api        func() *legacyapi.API
	collection string
	options    string // handler options
	method     string
	target     string
	body       string
	nth        int
	key        string // the client's Idempotency-Key, if any
	// traced puts Caddy's tracing before the batch handler.
	traced bool
}

// directive is the batch block of a dead saga's gateway, and of the one
// that finishes it.
func (tc deadSagaCase) directive() string {
	return `batch {
		concurrency 1
		item_timeout 2s
		` + tc.options + `
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/gadgets {` + resourceMethods + `
		}
	}`
}

var deadSagaCases = []deadSagaCase{
	{
		name: "update", api: seededAPI, collection: "/api/widgets",
		method: "PATCH", target: "/api/widgets", nth: 3,
		body: `[{"id":1,"name":"a"},{"id":2,"name":"b"},{"id":3,"name":"c"},{"id":4,"name":"d"},{"id":5,"name":"e"}]`,
	},
	{
		name: "delete", api: seededAPI, collection: "/api/gadgets",
		method: "DELETE", target: "/api/gadgets?ids=1,2,3,4,5", nth: 3,
	},
	{
		name: "create, idempotent upstream", collection: "/api/widgets", options: "idempotent_upstream",
		api: func() *legacyapi.API {
			return legacyapi.NewRecording(
				legacyapi.Collection{Path: "/api/widgets", HonorKeys: true, Seed: records("w", 1, 20)},
				legacyapi.Collection{Path: "/api/gadgets", PutCreates: true, Seed: records("g", 1, 20)},
			)
		},
		method: "POST", target: "/api/widgets", nth: 3,
		body: `[{"name":"a"},{"name":"b"},{"name":"c"},{"name":"d"},{"name":"e"}]`,
	},
}

// deadSaga runs tc's batch through a gateway at addr, a Caddy process
// keeping its journal in the file system storage dir, and kills it
// (SIGKILL) while its nth write is in flight: the write is applied at the
// upstream, its answer never reaches the gateway, and the gateway sends
// nothing more. The journal's lease lapses lease after the dead
// gateway's last renewal. It returns the upstream's address, and the
// state of the collection before the batch.
func deadSaga(t *testing.T, tc deadSagaCase, api *legacyapi.API, dir, addr string, lease time.Duration) (upstream string, before map[string]map[string]any) {
	t.Helper()
	bin := caddyBinary(t)
	dying := &dyingUpstream{api: api, nth: tc.nth, dying: make(chan struct{})}
	srv := httptest.NewServer(dying)
	t.Cleanup(func() {
		api.Close()
		srv.Close()
	})
	upstream = srv.Listener.Addr().String()
	before = api.Items(tc.collection)
	// The same site as the gateway that finishes the saga, so that the
	// journal names the same server; the process logs to its stderr.
	g := &gateway{addr: addr, upstream: upstream}
	config := strings.Replace(g.config(tc.recoverySite()), "\tadmin off\n",
		fmt.Sprintf("\tadmin off\n\tstorage file_system %s\n\tbatch {\n\t\tlease %s\n\t}\n", dir, lease), 1)
	p := startCaddyProcess(t, bin, strings.Replace(config, "output batchtest", "output stderr", 1), addr)
	go func() {
		// As if the client had sent the batch to /v1/..., which the site
		// rewrites before the batch handler (see recoverySite). It is
		// never answered: the gateway dies.
		req, _ := http.NewRequest(tc.method, "http://"+addr+"/v1"+tc.target, strings.NewReader(tc.body))
		if tc.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer journal-test")
		if tc.key != "" {
			req.Header.Set("Idempotency-Key", tc.key)
		}
		if resp, err := (&http.Client{Timeout: time.Minute}).Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-dying.dying:
	case <-time.After(30 * time.Second):
		t.Fatalf("the batch did not get to its write %d:\n%s", tc.nth, p.tail(40))
	}
	p.kill()
	return upstream, before
}

// recoverySite is the site a dead saga is finished through: a rewrite
// before the batch handler, which the recovery's request must take as
// the client's did, and a header set after it, which every request the
// recovery sends must carry, as the batch's own sub-requests do.
func (tc deadSagaCase) recoverySite() string {
	site := "\turi strip_prefix /v1\n\t" + tc.directive() + "\n\trequest_header X-Chain recovered\n\treverse_proxy UPSTREAM"
	if tc.traced {
		site = "\ttracing\n" + site
	}
	return site
}

// TestRecoverFinishesADeadSaga kills a saga mid-batch (the write in
// flight applied, its answer lost) and starts a Caddy on the same
// storage: its recovery leaves the saga alone while the dead owner's
// lease holds, then takes it over and undoes every write through the
// route the batch took and the handler chain after the batch handler,
// with the client's headers and the same proofs, and removes the
// journal.
func TestRecoverFinishesADeadSaga(t *testing.T) {
	for _, tc := range deadSagaCases {
		t.Run(tc.name, func(t *testing.T) {
			dir, addr := t.TempDir(), freeAddr(t)
			api := tc.api()
			const lease = 2 * time.Second
			upstream, before := deadSaga(t, tc, api, dir, addr, lease)
			killed := time.Now()
			if after := api.Items(tc.collection); reflect.DeepEqual(after, before) {
				t.Fatal("the dead saga changed nothing at the upstream")
			}
			api.ResetLog()
			startJournalGatewayAt(t, api, upstream, addr, dir, "lease 1s\n\t\trecovery_interval 100ms", tc.recoverySite())
			// Read while the dead owner's lease holds: nothing recovered yet.
			recoveredBefore := metricValue(t, "journals_recovered_total")

			time.Sleep(lease / 4)
			if len(journalKeys(t, dir)) == 0 {
				t.Fatal("the journal was taken over while its owner's lease held")
			}
			waitRecovered(t, api, tc.collection, before, dir, 10*time.Second)
			t.Logf("recovered %v after the kill", time.Since(killed).Round(time.Millisecond))
			for _, r := range api.Requests() {
				if r.Header.Get("X-Chain") != "recovered" || r.Header.Get("Authorization") != "Bearer journal-test" {
					t.Errorf("%s %s did not come through the handler chain with the client's headers: %v", r.Method, r.Path, r.Header)
				}
			}
			// The journal is removed before the recovery is counted and
			// logged: wait for that too.
			eventually(t, 5*time.Second, "the recovery to be counted", func() bool { return metricValue(t, "journals_recovered_total")-recoveredBefore >= 1 })
			if n := metricValue(t, "journals_recovered_total") - recoveredBefore; n != 1 {
				t.Errorf("caddy_http_batch_journals_recovered_total grew by %v, want 1", n)
			}
			logged := recoveryLog(t)
			if logged["outcome"] != "rolled_back" || logged["level"] != "info" {
				t.Errorf("recovery logged %v, want outcome rolled_back at INFO", logged)
			}
		})
	}
}

// waitRecovered waits until the collection is as it was before the batch
// and no journal is left in storage.
func waitRecovered(t *testing.T, api *legacyapi.API, collection string, before map[string]map[string]any, dir string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		after := api.Items(collection)
		left := journalKeys(t, dir)
		if reflect.DeepEqual(after, before) && len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not recovered within %s: journal %v\n got %v\nwant %v\nrequests:%s", within, left, after, before, describeRequests(api.Requests()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recoveryLog returns the recovery's one log line for the saga, which
// comes just after the journal is removed.
func recoveryLog(t *testing.T) map[string]any {
	t.Helper()
	var lines []map[string]any
	for deadline := time.Now().Add(2 * time.Second); len(lines) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		lines = lines[:0]
		for _, e := range testLogs.entries("batch") {
			if msg, _ := e["msg"].(string); strings.HasPrefix(msg, "recovered a batch") {
				lines = append(lines, e)
			}
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d recovery log lines, want 1: %v", len(lines), testLogs.entries("batch"))
	}
	return lines[0]
}

// TestRecoverNotOnValidate checks that caddy validate, which provisions
// every module, neither finishes nor touches a dead saga's journal, and
// that the same config, run, does.
func TestRecoverNotOnValidate(t *testing.T) {
	tc := deadSagaCases[0]
	dir, addr := t.TempDir(), freeAddr(t)
	api := tc.api()
	const lease = time.Second
	upstream, before := deadSaga(t, tc, api, dir, addr, lease)
	time.Sleep(lease)
	journal := journalKeys(t, dir)
	dead := api.Items(tc.collection)
	g := &gateway{addr: addr, upstream: upstream}
	config := strings.Replace(g.config(tc.recoverySite()), "\tadmin off\n",
		"\tadmin off\n\tstorage file_system "+dir+"\n\tbatch {\n\t\trecovery_interval 100ms\n\t}\n", 1)
	cfg := new(caddy.Config)
	if err := json.Unmarshal(adaptCaddyfile(t, config), cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(cfg); err != nil {
		t.Fatalf("validating: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if got := journalKeys(t, dir); !reflect.DeepEqual(got, journal) {
		t.Errorf("caddy validate changed the journal:\n got %v\nwant %v", got, journal)
	}
	if after := api.Items(tc.collection); !reflect.DeepEqual(after, dead) {
		t.Errorf("caddy validate changed the upstream:\n got %v\nwant %v", after, dead)
	}

	startJournalGatewayAt(t, api, upstream, addr, dir, "lease 1s\n\t\trecovery_interval 100ms", tc.recoverySite())
	waitRecovered(t, api, tc.collection, before, dir, 10*time.Second)
}

// startJournalGatewayAt is startJournalGatewayTo on a given address.
func startJournalGatewayAt(t *testing.T, api *legacyapi.API, upstream, addr, dir, app, site string) *gateway {
	t.Helper()
	g := &gateway{API: api, client: &http.Client{Timeout: 60 * time.Second}, addr: addr, upstream: upstream}
	g.URL = "http://" + g.addr
	global := "\tstorage file_system " + dir + "\n"
	if app != "" {
		global += "\tbatch {\n\t\t" + app + "\n\t}\n"
	}
	config := strings.Replace(g.config(site), "\tadmin off\n", "\tadmin off\n"+global, 1)
	testLogs.reset()
	loadCaddyfile(t, config)
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})
	return g
}

// TestRecoverSettlesTheIdempotencyKey: the client of a batch whose
// gateway died never got an answer, and retries with its Idempotency-Key.
// Once the recovery has finished the saga, the retry is answered with the
// recovered outcome, and nothing is sent upstream: the batch is not run
// again over the items the upstream already answered under their keys.
func TestRecoverSettlesTheIdempotencyKey(t *testing.T) {
	tc := deadSagaCases[0] // update
	tc.key = `"after-the-crash"`
	dir, addr := t.TempDir(), freeAddr(t)
	api := tc.api()
	upstream, before := deadSaga(t, tc, api, dir, addr, 2*time.Second)

	api.ResetLog()
	g := startJournalGatewayAt(t, api, upstream, addr, dir, "lease 1s\n\t\trecovery_interval 100ms", tc.recoverySite())
	waitRecovered(t, api, tc.collection, before, dir, 10*time.Second)
	// The record the dead gateway claimed for the batch: in flight, its
	// owner's lease lapsed, until the recovery settles it.
	storage := &certmagic.FileStorage{Path: dir}
	eventually(t, 5*time.Second, "the record to be settled", func() bool {
		keys, err := storage.List(context.Background(), durable.IdempotencyPrefix, true)
		if err != nil || len(keys) != 1 {
			return false
		}
		var rec durable.Record
		b, err := storage.Load(context.Background(), keys[0])
		return err == nil && json.Unmarshal(b, &rec) == nil && rec.State == durable.StateDone
	})
	api.ResetLog()
	r := g.do(t, tc.method, "/v1"+tc.target, tc.body, "Authorization", "Bearer journal-test", "Idempotency-Key", tc.key)
	if r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry was not replayed: %v", r)
	}
	if b := r.batch(t); b.Outcome != "rolled_back" {
		t.Errorf("the retry's outcome %q, want the recovered rolled_back", b.Outcome)
	}
	if reqs := api.Requests(); len(reqs) != 0 {
		t.Errorf("the retry reached the upstream: %s", describeRequests(reqs))
	}
}
