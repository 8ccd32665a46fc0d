package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// demoMix sends the demo the i-th request of a mix of what its clients
// do: batch GETs through the list filter, all-or-nothing PATCHes of which
// half fail on one item and are undone, keyed partial creates of posts
// (deleted again one by one), and all-or-nothing creates that fail and are
// undone. What it creates it deletes, so what the demo keeps afterwards is
// what it kept before.
func demoMix(client *http.Client, gateway string, i int) error {
	base := "http://" + gateway
	switch i % 5 {
	case 0:
		return expect(client, "GET", base+"/api/users?ids=1,2,3", "", nil, http.StatusOK)
	case 1:
		return expect(client, "PATCH", base+"/api/users", fmt.Sprintf(`[{"id":1,"name":"ada-%d"},{"id":2,"name":"bob-%d"}]`, i, i), nil, http.StatusOK)
	case 2:
		// The empty name is the demo API's 422: user 3's write is undone.
		return expect(client, "PATCH", base+"/api/users", fmt.Sprintf(`[{"id":3,"name":"cy-%d"},{"id":1,"name":""}]`, i), nil, http.StatusUnprocessableEntity)
	case 3:
		body, err := send(client, "POST", base+"/api/users/2/posts", fmt.Sprintf(`[{"name":"a-%d"},{"name":"b-%d"}]`, i, i),
			http.Header{"Idempotency-Key": {fmt.Sprintf("mix-%d", i)}}, http.StatusCreated)
		if err != nil {
			return err
		}
		var answer struct {
			Items []struct{ ID string }
		}
		if err := json.Unmarshal(body, &answer); err != nil {
			return err
		}
		for _, it := range answer.Items {
			if err := expect(client, "DELETE", base+"/api/users/2/posts/"+it.ID, "", nil, http.StatusOK); err != nil {
				return err
			}
		}
		return nil
	default:
		return expect(client, "POST", base+"/api/users", fmt.Sprintf(`[{"name":"new-%d"},{"name":""}]`, i), nil, http.StatusUnprocessableEntity)
	}
}

func expect(client *http.Client, method, url, body string, h http.Header, status int) error {
	_, err := send(client, method, url, body, h, status)
	return err
}

func send(client *http.Client, method, url, body string, h http.Header, status int) ([]byte, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != status {
		err = fmt.Errorf("%s %s answered %d, want %d: %s", method, url, resp.StatusCode, status, got)
	}
	return got, err
}

// heapAfterGC is the live heap, after a collection, in bytes.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestDemoMemoryIsFlat runs the mix through the demo (Caddyfile.example
// in front of the demo legacy API, in this process) and checks that the
// live heap after three times as many requests is what it was: the demo's
// API keeps the records its clients create, and no log of the requests it
// served (which grew by about 6.5 KiB a request when it kept one).
func TestDemoMemoryIsFlat(t *testing.T) {
	const warmup, more = 500, 1500
	gateway := startDemo(t)
	client := &http.Client{}
	run := func(from, to int) {
		for i := from; i < to; i++ {
			if err := demoMix(client, gateway, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(0, warmup)
	before := heapAfterGC()
	run(warmup, warmup+more)
	after := heapAfterGC()
	const slack = 4 << 20
	if after > before+slack {
		t.Errorf("the live heap grew from %.1f MiB to %.1f MiB over %d more requests of the mix; the demo keeps something per request",
			float64(before)/(1<<20), float64(after)/(1<<20), more)
	}
	t.Logf("live heap %.1f MiB after %d requests of the mix, %.1f MiB after %d", float64(before)/(1<<20), warmup, float64(after)/(1<<20), warmup+more)
}

// BenchmarkDemoMix sends b.N requests of the mix through the demo and
// reports the live heap at the end (heap-MiB), to compare a short run with
// a long one (docs/performance.md, "The demo's memory").
func BenchmarkDemoMix(b *testing.B) {
	gateway := startDemo(b)
	client := &http.Client{}
	for i := 0; b.Loop(); i++ {
		if err := demoMix(client, gateway, i); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(heapAfterGC())/(1<<20), "heap-MiB")
}
