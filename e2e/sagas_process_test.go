package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// operatedConfig is the Caddyfile of a gateway process at addr, with its
// admin endpoint at admin, in front of upstream, keeping its storage in
// dir (a folder, or a whole storage option); resource is the widgets'
// resource block (or another resource's).
func operatedConfig(addr, admin, upstream, dir, lease, resource string) string {
	storage := dir
	if !strings.HasPrefix(dir, "storage ") {
		storage = "storage file_system " + dir
	}
	return fmt.Sprintf(`{
	admin %[2]s
	persist_config off
	auto_https off
	grace_period 1s
	%[4]s
	batch {
		lease %[5]s
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
		concurrency 1
		compensation_retries 0
		%[6]s
	}
	reverse_proxy %[3]s
}
`, addr, admin, upstream, storage, lease, resource)
}

func widgetsResource(restore string) string {
	return "resource /api/widgets {" + resourceMethods + "\n\t\t\trestore_deleted " + restore + "\n\t\t}"
}

// processAdmin is an admin endpoint of a Caddy process, as a gateway
// the admin helpers can talk to.
func processAdmin(admin string) *gateway {
	return &gateway{admin: admin, client: &http.Client{Timeout: 60 * time.Second}}
}

// killMidDelete sends DELETE ids to the gateway at addr, and kills p once
// the first widget is deleted and the second's DELETE is held at the API.
func killMidDelete(t *testing.T, p *caddyProcess, addr string, api *legacyapi.API, first, second string) func() {
	t.Helper()
	held, release := heldUntilReleased(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/" + second, Status: 500, Body: htmlError})
	api.Inject(held)
	go func() {
		resp, err := http.Post("http://"+addr+"/api/widgets?ids="+first+","+second+"&_method=DELETE", "application/json", nil)
		if err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, 30*time.Second, "widget "+first+" deleted and widget "+second+"'s DELETE held", func() bool {
		_, ok := api.Item("/api/widgets", first)
		return !ok && api.InFlight() == 1
	})
	p.kill()
	return release
}

// TestSagaStuckAndRecoveredKept: a saga whose gateway was killed, and
// whose resource the recovering instance does not serve, is stuck with
// the reason; after the config is restored (restore_deleted post), a
// retry finishes it. A saga recovered after kill -9 that leaves items
// behind is kept, and the recovery's ERROR line holds no pre-image.
func TestSagaStuckAndRecoveredKept(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 10)},
		legacyapi.Collection{Path: "/api/gadgets", Seed: records("g", 1, 3)})
	upstream := newUpstream(t, api)
	dir := t.TempDir()
	gadgets := "resource /api/gadgets {" + resourceMethods + "\n\t\t}"

	addrA := freeAddr(t)
	a := startCaddyProcess(t, bin, operatedConfig(addrA, "off", upstream, dir, "2s", widgetsResource("put")), addrA)
	release := killMidDelete(t, a, addrA, api, "1", "2")
	defer release()
	time.Sleep(2500 * time.Millisecond) // A's lease lapses; B takes the saga over at start

	addrB, adminB := freeAddr(t), freeAddr(t)
	b := startCaddyProcess(t, bin, operatedConfig(addrB, adminB, upstream, dir, "2s", gadgets), addrB)
	g := processAdmin(adminB)
	var stuck []summaryJSON
	eventually(t, 30*time.Second, "the saga listed stuck", func() bool {
		stuck = listSagas(t, g, "?state=stuck")
		return len(stuck) == 1
	})
	if !strings.Contains(stuck[0].Reason, "no batch handler") {
		t.Errorf("stuck with reason %q, want that no batch handler serves it", stuck[0].Reason)
	}
	// The config is restored, with the fix: B's lease on the saga still
	// holds, so no scan takes it before the retry does.
	loadConfig(t, g, operatedConfig(addrB, adminB, upstream, dir, "30s", widgetsResource("post")))
	s := decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+stuck[0].ID+"/retry", nil), 200)
	if s.State != "resolved" {
		t.Fatalf("retry of the stuck saga: %+v", s)
	}
	if _, ok := api.Item("/api/widgets", "1"); !ok {
		t.Error("widget 1 was not put back")
	}
	if got := listSagas(t, g, ""); len(got) != 0 {
		t.Errorf("sagas left: %+v", got)
	}

	// A saga recovered after kill -9 that leaves an item behind is kept
	// (B takes it over once it saw its lease unchanged for one of its
	// own: 2s).
	loadConfig(t, g, operatedConfig(addrB, adminB, upstream, dir, "2s", widgetsResource("put")))
	addrC := freeAddr(t)
	c := startCaddyProcess(t, bin, operatedConfig(addrC, "off", upstream, dir, "2s", widgetsResource("put")), addrC)
	release2 := killMidDelete(t, c, addrC, api, "3", "4")
	defer release2()
	var kept []summaryJSON
	eventually(t, 30*time.Second, "the recovered saga kept", func() bool {
		kept = listSagas(t, g, "?state=left_behind")
		return len(kept) == 1
	})
	// The saga is kept as its run ends, and the line logged after.
	var line map[string]any
	eventually(t, 10*time.Second, "the recovery's ERROR line", func() bool {
		for _, e := range b.entries(t) {
			if e["level"] == "error" && e["saga"] == kept[0].ID {
				line = e
			}
		}
		return line != nil
	})
	if line["show"] != "caddy batch saga "+kept[0].ID || line["preimages"] != nil {
		t.Errorf("the recovery's ERROR line %v, want it to name the saga and hold no pre-image", line)
	}
	raw, _ := json.Marshal(line)
	if strings.Contains(string(raw), `"w3"`) {
		t.Errorf("the recovery's ERROR line holds widget 3's pre-image: %s", raw)
	}
	s = decodeSaga(t, g.adminDo(t, "GET", "/batch/sagas/"+kept[0].ID, nil), 200)
	if s.Items[0].ID != "3" || s.Items[0].Outcome != "rollback_failed" || s.Items[0].Preimage["name"] != "w3" {
		t.Errorf("the kept saga's item 0: %+v", s.Items[0])
	}
}

