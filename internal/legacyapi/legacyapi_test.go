package legacyapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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

func TestAnswers(t *testing.T) {
	users := func(api *API) string { return mustJSON(api.Items("/api/users")) }
	seedUsers := mustJSON(New(fixture()...).Items("/api/users"))

	tests := []struct {
		name, method, path, body string
		status                   int
		ct                       string
		wantBody                 string // exact, if set
		contains                 string // substring, if set
		allow                    string
		check                    func(t *testing.T, api *API, a answer)
	}{
		{name: "list ordered numerically", method: "GET", path: "/api/users", status: 200, ct: ctJSON,
			wantBody: `[{"id":1,"name":"Ada"},{"id":2,"name":"Bob"},{"id":10,"name":"Cy","role":"admin"}]`},
		{name: "list trailing slash", method: "GET", path: "/api/users/", status: 200, ct: ctJSON, contains: `"Ada"`},
		{name: "list nested", method: "GET", path: "/api/users/1/posts", status: 200, ct: ctJSON, wantBody: `[{"id":1,"title":"hello"}]`},
		{name: "page", method: "GET", path: "/api/users?offset=1&limit=1", status: 200, ct: ctJSON, wantBody: `[{"id":2,"name":"Bob"}]`},
		{name: "page past end", method: "GET", path: "/api/users?offset=9", status: 200, ct: ctJSON, wantBody: `[]`},
		{name: "page bad limit", method: "GET", path: "/api/users?limit=x", status: 400, ct: ctPlain},
		{name: "page negative offset", method: "GET", path: "/api/users?offset=-1", status: 400, ct: ctPlain},
		{name: "head list", method: "HEAD", path: "/api/users", status: 200, ct: ctJSON, wantBody: "",
			check: func(t *testing.T, _ *API, a answer) {
				if a.header.Get("Content-Length") == "0" || a.header.Get("Content-Length") == "" {
					t.Errorf("HEAD Content-Length = %q, want the GET length", a.header.Get("Content-Length"))
				}
			}},
		{name: "get item", method: "GET", path: "/api/users/1", status: 200, ct: ctJSON, wantBody: `{"id":1,"name":"Ada"}`},
		{name: "get escaped string id", method: "GET", path: "/gadgets/a%20b", status: 200, ct: ctJSON, wantBody: `{"id":"a b","name":"Spanner"}`},
		{name: "get missing item", method: "GET", path: "/api/users/7", status: 404, ct: ctHTML, contains: "<title>404 Not Found</title>"},
		{name: "head missing item", method: "HEAD", path: "/api/users/7", status: 404, ct: ctHTML, wantBody: ""},
		{name: "unknown path", method: "GET", path: "/nope", status: 404, ct: ctHTML, contains: "<h1>Not Found</h1>"},
		{name: "two segments deep", method: "GET", path: "/api/users/1/2", status: 404, ct: ctHTML},
		{name: "item trailing slash", method: "GET", path: "/api/users/1/", status: 404, ct: ctHTML},

		{name: "post assigns numeric id", method: "POST", path: "/api/users", body: `{"name":"Dee","age":42}`, status: 201, ct: ctJSON,
			wantBody: `{"age":42,"id":1000,"name":"Dee"}`,
			check: func(t *testing.T, api *API, a answer) {
				if rec, ok := api.Item("/api/users", "1000"); !ok || rec["id"] != json.Number("1000") {
					t.Errorf("stored %v, %v; want id json.Number 1000", rec, ok)
				}
			}},
		{name: "post with string id", method: "POST", path: "/gadgets", body: `{"id":"x/y","name":"Bolt"}`, status: 201, ct: ctJSON, wantBody: `{"id":"x/y","name":"Bolt"}`},
		{name: "post not object", method: "POST", path: "/api/users", body: `[1]`, status: 400, ct: ctPlain, wantBody: "body must be a JSON object"},
		{name: "post bad json", method: "POST", path: "/api/users", body: `{"name":`, status: 400, ct: ctPlain},
		{name: "post empty name", method: "POST", path: "/api/users", body: `{"name":""}`, status: 422, ct: ctHTML, contains: "<!DOCTYPE html>",
			check: func(t *testing.T, api *API, _ answer) {
				if got := users(api); got != seedUsers {
					t.Errorf("state changed: %s", got)
				}
			}},
		{name: "post name not string", method: "POST", path: "/api/users", body: `{"name":5}`, status: 422, ct: ctHTML},
		{name: "post duplicate id", method: "POST", path: "/api/users", body: `{"id":1,"name":"Eve"}`, status: 409, ct: ctPlain, wantBody: "duplicate id"},
		{name: "delete collection", method: "DELETE", path: "/api/users", status: 405, ct: ctHTML, allow: "GET, HEAD, POST"},

		{name: "put replaces keeping id", method: "PUT", path: "/api/users/2", body: `{"id":"2","name":"Bobby"}`, status: 200, ct: ctJSON,
			wantBody: `{"id":2,"name":"Bobby"}`},
		{name: "put cannot create", method: "PUT", path: "/api/users/7", body: `{"name":"Gus"}`, status: 404, ct: ctHTML,
			check: func(t *testing.T, api *API, _ answer) {
				if _, ok := api.Item("/api/users", "7"); ok {
					t.Error("PUT created a record on a collection without PutCreates")
				}
			}},
		{name: "put creates numeric", method: "PUT", path: "/gadgets/42", body: `{"name":"Gear"}`, status: 201, ct: ctJSON, wantBody: `{"id":42,"name":"Gear"}`},
		{name: "put creates string", method: "PUT", path: "/gadgets/c%20d", body: `{"name":"Cog"}`, status: 201, ct: ctJSON, wantBody: `{"id":"c d","name":"Cog"}`},
		{name: "put creates with body id type", method: "PUT", path: "/gadgets/7", body: `{"id":"7"}`, status: 201, ct: ctJSON, wantBody: `{"id":"7"}`},
		{name: "put not object", method: "PUT", path: "/api/users/1", body: `"x"`, status: 400, ct: ctPlain},
		{name: "put null name", method: "PUT", path: "/api/users/1", body: `{"name":null}`, status: 422, ct: ctHTML,
			check: func(t *testing.T, api *API, _ answer) {
				if got := users(api); got != seedUsers {
					t.Errorf("state changed: %s", got)
				}
			}},

		{name: "patch merges and removes null", method: "PATCH", path: "/api/users/10", body: `{"id":99,"role":null,"age":30}`, status: 200, ct: ctJSON,
			wantBody: `{"age":30,"id":10,"name":"Cy"}`,
			check: func(t *testing.T, api *API, _ answer) {
				if rec, _ := api.Item("/api/users", "10"); mustJSON(rec) != `{"age":30,"id":10,"name":"Cy"}` {
					t.Errorf("stored %v", rec)
				}
			}},
		{name: "patch missing", method: "PATCH", path: "/api/users/7", body: `{}`, status: 404, ct: ctHTML},
		{name: "patch not object", method: "PATCH", path: "/api/users/1", body: `null`, status: 400, ct: ctPlain},
		{name: "patch empty name", method: "PATCH", path: "/api/users/10", body: `{"name":"","age":1}`, status: 422, ct: ctHTML,
			check: func(t *testing.T, api *API, _ answer) {
				if got := users(api); got != seedUsers {
					t.Errorf("state changed: %s", got)
				}
			}},

		{name: "delete answers 200 {}", method: "DELETE", path: "/api/users/1", status: 200, ct: ctJSON, wantBody: `{}`,
			check: func(t *testing.T, api *API, _ answer) {
				if _, ok := api.Item("/api/users", "1"); ok {
					t.Error("record still there")
				}
			}},
		{name: "delete missing", method: "DELETE", path: "/api/users/7", status: 404, ct: ctHTML},
		{name: "post on item", method: "POST", path: "/api/users/1", body: `{}`, status: 405, ct: ctHTML, allow: "GET, HEAD, PUT, PATCH, DELETE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := start(t)
			a := do(t, tc.method, srv.URL+tc.path, tc.body)
			if a.status != tc.status {
				t.Errorf("status = %d, want %d (body %q)", a.status, tc.status, a.body)
			}
			if ct := a.header.Get("Content-Type"); ct != tc.ct {
				t.Errorf("Content-Type = %q, want %q", ct, tc.ct)
			}
			if tc.method != "HEAD" && a.header.Get("Content-Length") != fmt.Sprint(len(a.body)) {
				t.Errorf("Content-Length = %q, body has %d bytes", a.header.Get("Content-Length"), len(a.body))
			}
			if (tc.wantBody != "" || tc.method == "HEAD") && a.body != tc.wantBody {
				t.Errorf("body = %q, want %q", a.body, tc.wantBody)
			}
			if !strings.Contains(a.body, tc.contains) {
				t.Errorf("body = %q, want it to contain %q", a.body, tc.contains)
			}
			if got := a.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow = %q, want %q", got, tc.allow)
			}
			if tc.check != nil {
				tc.check(t, api, a)
			}
		})
	}
}

func TestNumericIDsAndLocation(t *testing.T) {
	api, srv := start(t)
	a := do(t, "POST", srv.URL+"/api/users", `{"name":"Dee"}`)
	if a.status != 201 || a.header.Get("Location") != srv.URL+"/api/users/1000" {
		t.Fatalf("POST: %d, Location %q", a.status, a.header.Get("Location"))
	}
	if id := decode(t, a.body).(map[string]any)["id"]; id != json.Number("1000") {
		t.Errorf("id = %#v, want a JSON number", id)
	}
	if a := do(t, "POST", srv.URL+"/api/users", `{"name":"Eve"}`); !strings.Contains(a.body, `"id":1001`) {
		t.Errorf("second POST = %s, want id 1001", a.body)
	}
	// An absolute Location escapes the id and leads back to the record.
	a = do(t, "POST", srv.URL+"/gadgets", `{"id":"x y/z","name":"Nut"}`)
	loc := a.header.Get("Location")
	if loc != srv.URL+"/gadgets/x%20y%2Fz" {
		t.Fatalf("Location = %q", loc)
	}
	if a := do(t, "GET", loc, ""); a.status != 200 || a.body != `{"id":"x y/z","name":"Nut"}` {
		t.Errorf("GET Location: %d %s", a.status, a.body)
	}
	for _, id := range []string{"1", "2", "10"} {
		if rec, _ := api.Item("/api/users", id); rec["id"] != json.Number(id) {
			t.Errorf("seed %s id = %#v, want json.Number", id, rec["id"])
		}
	}
	// Mixed ids: numbers numerically among themselves, otherwise lexically.
	mixed := New(Collection{Path: "/m", Seed: []map[string]any{{"id": "b"}, {"id": 10}, {"id": 9}, {"id": "a"}}})
	s := httptest.NewServer(mixed)
	defer s.Close()
	if a := do(t, "GET", s.URL+"/m", ""); a.body != `[{"id":9},{"id":10},{"id":"a"},{"id":"b"}]` {
		t.Errorf("order = %s", a.body)
	}
}

func TestNewPanicsOnMalformedDeclaration(t *testing.T) {
	for _, c := range []Collection{
		{Path: "api"}, {Path: "/api/"}, {Path: "/a//b"},
		{Path: "/a", Seed: []map[string]any{{"name": "no id"}}},
		{Path: "/a", Seed: []map[string]any{{"id": 1}, {"id": 1}}},
		{Path: "/a", Seed: []map[string]any{{"id": true}}},
		{Path: "/a", ETags: true, ContentETags: true},
		{Path: "/a/*/b", Seed: []map[string]any{{"id": 1}}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%+v) did not panic", c)
				}
			}()
			New(c)
		}()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Errorf("New did not panic on a pattern declared twice")
			}
		}()
		New(Collection{Path: "/a/*/b"}, Collection{Path: "/a/*/b"})
	}()
}

