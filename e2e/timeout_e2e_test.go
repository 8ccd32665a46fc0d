package e2e

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchTimeout: batch_timeout bounds a batch; what it cut short is
// undone like any failure, and the answer is 504.
func TestBatchTimeout(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency   1
		batch_timeout 400ms
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	for _, id := range []string{"1", "2", "3"} {
		api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/" + id, Delay: 250 * time.Millisecond})
	}
	before := api.Items("/api/widgets")
	b := checkProblem(t, g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]`), 504)
	if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" || b.Items[2].Outcome != "not_attempted" {
		t.Errorf("outcome %q items %v", b.Outcome, b.Outcomes())
	}
	sameState(t, api, "/api/widgets", before)
	if received(api, "PATCH", "/api/widgets/3") {
		t.Error("an item was started after batch_timeout")
	}
}

// TestBatchClientGoesAway: a client that hangs up mid-batch must not
// leave an all-or-nothing batch half done: the write in flight finishes,
// nothing new starts, and what happened is undone (or, if everything
// happened, stands), detached from the client's cancellation.
func TestBatchClientGoesAway(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/2", Delay: 400 * time.Millisecond})
	before := api.Items("/api/widgets")
	impatient := &http.Client{Timeout: 150 * time.Millisecond}
	req, _ := http.NewRequest("PATCH", g.URL+"/api/widgets", strings.NewReader(`[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]`))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := impatient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client got an answer (%d) before it gave up", resp.StatusCode)
	}
	var line map[string]any
	eventually(t, 5*time.Second, "the batch's log line", func() bool {
		for _, e := range testLogs.entries("http.handlers.batch") {
			if e["op"] == "update" {
				line = e
				return true
			}
		}
		return false
	})
	after := api.Items("/api/widgets")
	changed := 0
	for _, id := range []string{"1", "2", "3"} {
		if !reflect.DeepEqual(after[id], before[id]) {
			changed++
		}
	}
	if changed != 0 && changed != 3 {
		t.Errorf("half a batch was left: %d of 3 items changed (log: %v)", changed, line)
	}
	if changed == 0 && line["outcome"] != "rolled_back" && line["outcome"] != "failed" {
		t.Errorf("nothing changed, but the batch's outcome is %v", line["outcome"])
	}
}
