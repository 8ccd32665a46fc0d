package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// startAdminGateway is startGateway with Caddy's admin endpoint on, at a
// free loopback port, and the storage in a folder of the test's own.
func startAdminGateway(t *testing.T, api *legacyapi.API, site string) *gateway {
	t.Helper()
	g := &gateway{API: api, client: gatewayClient(t, 60*time.Second), addr: freeAddr(t),
		upstream: newUpstream(t, api), storage: "storage file_system " + t.TempDir(), admin: freeAddr(t)}
	g.start(t, site)
	return g
}

// reload loads site as g's new config, as caddy reload does.
func (g *gateway) reload(t testing.TB, site string) {
	t.Helper()
	loadCaddyfile(t, g.config(site))
}

// adminDo sends a request to g's admin endpoint.
func (g *gateway) adminDo(t testing.TB, method, path string, body any) response {
	t.Helper()
	r, err := g.adminTry(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// adminTry is adminDo for any goroutine: it returns what went wrong.
func (g *gateway) adminTry(method, path string, body any) (response, error) {
	var reader io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		reader = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, "http://"+g.admin+path, reader)
	if err != nil {
		return response{}, err
	}
	// A config load restarts the admin endpoint, closing kept-alive
	// connections under the client: each request has its own.
	req.Close = true
	resp, err := g.client.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: raw}, nil
}

// sagaJSON is a saga as the admin API shows it, in the parts tests read.
type sagaJSON struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	URI        string            `json:"uri"`
	Reason     string            `json:"reason"`
	LeftBehind json.RawMessage   `json:"left_behind"`
	Headers    map[string]string `json:"headers"`
	Items      []struct {
		ID       string         `json:"id"`
		Outcome  string         `json:"outcome"`
		Reason   string         `json:"reason"`
		Preimage map[string]any `json:"preimage"`
		Request  *struct {
			Headers map[string]string `json:"headers"`
		} `json:"request"`
		Compensation *struct {
			CreatedID string `json:"created_id"`
		} `json:"compensation"`
	} `json:"items"`
}

func decodeSaga(t testing.TB, r response, status int) sagaJSON {
	t.Helper()
	if r.Status != status {
		t.Fatalf("answered %s, want %d", r, status)
	}
	var s sagaJSON
	if err := json.Unmarshal(r.Body, &s); err != nil {
		t.Fatalf("not a saga: %v\n%s", err, r.Body)
	}
	return s
}

// summaryJSON is a saga as a listing shows it.
type summaryJSON struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	URI        string `json:"uri"`
	Items      int    `json:"items"`
	LeftBehind int    `json:"left_behind"`
	Reason     string `json:"reason"`
}

func listSagas(t testing.TB, g *gateway, query string) []summaryJSON {
	t.Helper()
	r := g.adminDo(t, "GET", "/batch/sagas"+query, nil)
	var list []summaryJSON
	if r.Status != 200 || json.Unmarshal(r.Body, &list) != nil || list == nil {
		t.Fatalf("GET /batch/sagas%s: %s, want a JSON array", query, r)
	}
	return list
}

// operatedSite is /api/widgets (whose PUT cannot create) restoring
// deletes by restore, behind a handler that refuses every request
// without the client's credential: the batch's sub-requests pass it as
// the client's single requests would.
func operatedSite(restore string) string {
	return `
	route {
		batch {
			concurrency 1
			compensation_retries 0
			scope_query tenant
			resource /api/widgets {` + resourceMethods + `
				restore_deleted ` + restore + `
			}
		}
		@stranger not header Authorization "Bearer s3cret"
		respond @stranger 401
		reverse_proxy UPSTREAM
	}`
}

// leaveWidget17Behind sends a batch DELETE of widgets 17, 18, 19 whose
// second fails: widget 17, deleted, cannot be put back by a PUT, so the
// saga is kept. It returns the saga's id, read from the ERROR line.
func leaveWidget17Behind(t *testing.T, g *gateway, header ...string) string {
	t.Helper()
	g.API.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	testLogs.reset()
	r := g.do(t, "DELETE", "/api/widgets?ids=17,18,19&tenant=acme", nil, append([]string{"Authorization", "Bearer s3cret"}, header...)...)
	checkLeftBehind(t, r, 0, "")
	g.API.ClearFaults()
	e := batchLine(t)
	saga, _ := e["saga"].(string)
	if e["level"] != "error" || saga == "" || e["show"] != "caddy batch saga "+saga {
		t.Fatalf("the ERROR line names no saga, or not the command that shows it: %v", e)
	}
	return saga
}

