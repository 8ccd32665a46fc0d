package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/batchapp"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/telemetry"
)

// mortalStorage is a storage that dies with the gateway that uses it:
// after kill, it writes nothing and deletes nothing.
type mortalStorage struct {
	certmagic.Storage
	mu   sync.Mutex
	dead bool
}

func (s *mortalStorage) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
}

func (s *mortalStorage) isDead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

func (s *mortalStorage) Store(ctx context.Context, key string, value []byte) error {
	if s.isDead() {
		return errors.New("the gateway is dead")
	}
	return s.Storage.Store(ctx, key, value)
}

func (s *mortalStorage) Delete(ctx context.Context, key string) error {
	if s.isDead() {
		return nil
	}
	return s.Storage.Delete(ctx, key)
}

// dyingSender sends through to the upstream until the nth write, which
// it sends and then dies with: the write is applied, its answer never
// recorded, and the gateway sends nothing more.
type dyingSender struct {
	next  batch.Sender
	nth   int
	dying chan struct{} // closed once the nth write was applied
	dead  chan struct{} // closed to let the dead saga's goroutine end

	mu     sync.Mutex
	writes int
}

func (s *dyingSender) Send(ctx context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	select {
	case <-s.dying:
		return nil, fmt.Errorf("%w: the gateway is dead", batch.ErrNotSent)
	default:
	}
	if sr.Method == http.MethodGet {
		return s.next.Send(ctx, sr)
	}
	s.mu.Lock()
	s.writes++
	n := s.writes
	s.mu.Unlock()
	if n != s.nth {
		return s.next.Send(ctx, sr)
	}
	_, _ = s.next.Send(ctx, sr)
	close(s.dying)
	<-s.dead
	return nil, errors.New("the gateway died before the answer")
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
}

// directive is the batch block of a dead saga's gateway, and of the one
// that finishes it.
func (tc deadSagaCase) directive() string {
	return `batch {
		concurrency 1
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

// deadSaga runs tc's batch straight against the upstream with a journal
// in the file system storage dir, as a gateway at addr would, and kills
// it while its nth write is in flight. The journal's lease lapses lease
// after its first write. It returns the upstream's address, and the
// state of the collection before the batch.
func deadSaga(t *testing.T, tc deadSagaCase, api *legacyapi.API, dir, addr string, lease time.Duration) (upstream string, before map[string]map[string]any) {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(func() {
		api.Close()
		srv.Close()
	})
	before = api.Items(tc.collection)
	_, plan := planOf(t, tc.directive(), tc.method, tc.target, tc.body, "Idempotency-Key", tc.key)
	storage := &mortalStorage{Storage: &certmagic.FileStorage{Path: dir}}
	origin := originOf(httptest.NewRequest(tc.method, tc.target, nil))
	// As if the client had sent the batch to /v1/..., which the site
	// rewrites before the batch handler (see recoverySite).
	origin.Server, origin.Host, origin.URI = "srv0", addr, "/v1"+tc.target
	j := durable.NewJournals(batchapp.DurableStorage(storage), durable.NewLeases(lease), zap.NewNop()).New(origin)
	sender := &dyingSender{
		next: &directSender{base: srv.URL, client: srv.Client()},
		nth:  tc.nth, dying: make(chan struct{}), dead: make(chan struct{}),
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		batch.Run(context.Background(), plan, batch.Runtime{Send: sender, Journal: j})
	}()
	select {
	case <-sender.dying:
	case <-ended:
		t.Fatal("the batch ended before its gateway died")
	}
	storage.kill()
	j.Abandon()
	// The dead saga's goroutine ends after the test, once the recovery
	// is over: a dead gateway does nothing, and must not end its saga's
	// bookkeeping before the one that took it over. (Its undos go
	// nowhere, and its journal nowhere either.)
	t.Cleanup(func() { close(sender.dead) })
	return srv.Listener.Addr().String(), before
}

// recoverySite is the site a dead saga is finished through: a rewrite
// before the batch handler, which the recovery's request must take as
// the client's did, and a header set after it, which every request the
// recovery sends must carry, as the batch's own sub-requests do.
func (tc deadSagaCase) recoverySite() string {
	return "\turi strip_prefix /v1\n\t" + tc.directive() + "\n\trequest_header X-Chain recovered\n\treverse_proxy UPSTREAM"
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
			recoveredBefore := counted(telemetry.Metrics.Recovered)
			startJournalGatewayAt(t, api, upstream, addr, dir, "lease 1s\n\t\trecovery_interval 100ms", tc.recoverySite())

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
			eventually(t, 5*time.Second, "the recovery to be counted", func() bool { return counted(telemetry.Metrics.Recovered)-recoveredBefore >= 1 })
			if n := counted(telemetry.Metrics.Recovered) - recoveredBefore; n != 1 {
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
	const lease = 300 * time.Millisecond
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

	startJournalGatewayAt(t, api, upstream, addr, dir, "recovery_interval 100ms", tc.recoverySite())
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

// TestGlobalOptionMistakes checks that the batch global option refuses
// what it cannot use, and that the app refuses a lease too short to be
// renewed.
func TestGlobalOptionMistakes(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"lease", "lease takes a duration"},
		{"lease soon", `lease takes a positive duration such as 10s, not "soon"`},
		{"lease 0s", `lease takes a positive duration such as 10s, not "0s"`},
		{"lease 10s 20s", "lease takes one duration"},
		{"interval 10s", `unknown batch global option "interval"`},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n\tbatch {\n\t\t"+tc.block+"\n\t}\n}\n:8080 {\n\trespond ok\n}\n"), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.block, err, tc.want)
		}
	}
	a := &batchapp.App{Lease: caddy.Duration(100 * time.Millisecond), RecoveryInterval: caddy.Duration(time.Second)}
	if err := a.Validate(); err == nil || !strings.Contains(err.Error(), "lease 100ms is too short") {
		t.Errorf("a 100ms lease: %v", err)
	}
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

	// The record the dead gateway claimed for the batch, as its claim
	// left it: in flight, its owner's lease lapsed.
	h, plan := planOf(t, tc.directive(), tc.method, tc.target, tc.body)
	req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
	req.Header.Set("Authorization", "Bearer journal-test")
	req.Header.Set("Idempotency-Key", tc.key)
	m, _ := h.policy.Lookup(tc.target)
	k := (&idempotency{}).watch(req, h.collectionScope(m), plan)
	now := time.Now()
	claimed := durable.Record{Version: 1, State: durable.StateInFlight, Fingerprint: k.fingerprint(), Resource: tc.collection, Op: "update",
		Owner: "dead", LeaseUntil: now.Add(-time.Second), Created: now, Expires: now.Add(time.Hour)}
	storage := &certmagic.FileStorage{Path: dir}
	if err := storage.Store(context.Background(), k.key, mustJSON(t, claimed)); err != nil {
		t.Fatal(err)
	}

	api.ResetLog()
	g := startJournalGatewayAt(t, api, upstream, addr, dir, "lease 1s\n\t\trecovery_interval 100ms", tc.recoverySite())
	waitRecovered(t, api, tc.collection, before, dir, 10*time.Second)
	eventually(t, 5*time.Second, "the record to be settled", func() bool {
		var rec durable.Record
		b, err := storage.Load(context.Background(), k.key)
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