func TestFaults(t *testing.T) {
	t.Run("status without state change", func(t *testing.T) {
		api, srv := start(t)
		api.Inject(Fault{Method: "DELETE", Path: "/api/users/1", Status: 503, Body: "<h1>down</h1>", Times: 1})
		a := do(t, "DELETE", srv.URL+"/api/users/1", "")
		if a.status != 503 || a.header.Get("Content-Type") != ctHTML || a.body != "<h1>down</h1>" {
			t.Errorf("got %d %q %q", a.status, a.header.Get("Content-Type"), a.body)
		}
		if _, ok := api.Item("/api/users", "1"); !ok {
			t.Error("faulted DELETE changed the state")
		}
		if a := do(t, "DELETE", srv.URL+"/api/users/1", ""); a.status != 200 {
			t.Errorf("after Times ran out: %d, want 200", a.status)
		}
	})

	t.Run("after apply then fault answer", func(t *testing.T) {
		api, srv := start(t)
		api.Inject(Fault{Path: "/api/users", AfterApply: true, Status: 502, ContentType: "application/json", Body: `{"error":"bad gateway"}`})
		a := do(t, "POST", srv.URL+"/api/users", `{"name":"Dee"}`)
		if a.status != 502 || a.header.Get("Content-Type") != "application/json" {
			t.Errorf("got %d %q", a.status, a.header.Get("Content-Type"))
		}
		if _, ok := api.Item("/api/users", "1000"); !ok {
			t.Error("AfterApply POST did not create the record")
		}
	})

	t.Run("drop", func(t *testing.T) {
		for _, after := range []bool{false, true} {
			api, srv := start(t)
			api.Inject(Fault{Method: "POST", Path: "/api/users", Drop: true, AfterApply: after})
			_, err := send(fresh(5*time.Second), "POST", srv.URL+"/api/users", `{"name":"Dee"}`, nil)
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("AfterApply=%v: err = %v, want an EOF", after, err)
			}
			if _, ok := api.Item("/api/users", "1000"); ok != after {
				t.Errorf("AfterApply=%v: record created = %v", after, ok)
			}
		}
	})

	t.Run("hang ends on client timeout", func(t *testing.T) {
		api := NewRecording(fixture()...)
		defer api.Close()
		srv := httptest.NewServer(api)
		api.Inject(Fault{Path: "/api/users/1", Hang: true, AfterApply: true})
		_, err := send(fresh(100*time.Millisecond), "DELETE", srv.URL+"/api/users/1", "", nil)
		if err == nil {
			t.Fatal("hanging request got an answer")
		}
		if _, ok := api.Item("/api/users", "1"); ok {
			t.Error("AfterApply DELETE did not apply")
		}
		// srv.Close waits for running handlers, so it returning proves the
		// hanging handler ended without Close.
		closeWithin(t, srv.Close, 2*time.Second)
	})

	t.Run("hang released by Close", func(t *testing.T) {
		api, srv := start(t)
		api.Inject(Fault{Path: "/api/users/1", Hang: true})
		errc := make(chan error, 1)
		go func() {
			_, err := send(fresh(0), "GET", srv.URL+"/api/users/1", "", nil)
			errc <- err
		}()
		for len(api.Requests()) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		api.Close()
		api.Close() // idempotent
		select {
		case err := <-errc:
			if err == nil {
				t.Error("released hang sent an answer, want a dropped connection")
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not release the hanging request")
		}
		if _, err := send(fresh(2*time.Second), "GET", srv.URL+"/api/users/1", "", nil); err == nil {
			t.Error("hang after Close answered")
		}
	})

	t.Run("delay", func(t *testing.T) {
		api, srv := start(t)
		api.Inject(Fault{Method: "GET", Path: "/api/users/1", Delay: 150 * time.Millisecond})
		t0 := time.Now()
		a := do(t, "GET", srv.URL+"/api/users/1", "")
		if el := time.Since(t0); el < 150*time.Millisecond || a.status != 200 || a.body != `{"id":1,"name":"Ada"}` {
			t.Errorf("after %v: %d %s", el, a.status, a.body)
		}
		// A client that gives up during the delay frees the handler.
		api.Inject(Fault{Method: "GET", Path: "/api/users/2", Delay: time.Hour})
		if _, err := send(fresh(50*time.Millisecond), "GET", srv.URL+"/api/users/2", "", nil); err == nil {
			t.Error("want a client timeout")
		}
	})

	t.Run("until", func(t *testing.T) {
		api, srv := start(t)
		release := make(chan struct{})
		api.Inject(Fault{Method: "GET", Path: "/api/users/1", Until: release})
		answered := make(chan answer, 1)
		go func() {
			a, err := send(http.DefaultClient, "GET", srv.URL+"/api/users/1", "", nil)
			if err != nil {
				a.body = err.Error()
			}
			answered <- a
		}()
		eventually(t, "the held GET in flight", func() bool { return api.InFlight() == 1 })
		select {
		case a := <-answered:
			t.Fatalf("answered %d before the release", a.status)
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		if a := <-answered; a.status != 200 || a.body != `{"id":1,"name":"Ada"}` {
			t.Errorf("after the release: %d %s", a.status, a.body)
		}
	})

	t.Run("times and order", func(t *testing.T) {
		api, srv := start(t)
		api.Inject(Fault{Method: "GET", Path: "/api/users/1", Status: 500, Times: 2})
		api.Inject(Fault{Method: "GET", Path: "/api/users/1", Status: 502, Times: 1})
		api.Inject(Fault{Method: "PUT", Path: "/api/users/1", Status: 503})
		var got []int
		for range 4 {
			got = append(got, do(t, "GET", srv.URL+"/api/users/1", "").status)
		}
		if fmt.Sprint(got) != "[500 500 502 200]" {
			t.Errorf("statuses = %v", got)
		}
		if a := do(t, "PUT", srv.URL+"/api/users/1", `{}`); a.status != 503 {
			t.Errorf("PUT = %d, want 503 every time", a.status)
		}
		api.ClearFaults()
		if a := do(t, "PUT", srv.URL+"/api/users/1", `{}`); a.status != 200 {
			t.Errorf("PUT after ClearFaults = %d", a.status)
		}
	})
}

func closeWithin(t *testing.T, f func(), d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatal("handler still running")
	}
}

func TestRequestLog(t *testing.T) {
	api, srv := start(t)
	api.Inject(Fault{Method: "PATCH", Path: "/gadgets/a%20b", Status: 500})
	hdr := http.Header{"X-Trace": {"t1"}}
	if _, err := send(http.DefaultClient, "PATCH", srv.URL+"/gadgets/a%20b?dry=1&x=%20", `{"name":"N"}`, hdr); err != nil {
		t.Fatal(err)
	}
	do(t, "GET", srv.URL+"/api/users", "")
	log := api.Requests()
	if len(log) != 2 {
		t.Fatalf("log has %d entries, want 2", len(log))
	}
	r := log[0]
	if r.Method != "PATCH" || r.Path != "/gadgets/a%20b" || r.RawQuery != "dry=1&x=%20" ||
		r.Header.Get("X-Trace") != "t1" || !bytes.Equal(r.Body, []byte(`{"name":"N"}`)) {
		t.Errorf("faulted request logged as %+v", r)
	}
	if log[1].Method != "GET" || log[1].Path != "/api/users" || len(log[1].Body) != 0 {
		t.Errorf("second entry %+v", log[1])
	}
	log[0].Header.Set("X-Trace", "changed") // copies must not alias the log
	if api.Requests()[0].Header.Get("X-Trace") != "t1" {
		t.Error("Requests returned an aliased header")
	}
	api.ResetLog()
	if n := len(api.Requests()); n != 0 {
		t.Errorf("after ResetLog: %d entries", n)
	}
}

func TestConcurrentClients(t *testing.T) {
	api, srv := start(t)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("g%d", i)
			steps := []struct {
				method, path, body string
				status             int
			}{
				{"POST", "/gadgets", `{"id":"` + id + `","name":"x"}`, 201},
				{"PATCH", "/gadgets/" + id, `{"n":` + fmt.Sprint(i) + `}`, 200},
				{"GET", "/gadgets", "", 200},
				{"DELETE", "/gadgets/" + id, "", 200},
			}
			for _, s := range steps {
				a, err := send(http.DefaultClient, s.method, srv.URL+s.path, s.body, nil)
				if err != nil || a.status != s.status {
					t.Errorf("%s %s: %v %d", s.method, s.path, err, a.status)
				}
				api.Items("/gadgets") // readers race with writers
				api.Requests()
			}
		}()
	}
	wg.Wait()
	if items := api.Items("/gadgets"); len(items) != 1 {
		t.Errorf("%d gadgets left, want only the seed", len(items))
	}
	if got := len(api.Requests()); got != 4*n {
		t.Errorf("%d requests logged, want %d", got, 4*n)
	}
}

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

func TestETagConditions(t *testing.T) {
	// In the header columns "current" stands for the target's ETag just
	// before the request.
	tests := []struct {
		name, method, path, body string
		ifMatch, ifNoneMatch     string
		status                   int
		changed                  bool
	}{
		{"put if-match current", "PUT", "/api/users/1", `{"name":"A"}`, "current", "", 200, true},
		{"put if-match in a list", "PUT", "/api/users/1", `{"name":"A"}`, `"v999", current`, "", 200, true},
		{"put if-match star", "PUT", "/api/users/1", `{"name":"A"}`, "*", "", 200, true},
		{"put if-match stale", "PUT", "/api/users/1", `{"name":"A"}`, `"v999"`, "", 412, false},
		{"put if-match weak tag never matches", "PUT", "/api/users/1", `{"name":"A"}`, "W/current", "", 412, false},
		{"put if-match before body checks", "PUT", "/api/users/1", `not json`, `"v999"`, "", 412, false},
		{"put blank if-match is no condition", "PUT", "/api/users/1", `{"name":"A"}`, " ", "", 200, true},
		{"put if-match star on missing", "PUT", "/gadgets/new", `{"name":"N"}`, "*", "", 412, false},
		{"put if-match on missing, no PutCreates", "PUT", "/api/users/7", `{"name":"N"}`, `"v1"`, "", 412, false},
		{"put if-none-match star on existing", "PUT", "/gadgets/a%20b", `{"name":"N"}`, "", "*", 412, false},
		{"put if-none-match weak current", "PUT", "/gadgets/a%20b", `{"name":"N"}`, "", "W/current", 412, false},
		{"put if-none-match other tag", "PUT", "/gadgets/a%20b", `{"name":"N"}`, "", `"v999"`, 200, true},
		{"put if-none-match star creates", "PUT", "/gadgets/new", `{"name":"N"}`, "", "*", 201, true},
		{"patch if-match current", "PATCH", "/api/users/2", `{"age":3}`, "current", "", 200, true},
		{"patch if-match stale", "PATCH", "/api/users/2", `{"age":3}`, `"v1"`, "", 412, false},
		{"patch if-match star on missing", "PATCH", "/api/users/7", `{"age":3}`, "*", "", 412, false},
		{"delete if-match current", "DELETE", "/api/users/10", "", "current", "", 200, true},
		{"delete if-match star", "DELETE", "/api/users/10", "", "*", "", 200, true},
		{"delete if-match stale", "DELETE", "/api/users/10", "", `"v1"`, "", 412, false},
		{"delete if-match star on missing", "DELETE", "/api/users/7", "", "*", "", 412, false},
		{"post if-none-match star, id exists", "POST", "/api/users", `{"id":1,"name":"X"}`, "", "*", 412, false},
		{"post if-none-match star, new id", "POST", "/api/users", `{"id":5,"name":"X"}`, "", "*", 201, true},
		{"post if-none-match star, no id", "POST", "/api/users", `{"name":"X"}`, "", "*", 201, true},
		{"post duplicate id without condition", "POST", "/api/users", `{"id":1,"name":"X"}`, "", "", 409, false},
		{"get ignores if-match", "GET", "/api/users/1", "", `"v999"`, "", 200, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) { c.ETags = true })...)
			current := do(t, "GET", srv.URL+tc.path, "").header.Get("ETag")
			hdr := http.Header{}
			if tc.ifMatch != "" {
				hdr.Set("If-Match", strings.ReplaceAll(tc.ifMatch, "current", current))
			}
			if tc.ifNoneMatch != "" {
				hdr.Set("If-None-Match", strings.ReplaceAll(tc.ifNoneMatch, "current", current))
			}
			before := state(api)
			a := doH(t, tc.method, srv.URL+tc.path, tc.body, hdr)
			if a.status != tc.status {
				t.Errorf("status = %d, want %d (body %q)", a.status, tc.status, a.body)
			}
			if a.status == 412 && (a.header.Get("Content-Type") != ctHTML || !strings.Contains(a.body, "412 Precondition Failed")) {
				t.Errorf("412 answer: %q %q, want an HTML page", a.header.Get("Content-Type"), a.body)
			}
			if changed := state(api) != before; changed != tc.changed {
				t.Errorf("state changed = %v, want %v", changed, tc.changed)
			}
		})
	}
}