// TestSagaLeftBehindIsOperated: a batch that leaves an item behind is
// kept; its ERROR line names the saga and holds no pre-image; it is
// listed and shown whole with its pre-image and no credential value,
// and nothing stored holds the credential; a retry while the cause
// persists leaves it with the new reason, one without the operator's
// credential is refused by the authenticating handler, and after the
// config is fixed (restore_deleted post) a retry with it puts widget 17
// back and the saga is gone.
func TestSagaLeftBehindIsOperated(t *testing.T) {
	api := seededAPI()
	g := startAdminGateway(t, api, operatedSite("put"))
	preimage, _ := api.Item("/api/widgets", "17")
	saga := leaveWidget17Behind(t, g)
	for _, line := range testLogs.lines {
		if bytes.Contains(line, []byte(`"w17"`)) || bytes.Contains(line, []byte("preimage")) {
			t.Errorf("a log line holds the pre-image: %s", line)
		}
	}

	list := listSagas(t, g, "")
	if len(list) != 1 || list[0].ID != saga || list[0].State != "left_behind" || list[0].URI != "/api/widgets?ids=17,18,19&tenant=[redacted]" ||
		list[0].Items != 3 || list[0].LeftBehind != 1 || !strings.Contains(list[0].Reason, "404") {
		t.Fatalf("listed %+v", list)
	}
	if got := listSagas(t, g, "?state=stuck"); len(got) != 0 {
		t.Errorf("stuck sagas %+v, want none", got)
	}
	s := decodeSaga(t, g.adminDo(t, "GET", "/batch/sagas/"+saga, nil), 200)
	if !sameJSON(t, s.Items[0].Preimage, preimage) || s.Items[0].Outcome != "rollback_failed" || s.Items[0].Reason == "" {
		t.Errorf("item 0 %+v, want widget 17's pre-image and why it was left", s.Items[0])
	}
	if s.Headers["Authorization"] != "[redacted]" || s.Items[0].Request.Headers["Authorization"] != "[redacted]" {
		t.Errorf("headers %v, %v: want the credential redacted", s.Headers, s.Items[0].Request.Headers)
	}
	checkStorageHolds(t, g, "s3cret", false)

	// The cause persists: widget 17 cannot be PUT back.
	s = decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}}), 200)
	if s.State != "left_behind" || !strings.Contains(s.Items[0].Reason, "404") {
		t.Errorf("retry with the cause unfixed: %s %+v, want left_behind saying the PUT was answered 404", s.State, s.Items[0])
	}
	// Without the operator's credential the handler refuses every request.
	s = decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", nil), 200)
	if s.State != "left_behind" || !strings.Contains(s.Items[0].Reason, "401") {
		t.Errorf("retry without a credential: %s %+v, want left_behind saying 401", s.State, s.Items[0])
	}
	if _, ok := api.Item("/api/widgets", "17"); ok {
		t.Fatal("widget 17 was put back while the cause persisted")
	}
	if n := sagasGauge(t, "left_behind"); n != 1 {
		t.Errorf("caddy_http_batch_sagas{state=left_behind} is %v after a retry that left the saga, want 1", n)
	}

	g.reload(t, operatedSite("post"))
	before := sagaActions(t, "retry", "resolved")
	s = decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}}), 200)
	if s.State != "resolved" || s.Items[0].Outcome != "rolled_back" {
		t.Fatalf("retry after the fix: %s %+v", s.State, s.Items[0])
	}
	if got, _ := api.Item("/api/widgets", "17"); !sameJSON(t, got, preimage) {
		t.Errorf("widget 17 is %v, want %v", got, preimage)
	}
	if n := sagaActions(t, "retry", "resolved"); n != before+1 {
		t.Errorf("retries resolved counted %v, want %v", n, before+1)
	}
	if got := listSagas(t, g, ""); len(got) != 0 {
		t.Errorf("sagas left: %+v", got)
	}
	if n := sagasGauge(t, "left_behind"); n != 0 {
		t.Errorf("caddy_http_batch_sagas{state=left_behind} is %v once the saga is resolved, want 0", n)
	}
	if r := g.adminDo(t, "GET", "/batch/sagas/"+saga, nil); r.Status != 404 || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("a resolved saga: %s, want a 404 problem", r)
	}
	if r := g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", nil); r.Status != 404 {
		t.Errorf("retrying a resolved saga: %s, want 404", r)
	}
}

