package batch

// The test harness of the engine: a scripted fake Sender with an
// in-memory legacy API behind it, and helpers that build plans through the
// real Detect and Parse, run them and decode what the client would read.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/policy"
)

// ---------------------------------------------------------------------
// The fake sender.

// answer is one scripted reply to a sub-request. The zero answer lets the
// in-memory store answer; the fields change that.
type answer struct {
	status int
	header http.Header
	body   string

	// err is returned with no response: ErrNotSent-wrapped means the
	// request never left, any other error means it was sent and no answer
	// came back.
	err error
	// effectThenErr lets the store apply the request, then loses the
	// answer: the write happened, the gateway cannot know.
	effectThenErr error
	// effectThenStatus lets the store apply the request, then answers
	// this status with an error page instead: a proxy in front of the
	// upstream whose answer did not reach it.
	effectThenStatus int
	// resent lets the store apply the request twice and answers the
	// second copy, marked Resent: an HTTP client that resent the request
	// after its first connection died.
	resent bool
	// readErr comes back with the scripted response: the status arrived,
	// the body could not be read whole.
	readErr error
	// hang blocks until the sub-request's context is done and returns its
	// error: an upstream that never answers.
	hang bool
	// lateAnswer waits until the sub-request's context is done, then
	// answers anyway: an upstream that answers just as time runs out.
	lateAnswer bool
	// hook runs before the answer; it may block on channels.
	hook func(ctx context.Context, req *SubRequest)
	// delay is slept before answering (ordering tests only).
	delay time.Duration
}

// reply is a shorthand for a canned answer.
func reply(status int, body string, header ...string) answer {
	a := answer{status: status, body: body, header: http.Header{}}
	for i := 0; i+1 < len(header); i += 2 {
		a.header.Add(header[i], header[i+1])
	}
	return a
}

// call is one sub-request as the fake received it.
type call struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   string
	// CtxErr is the sub-request context's error when Send returned.
	CtxErr error
	// CtxValue is the context's value under ctxKey{}.
	CtxValue any
}

// ctxKey is a context key a test can set on the client's context, to see
// that sub-requests keep the context's values.
type ctxKey struct{}

func (c call) String() string { return c.Method + " " + c.Path }

type fakeSender struct {
	// jitter, when set, delays every answer by a random duration below it,
	// so that items complete in random order.
	jitter time.Duration
	// noLocation makes a store create answer without a Location header.
	noLocation bool
	// stamps makes the store set "updated_at" on every record it stores,
	// from a clock of its own, whatever the write sent: Rails'
	// timestamps, Django's auto_now.
	stamps bool
	clock  int

	mu          sync.Mutex
	scripts     map[string][]answer // "METHOD /escaped/path" → answers; the last one repeats
	calls       []call
	inFlight    int
	maxInFlight int
	records     map[string]map[string]any
	nextID      int
}

func newFake() *fakeSender {
	return &fakeSender{scripts: map[string][]answer{}, records: map[string]map[string]any{}, nextID: 1000}
}

// on scripts the answers to one method and escaped path, in turn; the last
// answer repeats.
func (f *fakeSender) on(method, path string, answers ...answer) *fakeSender {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripts[method+" "+path] = answers
	return f
}

// seed stores records, each with its "id" member set.
func (f *fakeSender) seed(ids ...string) *fakeSender {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.records[id] = map[string]any{"id": id, "name": "widget " + id, "color": "red"}
	}
	return f
}

func (f *fakeSender) set(id string, rec map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[id] = rec
}

// state returns a copy of the store, records as JSON.
func (f *fakeSender) state() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return asJSON(f.records)
}

// asJSON is a copy of records, each as JSON.
func asJSON(records map[string]map[string]any) map[string]string {
	out := make(map[string]string, len(records))
	for key, rec := range records {
		b, _ := json.Marshal(rec)
		out[key] = string(b)
	}
	return out
}

// checkUnchanged fails the test unless the store holds what it held
// before: a rollback left nothing behind and lost nothing.
func (f *fakeSender) checkUnchanged(t testing.TB, before map[string]string) {
	t.Helper()
	checkSameRecords(t, f.state(), before)
}

// checkSameRecords fails the test unless a store's records (now) are
// those it held before.
func checkSameRecords(t testing.TB, now, before map[string]string) {
	t.Helper()
	if !maps.Equal(now, before) {
		t.Errorf("store %v, want it back as it was: %v", now, before)
	}
}

// log returns the sub-requests received so far, in arrival order.
func (f *fakeSender) log() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// sent returns "METHOD /path" of every sub-request, in arrival order.
func (f *fakeSender) sent() []string {
	var out []string
	for _, c := range f.log() {
		out = append(out, c.String())
	}
	return out
}

// sentWith returns the calls with the given method.
func (f *fakeSender) sentWith(method string) []call {
	var out []call
	for _, c := range f.log() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeSender) maxConcurrent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxInFlight
}

