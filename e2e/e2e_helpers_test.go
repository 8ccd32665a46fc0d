package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// The end-to-end tests of batch operations: a real Caddy, a real
// reverse_proxy, and the fake legacy API over loopback. Their key
// assertion is always the legacy API's final state: what a batch left
// there, whatever it answered.

// batchAnswer is a batch response (the envelope, or problem details with
// the envelope's members).
type batchAnswer = batchwire.Response

// batch decodes a batch answer, failing the test if it is not one.
func (r response) batch(t testing.TB) batchAnswer {
	t.Helper()
	var b batchAnswer
	if err := json.Unmarshal(r.Body, &b); err != nil {
		t.Fatalf("the answer is not a batch response: %v\n%s", err, r.Body)
	}
	return b
}

// checkProblem checks a failed batch's answer: problem+json (RFC 9457)
// with the status repeated in the body and a detail.
func checkProblem(t testing.TB, r response, status int) batchAnswer {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != problem.ContentType {
		t.Errorf("Content-Type %q, want %q", ct, problem.ContentType)
	}
	b := r.batch(t)
	if b.Status != status || b.Title != http.StatusText(status) || !strings.HasPrefix(b.Type, "https://") || b.Detail == "" {
		t.Errorf("problem members type %q title %q status %d detail %q", b.Type, b.Title, b.Status, b.Detail)
	}
	return b
}

// checkEnvelope checks a batch's JSON envelope (not problem+json).
func checkEnvelope(t testing.TB, r response, status int, outcome string) batchAnswer {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	b := r.batch(t)
	if b.Outcome != outcome {
		t.Errorf("outcome %q, want %q: %s", b.Outcome, outcome, r.Body)
	}
	return b
}

// optionalBody is a test row's body for gateway.do: none when empty.
func optionalBody(body string) any {
	if body == "" {
		return nil
	}
	return body
}

// records makes seed records {"id": n, "name": prefix+n} for n in [from, to].
func records(prefix string, from, to int) []map[string]any {
	var out []map[string]any
	for n := from; n <= to; n++ {
		out = append(out, map[string]any{"id": n, "name": prefix + strconv.Itoa(n)})
	}
	return out
}

// seededAPI serves /api/widgets (PUT cannot create, as in many legacy
// APIs) and /api/gadgets (PUT creates), 20 records each, and an empty
// /api/gizmos.
func seededAPI() *legacyapi.API {
	return legacyapi.NewRecording(
		legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 20)},
		legacyapi.Collection{Path: "/api/gadgets", PutCreates: true, Seed: records("g", 1, 20)},
		legacyapi.Collection{Path: "/api/gizmos", PutCreates: true, Seed: records("z", 1, 3)},
	)
}

// passThrough lets the next n requests of method on path through
// untouched, so that a fault injected after it hits request n+1: the
// way to aim a fault at one element of a batch CREATE, whose elements
// all go to the collection's path.
func passThrough(method, path string, n int) legacyapi.Fault {
	return legacyapi.Fault{Method: method, Path: path, Times: n}
}

// writes returns the requests that were not reads.
func writes(reqs []legacyapi.Request) []legacyapi.Request {
	var out []legacyapi.Request
	for _, r := range reqs {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			out = append(out, r)
		}
	}
	return out
}

func describeRequests(reqs []legacyapi.Request) string {
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "\n  %s %s %s", r.Method, r.Path, r.Body)
	}
	return b.String()
}

// decodeJSON decodes raw JSON (numbers as float64), for comparisons that
// do not care how a number was written.
func decodeJSON(t testing.TB, raw []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, raw)
	}
	return v
}

// sameJSON reports whether a and b (Go values or raw JSON) encode the same
// JSON value.
func sameJSON(t testing.TB, a, b any) bool {
	t.Helper()
	enc := func(v any) any {
		raw, ok := v.([]byte)
		if r, isRaw := v.(json.RawMessage); isRaw {
			raw, ok = r, true
		}
		if !ok {
			var err error
			if raw, err = json.Marshal(v); err != nil {
				t.Fatal(err)
			}
		}
		return decodeJSON(t, raw)
	}
	return reflect.DeepEqual(enc(a), enc(b))
}

// sameState fails the test unless the collection holds exactly what it
// held before.
func sameState(t testing.TB, api *legacyapi.API, collection string, before map[string]map[string]any) {
	t.Helper()
	after := api.Items(collection)
	if reflect.DeepEqual(before, after) {
		return
	}
	for id, rec := range after {
		if old, ok := before[id]; !ok {
			t.Errorf("%s: %s was left behind (orphan): %v", collection, id, rec)
		} else if !reflect.DeepEqual(old, rec) {
			t.Errorf("%s: %s is %v, want its pre-image %v", collection, id, rec, old)
		}
	}
	for id, rec := range before {
		if _, ok := after[id]; !ok {
			t.Errorf("%s: %s was deleted and not restored (was %v)", collection, id, rec)
		}
	}
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// received reports whether the fake API has received method path.
func received(api *legacyapi.API, method, path string) bool {
	for _, r := range api.Requests() {
		if r.Method == method && r.Path == path {
			return true
		}
	}
	return false
}

// mentionsItem reports whether a problem's detail names item index, as
// "item 3" or "items 1 and 3".
func mentionsItem(detail string, index int) bool {
	return regexp.MustCompile(`\bitems? (\d+ and )?` + strconv.Itoa(index) + `\b`).MatchString(detail)
}

const resourceMethods = `
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE`

// inFlightMeter counts the requests the legacy API is serving at once, of
// those counts admits (every one, when counts is nil).
type inFlightMeter struct {
	http.Handler
	counts    func(*http.Request) bool
	mu        sync.Mutex
	now, peak int
}

func (m *inFlightMeter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.counts != nil && !m.counts(r) {
		m.Handler.ServeHTTP(w, r)
		return
	}
	m.mu.Lock()
	m.now++
	m.peak = max(m.peak, m.now)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.now--
		m.mu.Unlock()
	}()
	m.Handler.ServeHTTP(w, r)
}

// resetPeak starts a new peak from the requests in flight now.
func (m *inFlightMeter) resetPeak() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.peak = m.now
}

func (m *inFlightMeter) peakInFlight() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

// heldUntilReleased is f with its answer held, instead of delayed, until
// release is called: a test's other writer then acts inside the batch's
// window however slow the machine is.
func heldUntilReleased(f legacyapi.Fault) (held legacyapi.Fault, release func()) {
	ch := make(chan struct{})
	f.Delay, f.Until = 0, ch
	return f, sync.OnceFunc(func() { close(ch) })
}

// send is g.do for goroutines other than the test's: it reports errors
// instead of failing the test.
func send(client *http.Client, base, method, path, body string) (response, error) {
	return sendHeader(client, base, method, path, body, nil)
}

// sendHeader is send with header added to the request.
func sendHeader(client *http.Client, base, method, path, body string, header http.Header) (response, error) {
	var reader io.Reader
	if body != "" {
		reader = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, base+path, reader)
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: raw}, err
}