// checkStorageHolds walks g's storage folder for s.
func checkStorageHolds(t testing.TB, g *gateway, s string, want bool) {
	t.Helper()
	dir := g.storageDir(t)
	found := false
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(s)) {
				found = true
				if !want {
					t.Errorf("%s holds %q", p, s)
				}
			}
		}
		return nil
	})
	if want && !found {
		t.Errorf("nothing in storage holds %q", s)
	}
}

// TestSagaRetryLeavesAnotherWritersItem: a client that creates widget 17
// again after the batch left it deleted wins: the retry proves the item
// absent first, leaves it as that client made it, and says so.
func TestSagaRetryLeavesAnotherWritersItem(t *testing.T) {
	api := seededAPI()
	g := startAdminGateway(t, api, operatedSite("put"))
	saga := leaveWidget17Behind(t, g)
	if r := g.do(t, "POST", "/api/widgets?tenant=acme", map[string]any{"id": 17, "name": "someone else's"}, "Authorization", "Bearer s3cret"); r.Status != 201 {
		t.Fatalf("another client's create: %s", r)
	}
	g.reload(t, operatedSite("post"))
	s := decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}}), 200)
	if s.State != "left_behind" || !strings.Contains(s.Items[0].Reason, "exists again") {
		t.Errorf("retry: %s %+v, want left_behind saying the item exists again", s.State, s.Items[0])
	}
	if got, _ := api.Item("/api/widgets", "17"); got["name"] != "someone else's" {
		t.Errorf("widget 17 is %v, want the other client's", got)
	}
}

// TestSagaResolve: resolve needs a reason (400 without), removes the
// saga, and writes a WARN audit line with the reason, the item's id and
// the caller, and no pre-image; a second resolve is 404.
func TestSagaResolve(t *testing.T) {
	api := seededAPI()
	g := startAdminGateway(t, api, operatedSite("put"))
	saga := leaveWidget17Behind(t, g)
	if r := g.adminDo(t, "POST", "/batch/sagas/"+saga+"/resolve", map[string]any{"reason": " "}); r.Status != 400 || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("resolve without a reason: %s, want a 400 problem", r)
	}
	testLogs.reset()
	s := decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/resolve", map[string]any{"reason": "widget 17 restored from the backup"}), 200)
	if s.State != "resolved" {
		t.Errorf("resolve answered %+v", s)
	}
	var audit map[string]any
	for _, e := range testLogs.entries("batch") {
		if e["msg"] == "saga resolve by an operator" {
			audit = e
		}
	}
	if audit == nil || audit["level"] != "warn" || audit["reason"] != "widget 17 restored from the backup" ||
		audit["saga"] != saga || !strings.Contains(audit["caller"].(string), "127.0.0.1") || !strings.Contains(fmtvalue(audit["items"]), "17") {
		t.Errorf("audit line %v", audit)
	}
	if strings.Contains(fmtvalue(audit), "w17") {
		t.Errorf("the audit line holds the pre-image: %v", audit)
	}
	if got := listSagas(t, g, ""); len(got) != 0 {
		t.Errorf("sagas left: %+v", got)
	}
	if r := g.adminDo(t, "POST", "/batch/sagas/"+saga+"/resolve", map[string]any{"reason": "again"}); r.Status != 404 {
		t.Errorf("a second resolve: %s, want 404", r)
	}
}

