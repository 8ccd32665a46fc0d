package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/problem"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// The end-to-end tests of the saga's promises (docs/all-or-nothing.md), from the
// issue "All-or-nothing you can trust": every one of them was a bug
// reproduced through Caddy. Another writer, through the gateway or
// straight at the legacy API, meets an all-or-nothing batch in the window
// that used to lose data; each test then asserts the legacy API's final
// state first, and the batch's answer second.

// usersAPI serves /users, with users 1..n named u1..un, in the habits c
// gives.
func usersAPI(c legacyapi.Collection, n int) *legacyapi.API {
	c.Path, c.Seed = "/users", records("u", 1, n)
	return legacyapi.NewRecording(c)
}

// usersSite is a gateway in front of /users with the given batch options,
// one per line.
func usersSite(options ...string) string {
	return `
	batch {
		` + strings.Join(options, "\n\t\t") + `
		resource /users {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
}

// slowSaga runs one item at a time, with an item_timeout long enough for
// the slow faults the tests aim at an item, so that another writer meets
// the batch in a window of about a second.
var slowSaga = []string{"concurrency 1", "item_timeout 5s", "compensation_retries 1"}

// sagaOptions are slowSaga's, with conditional_writes when the legacy API
// enforces its ETags' conditions: the conditions are then the proofs.
func sagaOptions(enforcedETags bool) []string {
	if enforcedETags {
		return append(slices.Clone(slowSaga), "conditional_writes")
	}
	return slowSaga
}

// inFlight is a request the test sent on another goroutine.
type inFlight struct {
	done       chan struct{}
	r          response
	err        error
	sent, came time.Time // when it was sent, and when its answer came
}

// start sends a request to base on another goroutine; body "" is none.
func start(base, method, path, body string) *inFlight {
	f := &inFlight{done: make(chan struct{}), sent: time.Now()}
	client := &http.Client{Timeout: 30 * time.Second}
	go func() {
		defer close(f.done)
		f.r, f.err = send(client, base, method, path, body)
		f.came = time.Now()
	}()
	return f
}

// answer waits for the request's answer.
func (f *inFlight) answer(t testing.TB) response {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30s")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f.r
}

func (f *inFlight) answered() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// overlapped fails the test unless b was sent well before a's answer
// came: b met a while a held its items, so any order the test finds
// between them is a's locks at work, not chance.
func overlapped(t testing.TB, a, b *inFlight) {
	t.Helper()
	if lead := a.came.Sub(b.sent); lead < 500*time.Millisecond {
		t.Fatalf("B was sent %s before A answered, want at least 500ms: the window was missed", lead)
	}
}

// direct sends a request straight to the legacy API, past the gateway:
// the other writer the gateway cannot lock out.
func (g *gateway) direct(t testing.TB, method, path, body string) response {
	t.Helper()
	r, err := send(g.client, "http://"+g.upstream, method, path, body)
	if err != nil {
		t.Fatalf("%s %s at the upstream: %v", method, path, err)
	}
	return r
}

// holds fails the test unless the tenant's record id of /users is want;
// a nil want means the record must not exist.
func holds(t testing.TB, api *legacyapi.API, tenant, id string, want map[string]any) {
	t.Helper()
	rec, ok := api.TenantItem("/users", tenant, id)
	switch {
	case want == nil && ok:
		t.Errorf("user %s (tenant %q) is %v, want it absent", id, tenant, rec)
	case want != nil && !ok:
		t.Errorf("user %s (tenant %q) is absent, want %v", id, tenant, want)
	case want != nil && !sameJSON(t, rec, want):
		t.Errorf("user %s (tenant %q) is %v, want %v", id, tenant, rec, want)
	}
}

func user(id int, name string) map[string]any { return map[string]any{"id": id, "name": name} }

// found returns what the proof read of item i found instead of what the
// batch left (compensation.found), decoded; nil if none.
func found(t testing.TB, r response, i int) map[string]any {
	t.Helper()
	var raw struct {
		Items []struct {
			Compensation *struct {
				Found json.RawMessage `json:"found"`
			} `json:"compensation"`
		} `json:"items"`
	}
	if err := json.Unmarshal(r.Body, &raw); err != nil || i >= len(raw.Items) {
		t.Fatalf("no item %d in %s", i, r.Body)
	}
	c := raw.Items[i].Compensation
	if c == nil || len(c.Found) == 0 {
		return nil
	}
	m, _ := decodeJSON(t, c.Found).(map[string]any)
	return m
}

// sent lists the requests of method on path, in arrival order.
func sent(api *legacyapi.API, method, path string) []legacyapi.Request {
	var out []legacyapi.Request
	for _, r := range api.Requests() {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// arrival is the position among the API's requests of the first one that
// match accepts, or -1.
func arrival(api *legacyapi.API, match func(legacyapi.Request) bool) int {
	return slices.IndexFunc(api.Requests(), match)
}

// checkLeftBehind checks a 500 rollback_failed answer whose detail names
// item i, with the reason its compensation gives, which must hold why.
func checkLeftBehind(t testing.TB, r response, i int, why string) batchAnswer {
	t.Helper()
	b := checkProblem(t, r, 500)
	if b.Outcome != "rollback_failed" {
		t.Errorf("outcome %q, want rollback_failed", b.Outcome)
	}
	if !mentionsItem(b.Detail, i) {
		t.Errorf("detail %q does not name item %d", b.Detail, i)
	}
	it := b.Items[i]
	if it.Outcome != "rollback_failed" || it.Compensation == nil || !strings.Contains(it.Compensation.Error, why) {
		t.Errorf("item %d: outcome %q compensation %+v, want rollback_failed with a reason holding %q", i, it.Outcome, it.Compensation, why)
	} else if !strings.Contains(b.Detail, it.Compensation.Error) {
		t.Errorf("detail %q does not give item %d's reason %q", b.Detail, i, it.Compensation.Error)
	}
	return b
}

// checkRepairLog checks the batch's ERROR log line (README, "The log
// line"): it names item i as left behind, and the kept saga, which gives
// its pre-image, so that an operator can repair it by hand; the line
// itself holds no pre-image.
func checkRepairLog(t testing.TB, g *gateway, i int, preimage map[string]any) {
	t.Helper()
	entries := testLogs.entries("http.handlers.batch")
	if len(entries) != 1 || entries[0]["level"] != "error" || entries[0]["outcome"] != "rollback_failed" {
		t.Fatalf("batch log %v, want one ERROR rollback_failed line", entries)
	}
	e := entries[0]
	if lb := fmt.Sprint(e["left_behind"]); !mentionsItem(lb, i) {
		t.Errorf("left_behind %s does not name item %d", lb, i)
	}
	if e["preimages"] != nil {
		t.Errorf("the log line holds pre-images: %v", e["preimages"])
	}
	saga, _ := e["saga"].(string)
	if saga == "" {
		t.Fatalf("the log line names no kept saga: %v", e)
	}
	// The kept saga as an operator's tools read it from the storage.
	storage := durableStorage(&certmagic.FileStorage{Path: g.storageDir(t)})
	v, err := durable.NewJournals(storage, durable.NewLeases(time.Minute), zap.NewNop()).Saga(context.Background(), saga)
	if err != nil {
		t.Fatalf("the kept saga %s: %v", saga, err)
	}
	if !sameJSON(t, v.Items[i].Preimage, preimage) {
		t.Errorf("the kept saga gives item %d's pre-image as %s, want %v", i, v.Items[i].Preimage, preimage)
	}
}

// TestSagaUndoLosesNoLaterWrite (case 1, the lost update by an undo):
// batch A updates users 1 and 2; its write to user 2 fails after about a
// second, while another writer changes user 1. A writer through the
// gateway (a single write or a batch) waits for A's lock and is applied
// after A's rollback, so its acknowledged write stands; a writer straight
// at the upstream changes user 1 before A's undo, and the undo's proof
// read sees it: A leaves user 1 alone and says so.
func TestSagaUndoLosesNoLaterWrite(t *testing.T) {
	const batchA = `[{"id": 1, "name": "A"}, {"id": 2, "name": "A"}]`
	slowFailure := legacyapi.Fault{Method: "PATCH", Path: "/users/2", Delay: time.Second, Status: 500, Body: htmlError}

	for _, tc := range []struct {
		name         string
		method, path string
		body         string
		status       int
		outcome      string
	}{
		{"a single PATCH through the gateway", "PATCH", "/users/1", `{"name": "B"}`, 200, ""},
		{"batch B through the gateway", "PATCH", "/users", `[{"id": 1, "name": "B"}]`, 200, "succeeded"},
	} {
		t.Run(tc.name+" waits for A's lock and lands after A's rollback", func(t *testing.T) {
			api := usersAPI(legacyapi.Collection{}, 2)
			g := startGateway(t, api, usersSite(slowSaga...))
			api.Inject(slowFailure)

			a := start(g.URL, "PATCH", "/users", batchA)
			eventually(t, 5*time.Second, "A's write to user 2", func() bool { return received(api, "PATCH", "/users/2") })
			holds(t, api, "", "1", user(1, "A")) // A wrote user 1; its undo is to come
			b := start(g.URL, tc.method, tc.path, tc.body)
			ra, rb := a.answer(t), b.answer(t)
			overlapped(t, a, b)

			holds(t, api, "", "1", user(1, "B"))
			holds(t, api, "", "2", user(2, "u2"))
			if rb.Status != tc.status {
				t.Fatalf("B: %v, want %d", rb, tc.status)
			}
			if tc.outcome != "" {
				checkEnvelope(t, rb, tc.status, tc.outcome)
			} else if !sameJSON(t, rb.Body, user(1, "B")) {
				t.Errorf("B's answer %s, want user 1 as B made it", rb.Body)
			}
			bA := checkProblem(t, ra, 502)
			if got := bA.Outcomes(); bA.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
				t.Errorf("A: outcome %q items %v, want rolled_back [rolled_back failed]", bA.Outcome, got)
			}
			// B's write reached the upstream after A's undo, not before.
			undo := arrival(api, func(r legacyapi.Request) bool { return r.Method == "PUT" && r.Path == "/users/1" })
			bWrite := arrival(api, func(r legacyapi.Request) bool {
				return r.Method == "PATCH" && r.Path == "/users/1" && strings.Contains(string(r.Body), `"B"`)
			})
			if undo < 0 || bWrite < undo {
				t.Errorf("A's undo is request %d, B's write request %d: B did not wait for A:%s", undo, bWrite, describeRequests(api.Requests()))
			}
		})
	}

	for _, etags := range []bool{false, true} {
		name := "a write straight at the upstream is not overwritten by A's undo"
		why := `another writer changed "name"`
		if etags {
			name += " (ETags: the undo's If-Match fails)"
			why = "precondition failed"
		}
		t.Run(name, func(t *testing.T) {
			api := usersAPI(legacyapi.Collection{ETags: etags}, 2)
			g := startGateway(t, api, usersSite(sagaOptions(etags)...))
			held, release := heldUntilReleased(slowFailure)
			api.Inject(held)

			a := start(g.URL, "PATCH", "/users", batchA)
			eventually(t, 5*time.Second, "A's write to user 2", func() bool { return received(api, "PATCH", "/users/2") })
			if r := g.direct(t, "PATCH", "/users/1", `{"name": "B"}`); r.Status != 200 {
				t.Fatalf("B at the upstream: %v", r)
			}
			if a.answered() {
				t.Fatal("A answered before B's write: the window was missed")
			}
			release()
			r := a.answer(t)

			holds(t, api, "", "1", user(1, "B"))
			holds(t, api, "", "2", user(2, "u2"))
			b := checkLeftBehind(t, r, 0, why)
			if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
				t.Errorf("item outcomes %v", got)
			}
			checkRepairLog(t, g, 0, user(1, "u1"))
			if !etags {
				if f := found(t, r, 0); !sameJSON(t, f, user(1, "B")) {
					t.Errorf("compensation.found %v, want what the proof read: user 1 as B made it", f)
				}
				if puts := sent(api, "PUT", "/users/1"); len(puts) > 0 {
					t.Errorf("A's undo was sent although its proof failed:%s", describeRequests(puts))
				}
			}
		})
	}
}

// TestSagaDeleteOfAChangedItem (case 2, the stale re-create): B changes
// user 3 straight at the upstream after A's preflight read it and before
// A's DELETE lands. With ETags A's DELETE carries If-Match and fails 412:
// nothing is lost. Without ETags the gateway cannot tell: A deletes B's
// version, its item 4 fails, and its rollback re-creates user 3 from the
// pre-image, so B's direct write is lost: the limit of an upstream
// without validators, asserted here so that it stays known. A writer
// through the gateway waits for A's lock and loses nothing.
func TestSagaDeleteOfAChangedItem(t *testing.T) {
	slowDelete := legacyapi.Fault{Method: "DELETE", Path: "/users/3", Delay: time.Second, Times: 1}

	t.Run("ETags: A's DELETE carries If-Match and fails 412, B's write stands", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{ETags: true, PutCreates: true}, 4)
		g := startGateway(t, api, usersSite(slowSaga...))
		held, release := heldUntilReleased(slowDelete)
		api.Inject(held)

		a := start(g.URL, "DELETE", "/users?ids=3,4", "")
		eventually(t, 5*time.Second, "A's DELETE of user 3", func() bool { return received(api, "DELETE", "/users/3") })
		if r := g.direct(t, "PATCH", "/users/3", `{"name": "B"}`); r.Status != 200 {
			t.Fatalf("B at the upstream: %v", r)
		}
		if a.answered() {
			t.Fatal("A answered before B's write: the window was missed")
		}
		release()
		r := a.answer(t)

		holds(t, api, "", "3", user(3, "B"))
		holds(t, api, "", "4", user(4, "u4"))
		b := checkProblem(t, r, 412)
		if got := b.Outcomes(); b.Outcome != "failed" || !slices.Equal(got, []string{"failed", "not_attempted"}) {
			t.Errorf("outcome %q items %v, want failed [failed not_attempted]", b.Outcome, got)
		}
		if dels := sent(api, "DELETE", "/users/3"); len(dels) != 1 || !strings.HasPrefix(dels[0].Header.Get("If-Match"), `"v`) {
			t.Errorf("A's DELETE of user 3:%s, want one, with the preflight's ETag in If-Match", describeRequests(dels))
		}
		if w := writes(api.Requests()); len(w) != 2 {
			t.Errorf("writes at the upstream:%s; want B's PATCH and A's refused DELETE", describeRequests(w))
		}
	})

	t.Run("no ETags, B straight at the upstream: A deletes B's version and re-creates the pre-image", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{PutCreates: true}, 4)
		g := startGateway(t, api, usersSite(slowSaga...))
		held, release := heldUntilReleased(slowDelete)
		api.Inject(held)
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})

		a := start(g.URL, "DELETE", "/users?ids=3,4", "")
		eventually(t, 5*time.Second, "A's DELETE of user 3", func() bool { return received(api, "DELETE", "/users/3") })
		if r := g.direct(t, "PATCH", "/users/3", `{"name": "B"}`); r.Status != 200 {
			t.Fatalf("B at the upstream: %v", r)
		}
		if a.answered() {
			t.Fatal("A answered before B's write: the window was missed")
		}
		release()
		r := a.answer(t)

		// The upstream has no validator, so neither A's DELETE nor its
		// undo can be made conditional on the version A read: B's write,
		// made past the gateway, is gone, and user 3 is as it was before
		// A. What A says is true of the item; nothing A wrote is left.
		holds(t, api, "", "3", user(3, "u3"))
		holds(t, api, "", "4", user(4, "u4"))
		b := checkProblem(t, r, 502)
		if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
			t.Errorf("outcome %q items %v, want rolled_back [rolled_back failed]", b.Outcome, got)
		}
		puts := sent(api, "PUT", "/users/3")
		if len(puts) != 1 || puts[0].Header.Get("If-None-Match") != "*" || !sameJSON(t, puts[0].Body, user(3, "u3")) {
			t.Errorf("A's re-create:%s, want one PUT of the pre-image with If-None-Match: *", describeRequests(puts))
		}
		if reads := sent(api, "GET", "/users/3"); len(reads) != 2 {
			t.Errorf("reads of user 3:%s; want the preflight and the proof that it is absent", describeRequests(reads))
		}
	})

	t.Run("no ETags, B through the gateway: B waits for A's lock and its write stands", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{PutCreates: true}, 4)
		g := startGateway(t, api, usersSite(slowSaga...))
		api.Inject(slowDelete)
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})

		a := start(g.URL, "DELETE", "/users?ids=3,4", "")
		eventually(t, 5*time.Second, "A's DELETE of user 3", func() bool { return received(api, "DELETE", "/users/3") })
		b := start(g.URL, "PATCH", "/users/3", `{"name": "B"}`)
		ra, rb := a.answer(t), b.answer(t)
		overlapped(t, a, b)

		holds(t, api, "", "3", user(3, "B"))
		holds(t, api, "", "4", user(4, "u4"))
		if rb.Status != 200 || !sameJSON(t, rb.Body, user(3, "B")) {
			t.Errorf("B: %v, want 200 with user 3 as B made it", rb)
		}
		if bA := checkProblem(t, ra, 502); bA.Outcome != "rolled_back" {
			t.Errorf("A: outcome %q, want rolled_back", bA.Outcome)
		}
		undo := arrival(api, func(r legacyapi.Request) bool { return r.Method == "PUT" && r.Path == "/users/3" })
		bWrite := arrival(api, func(r legacyapi.Request) bool { return r.Method == "PATCH" && r.Path == "/users/3" })
		if undo < 0 || bWrite < undo {
			t.Errorf("A's re-create is request %d, B's write request %d: B did not wait for A:%s", undo, bWrite, describeRequests(api.Requests()))
		}
	})
}

