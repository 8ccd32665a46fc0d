package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchOperationsLogging: one log line per batch with the facts an
// operator needs (ERROR with the ids for rollback_failed), and the
// placeholders for access logs.
func TestBatchOperationsLogging(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	log_append batch_op {http.batch.op}
	log_append batch_items {http.batch.items}
	log_append batch_outcome {http.batch.outcome}
	batch {
		concurrency 1
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
	log {
		output batchtest
		format json
	}
`)
	// widgets' PUT cannot create, so the default restore_deleted put
	// cannot bring back a deleted widget: an honest rollback_failed.
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	tests := []struct {
		method, path, body string
		status             int
		op                 string
		items              int
		outcome            string
		level              string
		compensations      bool
	}{
		{"GET", "/api/widgets?ids=1,2,3", "", 200, "get", 3, "succeeded", "info", false},
		{"POST", "/api/widgets", `[{"name": "a"}, {"name": "b"}]`, 201, "create", 2, "succeeded", "info", false},
		{"PATCH", "/api/widgets", `[{"id": 4, "name": "a"}, {"id": 5, "name": ""}]`, 422, "update", 2, "rolled_back", "info", true},
		{"DELETE", "/api/widgets?ids=17,18,19", "", 500, "delete", 3, "rollback_failed", "error", true},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			testLogs.reset()
			body := optionalBody(tt.body)
			r := g.do(t, tt.method, tt.path, body)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			entries := testLogs.entries("http.handlers.batch")
			if len(entries) != 1 {
				t.Fatalf("%d batch log lines, want 1: %v", len(entries), entries)
			}
			e := entries[0]
			if e["level"] != tt.level || e["op"] != tt.op || e["resource"] != "/api/widgets" ||
				e["items"] != float64(tt.items) || e["outcome"] != tt.outcome {
				t.Errorf("log line %v, want level %s op %s resource /api/widgets items %d outcome %s", e, tt.level, tt.op, tt.items, tt.outcome)
			}
			if d, ok := e["duration"].(float64); !ok || d <= 0 {
				t.Errorf("duration %v", e["duration"])
			}
			if c, ok := e["compensations"].(float64); !ok || (c > 0) != tt.compensations {
				t.Errorf("compensations %v, want some: %v", e["compensations"], tt.compensations)
			}
			if tt.outcome == "rollback_failed" {
				lb, _ := e["left_behind"].([]any)
				if len(lb) != 1 || !strings.Contains(fmt.Sprint(lb[0]), "17") {
					t.Errorf("left_behind %v, want widget 17 alone", e["left_behind"])
				}
				if _, ok := api.Item("/api/widgets", "17"); ok {
					t.Error("widget 17 exists: then it was not left behind")
				}
				for _, id := range []string{"18", "19"} {
					if _, ok := api.Item("/api/widgets", id); !ok {
						t.Errorf("widget %s was deleted", id)
					}
				}
				b := r.batch(t)
				if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed", "not_attempted"}) {
					t.Errorf("item outcomes %v", got)
				}
			}
			var access map[string]any
			for _, a := range testLogs.entries("http.log.access.log0") {
				if rq, _ := a["request"].(map[string]any); rq["uri"] == tt.path && rq["method"] == tt.method {
					access = a
				}
			}
			if access == nil {
				t.Fatalf("no access log entry for %s %s", tt.method, tt.path)
			}
			if access["batch_op"] != tt.op || fmt.Sprint(access["batch_items"]) != strconv.Itoa(tt.items) || access["batch_outcome"] != tt.outcome {
				t.Errorf("access log batch_op %v batch_items %v batch_outcome %v, want %s %d %s",
					access["batch_op"], access["batch_items"], access["batch_outcome"], tt.op, tt.items, tt.outcome)
			}
		})
	}
}
