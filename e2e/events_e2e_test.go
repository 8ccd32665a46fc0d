package e2e

// Caddy events (docs/operations.md, "Events"): what an events handler
// subscribed to the module's events receives.

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

func init() {
	caddy.RegisterModule(new(eventTap))
}

// eventTap is the test's events.handlers.batchtest_events: it records
// each event it handles, with the name it was configured with (the
// config it belongs to), into heardEvents. Caddy ships no events
// handler that a test could read.
type eventTap struct {
	Name string `json:"name,omitempty"`
}

// heard is one event an eventTap handled.
type heard struct {
	Tap, Event, Origin string
	Data               map[string]any
}

// blockingTap holds the handler named "blocking" in each event until
// release is closed; entered hears that it holds one.
var blockingTap = struct{ entered, release chan struct{} }{make(chan struct{}, 1), make(chan struct{})}

var heardEvents struct {
	mu  sync.Mutex
	all []heard
}

func (*eventTap) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "events.handlers.batchtest_events", New: func() caddy.Module { return new(eventTap) }}
}

// UnmarshalCaddyfile reads `batchtest_events <name>`.
func (h *eventTap) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	h.Name = d.Val()
	return nil
}

func (h *eventTap) Handle(_ context.Context, e caddy.Event) error {
	if h.Name == "blocking" {
		select {
		case blockingTap.entered <- struct{}{}:
		default:
		}
		select {
		case <-blockingTap.release:
		case <-time.After(10 * time.Second):
		}
	}
	raw, _ := json.Marshal(e.Data)
	var data map[string]any
	_ = json.Unmarshal(raw, &data)
	origin := ""
	if e.Origin() != nil {
		origin = string(e.Origin().CaddyModule().ID)
	}
	heardEvents.mu.Lock()
	defer heardEvents.mu.Unlock()
	heardEvents.all = append(heardEvents.all, heard{Tap: h.Name, Event: e.Name(), Origin: origin, Data: data})
	return nil
}

// awaitEvent waits for the first event named name whose data has
// saga, and returns it.
func awaitEvent(t testing.TB, name, saga string, match func(heard) bool) heard {
	t.Helper()
	var got heard
	eventually(t, 5*time.Second, "event "+name+" of saga "+saga, func() bool {
		heardEvents.mu.Lock()
		defer heardEvents.mu.Unlock()
		for _, e := range heardEvents.all {
			if e.Event == name && e.Data["saga"] == saga && (match == nil || match(e)) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// subscribed is the events global option that has tap handle both of
// the module's events.
func subscribed(tap string) string {
	return "\tevents {\n\t\ton batch.saga.left_behind batchtest_events " + tap +
		"\n\t\ton batch.saga.resolved batchtest_events " + tap + "\n\t}"
}

// startSubscribedGateway is startAdminGateway serving operatedSite("put"),
// whose events tap handles.
func startSubscribedGateway(t *testing.T, api *legacyapi.API, tap string) *gateway {
	t.Helper()
	g := &gateway{API: api, client: gatewayClient(t, 60*time.Second), addr: freeAddr(t),
		upstream: newUpstream(t, api), storage: "storage file_system " + t.TempDir(), admin: freeAddr(t), globals: subscribed(tap)}
	g.start(t, operatedSite("put"))
	return g
}

// A batch that leaves an item behind, a retry that leaves it still, a
// retry that finishes it and an operator's resolve of another are each
// an event with its data: the saga, where it ran, the item and why; no
// pre-image.
func TestEventsOfASagaLeftBehind(t *testing.T) {
	api := seededAPI()
	g := startSubscribedGateway(t, api, "A")
	saga := leaveWidget17Behind(t, g)

	e := awaitEvent(t, "batch.saga.left_behind", saga, func(e heard) bool { return e.Data["source"] == "batch" })
	items, _ := e.Data["items"].([]any)
	if e.Tap != "A" || e.Origin != "batch" || e.Data["kept"] != true || e.Data["count"] != 1.0 || len(items) != 1 ||
		e.Data["resource"] != "/api/widgets" || e.Data["op"] != "delete" || e.Data["outcome"] != "rollback_failed" {
		t.Fatalf("left_behind %+v", e)
	}
	if it := items[0].(map[string]any); it["id"] != "17" || it["index"] != 0.0 || it["reason"] == "" {
		t.Errorf("item %v", it)
	}
	if raw, _ := json.Marshal(e.Data); containsAny(string(raw), "w17", "s3cret") {
		t.Errorf("the event holds a pre-image or credential: %s", raw)
	}

	auth := map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}}
	g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", auth)
	awaitEvent(t, "batch.saga.left_behind", saga, func(e heard) bool { return e.Data["source"] == "retry" })

	g.reload(t, operatedSite("post"))
	g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", auth)
	r := awaitEvent(t, "batch.saga.resolved", saga, nil)
	if r.Data["by"] != "retry" || r.Data["items"] != 1.0 {
		t.Errorf("resolved %+v", r)
	}

	g.reload(t, operatedSite("put"))
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	other := leaveWidget17Behind(t, g)
	g.adminDo(t, "POST", "/batch/sagas/"+other+"/resolve", map[string]any{"reason": "put back by hand"})
	r = awaitEvent(t, "batch.saga.resolved", other, nil)
	if r.Data["by"] != "operator" || r.Data["reason"] != "put back by hand" {
		t.Errorf("resolved %+v", r)
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// An event queued under a config that is unloaded before the handlers
// get to it goes through the events app of the config running then:
// the new config's handler hears it, the old one's does not.
func TestEventsGoThroughTheRunningConfig(t *testing.T) {
	api := seededAPI()
	g := startSubscribedGateway(t, api, "blocking")
	saga := leaveWidget17Behind(t, g)
	select {
	case <-blockingTap.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the left_behind event did not reach the handler")
	}
	g.adminDo(t, "POST", "/batch/sagas/"+saga+"/resolve", map[string]any{"reason": "put back by hand"})
	g.globals = subscribed("B")
	g.reload(t, operatedSite("put"))
	close(blockingTap.release)
	r := awaitEvent(t, "batch.saga.resolved", saga, nil)
	if r.Tap != "B" {
		t.Errorf("the resolved event was handled by %q, want the running config's B", r.Tap)
	}
}
