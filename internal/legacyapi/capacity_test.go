package legacyapi

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// With Workers, a request waits in the queue while every worker is busy,
// and is served once one comes free.
func TestWorkersQueue(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, Collection{Path: "/w", Workers: 1, Seed: []map[string]any{{"id": 1}}})
	busy := make(chan struct{})
	api.Inject(Fault{Path: "/w/1", Until: busy, Times: 1})
	c := fresh(5 * time.Second)
	var first, second time.Time
	var wg sync.WaitGroup
	wg.Go(func() {
		if a, err := send(c, "GET", srv.URL+"/w/1", "", nil); err != nil || a.status != 200 {
			t.Errorf("first GET: %v %v", a.status, err)
		}
		first = time.Now()
	})
	for api.InFlight() < 1 { // the first holds the one worker, at its fault
		time.Sleep(time.Millisecond)
	}
	wg.Go(func() {
		if a, err := send(c, "GET", srv.URL+"/w/1", "", nil); err != nil || a.status != 200 {
			t.Errorf("second GET: %v %v", a.status, err)
		}
		second = time.Now()
	})
	for api.InFlight() < 2 { // the second is queued
		time.Sleep(time.Millisecond)
	}
	released := time.Now()
	close(busy)
	wg.Wait()
	if second.Before(released) || second.Before(first.Add(-time.Millisecond)) {
		t.Errorf("the queued request was answered at %v, before the worker came free at %v", second, released)
	}
}

// ServiceTime holds a worker that long: two workers serve four requests
// in no less than two service times.
func TestServiceTime(t *testing.T) {
	t.Parallel()
	_, srv := startWith(t, Collection{Path: "/w", Workers: 2, ServiceTime: 50 * time.Millisecond, Seed: []map[string]any{{"id": 1}}})
	c := &http.Client{Timeout: 5 * time.Second}
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if a, err := send(c, "GET", srv.URL+"/w/1", "", nil); err != nil || a.status != 200 {
				t.Errorf("GET: %v %v", a.status, err)
			}
		})
	}
	wg.Wait()
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Errorf("4 requests on 2 workers of 50ms took %s, less than 100ms", took)
	}
}

// RateLimit answers 429 with Retry-After beyond the bucket, applies
// nothing, and serves again once a token is back; without it nothing is
// limited.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t,
		Collection{Path: "/limited", RateLimit: 20, Burst: 2},
		Collection{Path: "/free"})
	c := fresh(5 * time.Second)
	for i, want := range []int{201, 201, 429} {
		a, err := send(c, "POST", srv.URL+"/limited", `{"name":"x"}`, http.Header{"Content-Type": {"application/json"}})
		if err != nil || a.status != want {
			t.Fatalf("POST %d: %d %v, want %d", i, a.status, err, want)
		}
		if want == 429 && a.header.Get("Retry-After") != "1" {
			t.Errorf("429 with Retry-After %q, want 1", a.header.Get("Retry-After"))
		}
	}
	if n := len(api.Items("/limited")); n != 2 {
		t.Errorf("%d records, want 2: the refused POST was applied", n)
	}
	time.Sleep(60 * time.Millisecond) // a token comes back every 50ms
	if a, _ := send(c, "GET", srv.URL+"/limited", "", nil); a.status != 200 {
		t.Errorf("GET after a token came back: %d", a.status)
	}
	for range 10 {
		if a, _ := send(c, "GET", srv.URL+"/free", "", nil); a.status != 200 {
			t.Fatalf("a collection without RateLimit answered %d", a.status)
		}
	}
}
