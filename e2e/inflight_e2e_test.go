package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The tests of max_in_flight: a storm of batches puts no more load on
// the upstream than the bound, reuses reverse_proxy's kept-alive
// connections, and leaves room for plain requests; undos go ahead of
// the storm; and the bound holds across a config reload.

// plainHeader marks the test's own single requests, so that the
// upstream can tell them from the batches' sub-requests.
const plainHeader = "X-Test-Plain"

// startQuietGateway is startGatewayTo with Caddy logging at WARN: the
// DEBUG line reverse_proxy writes per round trip would be most of the
// cost of a storm, and would skew the latencies it measures.
func startQuietGateway(t testing.TB, api *legacyapi.API, upstream, site string) *gateway {
	t.Helper()
	g := &gateway{API: api, client: gatewayClient(t, 2*time.Minute), addr: freeAddr(t), upstream: upstream}
	g.URL = "http://" + g.addr
	loadCaddyfile(t, strings.Replace(g.config(site), "level DEBUG", "level WARN", 1))
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})
	return g
}

func idList(from, to int) string {
	ids := make([]string, 0, to-from+1)
	for i := from; i <= to; i++ {
		ids = append(ids, strconv.Itoa(i))
	}
	return strings.Join(ids, ",")
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// stormFigures are what one storm measured.
type stormFigures struct {
	peakBatch         int // batch sub-requests in flight at the upstream at once
	peakAll           int // the same with the test's plain GETs
	warmConns, dialed int64
	idle              time.Duration   // a plain GET before the storm (median)
	during            []time.Duration // plain GETs during the storm
	took              time.Duration
	answers           []response
}

// TestStorm sends 50 batch GETs of 100 ids each at once, against an API
// that takes 10ms per GET, with max_in_flight 16 (asserted) and
// effectively off (measured only, for comparison). With the bound, the
// upstream never has more than 16 of the batches' sub-requests in
// flight, every batch is answered whole, the connections reverse_proxy
// kept alive from a warm-up serve the whole storm, and a plain GET
// sent during the storm is answered. Its latency is logged, not
// asserted: it depends on the machine.
func TestStorm(t *testing.T) {
	const clients, items, concurrency = 50, 100, 8
	for _, limit := range []int{16, 10000} {
		t.Run(fmt.Sprintf("max_in_flight=%d", limit), func(t *testing.T) {
			f := runStorm(t, limit, clients, items, concurrency)
			for i, r := range f.answers {
				if r.Status != http.StatusOK {
					t.Errorf("batch %d: %v", i, r)
					continue
				}
				if b := r.batch(t); b.Outcome != "succeeded" || len(b.Items) != items {
					t.Errorf("batch %d: outcome %q with %d items, want succeeded with %d", i, b.Outcome, len(b.Items), items)
				}
			}
			t.Logf("max_in_flight %d: %d clients x %d ids: storm took %v; peak in flight at the upstream %d (%d with the plain GETs); "+
				"connections %d after warm-up, %d dialed during the storm; plain GET %v idle, %v median / %v max during the storm (%d sent)",
				limit, clients, items, f.took.Round(time.Millisecond), f.peakBatch, f.peakAll, f.warmConns, f.dialed,
				f.idle.Round(100*time.Microsecond), median(f.during).Round(100*time.Microsecond),
				slices.Max(append([]time.Duration{0}, f.during...)).Round(100*time.Microsecond), len(f.during))
			if limit > clients*concurrency {
				return // the bound is off: nothing to hold it to
			}
			if f.peakBatch > limit {
				t.Errorf("%d batch sub-requests in flight at the upstream at once, want at most max_in_flight %d", f.peakBatch, limit)
			}
			if f.peakBatch < limit/2 {
				t.Errorf("at most %d batch sub-requests in flight at once: the storm did not use the %d slots", f.peakBatch, limit)
			}
			// Go's transport starts a dial when no idle connection is free at
			// the moment a request asks, even if one is put back a moment
			// later; on a loaded machine that can happen once or twice. The
			// storm without the bound dials hundreds.
			if f.dialed > 2 {
				t.Errorf("%d upstream connections dialed during the storm, want none (at most 2 racing a connection put back): the %d kept alive by the warm-up should serve it", f.dialed, f.warmConns)
			}
		})
	}
}

func runStorm(t *testing.T, limit, clients, items, concurrency int) stormFigures {
	const apiDelay = 10 * time.Millisecond
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, items)})
	// The first GET of /api/widgets/1, the warm-up's plain GET, is held,
	// so that its connection is in use while the warm-up fills the rest.
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/1", Delay: 500 * time.Millisecond, Times: 1})
	for i := 1; i <= items; i++ {
		api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/" + strconv.Itoa(i), Delay: apiDelay})
	}
	meter := &inFlightMeter{Handler: api, counts: func(r *http.Request) bool { return r.Header.Get(plainHeader) == "" }}
	srv := httptest.NewUnstartedServer(meter)
	ln, conns := legacyapi.CountConns(srv.Listener)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(func() {
		api.Close()
		srv.Close()
	})
	g := startQuietGateway(t, api, srv.Listener.Addr().String(), fmt.Sprintf(`
	batch {
		max_in_flight %d
		concurrency %d
		max_items %d
		batch_timeout 2m
		resource /api/widgets {
			collection GET
			item       GET
		}
	}
	reverse_proxy UPSTREAM {
		transport http {
			keepalive_idle_conns_per_host 32
		}
	}
`, limit, concurrency, items))
	client := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: clients + 1}}
	defer client.CloseIdleConnections()
	plain := func() (time.Duration, error) {
		req, _ := http.NewRequest("GET", g.URL+"/api/widgets/1", nil)
		req.Header.Set(plainHeader, "1")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("plain GET: %d", resp.StatusCode)
		}
		return time.Since(start), nil
	}
	batchURL := "/api/widgets?ids=" + idList(1, items)

	// Warm-up: a plain GET held at the upstream, and as many batches as
	// fill 16 slots, so that reverse_proxy keeps alive one connection
	// per slot of the bounded storm and one for the plain GETs.
	held := make(chan error, 1)
	go func() {
		_, err := plain()
		held <- err
	}()
	eventually(t, 5*time.Second, "the held plain GET", func() bool { return api.InFlight() == 1 })
	var wg sync.WaitGroup
	for range 16 / concurrency {
		wg.Go(func() {
			if r, err := send(client, g.URL, "GET", batchURL, ""); err != nil || r.Status != http.StatusOK {
				t.Errorf("warm-up batch: %v %v", r, err)
			}
		})
	}
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatalf("warm-up plain GET: %v", err)
	}
	f := stormFigures{warmConns: conns.Load()}
	if f.warmConns < 17 {
		t.Fatalf("the warm-up opened %d upstream connections, want at least 17", f.warmConns)
	}
	var idle []time.Duration
	for range 5 {
		d, err := plain()
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, d)
	}
	f.idle = median(idle)

	api.ResetPeak()
	meter.resetPeak()
	f.answers = make([]response, clients)
	var running atomic.Int64
	running.Store(int64(clients))
	start := time.Now()
	for i := range clients {
		wg.Go(func() {
			defer running.Add(-1)
			r, err := send(client, g.URL, "GET", batchURL, "")
			if err != nil {
				r = response{Status: -1, Body: []byte(err.Error())}
			}
			f.answers[i] = r
		})
	}
	// Plain GETs one after another while the storm runs, once it has
	// reached the upstream.
	eventually(t, 10*time.Second, "the storm", func() bool { return api.InFlight() >= min(limit, 16) })
	for running.Load() > 0 {
		d, err := plain()
		if err != nil {
			t.Errorf("a plain GET during the storm: %v", err)
			break
		}
		if running.Load() > 0 {
			f.during = append(f.during, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	f.took = time.Since(start)
	f.dialed = conns.Load() - f.warmConns
	f.peakBatch, f.peakAll = meter.peakInFlight(), api.PeakInFlight()
	if len(f.during) == 0 {
		t.Error("no plain GET was answered while the storm ran")
	}
	return f
}

// TestInFlightUndoNotStarved runs an all-or-nothing batch update that
// fails while a storm of batch GETs keeps every slot of max_in_flight
// busy and a long queue waiting. The update's own sub-requests wait
// their turn in the queue, like any batch's; its undos go first. Between
// the failing write and the last undo, fewer of the storm's
// sub-requests reach the upstream than were queued ahead: had the undos
// waited in line, even the first of them would have let the whole queue
// pass.
func TestInFlightUndoNotStarved(t *testing.T) {
	const limit, stormClients = 4, 12
	api := seededAPI()
	for i := 1; i <= 20; i++ {
		api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/gadgets/" + strconv.Itoa(i), Delay: 20 * time.Millisecond})
	}
	g := startQuietGateway(t, api, startUpstream(t, api), fmt.Sprintf(`
	batch {
		max_in_flight %d
		resource /api/widgets {`+resourceMethods+`
			concurrency 1
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`, limit))
	if s := readSlots(t); s.limit != limit {
		t.Fatalf("max_in_flight slots of the handler: %v, want %d", s.limit, limit)
	}

	stop := make(chan struct{})
	var storm sync.WaitGroup
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: stormClients + 1}}
	defer client.CloseIdleConnections()
	for range stormClients {
		storm.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if r, err := send(client, g.URL, "GET", "/api/gadgets?ids="+idList(1, 20), ""); err != nil || r.Status != http.StatusOK {
					t.Errorf("storm batch: %v %v", r, err)
					return
				}
			}
		})
	}
	defer func() {
		close(stop)
		storm.Wait()
	}()
	eventually(t, 10*time.Second, "the storm to queue", func() bool { return readSlots(t).waiting >= 60 })
	queued := int(readSlots(t).waiting)

	before := api.Items("/api/widgets")
	api.ResetLog()
	start := time.Now()
	r, err := send(client, g.URL, "PATCH", "/api/widgets", `[{"id": 1, "name": "one"}, {"id": 2, "name": "two"}, {"id": 3, "name": ""}]`)
	took := time.Since(start)
	stillQueued := int(readSlots(t).waiting)
	if err != nil {
		t.Fatal(err)
	}
	if b := checkProblem(t, r, http.StatusUnprocessableEntity); b.Outcome != "rolled_back" {
		t.Fatalf("outcome %q, want rolled_back: %s", b.Outcome, r.Body)
	}
	sameState(t, api, "/api/widgets", before)

	reqs := api.Requests()
	failed, lastUndo := -1, -1
	for i, rq := range reqs {
		switch {
		case rq.Method == "PATCH" && rq.Path == "/api/widgets/3":
			failed = i
		case rq.Method == "PUT" && strings.HasPrefix(rq.Path, "/api/widgets/"):
			lastUndo = i
		}
	}
	if failed < 0 || lastUndo < failed {
		t.Fatalf("no failing write followed by undos in what the upstream received:%s", describeRequests(writes(reqs)))
	}
	passed := 0
	for _, rq := range reqs[failed:lastUndo] {
		if strings.HasPrefix(rq.Path, "/api/gadgets/") {
			passed++
		}
	}
	t.Logf("the failing update took %v; %d storm sub-requests were queued when it was sent, %d when it was answered; "+
		"%d storm sub-requests reached the upstream between its failing write and its last undo",
		took.Round(time.Millisecond), queued, stillQueued, passed)
	if passed >= queued {
		t.Errorf("%d storm sub-requests reached the upstream between the failure and the last undo, with %d queued: the undos waited in line", passed, queued)
	}
	if stillQueued == 0 {
		t.Error("the storm was over before the rollback was: the test did not show undos going first under load")
	}
}