func TestETagValues(t *testing.T) {
	_, srv := startWith(t, with(func(c *Collection) { c.ETags = true })...)
	etag := func(a answer) string {
		t.Helper()
		tag := a.header.Get("ETag")
		if !strings.HasPrefix(tag, `"v`) || !strings.HasSuffix(tag, `"`) || len(tag) < 4 {
			t.Fatalf("ETag = %q (status %d), want a strong \"v<n>\"", tag, a.status)
		}
		return tag
	}
	u1 := srv.URL + "/api/users/1"
	seen := map[string]string{}
	distinct := func(what, tag string) {
		t.Helper()
		if prev, dup := seen[tag]; dup {
			t.Errorf("%s has ETag %s, already used by %s", what, tag, prev)
		}
		seen[tag] = what
	}

	got := etag(do(t, "GET", u1, ""))
	if head := etag(do(t, "HEAD", u1, "")); head != got {
		t.Errorf("HEAD ETag %s, GET %s", head, got)
	}
	if got != etag(do(t, "GET", u1, "")) {
		t.Error("ETag changed without a write")
	}
	distinct("seed", got)
	distinct("other seed", etag(do(t, "GET", srv.URL+"/api/users/2", "")))

	steps := []struct{ name, method, path, body string }{
		{"PUT", "PUT", "/api/users/1", `{"name":"Ada"}`}, // same content, still a write
		{"PATCH", "PATCH", "/api/users/1", `{"age":36}`},
		{"POST", "POST", "/api/users", `{"id":1000,"name":"Dee"}`},
		{"PUT create", "PUT", "/gadgets/9", `{"name":"Cog"}`},
	}
	for _, s := range steps {
		a := do(t, s.method, srv.URL+s.path, s.body)
		tag := etag(a)
		distinct(s.name, tag)
		read := s.path
		if loc := a.header.Get("Location"); loc != "" {
			read = strings.TrimPrefix(loc, srv.URL)
		}
		if now := etag(do(t, "GET", srv.URL+read, "")); now != tag {
			t.Errorf("%s answered ETag %s, a GET then %s", s.name, tag, now)
		}
	}

	// A deleted and re-created record does not get its old tag back.
	old := etag(do(t, "GET", srv.URL+"/api/users/2", ""))
	if a := do(t, "DELETE", srv.URL+"/api/users/2", ""); a.header.Get("ETag") != "" {
		t.Errorf("DELETE answered ETag %q", a.header.Get("ETag"))
	}
	again := etag(do(t, "POST", srv.URL+"/api/users", `{"id":2,"name":"Bob"}`))
	if again == old {
		t.Errorf("re-created record has its old ETag %s", old)
	}
	if a := do(t, "GET", srv.URL+"/api/users", ""); a.header.Get("ETag") != "" {
		t.Errorf("a list answered ETag %q", a.header.Get("ETag"))
	}
}

func TestNoETagsIgnoresConditions(t *testing.T) {
	api, srv := start(t)
	if a := do(t, "GET", srv.URL+"/api/users/1", ""); a.header.Get("ETag") != "" {
		t.Errorf("ETag %q without ETags", a.header.Get("ETag"))
	}
	for _, s := range []struct {
		method, path, body, header string
		status                     int
	}{
		{"PUT", "/api/users/1", `{"name":"A"}`, "If-Match", 200},
		{"PATCH", "/api/users/1", `{"age":1}`, "If-Match", 200},
		{"PUT", "/gadgets/a%20b", `{"name":"A"}`, "If-None-Match", 200},
		{"POST", "/api/users", `{"id":2,"name":"B"}`, "If-None-Match", 409},
		{"DELETE", "/api/users/1", "", "If-Match", 200},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, http.Header{s.header: {`"nope"`, "*"}})
		if a.status != s.status {
			t.Errorf("%s %s with %s: %d, want %d", s.method, s.path, s.header, a.status, s.status)
		}
	}
	if _, ok := api.Item("/api/users", "1"); ok {
		t.Error("conditional DELETE was not applied")
	}
}

func TestIdempotencyKeys(t *testing.T) {
	keyed := with(func(c *Collection) { c.HonorKeys = true })
	type req struct{ method, path, body, key string }
	first := req{"POST", "/api/users", `{"name":"Dee"}`, "k1"}
	tests := []struct {
		name     string
		cols     []Collection
		second   req
		status   int
		replayed bool
		created  []string // user ids beyond the seeds after both requests
		writes   Writes
	}{
		{"same key and body replays", keyed, first, 201, true, []string{"1000"}, Writes{Applied: 1, Replayed: 1}},
		{"same key, other body", keyed, req{"POST", "/api/users", `{"name":"Eve"}`, "k1"}, 422, false, []string{"1000"}, Writes{Applied: 1}},
		{"same key, same JSON spelled otherwise", keyed, req{"POST", "/api/users", `{"name": "Dee"}`, "k1"}, 422, false, []string{"1000"}, Writes{Applied: 1}},
		{"other key", keyed, req{"POST", "/api/users", `{"name":"Dee"}`, "k2"}, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
		{"no key", keyed, req{"POST", "/api/users", `{"name":"Dee"}`, ""}, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
		{"same key, other query", keyed, req{"POST", "/api/users?src=x", `{"name":"Dee"}`, "k1"}, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
		{"same key, other path", keyed, req{"PUT", "/api/users/2", `{"name":"Dee"}`, "k1"}, 200, false, []string{"1000"}, Writes{Applied: 2}},
		{"keys ignored without HonorKeys", fixture(), first, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := startWith(t, tc.cols...)
			var answers [2]answer
			for i, r := range []req{first, tc.second} {
				hdr := http.Header{}
				if r.key != "" {
					hdr.Set("Idempotency-Key", r.key)
				}
				answers[i] = doH(t, r.method, srv.URL+r.path, r.body, hdr)
			}
			a := answers[1]
			if a.status != tc.status {
				t.Errorf("second answer %d %q, want %d", a.status, a.body, tc.status)
			}
			if replayed := a.header.Get("Idempotent-Replayed") == "true"; replayed != tc.replayed {
				t.Errorf("Idempotent-Replayed = %q, want replayed %v", a.header.Get("Idempotent-Replayed"), tc.replayed)
			}
			if tc.replayed && (a.body != answers[0].body || a.header.Get("Location") != answers[0].header.Get("Location") ||
				a.header.Get("Content-Type") != answers[0].header.Get("Content-Type")) {
				t.Errorf("replay %q %v differs from the first answer %q %v", a.body, a.header, answers[0].body, answers[0].header)
			}
			var created []string
			for id := range api.Items("/api/users") {
				if len(id) == 4 {
					created = append(created, id)
				}
			}
			slices.Sort(created)
			if !slices.Equal(created, tc.created) {
				t.Errorf("created %v, want %v", created, tc.created)
			}
			if got := api.Writes(); got != tc.writes {
				t.Errorf("Writes() = %+v, want %+v", got, tc.writes)
			}
		})
	}
}

func TestIdempotencyKeyReplaysWhatever(t *testing.T) {
	api, srv := startWith(t, with(func(c *Collection) { c.HonorKeys = true })...)
	key := func(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }
	// A DELETE resent with its key is answered as the first, not 404.
	for range 2 {
		if a := doH(t, "DELETE", srv.URL+"/api/users/1", "", key("d")); a.status != 200 || a.body != "{}" {
			t.Errorf("DELETE: %d %q", a.status, a.body)
		}
	}
	// An error answer is stored and replayed too, even once the request
	// would succeed.
	doH(t, "PUT", srv.URL+"/api/users/1", `{"name":"Ada"}`, key("p"))
	do(t, "POST", srv.URL+"/api/users", `{"id":1,"name":"Ada"}`)
	if a := doH(t, "PUT", srv.URL+"/api/users/1", `{"name":"Ada"}`, key("p")); a.status != 404 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("resent PUT: %d %q, want the stored 404", a.status, a.header.Get("Idempotent-Replayed"))
	}
	// Reads ignore the header.
	for range 2 {
		if a := doH(t, "GET", srv.URL+"/api/users/1", "", key("g")); a.status != 200 || a.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("GET: %d %v", a.status, a.header)
		}
	}
	if got, want := api.Writes(), (Writes{Applied: 2, Replayed: 2}); got != want {
		t.Errorf("Writes() = %+v, want %+v", got, want)
	}
}

// A write applied whose answer was lost, resent with its key, gets the
// first answer back and is applied once.
func TestIdempotencyKeyAfterLostAnswer(t *testing.T) {
	tests := []struct {
		name    string
		fault   Fault
		timeout time.Duration // of the first attempt's client
		applied bool          // whether the first attempt reached the state
	}{
		{"drop after apply", Fault{Drop: true, AfterApply: true}, 5 * time.Second, true},
		{"hang after apply", Fault{Hang: true, AfterApply: true}, 100 * time.Millisecond, true},
		{"error page after apply", Fault{Status: 502, AfterApply: true}, 5 * time.Second, true},
		{"error page before apply", Fault{Status: 503}, 5 * time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) { c.HonorKeys = true })...)
			f := tc.fault
			f.Method, f.Path, f.Times = "POST", "/api/users", 1
			api.Inject(f)
			hdr := http.Header{"Idempotency-Key": {"once"}}
			first, err := send(fresh(tc.timeout), "POST", srv.URL+"/api/users", `{"name":"Dee"}`, hdr)
			if err == nil && first.status == 201 {
				t.Fatalf("first attempt answered %d", first.status)
			}
			a, err := send(fresh(5*time.Second), "POST", srv.URL+"/api/users", `{"name":"Dee"}`, hdr)
			if err != nil || a.status != 201 || a.body != `{"id":1000,"name":"Dee"}` || a.header.Get("Location") != srv.URL+"/api/users/1000" {
				t.Fatalf("resend: %v %d %q %v", err, a.status, a.body, a.header)
			}
			if replayed := a.header.Get("Idempotent-Replayed") == "true"; replayed != tc.applied {
				t.Errorf("replayed = %v, want %v", replayed, tc.applied)
			}
			want := Writes{Applied: 1}
			if tc.applied {
				want.Replayed = 1
			}
			if got := api.Writes(); got != want {
				t.Errorf("Writes() = %+v, want %+v", got, want)
			}
			if n := len(api.Items("/api/users")); n != 4 {
				t.Errorf("%d users, want the 3 seeds and one created", n)
			}
			if n := len(api.Requests()); n != 2 {
				t.Errorf("%d requests logged, want 2", n)
			}
		})
	}
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