// TestSagaRecreateOverANewerItem (case 3): A deleted user 3 and its item 4
// fails slowly; meanwhile B creates user 3 anew, straight at the upstream.
// A's re-create must not overwrite it: user 3 stays B's, and A answers 500
// rollback_failed for item 0 with the reason and what it found.
func TestSagaRecreateOverANewerItem(t *testing.T) {
	for _, etags := range []bool{false, true} {
		name, why := "proved absent by a read", "exists again"
		if etags {
			name, why = "ETags: the re-create's If-None-Match: * fails", "precondition failed"
		}
		t.Run(name, func(t *testing.T) {
			api := usersAPI(legacyapi.Collection{PutCreates: true, ETags: etags}, 4)
			g := startGateway(t, api, usersSite(sagaOptions(etags)...))
			held, release := heldUntilReleased(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})
			api.Inject(held)

			a := start(g.URL, "DELETE", "/users?ids=3,4", "")
			eventually(t, 5*time.Second, "A's DELETE of user 4", func() bool { return received(api, "DELETE", "/users/4") })
			holds(t, api, "", "3", nil)
			if r := g.direct(t, "PUT", "/users/3", `{"name": "B"}`); r.Status != 201 {
				t.Fatalf("B's PUT at the upstream: %v, want 201", r)
			}
			if a.answered() {
				t.Fatal("A answered before B's write: the window was missed")
			}
			release()
			r := a.answer(t)

			holds(t, api, "", "3", user(3, "B"))
			holds(t, api, "", "4", user(4, "u4"))
			b := checkLeftBehind(t, r, 0, why)
			if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
				t.Errorf("item outcomes %v", got)
			}
			checkRepairLog(t, g, 0, user(3, "u3"))
			if !etags {
				if f := found(t, r, 0); !sameJSON(t, f, user(3, "B")) {
					t.Errorf("compensation.found %v, want B's user 3", f)
				}
				if puts := sent(api, "PUT", "/users/3"); len(puts) != 1 {
					t.Errorf("PUTs of user 3:%s; want B's alone", describeRequests(puts))
				}
			}
		})
	}
}

