package batch

// The engine's test harness: policies, requests and plans built through
// the real Detect and Parse, runs, and what the client reads.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Policies, requests and plans.

// specMod changes the /widgets resource of a test.
type specMod func(*policy.ResourceSpec)

func settings(f func(*policy.Settings)) specMod {
	return func(r *policy.ResourceSpec) { f(&r.Settings) }
}

var (
	partial        = settings(func(s *policy.Settings) { s.SetAtomicity(policy.Partial) })
	declarative    = settings(func(s *policy.Settings) { s.DeleteSemantics = policy.Declarative })
	override       = settings(func(s *policy.Settings) { s.AllowOverride = true })
	restoreByPost  = settings(func(s *policy.Settings) { s.RestoreDeleted = policy.RestorePost })
	restoreByPatch = settings(func(s *policy.Settings) { s.RestoreUpdated = policy.RestorePatch })
	conditional    = settings(func(s *policy.Settings) { s.ConditionalWrites = true })
)

// listFilter reads the batch through the LIST, filtered by ?id=<id>
// repeated, as the fake's store does.
func listFilter(spec policy.ListFilterSpec) specMod {
	if spec.Template == "" {
		spec.Template = "id={id}"
	}
	return func(r *policy.ResourceSpec) { r.ListFilter = &spec }
}

func concurrency(n int) specMod {
	return settings(func(s *policy.Settings) { s.Concurrency = n })
}

func maxItems(n int) specMod { return settings(func(s *policy.Settings) { s.MaxItems = n }) }

func compensationRetries(n int) specMod {
	return settings(func(s *policy.Settings) { s.CompensationRetries = n })
}

func itemTimeout(d time.Duration) specMod {
	return settings(func(s *policy.Settings) { s.ItemTimeout = d })
}

func batchTimeout(d time.Duration) specMod {
	return settings(func(s *policy.Settings) { s.BatchTimeout = d })
}

// widgets returns the test resource: /widgets with every method, so every
// batch operation is on and every compensation is possible.
func widgets(t testing.TB, mods ...specMod) *policy.Policy {
	t.Helper()
	spec := policy.ResourceSpec{
		Path:              "/widgets",
		CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"},
		ItemMethods:       []string{"GET", "PUT", "PATCH", "DELETE"},
		Settings:          policy.Defaults(),
		Gateway:           policy.GatewayDefaults(),
	}
	for _, m := range mods {
		m(&spec)
	}
	pol, err := policy.New([]policy.ResourceSpec{spec})
	if err != nil {
		t.Fatalf("policy.New: %v", err)
	}
	return pol
}

// newRequest builds a client request; header holds name, value pairs.
func newRequest(method, target, body string, header ...string) *http.Request {
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, target, nil)
	} else {
		r = httptest.NewRequest(method, target, strings.NewReader(body))
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

// parse does what the handler does before fan-out: look the path up,
// Detect the operation, and Parse.
func parse(t testing.TB, r *http.Request, mods ...specMod) (*Plan, *problemView) {
	t.Helper()
	m, ok := widgets(t, mods...).Lookup(r.URL.EscapedPath())
	if !ok || m.Item {
		t.Fatalf("%s %s: not the /widgets collection", r.Method, r.URL)
	}
	op, isBatch, err := detectOp(r, m.Resource)
	if err != nil || !isBatch {
		t.Fatalf("%s %s: Detect = %v, %v, %v; want a batch", r.Method, r.URL, op, isBatch, err)
	}
	p, prob := parsePlan(r, m, op)
	if prob != nil {
		rec := httptest.NewRecorder()
		if err := prob.Write(rec); err != nil {
			t.Fatal(err)
		}
		return nil, decodeProblem(t, rec)
	}
	return p, nil
}

// mustPlan parses a request that must be a valid batch.
func mustPlan(t testing.TB, r *http.Request, mods ...specMod) *Plan {
	t.Helper()
	p, prob := parse(t, r, mods...)
	if prob != nil {
		t.Fatalf("%s %s: Parse refused it: %d %s", r.Method, r.URL, prob.Status, prob.Detail)
	}
	return p
}

func noBackoff(int) time.Duration { return 0 }

// run runs a plan to the end with no compensation backoff.
func run(p *Plan, s Sender) *Result {
	return runCtx(context.Background(), p, s)
}

func runCtx(ctx context.Context, p *Plan, s Sender) *Result {
	return newBatchRun(p, Runtime{Send: s}, noBackoff).do(ctx)
}

// run1 plans one request on /widgets and runs it on f.
func run1(t testing.TB, method, target, body string, f *fakeAPI, mods ...specMod) *Result {
	t.Helper()
	return run(mustPlan(t, newRequest(method, target, body), mods...), f)
}

// ---------------------------------------------------------------------
// What the client reads.

type problemView struct {
	ContentType string
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Detail      string `json:"detail"`
}

func decodeProblem(t testing.TB, rec *httptest.ResponseRecorder) *problemView {
	t.Helper()
	var pv problemView
	if err := json.Unmarshal(rec.Body.Bytes(), &pv); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	pv.ContentType = rec.Header().Get("Content-Type")
	if pv.Status != rec.Code {
		t.Errorf("problem status member %d, response status %d", pv.Status, rec.Code)
	}
	return &pv
}

// wire is a batch response as the client decodes it, with what the
// client sees of the HTTP answer.
type wire struct {
	Code        int
	ContentType string
	Header      http.Header
	batchwire.Response
}

// write answers the client with res and decodes what it would read.
func write(t testing.TB, res *Result) *wire {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := res.Write(rec); err != nil {
		t.Fatalf("Write: %v", err)
	}
	raw, _ := io.ReadAll(rec.Result().Body)
	w := &wire{Code: rec.Code, ContentType: rec.Header().Get("Content-Type"), Header: rec.Header()}
	if err := json.Unmarshal(raw, w); err != nil {
		t.Fatalf("batch response %q: %v", raw, err)
	}
	return w
}

// checkIndices asserts that the items are in request order, 0..n-1.
func (w *wire) checkIndices(t testing.TB, n int) {
	t.Helper()
	if len(w.Items) != n {
		t.Fatalf("%d items, want %d", len(w.Items), n)
	}
	for i, it := range w.Items {
		if it.Index != i {
			t.Fatalf("items[%d].index = %d", i, it.Index)
		}
	}
}

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func equalSlices[T comparable](t testing.TB, what string, got, want []T) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s =\n\t%#v\nwant\n\t%#v", what, got, want)
	}
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t testing.TB, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Errorf("%s: %q is not JSON: %v", what, got, err)
		return
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		panic(err)
	}
	if fmt.Sprint(g) != fmt.Sprint(w) {
		t.Errorf("%s = %s, want %s", what, got, want)
	}
}

func ids(n int, from int) string {
	var s []string
	for i := range n {
		s = append(s, strconv.Itoa(from+i))
	}
	return strings.Join(s, ",")
}

// elements builds a JSON array of n create elements {"name":"w<i>"}.
func elements(n int) string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf(`{"name":"w%d"}`, i))
	}
	return "[" + strings.Join(s, ",") + "]"
}