func TestTenants(t *testing.T) {
	api, srv := startWith(t, with(func(c *Collection) { c.Tenants = true })...)
	run(t, srv, []step{
		{"GET", "/api/users?tenant=a", "", 200, `[]`},
		{"GET", "/api/users/1?tenant=a", "", 404, ""},
		{"POST", "/api/users?tenant=a", `{"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"POST", "/api/users?tenant=a", `{"id":1,"name":"A1"}`, 201, ""},
		{"POST", "/api/users", `{"name":"D"}`, 201, `{"id":1000,"name":"D"}`}, // numbering is per tenant
		{"POST", "/api/users?tenant=b&x=1", `{"name":"B"}`, 201, `{"id":1000,"name":"B"}`},
		{"GET", "/api/users?tenant=a", "", 200, `[{"id":1,"name":"A1"},{"id":1000,"name":"A"}]`},
		{"GET", "/api/users?limit=1&tenant=a", "", 200, `[{"id":1,"name":"A1"}]`},
		{"GET", "/api/users/1", "", 200, `{"id":1,"name":"Ada"}`},
		{"GET", "/api/users/1?tenant=", "", 200, `{"id":1,"name":"Ada"}`}, // empty is the default tenant
		{"PUT", "/api/users/1?tenant=a", `{"name":"A2"}`, 200, `{"id":1,"name":"A2"}`},
		{"PATCH", "/api/users/1000?tenant=a", `{"age":1}`, 200, `{"age":1,"id":1000,"name":"A"}`},
		{"DELETE", "/api/users/1000?tenant=b", "", 200, `{}`},
		{"DELETE", "/api/users/2?tenant=a", "", 404, ""},
		{"PUT", "/gadgets/a%20b?tenant=a", `{"name":"G"}`, 201, `{"id":"a b","name":"G"}`},
	})
	for _, c := range []struct {
		tenant, id, want string // want "" for absent
	}{
		{"", "1", `{"id":1,"name":"Ada"}`},
		{"", "1000", `{"id":1000,"name":"D"}`},
		{"a", "1", `{"id":1,"name":"A2"}`},
		{"a", "1000", `{"age":1,"id":1000,"name":"A"}`},
		{"a", "2", ""},
		{"b", "1000", ""},
		{"nobody", "1", ""},
	} {
		rec, ok := api.TenantItem("/api/users", c.tenant, c.id)
		if got := mustJSON(rec); ok != (c.want != "") || (ok && got != c.want) {
			t.Errorf("TenantItem(%q, %q) = %s, %v; want %s", c.tenant, c.id, got, ok, c.want)
		}
	}
	if got := api.TenantItems("/api/users", "a"); len(got) != 2 {
		t.Errorf("TenantItems a = %v", got)
	}
	if got, want := mustJSON(api.Items("/api/users")), mustJSON(api.TenantItems("/api/users", "")); got != want || len(api.Items("/api/users")) != 4 {
		t.Errorf("Items = %s, TenantItems default = %s", got, want)
	}
	if got := api.TenantItems("/api/users", "nobody"); got == nil || len(got) != 0 {
		t.Errorf("TenantItems of an unused tenant = %#v, want empty", got)
	}
	if got := api.TenantItems("/nope", ""); got != nil {
		t.Errorf("TenantItems of an undeclared collection = %#v, want nil", got)
	}
	if a := do(t, "POST", srv.URL+"/gadgets?tenant=a", `{"id":"z","name":"Z"}`); a.header.Get("Location") != srv.URL+"/gadgets/z" {
		t.Errorf("Location = %q, want it without the query", a.header.Get("Location"))
	}
}

func TestTenantParameterIgnoredWithoutTenants(t *testing.T) {
	api, srv := start(t)
	run(t, srv, []step{
		{"POST", "/api/users?tenant=a", `{"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"GET", "/api/users/1?tenant=a", "", 200, `{"id":1,"name":"Ada"}`},
	})
	if _, ok := api.Item("/api/users", "1000"); !ok {
		t.Error("the POST did not land in the only tenant")
	}
	if n := len(api.TenantItems("/api/users", "a")); n != 0 {
		t.Errorf("tenant a has %d records", n)
	}
}

func TestETagsTenantsKeysComposed(t *testing.T) {
	api, srv := startWith(t, with(func(c *Collection) { c.ETags, c.Tenants, c.HonorKeys = true, true, true })...)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	created := doH(t, "POST", srv.URL+"/api/users?tenant=a", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*", "Idempotency-Key", "k"))
	ta, td := created.header.Get("ETag"), do(t, "GET", srv.URL+"/api/users/1", "").header.Get("ETag")
	if created.status != 201 || ta == "" || ta == td {
		t.Fatalf("create in tenant a: %d, ETag %q (default tenant's %q)", created.status, ta, td)
	}
	for _, s := range []struct {
		name, method, path, body string
		hdr                      http.Header
		status                   int
	}{
		{"other tenant's tag fails", "PUT", "/api/users/1?tenant=a", `{"name":"X"}`, hdr("If-Match", td), 412},
		{"and the other way round", "PATCH", "/api/users/1", `{"name":"X"}`, hdr("If-Match", ta), 412},
		{"missing in tenant b", "DELETE", "/api/users/1?tenant=b", "", hdr("If-Match", "*"), 412},
		{"absent in tenant b", "POST", "/api/users?tenant=b", `{"id":1,"name":"B1"}`, hdr("If-None-Match", "*"), 201},
		{"present in tenant a", "POST", "/api/users?tenant=a", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*"), 412},
		{"key replayed in its tenant", "POST", "/api/users?tenant=a", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*", "Idempotency-Key", "k"), 201},
		{"key is new in another tenant", "POST", "/api/users?tenant=c", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*", "Idempotency-Key", "k"), 201},
		{"own tag holds", "PATCH", "/api/users/1?tenant=a", `{"age":2}`, hdr("If-Match", ta), 200},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, s.hdr)
		if a.status != s.status {
			t.Errorf("%s: %d %q, want %d", s.name, a.status, a.body, s.status)
		}
		if s.name == "key replayed in its tenant" && (a.header.Get("ETag") != ta || a.header.Get("Idempotent-Replayed") != "true") {
			t.Errorf("%s: ETag %q replayed %q, want the first answer's %q", s.name, a.header.Get("ETag"), a.header.Get("Idempotent-Replayed"), ta)
		}
	}
	for tenant, want := range map[string]string{"": `{"id":1,"name":"Ada"}`, "a": `{"age":2,"id":1,"name":"A1"}`, "b": `{"id":1,"name":"B1"}`, "c": `{"id":1,"name":"A1"}`} {
		if rec, _ := api.TenantItem("/api/users", tenant, "1"); mustJSON(rec) != want {
			t.Errorf("tenant %q: %s, want %s", tenant, mustJSON(rec), want)
		}
	}
	if got, want := api.Writes(), (Writes{Applied: 4, Replayed: 1}); got != want {
		t.Errorf("Writes() = %+v, want %+v", got, want)
	}
}

func TestAPIKey(t *testing.T) {
	cols := fixture()
	cols[0].APIKey = "s3cret" // /api/users only
	cols[0].HonorKeys = true
	api, srv := startWith(t, cols...)
	tests := []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/api/users", "", 401},
		{"GET", "/api/users/", "", 401},
		{"GET", "/api/users?api_key=", "", 401},
		{"GET", "/api/users?api_key=wrong", "", 401},
		{"GET", "/api/users?API_KEY=s3cret", "", 401},
		{"HEAD", "/api/users/1", "", 401},
		{"POST", "/api/users", `{"name":"X"}`, 401},
		{"PUT", "/api/users/1?key=s3cret", `{"name":"X"}`, 401},
		{"PATCH", "/api/users/1", `{"name":"X"}`, 401},
		{"DELETE", "/api/users/1?api_key=s3cret2", "", 401},
		{"DELETE", "/api/users", "", 401}, // before the 405
		{"GET", "/api/users?api_key=s3cret", "", 200},
		{"GET", "/api/users/1?limit=1&api_key=s3cret", "", 200},
		{"GET", "/gadgets", "", 200},           // another collection, no key
		{"GET", "/api/users/1/posts", "", 200}, // a nested path is its own collection
		{"GET", "/nope", "", 404},
	}
	for _, tc := range tests {
		a := doH(t, tc.method, srv.URL+tc.path, tc.body, http.Header{"Idempotency-Key": {"k"}})
		if a.status != tc.status {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, a.status, tc.status)
		}
		if tc.status != 401 {
			continue
		}
		if a.header.Get("WWW-Authenticate") != `ApiKey realm="legacy"` || a.header.Get("Content-Type") != ctHTML ||
			(tc.method != "HEAD" && !strings.Contains(a.body, "<title>401 Unauthorized</title>")) {
			t.Errorf("%s %s: 401 with %v %q", tc.method, tc.path, a.header, a.body)
		}
	}
	if got := state(api); got != state(New(fixture()...)) {
		t.Errorf("refused requests changed the state: %s", got)
	}
	if got := api.Writes(); got != (Writes{}) {
		t.Errorf("Writes() = %+v after refused writes", got)
	}
	if a := do(t, "DELETE", srv.URL+"/api/users/1?api_key=s3cret", ""); a.status != 200 {
		t.Errorf("DELETE with the key: %d", a.status)
	}
}

func TestCreateAnswer(t *testing.T) {
	tests := []struct {
		answer    CreateAnswer
		status    int
		locations []string // of the two POSTs, after the server's URL
		bodies    []string
		ct        string
	}{
		{AnswerCreated, 201, []string{"/api/users/1000", "/api/users/5"}, []string{`{"id":1000,"name":"A"}`, `{"id":5,"name":"B"}`}, ctJSON},
		{AnswerAccepted, 202, []string{"/jobs/1", "/jobs/2"}, []string{`{"id":1,"status":"queued"}`, `{"id":2,"status":"queued"}`}, ctJSON},
		{AnswerSeeOther, 303, []string{"/api/users/1000", "/api/users/5"}, []string{"", ""}, ""},
		{AnswerBare, 201, []string{"", ""}, []string{"", ""}, ""},
	}
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.status, tc.bodies[0]), func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) { c.CreateAnswer, c.ETags = tc.answer, true })...)
			for i, body := range []string{`{"name":"A"}`, `{"id":5,"name":"B"}`} {
				a, err := send(noRedirects, "POST", srv.URL+"/api/users", body, nil)
				if err != nil {
					t.Fatal(err)
				}
				loc := tc.locations[i]
				if loc != "" {
					loc = srv.URL + loc
				}
				if a.status != tc.status || a.header.Get("Location") != loc || a.body != tc.bodies[i] || a.header.Get("Content-Type") != tc.ct {
					t.Errorf("POST %d: %d Location %q %q %q, want %d %q %q %q", i, a.status, a.header.Get("Location"), a.header.Get("Content-Type"), a.body,
						tc.status, loc, tc.ct, tc.bodies[i])
				}
				if hasTag := a.header.Get("ETag") != ""; hasTag != (tc.answer == AnswerCreated) {
					t.Errorf("POST %d: ETag %q", i, a.header.Get("ETag"))
				}
			}
			for _, id := range []string{"1000", "5"} {
				if _, ok := api.Item("/api/users", id); !ok {
					t.Errorf("record %s not created", id)
				}
			}
		})
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("New accepted an unknown CreateAnswer")
			}
		}()
		New(Collection{Path: "/x", CreateAnswer: AnswerBare + 1})
	}()
}

