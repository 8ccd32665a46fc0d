package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// scrape reads the gateway's /metrics (Caddy's own metrics handler, so
// the config's registry) in the text format.
func (g *gateway) scrape(t testing.TB) series {
	t.Helper()
	// A scrape often follows a config reload, which closes the old
	// server's kept-alive connections under the client: use a new one.
	g.client.CloseIdleConnections()
	r := g.do(t, "GET", "/metrics", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /metrics: %v", r)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(r.Body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, r.Body)
	}
	return mfs
}

type series map[string]*dto.MetricFamily

// get sums the series of family name whose labels include want: a
// counter's value, a histogram's count of observations.
func (s series) get(name string, want map[string]string) float64 {
	var sum float64
	mf := s[name]
	if mf == nil {
		return 0
	}
	for _, m := range mf.GetMetric() {
		labels := labelMap(m)
		if !matches(labels, want) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum
}

// sum is like get, for a histogram's sum of observations.
func (s series) sum(name string, want map[string]string) float64 {
	var sum float64
	if mf := s[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			if matches(labelMap(m), want) && m.Histogram != nil {
				sum += m.Histogram.GetSampleSum()
			}
		}
	}
	return sum
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

func matches(labels, want map[string]string) bool {
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// labelValues are every value a batch metric's label may take: each is
// a word from a fixed set, a server's name, or a resource's template.
var labelValues = map[string]*regexp.Regexp{
	"server":    regexp.MustCompile(`^srv\d+$`),
	"operation": regexp.MustCompile(`^(get|create|update|delete|envelope)$`),
	"atomicity": regexp.MustCompile(`^(all_or_nothing|partial)$`),
	"outcome":   regexp.MustCompile(`^(succeeded|partial|failed|not_attempted|rolled_back|rollback_failed|unknown|rejected)$`),
	"result":    regexp.MustCompile(`^(rolled_back|rollback_failed|resolved|left_behind|refused)$`),
	// A saga's state, or a bulk job's.
	"state":   regexp.MustCompile(`^(running|orphaned|stuck|left_behind|queued|paused|cancelling|succeeded|partial|failed|rolled_back|rollback_failed|cancelled)$`),
	"action":  regexp.MustCompile(`^(retry|resolve)$`),
	"request": regexp.MustCompile(`^(batch|single)$`),
	"reason":  regexp.MustCompile(`^(no_answer|status|body|queue_full|no_config)$`),
	"event":   regexp.MustCompile(`^batch\.(saga\.left_behind|saga\.resolved|job\.finished)$`),
	// A template: literal segments and {variables}; the tests' ids are
	// numbers, and no test's template has a segment that is a number
	// (a literal one starts with a letter: /v1/api/gadgets).
	"resource": regexp.MustCompile(`^(/([a-z][a-z0-9]*|\{[a-z]+\}))+/?$`),
}

// checkLabels fails the test if a batch metric has a label that is not
// one of labelValues, or a value that could be an id, a key or a concrete
// path.
func checkLabels(t testing.TB, s series, concrete ...string) {
	t.Helper()
	for name, mf := range s {
		if !strings.HasPrefix(name, "caddy_http_batch_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for k, v := range labelMap(m) {
				re, ok := labelValues[k]
				if !ok {
					t.Errorf("%s: unexpected label %s=%q", name, k, v)
				} else if !re.MatchString(v) {
					t.Errorf("%s: label %s=%q is no %s", name, k, v, k)
				}
				for _, c := range concrete {
					if strings.Contains(v, c) {
						t.Errorf("%s: label %s=%q holds %q", name, k, v, c)
					}
				}
			}
		}
	}
}

// TestMetricsAcrossReload scrapes the batch metrics through Caddy's own
// metrics handler, on the config's registry, before and after a config
// reload: the counters go on counting from where they were (the same
// collectors, registered on the new config's registry), and no label
// holds an id, a key or a concrete path.
func TestMetricsAcrossReload(t *testing.T) {
	api := legacyapi.New(
		legacyapi.Collection{Path: "/api/users/7/posts", Seed: records("p", 1, 20)},
	)
	site := func(extra string) string {
		return `
	batch {
		concurrency 1
		resource /api/users/{user}/posts {` + resourceMethods + `
		}` + extra + `
	}
	handle /metrics {
		metrics
	}
	reverse_proxy UPSTREAM
`
	}
	g := startGateway(t, api, site(""))
	const posts = "/api/users/{user}/posts"
	at := func(labels ...string) map[string]string {
		m := map[string]string{"resource": posts}
		for i := 0; i+1 < len(labels); i += 2 {
			m[labels[i]] = labels[i+1]
		}
		return m
	}
	type reading struct {
		got, rejected, rolledBack, items, itemsRolledBack, compensated, durations, sizes float64
	}
	read := func(s series) reading {
		return reading{
			got:             s.get("caddy_http_batch_requests_total", at("operation", "get", "atomicity", "all_or_nothing", "outcome", "succeeded")),
			rejected:        s.get("caddy_http_batch_requests_total", at("operation", "get", "outcome", "rejected")),
			rolledBack:      s.get("caddy_http_batch_requests_total", at("operation", "update", "atomicity", "all_or_nothing", "outcome", "rolled_back")),
			items:           s.get("caddy_http_batch_items_total", at("operation", "get", "outcome", "succeeded")),
			itemsRolledBack: s.get("caddy_http_batch_items_total", at("operation", "update", "outcome", "rolled_back")),
			compensated:     s.get("caddy_http_batch_compensations_total", at("operation", "update", "result", "rolled_back")),
			durations:       s.get("caddy_http_batch_request_duration_seconds", at()),
			sizes:           s.get("caddy_http_batch_items_per_request", at("operation", "get")),
		}
	}
	// Each round: a batch GET of 3 items, a refused one, and an update
	// whose second item the legacy API refuses (422), so the first is
	// rolled back.
	round := func() {
		t.Helper()
		checkEnvelope(t, g.do(t, "GET", "/api/users/7/posts?ids=1,2,3", nil), 200, "succeeded")
		checkProblem(t, g.do(t, "GET", "/api/users/7/posts?ids=1,,3", nil), 400)
		checkProblem(t, g.do(t, "PATCH", "/api/users/7/posts", `[{"id": 4, "name": "four"}, {"id": 5, "name": ""}]`), 422)
	}
	want := func(before reading) reading {
		return reading{
			got: before.got + 1, rejected: before.rejected + 1, rolledBack: before.rolledBack + 1,
			items: before.items + 3, itemsRolledBack: before.itemsRolledBack + 1, compensated: before.compensated + 1,
			durations: before.durations + 2, sizes: before.sizes + 1,
		}
	}

	// The collectors live as long as the process: other tests' batches
	// are in them too, so only what this test adds is compared.
	start := read(g.scrape(t))
	round()
	s := g.scrape(t)
	first := read(s)
	if first != want(start) {
		t.Errorf("after a round: %+v, want %+v", first, want(start))
	}
	checkLabels(t, s, "/7/", "ids=")

	loadCaddyfile(t, g.config(site("\n\t\tmax_items 50")))
	s = g.scrape(t)
	if got := read(s); got != first {
		t.Errorf("after the reload: %+v, want what it was before it, %+v", got, first)
	}
	round()
	s = g.scrape(t)
	if got := read(s); got != want(first) {
		t.Errorf("after a round on the new config: %+v, want %+v", got, want(first))
	}
	checkLabels(t, s, "/7/", "ids=")
}

// TestMetricsLockConflicts: a single write and a partial batch's write
// that wait for an item a batch holds, and give up after item_timeout
// (409), are counted as conflicts, each by who gave up; every lock taken
// or given up on is measured in lock_wait_seconds.
func TestMetricsLockConflicts(t *testing.T) {
	const (
		slow    = 500 * time.Millisecond // each write of the batch that holds the items
		timeout = 800 * time.Millisecond // item_timeout: longer than a write, shorter than the batch
	)
	api := seededAPI()
	g := startGateway(t, api, fmt.Sprintf(`
	batch {
		concurrency 1
		item_timeout %s
		resource /api/widgets {`+resourceMethods+`
			allow_override
		}
	}
	handle /metrics {
		metrics
	}
	reverse_proxy UPSTREAM
`, timeout))
	for _, id := range []string{"4", "5", "6"} {
		api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + id, Delay: slow})
	}
	conflicts := func(s series, request string) float64 {
		return s.get("caddy_http_batch_lock_conflicts_total", map[string]string{"resource": "/api/widgets", "request": request})
	}
	waits := func(s series) (count, seconds float64) {
		l := map[string]string{"resource": "/api/widgets"}
		return s.get("caddy_http_batch_lock_wait_seconds", l), s.sum("caddy_http_batch_lock_wait_seconds", l)
	}
	before := g.scrape(t)
	waitsBefore, secondsBefore := waits(before)

	client := &http.Client{Timeout: 30 * time.Second}
	holder := make(chan response, 1)
	go func() {
		r, err := send(client, g.URL, "PATCH", "/api/widgets", `[{"id": 4, "name": "a"}, {"id": 5, "name": "b"}, {"id": 6, "name": "c"}]`)
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		holder <- r
	}()
	// Once its first write is in, the batch holds 4, 5 and 6 for two
	// more slow writes: longer than item_timeout.
	eventually(t, 5*time.Second, "the batch's first write", func() bool { return received(api, "PATCH", "/api/widgets/4") })
	single := make(chan response, 1)
	go func() {
		r, err := send(client, g.URL, "PUT", "/api/widgets/6", `{"name": "single"}`)
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		single <- r
	}()
	req, _ := http.NewRequest("PATCH", g.URL+"/api/widgets", strings.NewReader(`[{"id": 6, "name": "partial"}]`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Prefer", "atomicity=partial")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	partial := response{Status: resp.StatusCode}
	if partial.Status != http.StatusMultiStatus {
		t.Errorf("the partial batch: %d, want 207 (its item refused with 409)", partial.Status)
	}
	if r := <-single; r.Status != http.StatusConflict {
		t.Errorf("the single write: %v, want 409", r)
	}
	if r := <-holder; r.Status != http.StatusOK {
		t.Errorf("the batch that held the items: %v, want 200", r)
	}

	after := g.scrape(t)
	for _, request := range []string{"single", "batch"} {
		if got := conflicts(after, request) - conflicts(before, request); got != 1 {
			t.Errorf("conflicts of %s requests: %v more, want 1", request, got)
		}
	}
	// The batch's three locks, and the two given up on.
	waitsAfter, secondsAfter := waits(after)
	if got := waitsAfter - waitsBefore; got != 5 {
		t.Errorf("lock waits: %v more, want 5", got)
	}
	if got := time.Duration((secondsAfter - secondsBefore) * float64(time.Second)); got < 2*timeout {
		t.Errorf("time waited for locks: %s more, want at least the two item_timeouts given up after (%s)", got, 2*timeout)
	}
	checkLabels(t, after, "/api/widgets/")
}

// gathered reads the running config's Prometheus registry, the one
// Caddy's metrics handler serves. It may be called from any goroutine:
// it returns what went wrong.
func gathered() (series, error) {
	ctx := caddy.ActiveContext()
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil, errors.New("reading the metrics: no Caddy config is running")
	}
	mfs, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering the metrics: %w", err)
	}
	s := series{}
	for _, mf := range mfs {
		s[mf.GetName()] = mf
	}
	return s, nil
}

// metric reads the batch metric caddy_http_batch_<name> of the running
// config, summing the series whose labels include the name-value pairs
// given. It may be called from any goroutine.
func metric(name string, labels ...string) (float64, error) {
	s, err := gathered()
	if err != nil {
		return 0, err
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	return s.get("caddy_http_batch_"+name, want), nil
}

// metricValue is metric for the test's own goroutine.
func metricValue(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, err := metric(name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// slotsReading is what the max_in_flight gauges of the running config
// say: the slots (summed over the sets of slots handlers track, each set
// counted once however many handlers share it), the sub-requests holding
// one, and those waiting for one.
type slotsReading struct{ limit, inFlight, waiting float64 }

func readSlots(t testing.TB) slotsReading {
	t.Helper()
	s, err := gathered()
	if err != nil {
		t.Fatal(err)
	}
	return slotsReading{
		limit:    s.get("caddy_http_batch_in_flight_limit", nil),
		inFlight: s.get("caddy_http_batch_subrequests_in_flight", nil),
		waiting:  s.get("caddy_http_batch_subrequests_waiting", nil),
	}
}
