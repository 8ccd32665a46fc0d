package legacyapi

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRequestLog(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

func TestLoadCounters(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// TestLogIsKeptOnlyWhenAsked: an API built with New, as the demo's is,
// keeps no request and no applied write however many it serves, and
// reading its log panics rather than answer an empty one that would say
// "the API saw none of it"; NewRecording keeps both.
func TestLogIsKeptOnlyWhenAsked(t *testing.T) {
	t.Parallel()
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
