package e2e

import (
	"fmt"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// switchableUpstream serves the fake legacy API on a loopback address
// that stays the same while a test takes the server down (new
// connections refused, open ones closed once they have answered) and
// brings it back.
type switchableUpstream struct {
	api      *legacyapi.API
	addr     string
	mu       sync.Mutex
	server   *http.Server
	listener net.Listener
	servers  []*http.Server
}

func newSwitchableUpstream(t testing.TB, api *legacyapi.API) *switchableUpstream {
	t.Helper()
	u := &switchableUpstream{api: api, addr: "127.0.0.1:0"}
	u.up(t)
	t.Cleanup(func() {
		api.Close()
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, s := range u.servers {
			s.Close()
		}
	})
	return u
}

func (u *switchableUpstream) up(t testing.TB) {
	t.Helper()
	l, err := net.Listen("tcp", u.addr)
	if err != nil {
		t.Fatalf("listening on %s again: %v", u.addr, err)
	}
	srv := &http.Server{Handler: u.api}
	go srv.Serve(l)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.addr, u.server, u.listener = l.Addr().String(), srv, l
	u.servers = append(u.servers, srv)
}

// down refuses new connections; a request in flight still gets its
// answer, and its connection is closed after it.
func (u *switchableUpstream) down() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.server.SetKeepAlivesEnabled(false)
	u.listener.Close()
}

// refusedAttempt reports whether reverse_proxy has logged a round trip of
// method that failed (the upstream was down).
func refusedAttempt(method string) bool {
	for _, e := range testLogs.entries("http.handlers.reverse_proxy") {
		rq, _ := e["request"].(map[string]any)
		if e["msg"] == "upstream roundtrip" && e["error"] != nil && rq["method"] == method {
			return true
		}
	}
	return false
}

// TestBatchUpstreamDownMidBatch takes the legacy API down while a batch
// runs (the second item is slow; the third cannot connect). If it comes
// back while the compensations retry, the batch is undone (502); if it
// stays down, the answer is an honest 500 rollback_failed naming exactly
// the items left behind, with an ERROR log line.
func TestBatchUpstreamDownMidBatch(t *testing.T) {
	ops := []struct {
		name         string
		method, path string
		body         string
		collection   string
		delayed      legacyapi.Fault // the second item's request, held until the upstream is down
	}{
		{"update", "PATCH", "/api/widgets", `[{"id": 11, "name": "a"}, {"id": 12, "name": "b"}, {"id": 13, "name": "c"}]`, "/api/widgets",
			legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/12"}},
		{"delete", "DELETE", "/api/gadgets?ids=11,12,13", "", "/api/gadgets",
			legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/12"}},
		{"create", "POST", "/api/widgets", `[{"name": "a"}, {"name": "b"}, {"name": "c"}]`, "/api/widgets",
			legacyapi.Fault{Method: "POST", Path: "/api/widgets", Times: 1}},
	}
	for _, op := range ops {
		for _, comesBack := range []bool{true, false} {
			name := op.name + ", the upstream stays down"
			if comesBack {
				name = op.name + ", the upstream comes back"
			}
			t.Run(name, func(t *testing.T) {
				api := seededAPI()
				up := newSwitchableUpstream(t, api)
				retries := 1
				if comesBack {
					retries = 5 // 100ms, 200ms, 400ms... between attempts: room to come back
				}
				g := startGatewayTo(t, api, up.addr, fmt.Sprintf(`
	batch {
		concurrency          1
		compensation_retries %d
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`, retries))
				before := api.Items(op.collection)
				if op.name == "create" {
					api.Inject(passThrough("POST", "/api/widgets", 1))
				}
				delayed, release := heldUntilReleased(op.delayed)
				api.Inject(delayed)

				answer, failed := make(chan response, 1), make(chan error, 1)
				go func() {
					var body any
					if op.body != "" {
						body = op.body
					}
					r, err := g.try(op.method, op.path, body)
					answer <- r
					failed <- err
				}()
				// The second item's request has arrived and waits: take the
				// upstream down under it.
				eventually(t, 5*time.Second, "the second item's request", func() bool {
					n := 0
					for _, r := range api.Requests() {
						if r.Method == op.delayed.Method && (r.Path == op.delayed.Path) {
							n++
						}
					}
					return n >= 2 || op.name != "create" && n >= 1
				})
				up.down()
				release()
				if comesBack {
					// A compensation starts with the read that proves it.
					eventually(t, 5*time.Second, "a compensation refused", func() bool { return refusedAttempt(http.MethodGet) })
					up.up(t)
				}
				r := <-answer
				if err := <-failed; err != nil {
					t.Fatal(err)
				}

				if !comesBack {
					b := checkProblem(t, r, 500)
					if b.Outcome != "rollback_failed" {
						t.Errorf("outcome %q, want rollback_failed", b.Outcome)
					}
					if got, want := b.Outcomes(), []string{"rollback_failed", "rollback_failed", "failed"}; !slices.Equal(got, want) {
						t.Errorf("item outcomes %v, want %v", got, want)
					}
					if b.Items[2].Status != 502 {
						t.Errorf("the item that could not connect: status %d, want 502", b.Items[2].Status)
					}
					// Exactly the items named are left as the batch made them.
					after := api.Items(op.collection)
					answerMatchesState(t, b, before, after)
					left := map[string]bool{b.Items[0].ID: true, b.Items[1].ID: true}
					switch op.name {
					case "update":
						if after["11"]["name"] != "a" || after["12"]["name"] != "b" || !reflect.DeepEqual(after["13"], before["13"]) {
							t.Errorf("state 11 %v 12 %v 13 %v: want 11 and 12 changed (named), 13 untouched", after["11"], after["12"], after["13"])
						}
					case "delete":
						_, has11 := after["11"]
						_, has12 := after["12"]
						if has11 || has12 || !reflect.DeepEqual(after["13"], before["13"]) {
							t.Errorf("want 11 and 12 deleted (named), 13 untouched: %v", after)
						}
					case "create":
						var created []string
						for id := range after {
							if _, ok := before[id]; !ok {
								created = append(created, id)
								if !left[id] {
									t.Errorf("widget %s %v was created but the answer does not name it", id, after[id])
								}
							}
						}
						if len(created) != 2 {
							t.Errorf("created %v, want the two named", created)
						}
					}
					entries := testLogs.entries("http.handlers.batch")
					if len(entries) != 1 || entries[0]["level"] != "error" || entries[0]["outcome"] != "rollback_failed" {
						t.Fatalf("batch log %v, want one ERROR line", entries)
					}
					lb := fmt.Sprint(entries[0]["left_behind"])
					for id := range left {
						if id == "" || !strings.Contains(lb, id) {
							t.Errorf("left_behind %s does not name id %q", lb, id)
						}
					}
					if strings.Contains(lb, "13") || mentionsItem(lb, 2) {
						t.Errorf("left_behind %s names the item that never happened", lb)
					}
					return
				}
				b := checkProblem(t, r, 502)
				if b.Outcome != "rolled_back" {
					t.Errorf("outcome %q, want rolled_back", b.Outcome)
				}
				answerMatchesState(t, b, before, api.Items(op.collection))
				if got, want := b.Outcomes(), []string{"rolled_back", "rolled_back", "failed"}; !slices.Equal(got, want) {
					t.Errorf("item outcomes %v, want %v", got, want)
				}
				sameState(t, api, op.collection, before)
			})
		}
	}
}