func TestAssignIDs(t *testing.T) {
	api, srv := startWith(t, with(func(c *Collection) { c.AssignIDs, c.ETags = true, true })...)
	run(t, srv, []step{
		{"POST", "/api/users", `{"id":5,"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"POST", "/api/users", `{"id":1,"name":"B"}`, 201, `{"id":1001,"name":"B"}`}, // not a duplicate
		{"POST", "/api/users", `{"id":true,"name":"C"}`, 201, `{"id":1002,"name":"C"}`},
		{"POST", "/gadgets", `{"id":"x","name":"D"}`, 201, `{"id":1000,"name":"D"}`},
	})
	if a := doH(t, "POST", srv.URL+"/api/users", `{"id":2,"name":"E"}`, http.Header{"If-None-Match": {"*"}}); a.status != 201 ||
		a.header.Get("Location") != srv.URL+"/api/users/1003" {
		t.Errorf("POST naming an existing id with If-None-Match: *: %d %q", a.status, a.header.Get("Location"))
	}
	if rec, _ := api.Item("/api/users", "1"); rec["name"] != "Ada" {
		t.Errorf("user 1 = %v", rec)
	}
	if _, ok := api.Item("/api/users", "5"); ok {
		t.Error("the client's id was used")
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

func TestWriteDelay(t *testing.T) {
	t.Run("writes wait, reads do not", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.WriteDelay = time.Hour })...)
		put := background("PUT", srv.URL+"/api/users/1", `{"name":"Ann"}`, nil)
		eventually(t, "the PUT is in flight", func() bool { return api.InFlight() == 1 })
		// Served meanwhile, and the write is not applied yet.
		if a := do(t, "GET", srv.URL+"/api/users/1", ""); a.status != 200 || a.body != `{"id":1,"name":"Ada"}` {
			t.Errorf("GET during the write: %d %s", a.status, a.body)
		}
		api.Close() // cuts the wait short; the write is then applied and answered
		if a := <-put; a.status != 200 || a.body != `{"id":1,"name":"Ann"}` {
			t.Errorf("PUT after Close: %d %s", a.status, a.body)
		}
		if rec, _ := api.Item("/api/users", "1"); rec["name"] != "Ann" {
			t.Errorf("record = %v", rec)
		}
	})

	t.Run("takes at least the delay", func(t *testing.T) {
		_, srv := startWith(t, with(func(c *Collection) { c.WriteDelay = 100 * time.Millisecond })...)
		for _, s := range []step{
			{"POST", "/api/users", `{"name":"D"}`, 201, ""},
			{"PATCH", "/api/users/1", `{"age":1}`, 200, ""},
			{"DELETE", "/api/users/7", "", 404, ""}, // refused, but only after the wait
		} {
			t0 := time.Now()
			run(t, srv, []step{s})
			if el := time.Since(t0); el < 100*time.Millisecond {
				t.Errorf("%s answered after %v", s.method, el)
			}
		}
	})

	t.Run("applied when the client has gone", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.WriteDelay = 500 * time.Millisecond })...)
		if _, err := send(fresh(20*time.Millisecond), "DELETE", srv.URL+"/api/users/1", "", nil); err == nil {
			t.Fatal("want a client timeout")
		}
		if _, ok := api.Item("/api/users", "1"); !ok {
			t.Fatal("applied before the delay")
		}
		eventually(t, "the DELETE is applied", func() bool { _, ok := api.Item("/api/users", "1"); return !ok })
		eventually(t, "the handler returned", func() bool { return api.InFlight() == 0 })
		if got := api.Writes(); got != (Writes{Applied: 1}) {
			t.Errorf("Writes() = %+v", got)
		}
	})

	t.Run("a key resent during the wait", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.WriteDelay, c.HonorKeys = time.Hour, true })...)
		key := http.Header{"Idempotency-Key": {"k"}}
		first := background("POST", srv.URL+"/api/users", `{"name":"D"}`, key)
		eventually(t, "the POST claimed its key", func() bool {
			api.mu.Lock()
			defer api.mu.Unlock()
			return len(api.keys) == 1
		})
		a := doH(t, "POST", srv.URL+"/api/users", `{"name":"D"}`, key)
		if a.status != 409 || a.header.Get("Retry-After") == "" || a.header.Get("Content-Type") != ctHTML {
			t.Errorf("resend during the wait: %d %v", a.status, a.header)
		}
		if a := doH(t, "POST", srv.URL+"/api/users", `{"name":"E"}`, key); a.status != 422 {
			t.Errorf("other body during the wait: %d", a.status)
		}
		api.Close()
		if a := <-first; a.status != 201 || a.body != `{"id":1000,"name":"D"}` {
			t.Errorf("first: %d %s", a.status, a.body)
		}
		if a := doH(t, "POST", srv.URL+"/api/users", `{"name":"D"}`, key); a.status != 201 || a.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("resend after: %d %v", a.status, a.header)
		}
		if got := api.Writes(); got != (Writes{Applied: 1, Replayed: 1}) {
			t.Errorf("Writes() = %+v", got)
		}
	})

	func() {
		defer func() {
			if recover() == nil {
				t.Error("New accepted a negative WriteDelay")
			}
		}()
		New(Collection{Path: "/x", WriteDelay: -time.Second})
	}()
}

func TestLoadCounters(t *testing.T) {
	api, srv := start(t)
	api.Inject(Fault{Method: "GET", Path: "/api/users/1", Hang: true})
	var answers []<-chan answer
	for n := 1; n <= 3; n++ {
		answers = append(answers, background("GET", srv.URL+"/api/users/1", "", nil))
		eventually(t, fmt.Sprint(n, " requests in flight"), func() bool { return api.InFlight() == n })
	}
	if got := api.PeakInFlight(); got != 3 {
		t.Errorf("PeakInFlight = %d, want 3", got)
	}
	api.ResetPeak()
	if got := api.PeakInFlight(); got != 3 {
		t.Errorf("PeakInFlight right after ResetPeak = %d, want the 3 in flight", got)
	}
	api.Close()
	for _, c := range answers {
		<-c
	}
	eventually(t, "none in flight", func() bool { return api.InFlight() == 0 })
	api.ResetPeak()
	if got := api.PeakInFlight(); got != 0 {
		t.Errorf("PeakInFlight after ResetPeak = %d, want 0", got)
	}
	do(t, "GET", srv.URL+"/api/users/2", "")
	if got := api.PeakInFlight(); got != 1 {
		t.Errorf("PeakInFlight after one request = %d, want 1", got)
	}
}

func TestCountConns(t *testing.T) {
	api := New(fixture()...)
	srv := httptest.NewUnstartedServer(api)
	ln, conns := CountConns(srv.Listener)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(api.Close)

	reuse := srv.Client() // keeps its connection alive between requests
	for range 5 {
		if a, err := send(reuse, "GET", srv.URL+"/api/users", "", nil); err != nil || a.status != 200 {
			t.Fatalf("GET: %v %d", err, a.status)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("%d connections for 5 requests on one kept-alive connection, want 1", got)
	}
	for range 2 {
		if _, err := send(fresh(5*time.Second), "GET", srv.URL+"/api/users", "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("%d connections, want 3", got)
	}
}

// AppliedWrites lists the writes carried out in the order they took
// effect, which is not their arrival order when one is held; reads and
// refused writes are not in it, and ResetLog forgets it.
func TestAppliedWrites(t *testing.T) {
	api, srv := start(t)
	release := make(chan struct{})
	api.Inject(Fault{Method: "PATCH", Path: "/api/users/1", Until: release, Times: 1})
	held := make(chan answer, 1)
	go func() {
		a, err := send(http.DefaultClient, "PATCH", srv.URL+"/api/users/1", `{"name":"first"}`, nil)
		if err != nil {
			a.body = err.Error()
		}
		held <- a
	}()
	for len(api.Requests()) == 0 {
		time.Sleep(time.Millisecond)
	}
	do(t, "PATCH", srv.URL+"/api/users/1", `{"name":"second"}`)
	do(t, "GET", srv.URL+"/api/users/1", "")
	do(t, "PATCH", srv.URL+"/api/users/99", `{"name":"nobody"}`) // 404
	do(t, "PATCH", srv.URL+"/api/users/2", `{"name":""}`)        // 422
	close(release)
	if a := <-held; a.status != 200 {
		t.Fatalf("held PATCH: %d %s", a.status, a.body)
	}
	var arrived, applied []string
	for _, r := range api.Requests() {
		arrived = append(arrived, r.Method+" "+r.Path+" "+string(r.Body))
	}
	for _, r := range api.AppliedWrites() {
		applied = append(applied, r.Method+" "+r.Path+" "+string(r.Body))
	}
	wantArrived := []string{
		`PATCH /api/users/1 {"name":"first"}`, `PATCH /api/users/1 {"name":"second"}`, `GET /api/users/1 `,
		`PATCH /api/users/99 {"name":"nobody"}`, `PATCH /api/users/2 {"name":""}`,
	}
	wantApplied := []string{`PATCH /api/users/1 {"name":"second"}`, `PATCH /api/users/1 {"name":"first"}`}
	if !slices.Equal(arrived, wantArrived) {
		t.Errorf("Requests() = %q, want %q", arrived, wantArrived)
	}
	if !slices.Equal(applied, wantApplied) {
		t.Errorf("AppliedWrites() = %q, want %q", applied, wantApplied)
	}
	if rec, _ := api.Item("/api/users", "1"); rec["name"] != "first" {
		t.Errorf("user 1 is %v, want the held write's name, applied last", rec)
	}
	api.ResetLog()
	if got := api.AppliedWrites(); len(got) != 0 {
		t.Errorf("AppliedWrites() after ResetLog = %v", got)
	}
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

func TestNormalize(t *testing.T) {
	api, srv := startWith(t, with(func(c *Collection) { c.Normalize, c.PutCreates = true, true })...)
	tests := []struct {
		name, method, path, body string
		status                   int
		col, id                  string // where the write stores its record
		want                     string // that record, updated_at aside
	}{
		{"post trims and lower-cases", "POST", "/api/users", `{"name":"  Dee \n","email":" Dee@Example.COM ","note":" x ","n":1,"tags":[" a "],"updated_at":"1999"}`, 201,
			"/api/users", "1000", `{"email":"dee@example.com","id":1000,"n":1,"name":"Dee","note":"x","tags":[" a "]}`},
		{"post trims a string id", "POST", "/gadgets", `{"id":" g1 ","name":"G "}`, 201, "/gadgets", "g1", `{"id":"g1","name":"G"}`},
		{"put replaces normalised", "PUT", "/api/users/2", `{"name":" Bobby","email":"B@X.ORG","updated_at":null}`, 200,
			"/api/users", "2", `{"email":"b@x.org","id":2,"name":"Bobby"}`},
		{"patch normalises what it sends", "PATCH", "/api/users/10", `{"email":"CY@X.ORG ","updated_at":"2000-01-01T00:00:00Z"}`, 200,
			"/api/users", "10", `{"email":"cy@x.org","id":10,"name":"Cy","role":"admin"}`},
		{"put creates normalised", "PUT", "/gadgets/9", `{"name":"Cog  "}`, 201, "/gadgets", "9", `{"id":9,"name":"Cog"}`},
		{"email not a string is kept", "PATCH", "/api/users/1", `{"email":5}`, 200, "/api/users", "1", `{"email":5,"id":1,"name":"Ada"}`},
	}
	var stamps []string
	for _, tc := range tests {
		a := do(t, tc.method, srv.URL+tc.path, tc.body)
		if a.status != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.name, a.status, a.body, tc.status)
		}
		rec := decode(t, a.body).(map[string]any)
		stamp, _ := rec["updated_at"].(string)
		if _, err := time.Parse(time.RFC3339Nano, stamp); err != nil || len(stamp) != len("2026-01-01T00:00:00.000000000Z") {
			t.Errorf("%s: updated_at %#v, want a fixed-width RFC 3339 timestamp", tc.name, rec["updated_at"])
		}
		stamps = append(stamps, stamp)
		// The answer is the record as stored.
		if got, _ := api.Item(tc.col, tc.id); mustJSON(got) != mustJSON(rec) {
			t.Errorf("%s: answered %s, stored %s", tc.name, mustJSON(rec), mustJSON(got))
		}
		delete(rec, "updated_at")
		if got := mustJSON(rec); got != tc.want {
			t.Errorf("%s: stored %s, want %s", tc.name, got, tc.want)
		}
	}
	// Even a write that changes nothing gets a new updated_at.
	for range 2 {
		stamps = append(stamps, decode(t, do(t, "PATCH", srv.URL+"/api/users/1", `{}`).body).(map[string]any)["updated_at"].(string))
	}
	if !slices.IsSorted(stamps) || len(slices.Compact(slices.Clone(stamps))) != len(stamps) {
		t.Errorf("updated_at of the writes %q, want strictly increasing", stamps)
	}

	before := state(api)
	for _, body := range []string{`{"name":"   "}`, `{"name":"\t\n"}`} {
		if a := do(t, "POST", srv.URL+"/api/users", body); a.status != 422 {
			t.Errorf("POST %s: %d, want 422 once trimmed", body, a.status)
		}
	}
	if a := do(t, "PATCH", srv.URL+"/api/users/1", `{"name":" "}`); a.status != 422 {
		t.Errorf("PATCH blank name: %d, want 422", a.status)
	}
	if state(api) != before {
		t.Error("refused writes changed the state")
	}
	// Seeds are stored as given, and reads do not stamp.
	if a := do(t, "GET", srv.URL+"/gadgets/a%20b", ""); a.body != `{"id":"a b","name":"Spanner"}` {
		t.Errorf("seed read as %s", a.body)
	}
}

func TestNormalizeOffStoresAsSent(t *testing.T) {
	api, srv := start(t)
	run(t, srv, []step{{"POST", "/api/users", `{"name":" Dee ","email":"D@X","updated_at":"mine"}`, 201,
		`{"email":"D@X","id":1000,"name":" Dee ","updated_at":"mine"}`}})
	if got := stored(api, "1000"); got != `{"email":"D@X","id":1000,"name":" Dee ","updated_at":"mine"}` {
		t.Errorf("stored %s", got)
	}
}

func TestFieldsAndReadOnly(t *testing.T) {
	for _, normalize := range []bool{false, true} {
		t.Run(fmt.Sprint("Normalize=", normalize), func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) {
				c.Fields, c.ReadOnly, c.Normalize, c.PutCreates = []string{"name", "email", "role"}, []string{"role"}, normalize, true
			})...)
			steps := []struct {
				method, path, body string
				status             int
				id, want           string // the record stored under id afterwards, updated_at aside
			}{
				{"POST", "/api/users", `{"name":"Dee","secret":1,"role":"admin","id":5}`, 201, "5", `{"id":5,"name":"Dee"}`},
				{"PUT", "/api/users/10", `{"name":"Cy2","role":"guest","extra":true}`, 200, "10", `{"id":10,"name":"Cy2","role":"admin"}`},
				{"PATCH", "/api/users/10", `{"role":null,"email":"c@x","x":1}`, 200, "10", `{"email":"c@x","id":10,"name":"Cy2","role":"admin"}`},
				{"PATCH", "/api/users/10", `{"role":"guest"}`, 200, "10", `{"email":"c@x","id":10,"name":"Cy2","role":"admin"}`},
				{"PUT", "/api/users/2", `{"name":"B","role":"admin"}`, 200, "2", `{"id":2,"name":"B"}`},
				{"PUT", "/api/users/3", `{"name":"New","role":"admin","x":1}`, 201, "3", `{"id":3,"name":"New"}`},
				{"POST", "/api/users", `{"x":1,"name":""}`, 422, "1", `{"id":1,"name":"Ada"}`},
			}
			for _, s := range steps {
				a := do(t, s.method, srv.URL+s.path, s.body)
				if a.status != s.status {
					t.Errorf("%s %s %s: %d %s, want %d", s.method, s.path, s.body, a.status, a.body, s.status)
				}
				rec, _ := api.Item("/api/users", s.id)
				if a.status < 300 && mustJSON(decode(t, a.body)) != mustJSON(rec) {
					t.Errorf("%s %s: answered %s, stored %s", s.method, s.path, a.body, mustJSON(rec))
				}
				if _, has := rec["updated_at"]; has != (normalize && a.status < 300) {
					t.Errorf("%s %s: updated_at present = %v", s.method, s.path, has)
				}
				delete(rec, "updated_at")
				if got := mustJSON(rec); got != s.want {
					t.Errorf("%s %s %s: stored %s, want %s", s.method, s.path, s.body, got, s.want)
				}
			}
		})
	}

	t.Run("updated_at passes Fields", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.Fields = []string{"name"} })...)
		do(t, "POST", srv.URL+"/api/users", `{"name":"D","updated_at":"mine","x":1}`)
		if got := stored(api, "1000"); got != `{"id":1000,"name":"D","updated_at":"mine"}` {
			t.Errorf("stored %s", got)
		}
	})

	t.Run("read-only id", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.ReadOnly = []string{"id"} })...)
		run(t, srv, []step{
			{"POST", "/api/users", `{"id":1,"name":"X"}`, 201, `{"id":1000,"name":"X"}`},
			{"PUT", "/api/users/2", `{"id":7,"name":"B"}`, 200, `{"id":2,"name":"B"}`},
		})
		if got := stored(api, "1"); got != `{"id":1,"name":"Ada"}` {
			t.Errorf("user 1 = %s", got)
		}
	})
}

func TestSelectParam(t *testing.T) {
	tests := []struct {
		param, query, wantItem, wantList string
	}{
		{"$select[]", "?$select[]=name", `{"id":10,"name":"Cy"}`, `[{"id":1,"name":"Ada"},{"id":2,"name":"Bob"},{"id":10,"name":"Cy"}]`},
		{"$select[]", "?%24select%5B%5D=role&$select[]=nope", `{"id":10,"role":"admin"}`, `[{"id":1},{"id":2},{"id":10,"role":"admin"}]`},
		{"fields", "?fields=role,name&limit=1", `{"id":10,"name":"Cy","role":"admin"}`, `[{"id":1,"name":"Ada"}]`},
		{"fields", "?fields=id", `{"id":10}`, `[{"id":1},{"id":2},{"id":10}]`},
		{"fields", "?fields=", `{"id":10,"name":"Cy","role":"admin"}`, ""},
		{"fields", "?fields=,", `{"id":10,"name":"Cy","role":"admin"}`, ""},
		{"fields", "?$select[]=name", `{"id":10,"name":"Cy","role":"admin"}`, ""}, // another collection's parameter
		{"", "?fields=name", `{"id":10,"name":"Cy","role":"admin"}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.param+tc.query, func(t *testing.T) {
			_, srv := startWith(t, with(func(c *Collection) { c.SelectParam = tc.param })...)
			get := do(t, "GET", srv.URL+"/api/users/10"+tc.query, "")
			if get.status != 200 || get.body != tc.wantItem {
				t.Errorf("GET item: %d %s, want %s", get.status, get.body, tc.wantItem)
			}
			if head := do(t, "HEAD", srv.URL+"/api/users/10"+tc.query, ""); head.header.Get("Content-Length") != fmt.Sprint(len(tc.wantItem)) {
				t.Errorf("HEAD Content-Length %q, want that of %s", head.header.Get("Content-Length"), tc.wantItem)
			}
			if tc.wantList != "" {
				if list := do(t, "GET", srv.URL+"/api/users"+tc.query, ""); list.body != tc.wantList {
					t.Errorf("GET list: %s, want %s", list.body, tc.wantList)
				}
			}
		})
	}

	t.Run("writes applied whole, answers shaped", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.SelectParam, c.PutCreates = "fields", true })...)
		steps := []struct {
			method, path, body, answer string
			status                     int
			id, stored                 string
		}{
			{"POST", "/api/users?fields=name", `{"name":"Dee","age":4}`, `{"id":1000,"name":"Dee"}`, 201, "1000", `{"age":4,"id":1000,"name":"Dee"}`},
			{"PUT", "/api/users/2?fields=age", `{"name":"B","age":5}`, `{"age":5,"id":2}`, 200, "2", `{"age":5,"id":2,"name":"B"}`},
			{"PUT", "/api/users/7?fields=nope", `{"name":"G"}`, `{"id":7}`, 201, "7", `{"id":7,"name":"G"}`},
			{"PATCH", "/api/users/10?fields=role&fields=age", `{"age":6}`, `{"age":6,"id":10,"role":"admin"}`, 200, "10", `{"age":6,"id":10,"name":"Cy","role":"admin"}`},
			{"DELETE", "/api/users/1?fields=name", "", `{}`, 200, "1", "absent"},
		}
		for _, s := range steps {
			a := do(t, s.method, srv.URL+s.path, s.body)
			if a.status != s.status || a.body != s.answer {
				t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.answer)
			}
			if got := stored(api, s.id); got != s.stored {
				t.Errorf("%s %s: stored %s, want %s", s.method, s.path, got, s.stored)
			}
		}
	})

	t.Run("with Normalize", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.SelectParam, c.Normalize = "fields", true })...)
		run(t, srv, []step{{"POST", "/api/users?fields=email", `{"name":" D ","email":"D@X"}`, 201, `{"email":"d@x","id":1000}`}})
		if rec, _ := api.Item("/api/users", "1000"); rec["name"] != "D" || rec["updated_at"] == nil {
			t.Errorf("stored %v", rec)
		}
	})
}

