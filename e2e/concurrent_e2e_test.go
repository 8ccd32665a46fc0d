package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchConcurrentThroughCaddy runs many batches of 20 items at once
// through one Caddy (run it with -race): GETs, CREATEs, UPDATEs and
// DELETEs on disjoint ids, some all-or-nothing ones failing on purpose.
// Every answer must say what happened, and the legacy API must hold
// exactly what the answers say.
func TestBatchConcurrentThroughCaddy(t *testing.T) {
	const (
		perOp  = 30 // batches of each operation
		items  = 20 // items per batch
		failed = 4  // one batch in failed fails on purpose
	)
	api := legacyapi.NewRecording(
		// updates use widgets 1..600, GETs 601..1200
		legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 2*perOp*items)},
		legacyapi.Collection{Path: "/api/gadgets", PutCreates: true, Seed: records("g", 1, perOp*items)},
		legacyapi.Collection{Path: "/api/things"},
	)
	g := startGateway(t, api, `
	batch {
		concurrency 8
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
		resource /api/things {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	widgets, gadgets := api.Items("/api/widgets"), api.Items("/api/gadgets")
	failing := func(b int) bool { return b%failed == 1 }
	id := func(b, i int) int { return b*items + i + 1 }

	type call struct {
		op, method, path, body string
		batch                  int
	}
	var calls []call
	for b := range perOp {
		var ids []string
		var creates, updates []map[string]any
		for i := range items {
			ids = append(ids, strconv.Itoa(id(b, i)))
			name := fmt.Sprintf("b%d-%d", b, i)
			if failing(b) && i == 13 {
				name = "" // the legacy API's 422
			}
			creates = append(creates, map[string]any{"name": name, "batch": b})
			updates = append(updates, map[string]any{"id": id(b, i), "name": name})
		}
		gets := make([]string, items)
		for i := range items {
			gets[i] = strconv.Itoa(perOp*items + id(b, i))
		}
		if failing(b) {
			api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/" + strconv.Itoa(id(b, 7)), Status: 503, Body: htmlError})
		}
		create, _ := json.Marshal(creates)
		update, _ := json.Marshal(updates)
		calls = append(calls,
			call{"get", "GET", "/api/widgets?ids=" + strings.Join(gets, ","), "", b},
			call{"create", "POST", "/api/things", string(create), b},
			call{"update", "PATCH", "/api/widgets", string(update), b},
			call{"delete", "DELETE", "/api/gadgets?ids=" + strings.Join(ids, ","), "", b},
		)
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: len(calls)}}
	defer client.CloseIdleConnections()
	answers := make([]response, len(calls))
	errs := make([]error, len(calls))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k, c := range calls {
		wg.Go(func() {
			<-start
			answers[k], errs[k] = send(client, g.URL, c.method, c.path, c.body)
		})
	}
	close(start)
	wg.Wait()

	things := api.Items("/api/things")
	createdBy := map[int]int{} // batch -> records of things it left
	for _, rec := range things {
		n, _ := rec["batch"].(json.Number).Int64()
		createdBy[int(n)]++
	}
	for k, c := range calls {
		if errs[k] != nil {
			t.Errorf("%s batch %d: %v", c.op, c.batch, errs[k])
			continue
		}
		r := answers[k]
		var b batchAnswer
		if err := json.Unmarshal(r.Body, &b); err != nil || len(b.Items) != items {
			t.Errorf("%s batch %d: %d %s", c.op, c.batch, r.Status, r.Body)
			continue
		}
		fail := failing(c.batch) && c.op != "get"
		wantStatus := map[string]int{"get": 200, "create": 201, "update": 200, "delete": 200}[c.op]
		if fail {
			wantStatus = map[string]int{"create": 422, "update": 422, "delete": 502}[c.op]
		}
		if r.Status != wantStatus || fail != (b.Outcome == "rolled_back") || !fail && b.Outcome != "succeeded" {
			t.Errorf("%s batch %d: status %d outcome %q, want %d (failing on purpose: %v)", c.op, c.batch, r.Status, b.Outcome, wantStatus, fail)
			continue
		}
		for i, it := range b.Items {
			ok := it.Outcome == "succeeded"
			if fail {
				ok = it.Outcome == "rolled_back" || it.Outcome == "failed" || it.Outcome == "not_attempted"
			}
			if !ok || it.Index != i {
				t.Errorf("%s batch %d item %d: index %d outcome %q", c.op, c.batch, i, it.Index, it.Outcome)
			}
		}
		switch c.op {
		case "get":
			for i, it := range b.Items {
				want := widgets[strconv.Itoa(perOp*items+id(c.batch, i))]
				if !sameJSON(t, it.Body, want) {
					t.Errorf("get batch %d item %d: %s, want %v", c.batch, i, it.Body, want)
				}
			}
		case "create":
			if fail {
				if createdBy[c.batch] != 0 {
					t.Errorf("create batch %d failed but left %d records behind", c.batch, createdBy[c.batch])
				}
				continue
			}
			if createdBy[c.batch] != items {
				t.Errorf("create batch %d succeeded and left %d records, want %d", c.batch, createdBy[c.batch], items)
			}
			for i, it := range b.Items {
				if rec := things[it.ID]; rec["name"] != fmt.Sprintf("b%d-%d", c.batch, i) {
					t.Errorf("create batch %d item %d: id %q holds %v", c.batch, i, it.ID, rec)
				}
			}
		case "update":
			for i := range items {
				key := strconv.Itoa(id(c.batch, i))
				rec, _ := api.Item("/api/widgets", key)
				if fail && !reflect.DeepEqual(rec, widgets[key]) || !fail && rec["name"] != fmt.Sprintf("b%d-%d", c.batch, i) {
					t.Errorf("update batch %d (failing: %v): widget %s is %v (was %v)", c.batch, fail, key, rec, widgets[key])
				}
			}
		case "delete":
			for i := range items {
				key := strconv.Itoa(id(c.batch, i))
				rec, exists := api.Item("/api/gadgets", key)
				if fail && !reflect.DeepEqual(rec, gadgets[key]) || !fail && exists {
					t.Errorf("delete batch %d (failing: %v): gadget %s is %v (exists: %v)", c.batch, fail, key, rec, exists)
				}
			}
		}
	}
	want := 0
	for b := range perOp {
		if !failing(b) {
			want += items
		}
	}
	if len(things) != want {
		t.Errorf("/api/things holds %d records, want %d: orphans", len(things), want)
	}
	for k := range widgets {
		if n, _ := strconv.Atoi(k); n > perOp*items {
			if rec, _ := api.Item("/api/widgets", k); !reflect.DeepEqual(rec, widgets[k]) {
				t.Errorf("widget %s, only ever read, is %v", k, rec)
			}
		}
	}
}