// TestSagaQueryOnEverySubRequest (case 4): the client's query reaches
// every request of the saga. On a multi-tenant API a failed delete in
// tenant t2 is undone in t2, and the default tenant, which holds the same
// ids, is never touched; on an API keyed by ?api_key= the preflight and
// the undo carry the key too.
func TestSagaQueryOnEverySubRequest(t *testing.T) {
	api := legacyapi.NewRecording(
		legacyapi.Collection{Path: "/users", Tenants: true, PutCreates: true, Seed: records("u", 1, 2)},
		legacyapi.Collection{Path: "/keyed", APIKey: "k3y", Seed: records("k", 1, 2)},
	)
	g := startGateway(t, api, `
	batch {
		concurrency 1
		scope_query tenant api_key
		resource /users {`+resourceMethods+`
		}
		resource /keyed {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	everyQuery := func(t *testing.T, query string, want []string) {
		t.Helper()
		var got []string
		for _, r := range api.Requests() {
			got = append(got, r.Method+" "+r.Path)
			if r.RawQuery != query {
				t.Errorf("%s %s?%s, want the client's query %q", r.Method, r.Path, r.RawQuery, query)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("the upstream received %v, want %v", got, want)
		}
	}

	t.Run("tenant=t2: the rollback brings t2's user 1 back, the default tenant untouched", func(t *testing.T) {
		for _, id := range []string{"1", "2"} {
			if r := g.direct(t, "PUT", "/users/"+id+"?tenant=t2", `{"name": "t2-`+id+`"}`); r.Status != 201 {
				t.Fatalf("seeding t2: %v", r)
			}
		}
		t2, defaults := api.TenantItems("/users", "t2"), api.Items("/users")
		api.ResetLog()
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/2", Status: 500, Body: htmlError, Times: 1})

		r := g.do(t, "DELETE", "/users?ids=1,2&tenant=t2", nil)

		holds(t, api, "t2", "1", user(1, "t2-1"))
		if after := api.TenantItems("/users", "t2"); !sameJSON(t, after, t2) {
			t.Errorf("tenant t2 holds %v, want %v", after, t2)
		}
		sameState(t, api, "/users", defaults)
		b := checkProblem(t, r, 502)
		if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
			t.Errorf("outcome %q items %v, want rolled_back [rolled_back failed]", b.Outcome, got)
		}
		everyQuery(t, "tenant=t2", []string{
			"GET /users/1", "GET /users/2", // preflight
			"DELETE /users/1", "DELETE /users/2",
			"GET /users/1", // the proof that user 1 is absent
			"PUT /users/1", // the undo
		})
	})

	t.Run("api_key: an all-or-nothing update succeeds", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "PATCH", "/keyed?api_key=k3y", `[{"id": 1, "name": "x"}, {"id": 2, "name": "y"}]`)
		checkEnvelope(t, r, 200, "succeeded")
		for id, name := range map[string]string{"1": "x", "2": "y"} {
			if rec, _ := api.Item("/keyed", id); rec["name"] != name {
				t.Errorf("keyed %s is %v, want name %q", id, rec, name)
			}
		}
		everyQuery(t, "api_key=k3y", []string{"GET /keyed/1", "GET /keyed/2", "PATCH /keyed/1", "PATCH /keyed/2"})
	})

	t.Run("api_key: a failed create is undone, no orphan", func(t *testing.T) {
		before := api.Items("/keyed")
		api.ResetLog()
		r := g.do(t, "POST", "/keyed?api_key=k3y", `[{"name": "new"}, {"name": ""}]`)

		if after := api.Items("/keyed"); !sameJSON(t, after, before) {
			t.Errorf("/keyed holds %v, want %v: an orphan or a loss", after, before)
		}
		b := checkProblem(t, r, 422)
		if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
			t.Errorf("outcome %q items %v, want rolled_back [rolled_back failed]", b.Outcome, got)
		}
		created := "/keyed/" + b.Items[0].ID
		everyQuery(t, "api_key=k3y", []string{"POST /keyed", "POST /keyed", "GET " + created, "DELETE " + created})
	})
}

// TestSagaUndoDeletesOnlyWhatItCreated (case 5): an undo never deletes
// an item the batch did not create, whatever the create's answer
// (a 202 naming a job, a bare 201) or the id its element carried.
func TestSagaUndoDeletesOnlyWhatItCreated(t *testing.T) {
	site := usersSite(slowSaga...)

	t.Run("202 with Location /jobs/2: the job's number is not an id", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{CreateAnswer: legacyapi.AnswerAccepted}, 2)
		g := startGateway(t, api, site)
		if r := g.direct(t, "POST", "/users", `{"name": "earlier"}`); r.Status != 202 {
			t.Fatalf("an earlier create: %v", r) // job 1, so the batch's is job 2
		}
		before := api.Items("/users")
		api.ResetLog()

		r := g.do(t, "POST", "/users", `[{"name": "new"}, {"name": ""}]`)

		after := api.Items("/users")
		for id, rec := range before {
			if !sameJSON(t, after[id], rec) {
				t.Errorf("user %s is %v, want %v", id, after[id], rec)
			}
		}
		var left []map[string]any
		for id, rec := range after {
			if _, ok := before[id]; !ok {
				left = append(left, rec)
			}
		}
		if len(left) != 1 || left[0]["name"] != "new" {
			t.Errorf("created and left %v, want the one user the batch created", left)
		}
		b := checkLeftBehind(t, r, 0, "named no id")
		if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
			t.Errorf("item outcomes %v", got)
		}
		if it := b.Items[0]; it.Status != 202 || it.ID != "" || !strings.HasSuffix(it.Headers["Location"], "/jobs/2") {
			t.Errorf("item 0: %+v, want 202, no id, Location /jobs/2", it)
		}
		if w := writes(api.Requests()); len(w) != 2 {
			t.Errorf("writes:%s; want the two creates and no DELETE", describeRequests(w))
		}
	})

	bare := legacyapi.Collection{AssignIDs: true, CreateAnswer: legacyapi.AnswerBare, PutCreates: true}

	t.Run("ids assigned, bare 201: the element's id 3 is not where the item went", func(t *testing.T) {
		api := usersAPI(bare, 2)
		g := startGateway(t, api, site)
		before := api.Items("/users")

		r := g.do(t, "POST", "/users", `[{"id": 3, "name": "batch"}, {"name": ""}]`)

		holds(t, api, "", "3", nil)
		holds(t, api, "", "1000", user(1000, "batch")) // the upstream's id, which no answer named
		if len(api.Items("/users")) != len(before)+1 {
			t.Errorf("users %v, want the seeds and 1000", api.Items("/users"))
		}
		b := checkLeftBehind(t, r, 0, "gone")
		if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
			t.Errorf("item outcomes %v", got)
		}
		if dels := writes(api.Requests()); len(dels) != 2 {
			t.Errorf("writes:%s; want the two creates and no DELETE", describeRequests(dels))
		}
	})

	t.Run("ids assigned, bare 201: a user 3 someone else made meanwhile is not deleted", func(t *testing.T) {
		api := usersAPI(bare, 2)
		g := startGateway(t, api, site)
		api.Inject(passThrough("POST", "/users", 1))
		held, release := heldUntilReleased(legacyapi.Fault{Method: "POST", Path: "/users", Status: 500, Body: htmlError, Times: 1})
		api.Inject(held)

		a := start(g.URL, "POST", "/users", `[{"id": 3, "name": "batch"}, {"name": "second"}]`)
		eventually(t, 5*time.Second, "the second create", func() bool { return len(sent(api, "POST", "/users")) == 2 })
		if r := g.direct(t, "PUT", "/users/3", `{"name": "B"}`); r.Status != 201 {
			t.Fatalf("B's PUT at the upstream: %v, want 201", r)
		}
		if a.answered() {
			t.Fatal("A answered before B's write: the window was missed")
		}
		release()
		r := a.answer(t)

		holds(t, api, "", "3", user(3, "B"))
		holds(t, api, "", "1000", user(1000, "batch"))
		checkLeftBehind(t, r, 0, `another writer changed "name"`)
		if f := found(t, r, 0); !sameJSON(t, f, user(3, "B")) {
			t.Errorf("compensation.found %v, want B's user 3", f)
		}
		if dels := sent(api, "DELETE", "/users/3"); len(dels) > 0 {
			t.Errorf("B's user 3 was sent a DELETE:%s", describeRequests(dels))
		}
	})

	t.Run("an element's id that exists fails 409 before anything is sent", func(t *testing.T) {
		api := usersAPI(bare, 3)
		g := startGateway(t, api, site)
		before := api.Items("/users")

		r := g.do(t, "POST", "/users", `[{"id": 3, "name": "imposter"}, {"name": "second"}]`)

		sameState(t, api, "/users", before)
		b := checkProblem(t, r, 409)
		if got := b.Outcomes(); b.Outcome != "failed" || !slices.Equal(got, []string{"failed", "not_attempted"}) {
			t.Errorf("outcome %q items %v, want failed [failed not_attempted]", b.Outcome, got)
		}
		if w := writes(api.Requests()); len(w) > 0 {
			t.Errorf("writes reached the upstream:%s", describeRequests(w))
		}
	})

	t.Run("an existing id whose 409 would be lost: checked first, never sent", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{}, 2)
		g := startGateway(t, api, site)
		// The oldest engine sent the create, lost its 409, read user 1,
		// found it and deleted it. The drop is armed for any create.
		api.Inject(legacyapi.Fault{Method: "POST", Path: "/users", Drop: true})
		before := api.Items("/users")

		r := g.do(t, "POST", "/users", `[{"name": "new"}, {"id": 1, "name": "imposter"}]`)

		// Every id a create names is checked before anything is written:
		// nothing was created, so there is nothing to undo.
		sameState(t, api, "/users", before)
		b := checkProblem(t, r, 409)
		if got := b.Outcomes(); b.Outcome != "failed" || !slices.Equal(got, []string{"not_attempted", "failed"}) {
			t.Errorf("outcome %q items %v, want failed [not_attempted failed]", b.Outcome, got)
		}
		if posts := sent(api, "POST", "/users"); len(posts) != 0 {
			t.Errorf("creates sent:%s; want none", describeRequests(posts))
		}
		if w := sent(api, "DELETE", "/users/1"); len(w) > 0 {
			t.Errorf("user 1 was sent a DELETE:%s", describeRequests(w))
		}
	})
}

// TestSagaRestoreDeletedPostOnAssignedIDs (case 6): restore_deleted post
// on an API that assigns ids re-creates the deleted user under a new id
// (1000). That is not rolled_back: the answer names the new id.
func TestSagaRestoreDeletedPostOnAssignedIDs(t *testing.T) {
	api := usersAPI(legacyapi.Collection{AssignIDs: true}, 4)
	g := startGateway(t, api, usersSite(append(slowSaga, "restore_deleted post")...))
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})

	r := g.do(t, "DELETE", "/users?ids=3,4", nil)

	holds(t, api, "", "3", nil)
	holds(t, api, "", "1000", user(1000, "u3"))
	holds(t, api, "", "4", user(4, "u4"))
	b := checkLeftBehind(t, r, 0, `"1000"`)
	if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
		t.Errorf("item outcomes %v", got)
	}
	if !strings.Contains(b.Detail, "1000") {
		t.Errorf("detail %q does not name the new id 1000", b.Detail)
	}
}

// TestSagaCreateAnsweredSeeOther (case 7): a create answered 303 was
// applied; its outcome is unknown until the saga reads the item its
// Location names, and then deletes it: rolled_back, no orphan.
func TestSagaCreateAnsweredSeeOther(t *testing.T) {
	api := usersAPI(legacyapi.Collection{CreateAnswer: legacyapi.AnswerSeeOther}, 2)
	g := startGateway(t, api, usersSite(slowSaga...))
	before := api.Items("/users")

	r := g.do(t, "POST", "/users", `[{"name": "new"}, {"name": ""}]`)

	sameState(t, api, "/users", before)
	b := checkProblem(t, r, 502)
	if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "not_attempted"}) {
		t.Errorf("outcome %q items %v, want rolled_back [rolled_back not_attempted]", b.Outcome, got)
	}
	if it := b.Items[0]; it.Status != 303 || it.ID != "1000" {
		t.Errorf("item 0: status %d id %q, want 303 and the id its Location names (1000)", it.Status, it.ID)
	}
	if reads, dels := sent(api, "GET", "/users/1000"), sent(api, "DELETE", "/users/1000"); len(reads) == 0 || len(dels) != 1 {
		t.Errorf("reads%s\ndeletes%s\nwant the item read, then deleted once", describeRequests(reads), describeRequests(dels))
	}
}

// TestSagaBatchTimeoutLetsWritesFinish (case 8): batch_timeout stops new
// starts, never a write in flight. Creates take 1.4s each, one at a time,
// within a 2s batch_timeout: the second is in flight at the deadline and
// is let finish, the third never starts, and both created users are
// deleted again: 504 rolled_back, nothing left.
func TestSagaBatchTimeoutLetsWritesFinish(t *testing.T) {
	api := usersAPI(legacyapi.Collection{WriteDelay: 1400 * time.Millisecond}, 2)
	g := startGateway(t, api, usersSite("concurrency 1", "batch_timeout 2s"))
	before := api.Items("/users")

	r := g.do(t, "POST", "/users", `[{"name": "c1"}, {"name": "c2"}, {"name": "c3"}]`)

	sameState(t, api, "/users", before)
	b := checkProblem(t, r, 504)
	if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "rolled_back", "not_attempted"}) {
		t.Errorf("outcome %q items %v, want rolled_back [rolled_back rolled_back not_attempted]", b.Outcome, got)
	}
	if it := b.Items[1]; it.Status != 201 || it.ID == "" {
		t.Errorf("item 1, in flight at the deadline: status %d id %q, want its own 201", it.Status, it.ID)
	}
	posts := sent(api, "POST", "/users")
	if len(posts) != 2 {
		t.Errorf("creates sent:%s; want two", describeRequests(posts))
	}
	for _, p := range posts {
		if strings.Contains(string(p.Body), "c3") {
			t.Error("the third create was sent after batch_timeout")
		}
	}
	if w := api.Writes(); w.Applied != 4 {
		t.Errorf("%d writes applied, want 4: two creates and their two deletes", w.Applied)
	}
}

// TestSagaUndoTimeBounded (case 9): five undos that hang, with
// compensation_timeout 1s and compensation_retries 2, run side by side:
// the batch answers within one compensation's budget (3×1s plus 300ms of
// backoff) of its failure, not five of them in a row.
func TestSagaUndoTimeBounded(t *testing.T) {
	api := usersAPI(legacyapi.Collection{}, 6)
	puts := &inFlightMeter{Handler: api, counts: func(r *http.Request) bool { return r.Method == "PUT" }}
	upstream := httptest.NewServer(puts)
	t.Cleanup(func() {
		api.Close() // the hanging PUTs end before the server closes
		upstream.Close()
	})
	g := startGatewayTo(t, api, upstream.Listener.Addr().String(), usersSite(
		"concurrency 6", "batch_timeout 3s", "compensation_timeout 1s", "compensation_retries 2"))
	for id := 1; id <= 5; id++ {
		api.Inject(legacyapi.Fault{Method: "PUT", Path: "/users/" + strconv.Itoa(id), Hang: true})
	}
	// Late enough that all six writes are sent before it fails.
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/users/6", Delay: 300 * time.Millisecond, Status: 500, Body: htmlError})

	begin := time.Now()
	r := g.do(t, "PATCH", "/users", `[{"id": 1, "name": "A"}, {"id": 2, "name": "A"}, {"id": 3, "name": "A"},
		{"id": 4, "name": "A"}, {"id": 5, "name": "A"}, {"id": 6, "name": "A"}]`)
	took := time.Since(begin)

	for id := 1; id <= 5; id++ {
		holds(t, api, "", strconv.Itoa(id), user(id, "A")) // left as the batch made it, and named
	}
	holds(t, api, "", "6", user(6, "u6"))
	if took > 9*time.Second {
		t.Errorf("the batch answered after %s, want within batch_timeout and one compensation's budget (about 3.3s)", took)
	}
	if n := puts.peakInFlight(); n != 5 {
		t.Errorf("at most %d undo PUTs in flight at once, want all 5 side by side", n)
	}
	b := checkProblem(t, r, 500)
	if got := b.Outcomes(); b.Outcome != "rollback_failed" || !slices.Equal(got, []string{"rollback_failed", "rollback_failed", "rollback_failed", "rollback_failed", "rollback_failed", "failed"}) {
		t.Errorf("outcome %q items %v", b.Outcome, got)
	}
	for i, it := range b.Items[:5] {
		if c := it.Compensation; c == nil || c.Method != "PUT" || c.Attempts != 3 || c.Error == "" {
			t.Errorf("item %d compensation %+v, want 3 attempts of a PUT, with the reason it failed", i, c)
		}
		if !mentionsItem(b.Detail, i) {
			t.Errorf("detail %q does not name item %d", b.Detail, i)
		}
	}
}

// TestSagaIdempotentUpstreamResend: with idempotent_upstream, an update
// applied whose answer was lost is sent again with the same
// Idempotency-Key during compensation; the API replays its answer,
// applying nothing twice, and the saga undoes the item: the API ends as
// it began.
func TestSagaIdempotentUpstreamResend(t *testing.T) {
	api := usersAPI(legacyapi.Collection{HonorKeys: true}, 2)
	g := startGateway(t, api, usersSite(append(slowSaga, "idempotent_upstream")...))
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/users/2", AfterApply: true, Drop: true, Times: 1})
	before := api.Items("/users")

	r := g.do(t, "PATCH", "/users", `[{"id": 1, "name": "x"}, {"id": 2, "name": "y"}]`)

	sameState(t, api, "/users", before)
	patches := sent(api, "PATCH", "/users/2")
	if len(patches) != 2 || patches[0].Header.Get("Idempotency-Key") == "" ||
		patches[0].Header.Get("Idempotency-Key") != patches[1].Header.Get("Idempotency-Key") {
		t.Errorf("PATCH /users/2 sent:%s, want twice with the same Idempotency-Key", describeRequests(patches))
	}
	if w := api.Writes(); w.Replayed != 1 || w.Applied != 4 {
		t.Errorf("writes %+v, want 1 replayed and 4 applied: two updates, two undos", w)
	}
	b := checkProblem(t, r, 502)
	if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "rolled_back"}) {
		t.Errorf("outcome %q items %v, want rolled_back [rolled_back rolled_back]", b.Outcome, got)
	}
}

// TestSagaSingleWriteLockedOut: a single write that a batch keeps waiting
// longer than item_timeout is answered 409 problem+json with
// Retry-After, and writes nothing.
func TestSagaSingleWriteLockedOut(t *testing.T) {
	api := usersAPI(legacyapi.Collection{}, 4)
	g := startGateway(t, api, usersSite("concurrency 1", "item_timeout 1s"))
	for _, id := range []string{"2", "3", "4"} {
		api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/users/" + id, Delay: 600 * time.Millisecond})
	}

	a := start(g.URL, "PATCH", "/users", `[{"id": 1, "name": "A"}, {"id": 2, "name": "A"}, {"id": 3, "name": "A"}, {"id": 4, "name": "A"}]`)
	eventually(t, 5*time.Second, "the batch's write to user 2", func() bool { return received(api, "PATCH", "/users/2") })
	begin := time.Now()
	r := g.do(t, "PATCH", "/users/1", `{"name": "B"}`)
	waited := time.Since(begin)
	ra := a.answer(t)

	holds(t, api, "", "1", user(1, "A"))
	for _, req := range api.Requests() {
		if strings.Contains(string(req.Body), `"B"`) {
			t.Errorf("the refused write reached the upstream: %s %s %s", req.Method, req.Path, req.Body)
		}
	}
	if r.Status != 409 || r.Header.Get("Content-Type") != problem.ContentType || r.Header.Get("Retry-After") == "" {
		t.Fatalf("the single write: %v (Content-Type %q, Retry-After %q), want 409 problem+json with Retry-After",
			r, r.Header.Get("Content-Type"), r.Header.Get("Retry-After"))
	}
	if p := r.JSON(t); p["status"] != float64(409) || !strings.Contains(fmt.Sprint(p["detail"]), "/users/1") {
		t.Errorf("problem %s, want status 409 and a detail naming /users/1", r.Body)
	}
	if waited < 900*time.Millisecond {
		t.Errorf("refused after %s, want after waiting item_timeout (1s)", waited)
	}
	checkEnvelope(t, ra, 200, "succeeded")
}