func TestLenientIDs(t *testing.T) {
	seed := []map[string]any{{"id": 0, "name": "Zero"}, {"id": 3, "name": "Three"}, {"id": "7", "name": "Seven"}}
	t.Run("reads", func(t *testing.T) {
		_, srv := startWith(t, Collection{Path: "/n", LenientIDs: true, Seed: seed})
		tests := []struct {
			segment string
			status  int
			name    string
		}{
			{"3", 200, "Three"}, {"03", 200, "Three"}, {"+3", 200, "Three"}, {"%2B3", 200, "Three"}, {"+003", 200, "Three"},
			{"3.json", 200, "Three"}, {"3.JSON", 200, "Three"}, {"3.Json", 200, "Three"}, {"+03.json", 200, "Three"},
			{"0", 200, "Zero"}, {"00", 200, "Zero"}, {"+0", 200, "Zero"}, {"0.json", 200, "Zero"},
			{"7", 200, "Seven"}, {"007", 200, "Seven"},
			{"3x", 404, ""}, {"x3", 404, ""}, {"+", 404, ""}, {".json", 404, ""}, {"-3", 404, ""}, {"3.5", 404, ""},
			{"++3", 404, ""}, {"3.json.json", 404, ""}, {"3.jsonx", 404, ""}, {"%203", 404, ""}, {"3.xml", 404, ""},
			{"4", 404, ""}, {"04.json", 404, ""},
		}
		for _, tc := range tests {
			for _, method := range []string{"GET", "HEAD"} {
				a := do(t, method, srv.URL+"/n/"+tc.segment, "")
				if a.status != tc.status || (method == "GET" && tc.name != "" && !strings.Contains(a.body, `"`+tc.name+`"`)) {
					t.Errorf("%s /n/%s: %d %s, want %d %s", method, tc.segment, a.status, a.body, tc.status, tc.name)
				}
				if tc.status == 404 && a.header.Get("Content-Type") != ctHTML {
					t.Errorf("%s /n/%s: 404 as %q", method, tc.segment, a.header.Get("Content-Type"))
				}
			}
		}
	})

	t.Run("writes", func(t *testing.T) {
		api, srv := startWith(t, Collection{Path: "/n", LenientIDs: true, PutCreates: true, Seed: seed})
		for _, s := range []struct {
			method, path, body string
			status             int
			answer             string
		}{
			{"PUT", "/n/03", `{"name":"Tri"}`, 200, `{"id":3,"name":"Tri"}`},
			{"PATCH", "/n/+3.json", `{"age":3}`, 200, `{"age":3,"id":3,"name":"Tri"}`},
			{"PATCH", "/n/3x", `{"age":3}`, 404, ""},
			{"PUT", "/n/3x", `{"name":"X"}`, 404, ""}, // PutCreates cannot create what names nothing
			{"DELETE", "/n/00", "", 200, `{}`},
			{"DELETE", "/n/0", "", 404, ""},
			{"POST", "/n/3x", `{}`, 404, ""},
			{"POST", "/n/3", `{}`, 405, ""},
		} {
			a := do(t, s.method, srv.URL+s.path, s.body)
			if a.status != s.status || (s.answer != "" && a.body != s.answer) {
				t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.answer)
			}
		}
		a := do(t, "PUT", srv.URL+"/n/0012.JSON", `{"name":"Twelve"}`)
		if a.status != 201 || a.body != `{"id":12,"name":"Twelve"}` || a.header.Get("Location") != srv.URL+"/n/12" {
			t.Errorf("PUT create: %d %s Location %q", a.status, a.body, a.header.Get("Location"))
		}
		got := map[string]string{}
		for id, rec := range api.Items("/n") {
			got[id] = mustJSON(rec)
		}
		want := map[string]string{"3": `{"age":3,"id":3,"name":"Tri"}`, "7": `{"id":"7","name":"Seven"}`, "12": `{"id":12,"name":"Twelve"}`}
		if mustJSON(got) != mustJSON(want) {
			t.Errorf("stored %v, want %v", got, want)
		}
	})

	t.Run("off by default", func(t *testing.T) {
		_, srv := startWith(t, Collection{Path: "/n", Seed: seed})
		run(t, srv, []step{{"GET", "/n/3", "", 200, ""}, {"GET", "/n/03", "", 404, ""}, {"GET", "/n/3.json", "", 404, ""}})
	})
}

