package legacyapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestFaults(t *testing.T) {
	t.Parallel()
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

func TestWriteDelay(t *testing.T) {
	t.Parallel()
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