// sagaActions reads the count of an operator's action.
func sagaActions(t testing.TB, action, result string) float64 {
	t.Helper()
	return metricValue(t, "saga_actions_total", "action", action, "result", result)
}

// sagasGauge reads the sagas gauge of a state.
func sagasGauge(t testing.TB, state string) float64 {
	t.Helper()
	return metricValue(t, "sagas", "state", state)
}

func fmtvalue(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestSagaPostRestoreIsNeverResent: in front of an API that assigns ids
// on POST, a restore_deleted post re-creates widget 17 under another id;
// the saga records it, and a second retry sends no POST: no duplicate.
func TestSagaPostRestoreIsNeverResent(t *testing.T) {
	api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", AssignIDs: true, Seed: records("w", 1, 20)})
	g := startAdminGateway(t, api, operatedSite("post"))
	saga := leaveWidget17Behind(t, g)
	n := len(api.Items("/api/widgets"))
	s := decodeSaga(t, g.adminDo(t, "GET", "/batch/sagas/"+saga, nil), 200)
	if s.Items[0].Compensation == nil || s.Items[0].Compensation.CreatedID == "" {
		t.Fatalf("item 0 %+v, want the id the POST restore got", s.Items[0])
	}
	created := s.Items[0].Compensation.CreatedID
	for range 2 {
		s = decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}}), 200)
		if s.State != "left_behind" || s.Items[0].Compensation == nil || s.Items[0].Compensation.CreatedID != created {
			t.Errorf("retry: %s %+v, want left_behind naming %s", s.State, s.Items[0], created)
		}
	}
	if got := len(api.Items("/api/widgets")); got != n {
		t.Errorf("%d widgets after two retries, want %d: a restore was sent again", got, n)
	}
}

// TestSagaIdempotencyReplayKeepsTheFirstAnswer: after a retry finished
// the saga, the batch's Idempotency-Key still replays what the client
// was told first.
func TestSagaIdempotencyReplayKeepsTheFirstAnswer(t *testing.T) {
	api := seededAPI()
	g := startAdminGateway(t, api, operatedSite("put"))
	g.API.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/18", Status: 500, Body: htmlError})
	first := g.do(t, "DELETE", "/api/widgets?ids=17,18,19&tenant=acme", nil, "Authorization", "Bearer s3cret", "Idempotency-Key", "k-23")
	checkLeftBehind(t, first, 0, "")
	g.API.ClearFaults()
	saga := listSagas(t, g, "")[0].ID
	g.reload(t, operatedSite("post"))
	if s := decodeSaga(t, g.adminDo(t, "POST", "/batch/sagas/"+saga+"/retry", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret"}}), 200); s.State != "resolved" {
		t.Fatalf("retry: %+v", s)
	}
	again := g.do(t, "DELETE", "/api/widgets?ids=17,18,19&tenant=acme", nil, "Authorization", "Bearer s3cret", "Idempotency-Key", "k-23")
	if again.Status != first.Status || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay after the retry: %s, want the first answer %s replayed", again, first)
	}
	if _, ok := api.Item("/api/widgets", "17"); !ok {
		t.Error("the replay undid the retry's restore")
	}
}

// TestSagaAdminErrors: unknown ids and actions are 404, a bad query or
// a wrong method is refused, all as problems.
func TestSagaAdminErrors(t *testing.T) {
	g := startAdminGateway(t, seededAPI(), operatedSite("put"))
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/batch/sagas/0123456789abcdef0123456789abcdef", 404},
		{"GET", "/batch/sagas/..%2f..%2fetc", 404},
		{"POST", "/batch/sagas/0123456789abcdef0123456789abcdef/retry", 404},
		{"POST", "/batch/sagas/0123456789abcdef0123456789abcdef/undo", 404},
		{"GET", "/batch/sagas/0123456789abcdef0123456789abcdef/retry", 405},
		{"GET", "/batch/sagas?state=done", 400},
		{"GET", "/batch/sagas?limit=0", 400},
		{"POST", "/batch/sagas", 405},
	} {
		if r := g.adminDo(t, c.method, c.path, nil); r.Status != c.status || r.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %s, want a %d problem", c.method, c.path, r, c.status)
		}
	}
}