func TestContentETags(t *testing.T) {
	api, srv := startWith(t, with(func(c *Collection) { c.ContentETags, c.PutCreates = true, true })...)
	get := func(path string) (tag, body string) {
		t.Helper()
		a := do(t, "GET", srv.URL+path, "")
		tag = a.header.Get("ETag")
		if a.status != 200 || len(tag) != 18 || tag[0] != '"' || tag[17] != '"' {
			t.Fatalf("GET %s: %d ETag %q, want a strong hashed tag", path, a.status, tag)
		}
		if head := do(t, "HEAD", srv.URL+path, ""); head.header.Get("ETag") != tag {
			t.Errorf("HEAD %s: ETag %q, GET %q", path, head.header.Get("ETag"), tag)
		}
		return tag, a.body
	}
	u1, body1 := get("/api/users/1")
	if again, _ := get("/api/users/1"); again != u1 {
		t.Errorf("ETag changed without a write: %s, %s", u1, again)
	}
	list, _ := get("/api/users")
	if list == u1 {
		t.Error("a list and an item share a tag")
	}
	if other, _ := get("/api/users/2"); other == u1 {
		t.Error("two records share a tag")
	}

	// A write that leaves the content as it was leaves the tag too; the
	// write answers carry none.
	for _, s := range []struct{ method, path, body string }{
		{"PUT", "/api/users/1", `{"name":"Ada"}`},
		{"PATCH", "/api/users/1", `{}`},
	} {
		if a := do(t, s.method, srv.URL+s.path, s.body); a.status != 200 || a.header.Get("ETag") != "" {
			t.Errorf("%s: %d ETag %q", s.method, a.status, a.header.Get("ETag"))
		}
		if tag, _ := get("/api/users/1"); tag != u1 {
			t.Errorf("after a %s to equal content: %s, want %s", s.method, tag, u1)
		}
	}
	if a := do(t, "PATCH", srv.URL+"/api/users/1", `{"age":36}`); a.header.Get("ETag") != "" {
		t.Errorf("PATCH answered ETag %q", a.header.Get("ETag"))
	}
	changed, _ := get("/api/users/1")
	if changed == u1 {
		t.Error("ETag unchanged after a change")
	}
	if tag, _ := get("/api/users"); tag == list {
		t.Error("list ETag unchanged after a change")
	}

	// Conditions are never enforced.
	for _, s := range []struct {
		method, path, body, header, value string
		status                            int
	}{
		{"PUT", "/api/users/1", `{"name":"Ann"}`, "If-Match", u1, 200}, // stale
		{"PATCH", "/api/users/1", `{"name":"Ada","age":null}`, "If-Match", `"nope"`, 200},
		{"PUT", "/gadgets/a%20b", `{"name":"G"}`, "If-None-Match", "*", 200},
		{"PUT", "/gadgets/new", `{"name":"N"}`, "If-Match", "*", 201},
		{"POST", "/api/users", `{"id":2,"name":"B"}`, "If-None-Match", "*", 409},
		{"DELETE", "/api/users/2", "", "If-Match", `"nope"`, 200},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, http.Header{s.header: {s.value}})
		if a.status != s.status || a.header.Get("ETag") != "" {
			t.Errorf("%s %s with %s: %d ETag %q, want %d and none", s.method, s.path, s.header, a.status, a.header.Get("ETag"), s.status)
		}
	}
	if tag, body := get("/api/users/1"); tag != u1 || body != body1 {
		t.Errorf("back to %s: ETag %s, want the first %s", body, tag, u1)
	}
	if _, ok := api.Item("/api/users", "2"); ok {
		t.Error("conditional DELETE not applied")
	}
	if a := do(t, "GET", srv.URL+"/api/users/2", ""); a.status != 404 || a.header.Get("ETag") != "" {
		t.Errorf("404 with ETag %q", a.header.Get("ETag"))
	}
	if a := doH(t, "GET", srv.URL+"/api/users/1", "", http.Header{"If-None-Match": {u1}}); a.status != 200 {
		t.Errorf("GET with a matching If-None-Match: %d, want 200", a.status)
	}

	// The tag is that of the body answered, so a selection has its own.
	_, srv = startWith(t, with(func(c *Collection) { c.ContentETags, c.SelectParam = true, "fields" })...)
	whole := do(t, "GET", srv.URL+"/api/users/10", "").header.Get("ETag")
	part := do(t, "GET", srv.URL+"/api/users/10?fields=name", "")
	if part.header.Get("ETag") == whole || part.header.Get("ETag") != contentTag([]byte(part.body)) {
		t.Errorf("selected answer %s has ETag %q (whole %q)", part.body, part.header.Get("ETag"), whole)
	}
}

func TestTrailingSlash(t *testing.T) {
	cols := with(func(c *Collection) { c.TrailingSlash, c.HonorKeys = true, true })
	cols[0].APIKey = "k"
	api, srv := startWith(t, cols...)
	seed := state(api)
	key := http.Header{"Idempotency-Key": {"once"}}
	for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		for _, path := range []string{"/api/users", "/api/users/1?api_key=k&tenant=a", "/gadgets/a%20b", "/gadgets/new", "/api/users/1/posts", "/api/users/1/posts/1"} {
			a, err := send(noRedirects, method, srv.URL+path, `{"name":"X"}`, key)
			if err != nil {
				t.Fatal(err)
			}
			p, q, _ := strings.Cut(path, "?")
			want := srv.URL + p + "/"
			if q != "" {
				want += "?" + q
			}
			if a.status != 301 || a.header.Get("Location") != want || a.header.Get("Content-Type") != ctHTML ||
				(method != "HEAD" && !strings.Contains(a.body, "301 Moved Permanently")) {
				t.Errorf("%s %s: %d Location %q %q, want 301 to %s", method, path, a.status, a.header.Get("Location"), a.body, want)
			}
		}
	}
	if got := state(api); got != seed {
		t.Errorf("redirected requests changed the state: %s", got)
	}
	if got := api.Writes(); got != (Writes{}) {
		t.Errorf("Writes() = %+v after redirects", got)
	}
	if got := api.AppliedWrites(); len(got) != 0 {
		t.Errorf("AppliedWrites() = %v after redirects", got)
	}
	api.mu.Lock()
	if n := len(api.keys); n != 0 {
		t.Errorf("redirects stored %d Idempotency-Keys", n)
	}
	api.mu.Unlock()

	// The slashed URLs are the API.
	for _, s := range []struct {
		method, path, body string
		status             int
		wantBody           string
	}{
		{"GET", "/api/users/?api_key=k&limit=1", "", 200, `[{"id":1,"name":"Ada"}]`},
		{"GET", "/api/users/1/?api_key=k", "", 200, `{"id":1,"name":"Ada"}`},
		{"GET", "/api/users/?limit=1", "", 401, ""},
		{"PUT", "/api/users/1/?api_key=k", `{"name":"Ann"}`, 200, `{"id":1,"name":"Ann"}`},
		{"PATCH", "/gadgets/a%20b/", `{"n":1}`, 200, `{"id":"a b","n":1,"name":"Spanner"}`},
		{"DELETE", "/api/users/2/?api_key=k", "", 200, `{}`},
		{"PUT", "/gadgets/new/", `{"name":"N"}`, 201, `{"id":"new","name":"N"}`},
		{"GET", "/api/users/1/posts/1/", "", 200, `{"id":1,"title":"hello"}`},
		{"GET", "/api/users/1//?api_key=k", "", 404, ""},
		{"GET", "/api/users/1/x/?api_key=k", "", 404, ""},
		{"POST", "/api/users/1/?api_key=k", `{}`, 405, ""},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, key)
		if a.status != s.status || (s.wantBody != "" && a.body != s.wantBody) {
			t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.wantBody)
		}
	}
	a := doH(t, "POST", srv.URL+"/gadgets/", `{"id":"x/y","name":"Bolt"}`, key)
	if loc := a.header.Get("Location"); a.status != 201 || loc != srv.URL+"/gadgets/x%2Fy/" {
		t.Fatalf("POST: %d Location %q", a.status, loc)
	}
	if a := do(t, "GET", a.header.Get("Location"), ""); a.status != 200 || a.body != `{"id":"x/y","name":"Bolt"}` {
		t.Errorf("GET Location: %d %s", a.status, a.body)
	}
	if a := doH(t, "PUT", srv.URL+"/gadgets/q/", `{}`, nil); a.header.Get("Location") != srv.URL+"/gadgets/q/" {
		t.Errorf("PUT create Location %q", a.header.Get("Location"))
	}
	for _, answer := range []CreateAnswer{AnswerSeeOther, AnswerCreated} {
		_, srv := startWith(t, Collection{Path: "/s", TrailingSlash: true, CreateAnswer: answer})
		a, err := send(noRedirects, "POST", srv.URL+"/s/", `{}`, nil)
		if err != nil || a.header.Get("Location") != srv.URL+"/s/1000/" {
			t.Errorf("CreateAnswer %d: %v Location %q", answer, err, a.header.Get("Location"))
		}
	}

	// Faults match the path exactly as received.
	api.Inject(Fault{Path: "/api/users/1", Status: 503, Times: 1})
	api.Inject(Fault{Path: "/api/users/10/", Status: 502, Times: 1})
	if a, _ := send(noRedirects, "GET", srv.URL+"/api/users/1", "", nil); a.status != 503 {
		t.Errorf("fault on the unslashed path: %d", a.status)
	}
	if a, _ := send(noRedirects, "GET", srv.URL+"/api/users/10", "", nil); a.status != 301 {
		t.Errorf("unslashed path with a fault on the slashed one: %d", a.status)
	}
	if a, _ := send(noRedirects, "GET", srv.URL+"/api/users/10/", "", nil); a.status != 502 {
		t.Errorf("fault on the slashed path: %d", a.status)
	}
}

func TestTrailingSlashWithLenientIDs(t *testing.T) {
	_, srv := startWith(t, Collection{Path: "/n", TrailingSlash: true, LenientIDs: true, Seed: []map[string]any{{"id": 3}}})
	for _, s := range []struct {
		path     string
		status   int
		location string
	}{
		{"/n/03/", 200, ""},
		{"/n/3.json/", 200, ""},
		{"/n/03", 301, "/n/03/"},
		{"/n/3x", 404, ""},
		{"/n/3x/", 404, ""},
	} {
		a, err := send(noRedirects, "GET", srv.URL+s.path, "", nil)
		if loc := strings.TrimPrefix(a.header.Get("Location"), srv.URL); err != nil || a.status != s.status || loc != s.location {
			t.Errorf("GET %s: %v %d Location %q, want %d %q", s.path, err, a.status, loc, s.status, s.location)
		}
	}
}

// listIDs is the ids of a LIST answer's records, plain or paged.
func listIDs(t *testing.T, body string) string {
	t.Helper()
	v := decode(t, body)
	if page, ok := v.(map[string]any); ok {
		v = page["results"]
	}
	var ids []string
	for _, rec := range v.([]any) {
		ids = append(ids, fmt.Sprint(rec.(map[string]any)["id"]))
	}
	return strings.Join(ids, ",")
}

