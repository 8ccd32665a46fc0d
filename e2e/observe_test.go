package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// batchLine returns the one batch log line, failing the test if there is
// not exactly one.
func batchLine(t testing.TB) map[string]any {
	t.Helper()
	entries := testLogs.entries("http.handlers.batch")
	if len(entries) != 1 {
		t.Fatalf("%d batch log lines, want 1: %v", len(entries), entries)
	}
	return entries[0]
}

// accessLine returns the access log's entry of the request method uri.
func accessLine(t testing.TB, method, uri string) map[string]any {
	t.Helper()
	for _, a := range testLogs.entries("http.log.access.log0") {
		if rq, _ := a["request"].(map[string]any); rq["uri"] == uri && rq["method"] == method {
			return a
		}
	}
	t.Fatalf("no access log entry for %s %s", method, uri)
	return nil
}

// TestLogLineIdentifiesTheRequest: the batch's log line, and the DEBUG
// line of a batch refused before anything was sent, carry the request's
// uuid, method, URI and client IP as Caddy's access log has them, so the
// two can be joined; the refused batch's outcome placeholder is
// "rejected". The client IP is the one Caddy computes from a trusted
// proxy's X-Forwarded-For, not the connection's address.
func TestLogLineIdentifiesTheRequest(t *testing.T) {
	api := seededAPI()
	site := `
	log_append batch_outcome {http.batch.outcome}
	batch {
		resource /api/widgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
	log {
		output batchtest
		format json
	}
`
	g := startGateway(t, api, site)
	loadCaddyfile(t, strings.Replace(g.config(site), "persist_config off", `persist_config off
	servers {
		trusted_proxies static 127.0.0.1/32
	}`, 1))
	const client = "203.0.113.9"

	tests := []struct {
		name, method, uri, body string
		status                  int
		level, msg, outcome     string
	}{
		{"run", "GET", "/api/widgets?ids=1,2", "", 200, "info", "batch", "succeeded"},
		{"rejected", "PATCH", "/api/widgets?tenant=a", `[{"name": "no id"}]`, 400, "debug", "batch rejected", "rejected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testLogs.reset()
			body := optionalBody(tt.body)
			if r := g.do(t, tt.method, tt.uri, body, "X-Forwarded-For", client); r.Status != tt.status {
				t.Fatalf("%v, want %d", r, tt.status)
			}
			e := batchLine(t)
			a := accessLine(t, tt.method, tt.uri)
			if e["level"] != tt.level || e["msg"] != tt.msg || e["outcome"] != tt.outcome {
				t.Errorf("level %v msg %q outcome %v, want %s %q %s", e["level"], e["msg"], e["outcome"], tt.level, tt.msg, tt.outcome)
			}
			if uuid, _ := e["uuid"].(string); uuid == "" || uuid != a["uuid"] {
				t.Errorf("uuid %q, want the access log's %q", e["uuid"], a["uuid"])
			}
			rq := a["request"].(map[string]any)
			if e["method"] != tt.method || e["uri"] != tt.uri || e["client_ip"] != client || rq["client_ip"] != client {
				t.Errorf("method %v uri %v client_ip %v (access log: %v), want %s %s %s",
					e["method"], e["uri"], e["client_ip"], rq["client_ip"], tt.method, tt.uri, client)
			}
			if e["op"] == nil || e["resource"] != "/api/widgets" || e["status"] != float64(tt.status) {
				t.Errorf("op %v resource %v status %v", e["op"], e["resource"], e["status"])
			}
			if a["batch_outcome"] != tt.outcome {
				t.Errorf("access log batch_outcome %v, want %s", a["batch_outcome"], tt.outcome)
			}
		})
	}
}

