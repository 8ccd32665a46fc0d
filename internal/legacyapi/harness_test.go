// The harness of the fake API's tests: a server per test, clients with
// their own timeouts, and the helpers every test file shares.

package legacyapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fixture declares a strict collection (PUT cannot create), a lenient one
// with string ids, and a nested one.
func fixture() []Collection {
	return []Collection{
		{Path: "/api/users", Seed: []map[string]any{
			{"id": 1, "name": "Ada"}, {"id": 2, "name": "Bob"}, {"id": 10, "name": "Cy", "role": "admin"},
		}},
		{Path: "/gadgets", PutCreates: true, Seed: []map[string]any{{"id": "a b", "name": "Spanner"}}},
		{Path: "/api/users/1/posts", Seed: []map[string]any{{"id": 1, "title": "hello"}}},
	}
}

// start serves a fresh API; API.Close runs before the server's Close so
// hanging handlers cannot block the cleanup.
func start(t *testing.T) (*API, *httptest.Server) {
	t.Helper()
	api := NewRecording(fixture()...)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	t.Cleanup(api.Close)
	return api, srv
}

type answer struct {
	status int
	header http.Header
	body   string
}

// fresh returns a client that never reuses connections, so the transport
// cannot silently retry a dropped idempotent request on a new connection.
func fresh(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}

func send(c *http.Client, method, url, body string, hdr http.Header) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}, err
}

func do(t *testing.T, method, url, body string) answer {
	t.Helper()
	a, err := send(http.DefaultClient, method, url, body, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return a
}

func decode(t *testing.T, s string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return v
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

const (
	ctJSON  = "application/json; charset=utf-8"
	ctHTML  = "text/html; charset=utf-8"
	ctPlain = "text/plain; charset=utf-8"
)

// startWith serves a fresh API over the given collections, closed like
// start's.
func startWith(t *testing.T, cols ...Collection) (*API, *httptest.Server) {
	t.Helper()
	api := NewRecording(cols...)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	t.Cleanup(api.Close)
	return api, srv
}

// with returns fixture() with change applied to every collection.
func with(change func(*Collection)) []Collection {
	cols := fixture()
	for i := range cols {
		change(&cols[i])
	}
	return cols
}

func doH(t *testing.T, method, url, body string, hdr http.Header) answer {
	t.Helper()
	a, err := send(http.DefaultClient, method, url, body, hdr)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return a
}

// state is every record of the fixture's collections, to tell whether a
// request changed anything.
func state(api *API) string {
	return mustJSON([]any{api.Items("/api/users"), api.Items("/gadgets"), api.Items("/api/users/1/posts")})
}

// step is one request of a scripted test and what it must answer.
type step struct {
	method, path, body string
	status             int
	wantBody           string // exact, if set
}

func run(t *testing.T, srv *httptest.Server, steps []step) {
	t.Helper()
	for _, s := range steps {
		a := do(t, s.method, srv.URL+s.path, s.body)
		if a.status != s.status || (s.wantBody != "" && a.body != s.wantBody) {
			t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.wantBody)
		}
	}
}

// eventually polls cond until it holds or two seconds have passed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// background sends a request in a goroutine; the answer comes on the channel.
func background(method, url, body string, hdr http.Header) <-chan answer {
	c := make(chan answer, 1)
	go func() {
		a, err := send(fresh(10*time.Second), method, url, body, hdr)
		if err != nil {
			a.status, a.body = -1, err.Error()
		}
		c <- a
	}()
	return c
}

// noRedirects is a client that hands back redirects instead of following
// them, so a test sees the 301 or 303 itself.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// stored is the record the API holds under id in /api/users, as JSON, or
// "absent".
func stored(api *API, id string) string {
	rec, ok := api.Item("/api/users", id)
	if !ok {
		return "absent"
	}
	return mustJSON(rec)
}