func (f *fakeSender) Send(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, call{
		Method: req.Method, Path: req.Path, RawQuery: req.RawQuery,
		Header: req.Header.Clone(), Body: string(req.Body), CtxValue: ctx.Value(ctxKey{}),
	})
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	var a answer
	key := req.Method + " " + req.Path
	if script := f.scripts[key]; len(script) > 0 {
		a = script[0]
		if len(script) > 1 {
			f.scripts[key] = script[1:]
		}
	}
	delay := a.delay
	if f.jitter > 0 {
		delay += rand.N(f.jitter)
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.calls[n].CtxErr = ctx.Err()
		f.mu.Unlock()
	}()

	if a.hook != nil {
		a.hook(ctx, req)
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	switch {
	case a.hang:
		<-ctx.Done()
		return nil, ctx.Err()
	case a.lateAnswer:
		<-ctx.Done()
	}
	if a.err != nil {
		return nil, a.err
	}
	if a.status != 0 {
		h := a.header.Clone()
		if h == nil {
			h = http.Header{}
		}
		return &SubResponse{Status: a.status, Header: h, Body: []byte(a.body)}, a.readErr
	}
	resp := f.store(req)
	if a.resent {
		resp = f.store(req)
		resp.Resent = true
	}
	if a.effectThenErr != nil {
		return nil, a.effectThenErr
	}
	if a.effectThenStatus != 0 {
		return &SubResponse{Status: a.effectThenStatus, Header: http.Header{"Content-Type": {"text/html"}}, Body: []byte("<h1>Bad Gateway</h1>")}, nil
	}
	return resp, nil
}

// store is a tiny legacy API over /widgets: GET reads a record, POST on
// the collection creates one (with a Location), PATCH merges (JSON merge
// patch), PUT replaces or creates, DELETE removes.
func (f *fakeSender) store(req *SubRequest) *SubResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	js := func(status int, v any) *SubResponse {
		b, _ := json.Marshal(v)
		return &SubResponse{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: b}
	}
	notFound := js(http.StatusNotFound, map[string]string{"error": "not found"})
	var body map[string]any
	if req.Body != nil {
		if err := json.Unmarshal(req.Body, &body); err != nil {
			return js(http.StatusBadRequest, map[string]string{"error": err.Error()})
		}
	}
	if req.Path == "/widgets" && req.Method == http.MethodGet {
		// The LIST, filtered as json-server does (?id=1&id=2); without
		// the filter, every record.
		q, _ := url.ParseQuery(req.RawQuery)
		ids := q["id"]
		if len(ids) == 0 {
			ids = slices.Sorted(maps.Keys(f.records))
		}
		list := []map[string]any{}
		for _, id := range ids {
			if rec, ok := f.records[id]; ok {
				list = append(list, rec)
			}
		}
		return js(http.StatusOK, list)
	}
	if req.Path == "/widgets" {
		if req.Method != http.MethodPost {
			return js(http.StatusMethodNotAllowed, nil)
		}
		var id string
		switch v := body["id"].(type) {
		case string:
			id = v
		case float64:
			id = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			id = strconv.Itoa(f.nextID)
			f.nextID++
		}
		if _, exists := f.records[id]; exists {
			return js(http.StatusConflict, map[string]string{"error": "exists"})
		}
		body["id"] = id
		f.stamp(body)
		f.records[id] = body
		resp := js(http.StatusCreated, body)
		if !f.noLocation {
			resp.Header.Set("Location", "http://upstream.test/widgets/"+url.PathEscape(id))
		}
		return resp
	}
	rest, ok := strings.CutPrefix(req.Path, "/widgets/")
	if !ok || strings.Contains(rest, "/") {
		return notFound
	}
	id, err := url.PathUnescape(rest)
	if err != nil {
		return notFound
	}
	rec, exists := f.records[id]
	switch req.Method {
	case http.MethodGet:
		if !exists {
			return notFound
		}
		return js(http.StatusOK, rec)
	case http.MethodPatch:
		if !exists {
			return notFound
		}
		merged := maps.Clone(rec)
		for k, v := range body {
			if v == nil {
				delete(merged, k)
			} else {
				merged[k] = v
			}
		}
		f.stamp(merged)
		f.records[id] = merged
		return js(http.StatusOK, merged)
	case http.MethodPut:
		f.stamp(body)
		f.records[id] = body
		if exists {
			return js(http.StatusOK, body)
		}
		return js(http.StatusCreated, body)
	case http.MethodDelete:
		if !exists {
			return notFound
		}
		delete(f.records, id)
		return &SubResponse{Status: http.StatusNoContent, Header: http.Header{}}
	}
	return js(http.StatusMethodNotAllowed, nil)
}

// stamp sets a record's updated_at, when the store stamps. Callers hold
// mu.
func (f *fakeSender) stamp(rec map[string]any) {
	if f.stamps {
		f.clock++
		rec["updated_at"] = fmt.Sprintf("t%d", f.clock)
	}
}

// ---------------------------------------------------------------------
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
	return newSaga(p, Runtime{Send: s}, noBackoff).run(ctx)
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