// TestLogUpstreamUnreachable: a batch none of whose sub-requests could
// reach the upstream (a closed port) is logged at ERROR with the
// underlying errors, as Caddy logs a single request's 502, whatever its
// atomicity and whether it got as far as a write; a batch the upstream
// answered with its own 502s is not.
func TestLogUpstreamUnreachable(t *testing.T) {
	site := `
	batch {
		resource /api/widgets {` + resourceMethods + `
			atomicity get partial
		}
		resource /api/gadgets {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
	t.Run("closed port", func(t *testing.T) {
		g := startGatewayTo(t, seededAPI(), freeAddr(t), site)
		for _, tt := range []struct {
			name, method, path, body string
			status                   int
			outcome                  string
		}{
			{"get, all_or_nothing", "GET", "/api/gadgets?ids=1,2,3", "", 502, "failed"},
			{"get, partial", "GET", "/api/widgets?ids=1,2,3", "", 207, "failed"},
			{"update: its preflight", "PATCH", "/api/gadgets", `[{"id": 1, "name": "a"}]`, 502, "failed"},
			{"create", "POST", "/api/gadgets", `[{"name": "a"}, {"name": "b"}]`, 502, "failed"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				testLogs.reset()
				body := optionalBody(tt.body)
				if r := g.do(t, tt.method, tt.path, body); r.Status != tt.status {
					t.Fatalf("%v, want %d", r, tt.status)
				}
				e := batchLine(t)
				if e["level"] != "error" || e["msg"] != "batch failed: the upstream could not be reached" || e["outcome"] != tt.outcome {
					t.Errorf("level %v msg %q outcome %v, want error, unreachable, %s", e["level"], e["msg"], e["outcome"], tt.outcome)
				}
				if errs, _ := e["errors"].([]any); len(errs) == 0 || !strings.Contains(errs[0].(string), "connect") {
					t.Errorf("errors %v, want the dial error", e["errors"])
				}
				if e["uuid"] == nil {
					t.Error("no uuid")
				}
			})
		}
	})
	t.Run("upstream answers 502", func(t *testing.T) {
		api := seededAPI()
		g := startGateway(t, api, site)
		for _, path := range []string{"/api/gadgets/1", "/api/gadgets/2"} {
			api.Inject(legacyapi.Fault{Method: "GET", Path: path, Status: 502, Body: htmlError})
		}
		testLogs.reset()
		checkProblem(t, g.do(t, "GET", "/api/gadgets?ids=1,2", nil), 502)
		if e := batchLine(t); e["level"] != "info" {
			t.Errorf("level %v, want info: the upstream was reached, and answered", e["level"])
		}
	})
}

// TestLogRollbackFailedPreimage: with journal off, the ERROR line of a
// rollback that left an item behind names it with the reason, and
// carries what it was before the batch, for a repair by hand: there is
// no kept saga to hold it (with the journal on, checkRepairLog).
func TestLogRollbackFailedPreimage(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		journal off
		concurrency 1
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	// Widgets' PUT cannot create, so the default restore_deleted put
	// cannot bring back deleted widget 17.
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	preimage, _ := api.Item("/api/widgets", "17")
	checkProblem(t, g.do(t, "DELETE", "/api/widgets?ids=17,18,19", nil), 500)

	e := batchLine(t)
	if e["level"] != "error" || e["outcome"] != "rollback_failed" {
		t.Fatalf("level %v outcome %v, want an ERROR rollback_failed line", e["level"], e["outcome"])
	}
	left, _ := e["left_behind"].([]any)
	if len(left) != 1 || !strings.Contains(left[0].(string), `"17"`) || !strings.Contains(left[0].(string), ": ") {
		t.Errorf("left_behind %v, want widget 17 with the reason", e["left_behind"])
	}
	pre, _ := e["preimages"].([]any)
	if len(pre) != 1 {
		t.Fatalf("preimages %v, want widget 17's", e["preimages"])
	}
	p, _ := pre[0].(map[string]any)
	raw, _ := json.Marshal(p["preimage"])
	if item, _ := p["item"].(string); !strings.Contains(item, `"17"`) || !sameJSON(t, raw, preimage) {
		t.Errorf("preimage %v, want widget 17 as it was, %v", p, preimage)
	}
	if e["uuid"] == nil || e["uri"] != "/api/widgets?ids=17,18,19" {
		t.Errorf("uuid %v uri %v", e["uuid"], e["uri"])
	}
}