// startUpstream serves api on a loopback port and returns its address.
func startUpstream(t testing.TB, api *legacyapi.API) string {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(func() {
		api.Close()
		srv.Close()
	})
	return srv.Listener.Addr().String()
}

// TestInFlightSlotsSharedAcrossReload reloads the same config while a
// batch holds every slot of max_in_flight: a batch on the new config
// waits for the old config's batch instead of getting slots of its own,
// so the upstream never sees more than the bound. A reload that changes
// max_in_flight gets new slots at the new value.
func TestInFlightSlotsSharedAcrossReload(t *testing.T) {
	const limit = 4
	api := seededAPI()
	// The old config's batch holds its slots until the new config's batch
	// is seen waiting, however long the reload takes on a loaded machine.
	release := make(chan struct{})
	for i := 1; i <= 8; i++ {
		api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/" + strconv.Itoa(i), Until: release})
		api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/gadgets/" + strconv.Itoa(i), Delay: 50 * time.Millisecond})
	}
	site := func(n int) string {
		return fmt.Sprintf(`
	batch {
		max_in_flight %d
		concurrency 4
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`, n)
	}
	g := startGateway(t, api, site(limit))
	if s := readSlots(t); s.limit != limit {
		t.Fatalf("max_in_flight slots of the handler: %v, want %d", s.limit, limit)
	}

	fresh := func() *http.Client {
		return &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	}
	answers := make(chan response, 2)
	get := func(path string) {
		r, err := send(fresh(), g.URL, "GET", path, "")
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		answers <- r
	}
	go get("/api/widgets?ids=" + idList(1, 8))
	eventually(t, 5*time.Second, "the old config's batch to hold every slot", func() bool { return api.InFlight() == limit })
	api.ResetPeak()

	if err := caddy.Load(adaptCaddyfile(t, g.config(site(limit))), true); err != nil {
		t.Fatalf("reloading: %v", err)
	}
	if len(answers) != 0 {
		t.Fatal("the batch was answered before the reload finished: the test did not reload under it")
	}
	// The old config's batch holds every slot. Had the reloaded handler
	// new slots, the gauges would count both sets (2 x max_in_flight), or
	// only its own, none of them in flight.
	if s := readSlots(t); s.limit != limit || s.inFlight != limit {
		t.Fatalf("after the reload: %v slots, %v in flight, want the old config's %d, all held: the reloaded handler has new slots, "+
			"and the old config's batch and the new config's would each have max_in_flight", s.limit, s.inFlight, limit)
	}
	go get("/api/gadgets?ids=" + idList(1, 8))
	// With slots of its own, the new config's batch would not wait: it
	// would be at the upstream beside the old one's.
	eventually(t, 5*time.Second, "the new config's batch to wait for a slot", func() bool {
		return readSlots(t).waiting > 0 || api.InFlight() > limit
	})
	close(release)
	for range 2 {
		r := <-answers
		if b := checkEnvelope(t, r, http.StatusOK, "succeeded"); len(b.Items) != 8 {
			t.Errorf("%d items, want 8: %s", len(b.Items), r.Body)
		}
	}
	if p := api.PeakInFlight(); p > limit {
		t.Errorf("%d sub-requests in flight at the upstream across the reload, want at most max_in_flight %d", p, limit)
	}

	// A new value is a new bound; the old slots go with the last config
	// that used them.
	if err := caddy.Load(adaptCaddyfile(t, g.config(site(limit+2))), true); err != nil {
		t.Fatalf("reloading: %v", err)
	}
	// Once no handler tracks the old slots, the gauges count the new
	// ones alone.
	eventually(t, 5*time.Second, "the old slots to be let go", func() bool { return readSlots(t).limit == limit+2 })
	if s := readSlots(t); s.limit != limit+2 || s.inFlight != 0 || s.waiting != 0 {
		t.Errorf("after max_in_flight %d: %+v, want %d idle slots", limit+2, s, limit+2)
	}
}
