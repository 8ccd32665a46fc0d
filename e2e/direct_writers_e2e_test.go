package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestUndoNeverOverwritesDirectWriters: with strong ETags, all-or-nothing
// batch updates and deletes through the gateway (some failing on
// purpose) meet writers that go straight to the legacy API, taking no
// lock. In the order the API carried writes out, an undo lands only
// right on top of its own batch's write to that item, never on another
// writer's; and an item reported rolled_back had its write undone.
// The API enforces its ETags' conditions: with conditional_writes they
// are the undos' proofs; without, every undo is also read first.
func TestUndoNeverOverwritesDirectWriters(t *testing.T) {
	t.Run("conditions and reads", func(t *testing.T) { testUndoNeverOverwritesDirectWriters(t, "") })
	t.Run("conditional_writes", func(t *testing.T) { testUndoNeverOverwritesDirectWriters(t, "conditional_writes") })
}

func testUndoNeverOverwritesDirectWriters(t *testing.T, options string) {
	const batches, directWriters, nIDs = 36, 3, 8
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, ETags: true, Seed: records("w", 1, nIDs)})
	g := startGateway(t, api, `
	batch {
		concurrency 3
		batch_timeout 60s
		`+options+`
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	for range 3 {
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: fmt.Sprintf("/api/widgets/%d", 1+rand.IntN(nIDs)), Status: 503, Body: htmlError, Times: 1})
	}
	client := &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: batches + directWriters}}
	defer client.CloseIdleConnections()

	done := make(chan struct{})
	var direct sync.WaitGroup
	for d := range directWriters {
		direct.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-done:
					return
				case <-time.After(time.Duration(1+rand.IntN(5)) * time.Millisecond):
				}
				id := 1 + rand.IntN(nIDs)
				if rand.IntN(2) == 0 {
					// The newest item: most likely one a batch has just
					// created.
					for k := range api.Items("/api/widgets") {
						if n, _ := strconv.Atoi(k); n > id {
							id = n
						}
					}
				}
				path := fmt.Sprintf("/api/widgets/%d?by=direct", id)
				var err error
				switch rand.IntN(8) {
				case 0:
					_, err = send(client, "http://"+g.upstream, "DELETE", path, "")
				case 1, 2, 3:
					_, err = send(client, "http://"+g.upstream, "PUT", path, fmt.Sprintf(`{"id":%d,"name":"w%d","v":"d%d-%d"}`, id, id, d, k))
				default:
					_, err = send(client, "http://"+g.upstream, "PATCH", path, fmt.Sprintf(`{"v":"d%d-%d"}`, d, k))
				}
				if err != nil {
					t.Errorf("direct writer %d: %v", d, err)
					return
				}
			}
		})
	}

	answers := make([]batchAnswer, batches)
	var wg sync.WaitGroup
	for b := range batches {
		wg.Go(func() {
			perm := rand.Perm(nIDs)[:2+rand.IntN(3)]
			method, path, body := "PATCH", "/api/widgets", ""
			switch b % 4 {
			case 0:
				var ids []string
				for _, i := range perm {
					ids = append(ids, strconv.Itoa(i+1))
				}
				method, path = "DELETE", "/api/widgets?ids="+strings.Join(ids, ",")
			default:
				elems := make([]map[string]any, len(perm))
				for k, i := range perm {
					elems[k] = map[string]any{"id": i + 1, "v": fmt.Sprintf("b%d", b)}
					if b%4 == 3 {
						elems[k] = map[string]any{"name": fmt.Sprintf("new b%d-%d", b, k)}
					}
				}
				if b%8 == 1 || b%8 == 7 {
					elems[len(elems)-1]["name"] = "" // the legacy API's 422
				}
				if b%4 == 3 {
					method = "POST"
				}
				raw, _ := json.Marshal(elems)
				body = string(raw)
			}
			answers[b] = sendKeyedBatch(t, client, g.URL, b, method, path, body, nil)
		})
	}
	wg.Wait()
	close(done)
	direct.Wait()

	l := judgeUndos(t, api, answers)
	if l.repeated != 0 {
		t.Errorf("%d undos landed on themselves: a retried conditional undo must fail on its own result", l.repeated)
	}
	for b, a := range answers {
		for _, it := range a.Items {
			if it.Outcome == "rollback_failed" && it.Compensation == nil {
				t.Errorf("batch %d item %d (id %s) is rollback_failed without saying why", b, it.Index, it.ID)
			}
		}
	}
	t.Logf("batch outcomes %v; %d writes carried out; %d re-creates after a direct writer's own delete", l.outcomes, len(l.applied), l.reborn)
}