// loadConfig loads a Caddyfile through an admin endpoint, as caddy
// reload does.
func loadConfig(t *testing.T, g *gateway, caddyfile string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+g.admin+"/load", strings.NewReader(caddyfile))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("loading the config: %d", resp.StatusCode)
	}
}

// TestSagaClusterOperations: two instances sharing a Redis storage; a
// saga one left behind is listed, retried and resolved through the
// other's admin endpoint, and of two retries at once (one on each
// instance) one runs and the other is 409.
func TestSagaClusterOperations(t *testing.T) {
	t.Parallel()
	bin := caddyBinary(t)
	api := seededAPI()
	upstream := newUpstream(t, api)
	host, port, prefix := redisServer(t)
	storage := redisOption(host, port, prefix)
	addrA, adminA, addrB, adminB := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	startCaddyProcess(t, bin, operatedConfig(addrA, adminA, upstream, storage, "30s", widgetsResource("put")), addrA)
	startCaddyProcess(t, bin, operatedConfig(addrB, adminB, upstream, storage, "30s", widgetsResource("put")), addrB)
	a, b := processAdmin(adminA), processAdmin(adminB)

	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	resp, err := http.Post("http://"+addrA+"/api/widgets?ids=17,18&_method=DELETE", "application/json", nil)
	if err != nil || resp.StatusCode != 500 {
		t.Fatalf("the batch on A: %v %v", resp, err)
	}
	resp.Body.Close()
	api.ClearFaults()
	list := listSagas(t, b, "")
	if len(list) != 1 || list[0].State != "left_behind" {
		t.Fatalf("B lists %+v, want A's saga left behind", list)
	}
	saga := list[0].ID

	// A retry on A holds at the API's PUT; one on B meanwhile is 409.
	held, release := heldUntilReleased(legacyapi.Fault{Method: "PUT", Path: "/api/widgets/17", Status: 404, Body: htmlError})
	api.Inject(held)
	first := make(chan response, 1)
	go func() {
		r, err := a.adminTry("POST", "/batch/sagas/"+saga+"/retry", nil)
		if err != nil {
			r = response{Status: -1, Body: []byte(err.Error())}
		}
		first <- r
	}()
	eventually(t, 30*time.Second, "A's retry at the API", func() bool { return api.InFlight() == 1 })
	if r := b.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", nil); r.Status != 409 || !strings.Contains(string(r.Body), "saga-running") {
		t.Errorf("a retry on B while A's runs: %s, want 409 saga-running", r)
	}
	if got := listSagas(t, b, ""); len(got) != 1 || got[0].State != "running" {
		t.Errorf("B lists %+v while A retries, want it running", got)
	}
	release()
	if s := decodeSaga(t, <-first, 200); s.State != "left_behind" {
		t.Errorf("A's retry: %+v", s)
	}
	api.ClearFaults()

	if s := decodeSaga(t, b.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", nil), 200); s.State != "left_behind" || s.Items[0].Reason == "" {
		t.Errorf("B's retry: %+v", s)
	}
	if s := decodeSaga(t, b.adminDo(t, "POST", "/batch/sagas/"+saga+"/resolve", map[string]any{"reason": "restored by hand"}), 200); s.State != "resolved" {
		t.Errorf("B's resolve: %+v", s)
	}
	if got := listSagas(t, a, ""); len(got) != 0 {
		t.Errorf("A lists %+v after B resolved it", got)
	}
}