func TestListFilters(t *testing.T) {
	seed := []map[string]any{{"id": 1}, {"id": 2}, {"id": 3}, {"id": "a,b"}, {"id": 10}}
	for _, tt := range []struct {
		name  string
		col   Collection
		query string
		want  string
	}{
		{"json-server: the key repeated", Collection{FilterParam: "id"}, "id=3&id=1&id=99", "1,3"},
		{"json-server: a value is one id, commas included", Collection{FilterParam: "id"}, "id=a,b&id=2", "2,a,b"},
		{"django-filter: a comma list", Collection{FilterParam: "id__in", FilterComma: true}, "id__in=10,2,a%2Cb", "2,10,a,b"},
		{"JSON:API: an escaped key", Collection{FilterParam: "filter[id]", FilterComma: true}, "filter%5Bid%5D=1,3", "1,3"},
		{"JSON:API: the key as written", Collection{FilterParam: "filter[id]", FilterComma: true}, "filter[id]=2", "2"},
		{"a filter asked twice adds up, once each", Collection{FilterParam: "id__in", FilterComma: true}, "id__in=1&id__in=1,2", "1,2"},
		{"the filter present and empty holds nothing", Collection{FilterParam: "id"}, "id=", ""},
		{"an API that knows no filter answers everything", Collection{}, "id__in=1,2", "1,2,3,10,a,b"},
		{"another API's filter is ignored", Collection{FilterParam: "id"}, "id__in=1,2", "1,2,3,10,a,b"},
		{"hidden records are left out", Collection{FilterParam: "id", Hidden: []string{"2"}}, "id=1&id=2", "1"},
		{"hidden records are left out of everything", Collection{Hidden: []string{"2", "3"}}, "", "1,10,a,b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.col.Path, tt.col.Seed = "/w", seed
			_, srv := startWith(t, tt.col)
			a := do(t, "GET", srv.URL+"/w?"+tt.query, "")
			if a.status != 200 {
				t.Fatalf("%d %s", a.status, a.body)
			}
			if got := listIDs(t, a.body); got != tt.want {
				t.Errorf("LIST ?%s holds %q, want %q", tt.query, got, tt.want)
			}
		})
	}
}

func TestListPages(t *testing.T) {
	_, srv := startWith(t, Collection{Path: "/w", PageSize: 2, MaxPageSize: 3, FilterParam: "id__in", FilterComma: true,
		Seed: []map[string]any{{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}, {"id": 5}}})
	page := func(query string) map[string]any {
		t.Helper()
		a := do(t, "GET", srv.URL+"/w?"+query, "")
		if a.status != 200 {
			t.Fatalf("?%s: %d %s", query, a.status, a.body)
		}
		return decode(t, a.body).(map[string]any)
	}
	p := page("")
	if p["count"] != json.Number("5") || p["previous"] != nil || !strings.HasSuffix(fmt.Sprint(p["next"]), "/w?page=2") ||
		!strings.HasPrefix(fmt.Sprint(p["next"]), "http://") || listIDs(t, mustJSON(p)) != "1,2" {
		t.Errorf("page 1: %v", p)
	}
	p = page("page=3")
	if p["next"] != nil || !strings.Contains(fmt.Sprint(p["previous"]), "page=2") || listIDs(t, mustJSON(p)) != "5" {
		t.Errorf("page 3: %v", p)
	}
	// Asked for 100 a page, capped at 3 without a word: the next link is
	// all that tells.
	p = page("id__in=1,2,3,4,5&page_size=100")
	if p["count"] != json.Number("5") || listIDs(t, mustJSON(p)) != "1,2,3" || !strings.Contains(fmt.Sprint(p["next"]), "page=2") ||
		!strings.Contains(fmt.Sprint(p["next"]), "id__in=1%2C2%2C3%2C4%2C5") {
		t.Errorf("page_size 100 under a cap of 3: %v", p)
	}
	if a := do(t, "GET", srv.URL+"/w?page=4", ""); a.status != 404 || !strings.Contains(a.body, "Invalid page") {
		t.Errorf("a page past the end: %d %s", a.status, a.body)
	}
	if a := do(t, "GET", srv.URL+"/w?id__in=9", ""); a.status != 200 || listIDs(t, a.body) != "" {
		t.Errorf("nothing matches: %d %s", a.status, a.body)
	}
}

func TestHiddenItems(t *testing.T) {
	api, srv := startWith(t, Collection{Path: "/w", Hidden: []string{"2"}, Seed: []map[string]any{{"id": 1}, {"id": 2}}})
	if a := do(t, "GET", srv.URL+"/w/2", ""); a.status != 403 || a.header.Get("Content-Type") != ctHTML {
		t.Errorf("GET of a hidden item: %d %s", a.status, a.body)
	}
	if a := do(t, "PATCH", srv.URL+"/w/2", `{"name":"x"}`); a.status != 200 {
		t.Errorf("PATCH of a hidden item: %d %s", a.status, a.body)
	}
	if rec, _ := api.Item("/w", "2"); rec["name"] != "x" {
		t.Errorf("the hidden item is %v", rec)
	}
}

// A LIST fault hits the LIST, not the items.
func TestListFault(t *testing.T) {
	api, srv := startWith(t, Collection{Path: "/w", FilterParam: "id", Seed: []map[string]any{{"id": 1}}})
	api.Inject(Fault{Method: "GET", Path: "/w", Status: 500, Body: "down"})
	if a := do(t, "GET", srv.URL+"/w?id=1", ""); a.status != 500 {
		t.Errorf("the LIST: %d", a.status)
	}
	if a := do(t, "GET", srv.URL+"/w/1", ""); a.status != 200 {
		t.Errorf("the item: %d", a.status)
	}
}

// The LIST's filter, tenants and $select combine.
func TestListFilterTenantsSelect(t *testing.T) {
	_, srv := startWith(t, Collection{Path: "/w", FilterParam: "id", Tenants: true, SelectParam: "fields", PutCreates: true,
		Seed: []map[string]any{{"id": 1, "name": "a", "color": "red"}}})
	do(t, "PUT", srv.URL+"/w/1?tenant=t", `{"name":"t1","color":"blue"}`)
	a := do(t, "GET", srv.URL+"/w?id=1&tenant=t&fields=name", "")
	if got := mustJSON(decode(t, a.body)); got != `[{"id":1,"name":"t1"}]` {
		t.Errorf("tenant t's user 1, name only: %s", got)
	}
}

func TestPatternCollections(t *testing.T) {
	api, srv := startWith(t, append(fixture(), Collection{Path: "/api/users/*/posts", ETags: true, FilterParam: "id"})...)
	run(t, srv, []step{
		{"GET", "/api/users/2/posts", "", 200, `[]`},
		{"GET", "/api/users/999/posts", "", 404, ""}, // no user 999
		{"POST", "/api/users/999/posts", `{"title":"x"}`, 404, ""},
		{"GET", "/api/users//posts", "", 404, ""},
		{"POST", "/api/users", `{"name":"New"}`, 201, `{"id":1000,"name":"New"}`},
		{"POST", "/api/users/1000/posts", `{"title":"t"}`, 201, `{"id":1000,"title":"t"}`},
		{"POST", "/api/users/2/posts", `{"title":"b"}`, 201, `{"id":1000,"title":"b"}`}, // numbering is per parent
		{"POST", "/api/users/2/posts", `{"title":"c"}`, 201, `{"id":1001,"title":"c"}`},
		{"GET", "/api/users/1000/posts", "", 200, `[{"id":1000,"title":"t"}]`},
		{"GET", "/api/users/2/posts?id=1001&id=1000", "", 200, `[{"id":1000,"title":"b"},{"id":1001,"title":"c"}]`},
		{"GET", "/api/users/2/posts?id=1001", "", 200, `[{"id":1001,"title":"c"}]`},
		{"GET", "/api/users/1/posts", "", 200, `[{"id":1,"title":"hello"}]`}, // the declared path wins
		{"DELETE", "/api/users/10", "", 200, `{}`},
		{"GET", "/api/users/10/posts", "", 404, ""},
	})

	a := do(t, "POST", srv.URL+"/api/users/1000/posts", `{"title":"u"}`)
	if a.header.Get("Location") != srv.URL+"/api/users/1000/posts/1001" || a.header.Get("ETag") == "" {
		t.Errorf("POST to a concrete path of a pattern: Location %q, ETag %q", a.header.Get("Location"), a.header.Get("ETag"))
	}
	if a := doH(t, "PUT", srv.URL+"/api/users/1000/posts/1001", `{"title":"v"}`, http.Header{"If-Match": {`"v1"`}}); a.status != 412 {
		t.Errorf("PUT with a stale If-Match: %d %s, want 412", a.status, a.body)
	}
	if a := do(t, "GET", srv.URL+"/api/users/1/posts/1", ""); a.status != 200 || a.header.Get("ETag") != "" {
		t.Errorf("GET of the declared path: %d, ETag %q; want 200 with no ETag, as declared", a.status, a.header.Get("ETag"))
	}

	if rec, ok := api.Item("/api/users/1000/posts", "1001"); !ok || mustJSON(rec) != `{"id":1001,"title":"u"}` {
		t.Errorf("Item = %s, %v", mustJSON(rec), ok)
	}
	if got := mustJSON(api.Items("/api/users/2/posts")); got != `{"1000":{"id":1000,"title":"b"},"1001":{"id":1001,"title":"c"}}` {
		t.Errorf("Items of user 2's posts = %s", got)
	}
	if got := api.Items("/api/users/3/posts"); got == nil || len(got) != 0 {
		t.Errorf("Items of a concrete path never used = %#v, want empty", got)
	}
	if got := api.Items("/api/users/3/comments"); got != nil {
		t.Errorf("Items of a path nothing serves = %#v, want nil", got)
	}

	api.Inject(Fault{Method: "POST", Path: "/api/users/2/posts", Status: 503, AfterApply: true, Times: 1})
	if a := do(t, "POST", srv.URL+"/api/users/2/posts", `{"title":"d"}`); a.status != 503 {
		t.Errorf("faulted POST: %d, want 503", a.status)
	}
	applied := api.AppliedWrites()
	if last := applied[len(applied)-1]; last.Path != "/api/users/2/posts" || len(api.Items("/api/users/2/posts")) != 3 {
		t.Errorf("last applied write %s %s, %d posts of user 2; want the faulted POST applied", last.Method, last.Path, len(api.Items("/api/users/2/posts")))
	}
}

func TestPatternCollectionParentInTenant(t *testing.T) {
	cols := append(with(func(c *Collection) { c.Tenants = true }), Collection{Path: "/api/users/*/posts", Tenants: true})
	api, srv := startWith(t, cols...)
	run(t, srv, []step{
		{"POST", "/api/users?tenant=a", `{"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"POST", "/api/users/1000/posts?tenant=a", `{"title":"t"}`, 201, `{"id":1000,"title":"t"}`},
		{"GET", "/api/users/1000/posts", "", 404, ""}, // user 1000 is tenant a's only
		{"GET", "/api/users/2/posts?tenant=a", "", 404, ""},
		{"GET", "/api/users/2/posts", "", 200, `[]`},
	})
	if _, ok := api.TenantItem("/api/users/1000/posts", "a", "1000"); !ok {
		t.Errorf("TenantItem of a concrete path of a pattern: not found")
	}
}

// TestLogIsKeptOnlyWhenAsked: an API built with New, as the demo's is,
// keeps no request and no applied write however many it serves, and
// reading its log panics rather than answer an empty one that would say
// "the API saw none of it"; NewRecording keeps both.
func TestLogIsKeptOnlyWhenAsked(t *testing.T) {
	serve := func(api *API) {
		for i := range 50 {
			w := httptest.NewRecorder()
			api.ServeHTTP(w, httptest.NewRequest("PATCH", "/api/users/1", strings.NewReader(fmt.Sprintf(`{"name":"n%d"}`, i))))
			if w.Code != http.StatusOK {
				t.Fatalf("PATCH answered %d", w.Code)
			}
		}
	}
	quiet := New(fixture()...)
	serve(quiet)
	if n := len(quiet.log) + len(quiet.applied); n != 0 {
		t.Errorf("New kept %d requests and writes, want none", n)
	}
	if got := quiet.Writes().Applied; got != 50 {
		t.Errorf("Writes().Applied = %d, want 50: the counters are kept either way", got)
	}
	for name, read := range map[string]func(){
		"Requests":      func() { quiet.Requests() },
		"AppliedWrites": func() { quiet.AppliedWrites() },
		"ResetLog":      quiet.ResetLog,
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s on an API built with New did not panic", name)
				}
			}()
			read()
		}()
	}
	loud := NewRecording(fixture()...)
	serve(loud)
	if got, applied := len(loud.Requests()), len(loud.AppliedWrites()); got != 50 || applied != 50 {
		t.Errorf("NewRecording kept %d requests and %d writes, want 50 and 50", got, applied)
	}
}
