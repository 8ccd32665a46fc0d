package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchConfigReloadInFlight reloads Caddy's config while batches
// run, each held at the upstream until the new config serves. A reload
// does not wait for them: caddy.Load returns once the new config serves,
// the old servers drain within grace_period, and the old config's context
// (the one the module was provisioned with) is cancelled at once. Every batch in flight must still finish correctly,
// including the compensations of one that fails after the reload, and a
// batch sent after the reload must get the new config.
func TestBatchConfigReloadInFlight(t *testing.T) {
	// max_in_flight is pinned: six batches hold a request each at the
	// upstream at once, more than the default auto's first 4 slots let
	// through, and the test waits to see every one of them there.
	site := func(extra string) string {
		return `
	batch {
		concurrency 1
		max_in_flight 32
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/gadgets {` + resourceMethods + `
		}` + extra + `
	}
	reverse_proxy UPSTREAM
`
	}
	api := seededAPI()
	g := startGateway(t, api, site(""))

	// Before the reload /api/gizmos is no resource: a GET with ids is a
	// LIST the legacy API answers with an array.
	if r := g.do(t, "GET", "/api/gizmos?ids=1,2", nil); r.Status != 200 || !strings.HasPrefix(string(r.Body), "[") {
		t.Fatalf("before the reload: %v, want the legacy API's list", r)
	}

	widgets, gadgets := api.Items("/api/widgets"), api.Items("/api/gadgets")
	// Each batch's slow request is held at the upstream until the new
	// config is seen serving, however long the reload takes.
	release := make(chan struct{})
	for _, f := range []legacyapi.Fault{
		{Method: "GET", Path: "/api/widgets/2", Until: release},
		{Method: "PATCH", Path: "/api/widgets/4", Until: release},
		{Method: "PATCH", Path: "/api/widgets/6", Until: release},
		{Method: "POST", Path: "/api/widgets", Until: release, Times: 1},
		{Method: "DELETE", Path: "/api/gadgets/8", Until: release},
		{Method: "DELETE", Path: "/api/gadgets/10", Until: release},
		{Method: "DELETE", Path: "/api/gadgets/11", Status: 500, Body: htmlError},
	} {
		api.Inject(f)
	}
	inFlight := []struct {
		name, op, method, path, body string
		items                        int
		status                       int
		outcome                      string
		slowRequest                  string // the request that keeps it in flight
	}{
		{"get", "get", "GET", "/api/widgets?ids=1,2,3", "", 3, 200, "succeeded", "GET /api/widgets/2"},
		{"update", "update", "PATCH", "/api/widgets", `[{"id": 4, "name": "four"}, {"id": 5, "name": "five"}]`, 2, 200, "succeeded", "PATCH /api/widgets/4"},
		{"update that fails after the reload", "update", "PATCH", "/api/widgets", `[{"id": 6, "name": "six"}, {"id": 7, "name": ""}]`, 2, 422, "rolled_back", "PATCH /api/widgets/6"},
		{"create", "create", "POST", "/api/widgets", `[{"name": "r1"}, {"name": "r2"}]`, 2, 201, "succeeded", "POST /api/widgets"},
		{"delete", "delete", "DELETE", "/api/gadgets?ids=8,9", "", 2, 200, "succeeded", "DELETE /api/gadgets/8"},
		{"delete that fails after the reload", "delete", "DELETE", "/api/gadgets?ids=10,11", "", 2, 502, "rolled_back", "DELETE /api/gadgets/10"},
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	answers := make([]chan response, len(inFlight))
	for i, b := range inFlight {
		answers[i] = make(chan response, 1)
		go func() {
			r, err := send(client, g.URL, b.method, b.path, b.body)
			if err != nil {
				r = response{Status: -1, Body: []byte(err.Error())}
			}
			answers[i] <- r
		}()
	}
	for _, b := range inFlight {
		method, path, _ := strings.Cut(b.slowRequest, " ")
		eventually(t, 5*time.Second, b.slowRequest, func() bool { return received(api, method, path) })
	}

	newConfig := adaptCaddyfile(t, g.config(site(`
		resource /api/gizmos {`+resourceMethods+`
		}
		max_items 3`)))
	loaded := make(chan error, 1)
	go func() { loaded <- caddy.Load(newConfig, true) }()
	if err := <-loaded; err != nil {
		t.Fatalf("reloading: %v", err)
	}
	for i, b := range inFlight {
		select {
		case r := <-answers[i]:
			t.Fatalf("%s answered before the reload finished (%v): the test did not reload under it", b.name, r)
		default:
		}
	}

	// The new config serves while the old batches still run.
	fresh := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var r response
	eventually(t, 5*time.Second, "the new config", func() bool {
		var err error
		r, err = send(fresh, g.URL, "GET", "/api/gizmos?ids=1,2", "")
		return err == nil && strings.HasPrefix(string(r.Body), "{")
	})
	b := checkEnvelope(t, r, 200, "succeeded")
	if len(b.Items) != 2 || !sameJSON(t, b.Items[1].Body, map[string]any{"id": 2, "name": "z2"}) {
		t.Errorf("batch GET on the new resource: %s", r.Body)
	}
	close(release)

	for i, want := range inFlight {
		r := <-answers[i]
		if r.Status != want.status {
			t.Errorf("%s: status %d, want %d: %s", want.name, r.Status, want.status, r.Body)
			continue
		}
		var got batchAnswer
		if err := json.Unmarshal(r.Body, &got); err != nil || got.Outcome != want.outcome {
			t.Errorf("%s: outcome %q, want %q: %s", want.name, got.Outcome, want.outcome, r.Body)
		}
		if want.name == "create" {
			for _, it := range got.Items {
				if rec, ok := api.Item("/api/widgets", it.ID); !ok || !strings.HasPrefix(rec["name"].(string), "r") {
					t.Errorf("create: item %d (id %q) is not there: %v", it.Index, it.ID, rec)
				}
			}
		}
	}
	// One log line per batch, from the old config's logger too.
	lines := testLogs.entries("http.handlers.batch")
	for _, want := range inFlight {
		found := false
		for i, e := range lines {
			if e["op"] == want.op && e["outcome"] == want.outcome && e["items"] == float64(want.items) {
				lines = append(lines[:i], lines[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: no log line (op %s, outcome %s)", want.name, want.op, want.outcome)
		}
	}

	after := api.Items("/api/widgets")
	if after["4"]["name"] != "four" || after["5"]["name"] != "five" {
		t.Errorf("the update in flight was not applied: %v %v", after["4"], after["5"])
	}
	for _, id := range []string{"1", "2", "3", "6", "7"} {
		if !reflect.DeepEqual(after[id], widgets[id]) {
			t.Errorf("widget %s is %v, want %v", id, after[id], widgets[id])
		}
	}
	afterGadgets := api.Items("/api/gadgets")
	for _, id := range []string{"8", "9"} {
		if _, ok := afterGadgets[id]; ok {
			t.Errorf("gadget %s was not deleted", id)
		}
	}
	for _, id := range []string{"10", "11"} {
		if !reflect.DeepEqual(afterGadgets[id], gadgets[id]) {
			t.Errorf("gadget %s is %v, want it restored to %v", id, afterGadgets[id], gadgets[id])
		}
	}

	// A batch after the reload has the new limits.
	if r, err := send(fresh, g.URL, "GET", "/api/widgets?ids=1,2,3,4", ""); err != nil || r.Status != 413 {
		t.Errorf("4 ids under the new max_items 3: %v %v", r, err)
	}
}

// TestLockTableOutlivesReloads: a saga that is still compensating when
// the config is reloaded to one without a batch handler, and back, keeps
// its items locked against the later config's writers: the local lock
// table lives as long as the process, not as long as some handler. A
// single write to the saga's item waits for it (and, with a short
// item_timeout, is refused 409 without reaching the API); once the undo
// is done, the write comes after it.
func TestLockTableOutlivesReloads(t *testing.T) {
	withBatch := func(extra string) string {
		return `
	batch {
		concurrency 1` + extra + `
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
	}
	api := seededAPI()
	g := startGateway(t, api, withBatch(""))
	release := make(chan struct{})
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/2", Status: 500, Body: htmlError})
	api.Inject(legacyapi.Fault{Method: "PUT", Path: "/api/widgets/1", Until: release, Times: 1}) // the undo of widget 1

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	saga := make(chan response, 1)
	go func() {
		r, err := send(client, g.URL, "PATCH", "/api/widgets", `[{"id": 1, "name": "saga"}, {"id": 2, "name": "x"}]`)
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		saga <- r
	}()
	eventually(t, 5*time.Second, "the undo of widget 1", func() bool { return received(api, "PUT", "/api/widgets/1") })

	for _, site := range []string{"\n\treverse_proxy UPSTREAM\n", withBatch("\n\t\titem_timeout 300ms")} {
		if err := caddy.Load(adaptCaddyfile(t, g.config(site)), true); err != nil {
			t.Fatalf("reloading: %v", err)
		}
	}
	fresh := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	r, err := sendPastReload(fresh, g.URL, "PATCH", "/api/widgets/1", `{"name": "single"}`)
	if err != nil || r.Status != http.StatusConflict {
		t.Errorf("a single write while the saga undoes its item: %v %v, want 409", r, err)
	}
	if n := len(requestsWith(api, "PATCH", "/api/widgets/1")); n != 1 { // the saga's own
		t.Errorf("%d PATCHes of widget 1 reached the API while the saga held it, want the saga's alone", n)
	}
	close(release)
	var got batchAnswer
	if r := <-saga; json.Unmarshal(r.Body, &got) != nil || got.Outcome != "rolled_back" {
		t.Errorf("the saga: %v, want rolled_back", r)
	}
	if r, err := sendPastReload(fresh, g.URL, "PATCH", "/api/widgets/1", `{"name": "single"}`); err != nil || r.Status != 200 {
		t.Fatalf("the single write after the saga: %v %v", r, err)
	}
	if w1, _ := api.Item("/api/widgets", "1"); w1["name"] != "single" {
		t.Errorf("widget 1 is %v: the single write did not come after the undo", w1)
	}
}

// sendPastReload is send, again while the connection is reset before
// the request goes: Caddy listens with SO_REUSEPORT, so a reload opens
// the new config's socket beside the old one, and closing the old one
// resets the connections still in its backlog. Nothing was sent on such
// a connection, so sending again is what any client may do. A fresh
// connection the old socket had accepted, and closed with no answer
// (EOF), is sent again too: its request was never served by the old
// config's handlers, and the callers count what reached the API, so one
// that did would still fail them.
func sendPastReload(client *http.Client, base, method, path, body string) (response, error) {
	for try := 0; ; try++ {
		r, err := send(client, base, method, path, body)
		var op *net.OpError
		dial := errors.As(err, &op) && op.Op == "dial"
		if err == nil || try == 4 || !dial && !errors.Is(err, io.EOF) {
			return r, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requestsWith lists the requests the API received with method to path.
func requestsWith(api *legacyapi.API, method, path string) []legacyapi.Request {
	var out []legacyapi.Request
	for _, r := range requestsTo(api, path) {
		if r.Method == method {
			out = append(out, r)
		}
	}
	return out
}
