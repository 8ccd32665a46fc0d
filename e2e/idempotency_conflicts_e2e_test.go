package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestIdempotencyInFlight: the same key while the first request runs is
// 409 with Retry-After, and sends nothing; once the first has answered,
// the key is replayed.
func TestIdempotencyInFlight(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/slow", WriteDelay: 1500 * time.Millisecond, Seed: records("s", 1, 3)})
	g := startIdemGateway(t, api, t.TempDir(), `
	batch {
		resource /api/slow {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	key := []string{"Idempotency-Key", "slow-1"}
	body := `[{"id": 1, "name": "x"}]`
	var first response
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() { first, firstErr = g.try("PATCH", "/api/slow", body, key...) })
	eventually(t, 5*time.Second, "the first write to reach the API", func() bool { return api.InFlight() > 0 })

	r := g.do(t, "PATCH", "/api/slow", body, key...)
	checkIdemProblem(t, r, 409, "idempotency-key-in-use")
	if r.Header.Get("Retry-After") == "" {
		t.Error("409 without Retry-After")
	}
	wg.Wait()
	if firstErr != nil || first.Status != 200 {
		t.Fatalf("first answer %v %v", first, firstErr)
	}
	if n := len(writes(api.Requests())); n != 1 {
		t.Errorf("%d writes upstream, want the first request's 1", n)
	}
	api.ResetLog()
	checkReplay(t, api, first, g.do(t, "PATCH", "/api/slow", body, key...))
}

// TestIdempotencyKeyReused: the same key for another request (another
// body, query or path) is 422, and sends nothing.
func TestIdempotencyKeyReused(t *testing.T) {
	api := seededAPI()
	g := startIdemGateway(t, api, t.TempDir(), idemSite)
	key := []string{"Idempotency-Key", "reused"}
	if r := g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}]`, key...); r.Status != 200 {
		t.Fatalf("first answer %v", r)
	}
	api.ResetLog()
	for _, other := range []struct{ name, path, body string }{
		{"another body", "/api/widgets", `[{"id": 1, "name": "b"}]`},
		{"another query", "/api/widgets?tenant=x", `[{"id": 1, "name": "a"}]`},
		{"another spelling of the path", "/api/widgets/", `[{"id": 1, "name": "a"}]`},
	} {
		r := g.do(t, "PATCH", other.path, other.body, key...)
		checkIdemProblem(t, r, 422, "idempotency-key-reused")
	}
	if reqs := api.Requests(); len(reqs) > 0 {
		t.Errorf("a reused key sent requests upstream:%s", describeRequests(reqs))
	}
	if w, _ := api.Item("/api/widgets", "1"); w["name"] != "a" {
		t.Errorf("widget 1 is %v", w)
	}
}

// TestIdempotencyScopedByCredentials: a key is the client's own: the same
// key and request from other credentials (Authorization or Cookie) runs
// anew, and never gets the first client's answer.
func TestIdempotencyScopedByCredentials(t *testing.T) {
	api := seededAPI()
	g := startIdemGateway(t, api, t.TempDir(), idemSite)
	body := `[{"id": 1, "name": "a"}]`
	send := func(cred ...string) response {
		return g.do(t, "PATCH", "/api/widgets", body, append([]string{"Idempotency-Key", "shared"}, cred...)...)
	}
	clients := [][]string{
		{"Authorization", "Bearer alice"},
		{"Authorization", "Bearer bob"},
		{"Cookie", "session=carol"},
		{"Cookie", "session=dave"},
		nil, // no credentials at all
	}
	for _, cred := range clients {
		api.ResetLog()
		if r := send(cred...); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("%v: %v", cred, r)
		}
		if n := len(writes(api.Requests())); n != 1 {
			t.Errorf("%v: %d writes upstream, want 1: the key is not shared across credentials", cred, n)
		}
	}
	api.ResetLog()
	if r := send("Authorization", "Bearer alice"); r.Header.Get("Idempotent-Replayed") != "true" || len(api.Requests()) > 0 {
		t.Errorf("alice's own retry was not replayed: %v", r)
	}
}

// TestIdempotencyScopedByHeaders: under scope_headers X-API-Key, two
// clients told apart only by that header each run their own batch with
// the same key and request, and each retry replays its own; without it
// they are one client, and the second is answered the first's batch.
func TestIdempotencyScopedByHeaders(t *testing.T) {
	body := `[{"id": 1, "name": "a"}]`
	for _, tt := range []struct {
		name, site string
		apart      bool
	}{
		{"scope_headers X-API-Key", strings.Replace(idemSite, "scope_query tenant", "scope_query tenant\n\t\tscope_headers X-API-Key", 1), true},
		{"no scope_headers", idemSite, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := seededAPI()
			g := startIdemGateway(t, api, t.TempDir(), tt.site)
			send := func(apiKey string) response {
				return g.do(t, "PATCH", "/api/widgets", body, "Idempotency-Key", "shared", "X-API-Key", apiKey)
			}
			if r := send("alice"); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("alice: %v", r)
			}
			api.ResetLog()
			r := send("bob")
			replayed := r.Header.Get("Idempotent-Replayed") == "true"
			if writes := len(writes(api.Requests())); tt.apart && (replayed || writes != 1) {
				t.Errorf("bob was answered alice's batch (replayed %t, %d writes upstream): the key is shared across X-API-Keys", replayed, writes)
			} else if !tt.apart && (!replayed || writes != 0) {
				t.Errorf("without scope_headers bob is not alice (replayed %t, %d writes): the test no longer shows why the option exists", replayed, writes)
			}
			api.ResetLog()
			if r := send("alice"); r.Header.Get("Idempotent-Replayed") != "true" || len(api.Requests()) > 0 {
				t.Errorf("alice's own retry was not replayed: %v", r)
			}
		})
	}
}

// TestIdempotencyRefusedBatchGivesItsKeyBack: a batch refused before it
// sent anything (another write held its item) is not recorded: the
// client was told to try again, and the same key then runs.
func TestIdempotencyRefusedBatchGivesItsKeyBack(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/slow", WriteDelay: time.Second, Seed: records("s", 1, 3)})
	g := startIdemGateway(t, api, t.TempDir(), `
	batch {
		batch_timeout 200ms
		resource /api/slow {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	var wg sync.WaitGroup
	var singleErr error
	wg.Go(func() { _, singleErr = g.try("PATCH", "/api/slow/1", `{"name": "single"}`) })
	eventually(t, 5*time.Second, "the single write to reach the API", func() bool { return api.InFlight() > 0 })
	key := []string{"Idempotency-Key", "locked-out"}
	body := `[{"id": 1, "name": "batch"}]`
	r := g.do(t, "PATCH", "/api/slow", body, key...)
	if r.Status != 409 {
		t.Fatalf("a batch on a locked item: %v", r)
	}
	wg.Wait()
	if singleErr != nil {
		t.Fatal(singleErr)
	}
	api.ResetLog()
	r = g.do(t, "PATCH", "/api/slow", body, key...)
	if r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" || len(writes(api.Requests())) != 1 {
		t.Errorf("the key was not given back: %v", r)
	}
}

// TestIdempotencyStoredStates: what a request finds in a record left by
// another gateway. A claim whose owner stopped renewing it (it died
// mid-batch) is neither run again (the items' upstream keys would be
// replayed) nor waited for: 409 without Retry-After. An answer too large
// to keep is 409 too, and an unreadable record counts as none.
func TestIdempotencyStoredStates(t *testing.T) {
	api := seededAPI()
	dir := t.TempDir()
	g := startIdemGateway(t, api, dir, idemSite)
	storage := &certmagic.FileStorage{Path: dir}
	now := time.Now()
	cases := []struct {
		name   string
		record func(fingerprint string) []byte
		status int
		kind   string
	}{
		{"abandoned", func(fp string) []byte {
			return mustJSON(t, durable.Record{Version: 1, State: durable.StateInFlight, Fingerprint: fp, Owner: "dead",
				LeaseUntil: now.Add(-time.Second), Created: now.Add(-time.Minute), Expires: now.Add(time.Hour)})
		}, 409, "idempotency-key-abandoned"},
		{"answer not kept", func(fp string) []byte {
			return mustJSON(t, durable.Record{Version: 1, State: durable.StateDone, Fingerprint: fp, Created: now, Expires: now.Add(time.Hour),
				Outcome: "succeeded", Answer: &durable.Answer{Status: 200}, AnswerSize: 20 << 20})
		}, 409, "idempotency-answer-not-kept"},
		{"unreadable", func(string) []byte { return []byte(`{"v": 1, "state": `) }, 200, ""},
		// A newer build's (a cluster being upgraded): its batch may be
		// running on an upgraded instance, so this one runs nothing.
		{"newer", func(string) []byte { return []byte(`{"v": 99}`) }, 503, "idempotency-unavailable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := `[{"id": 1, "name": "a"}]`
			key := "stored-" + c.name
			// The request the other gateway served, as its record names
			// it: this gateway serves it once, and its record's key and
			// fingerprint are the other gateway's.
			ctx := context.Background()
			kept, err := storage.List(ctx, durable.IdempotencyPrefix, true)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			if r := g.do(t, "PATCH", "/api/widgets", body, "Idempotency-Key", key); r.Status != 200 {
				t.Fatalf("the first request: %v", r)
			}
			all, err := storage.List(ctx, durable.IdempotencyPrefix, true)
			if err != nil {
				t.Fatal(err)
			}
			var record string
			for _, k := range all {
				if !slices.Contains(kept, k) {
					record = k
				}
			}
			var first durable.Record
			if raw, err := storage.Load(ctx, record); err != nil || json.Unmarshal(raw, &first) != nil || first.Fingerprint == "" {
				t.Fatalf("no record of the first request among %v (%v)", all, err)
			}
			if err := storage.Store(ctx, record, c.record(first.Fingerprint)); err != nil {
				t.Fatal(err)
			}
			api.ResetLog()
			r := g.do(t, "PATCH", "/api/widgets", body, "Idempotency-Key", key)
			if c.kind == "" {
				if r.Status != c.status || r.Header.Get("Idempotent-Replayed") != "" || len(writes(api.Requests())) != 1 {
					t.Errorf("%v, want it run anew", r)
				}
				return
			}
			checkIdemProblem(t, r, c.status, c.kind)
			if r.Header.Get("Retry-After") != "" && c.status != 503 {
				t.Errorf("Retry-After %q on a key that will never run", r.Header.Get("Retry-After"))
			}
			if reqs := api.Requests(); len(reqs) > 0 {
				t.Errorf("requests upstream:%s", describeRequests(reqs))
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// checkIdemProblem checks a problem+json answer of the given type.
func checkIdemProblem(t *testing.T, r response, status int, kind string) {
	t.Helper()
	if r.Status != status || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%v, want %d problem+json", r, status)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal(r.Body, &p); err != nil || !strings.HasSuffix(p.Type, "#problem-"+kind) || p.Status != status || p.Detail == "" {
		t.Errorf("problem %+v (%v), want type %s", p, err, kind)
	}
}

// TestIdempotencyConcurrentCopies sends each of several keyed batch
// writes five times at once, some copies with another body. Whatever the
// interleaving, each batch runs once: the legacy API carries out each of
// its item writes at most once, every copy with the first's body is
// answered either 409 (the first still running) or exactly as the first,
// and every copy with another body 409 or 422.
func TestIdempotencyConcurrentCopies(t *testing.T) {
	const keys, copies = 8, 5
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 20 * time.Millisecond, Seed: records("w", 1, 2*keys)})
	g := startIdemGateway(t, api, t.TempDir(), `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: keys * copies}}
	defer client.CloseIdleConnections()
	body := func(k, variant int) string {
		return fmt.Sprintf(`[{"id": %d, "name": "k%d-%d"}, {"id": %d, "name": "k%d-%d"}]`, 2*k+1, k, variant, 2*k+2, k, variant)
	}
	answers := make([][copies]response, keys)
	var wg sync.WaitGroup
	for k := range keys {
		for c := range copies {
			wg.Go(func() {
				// Staggered, so that some copies meet the first running
				// and some find it done.
				time.Sleep(time.Duration(rand.IntN(c*80+1)) * time.Millisecond)
				r, err := sendHeader(client, g.URL, "PATCH", "/api/widgets", body(k, c/4), http.Header{"Idempotency-Key": {fmt.Sprintf(`"key-%d"`, k)}})
				if err != nil {
					t.Errorf("key %d copy %d: %v", k, c, err)
				}
				answers[k][c] = r
			})
		}
	}
	wg.Wait()

	applied := map[string]int{}
	for _, w := range api.AppliedWrites() {
		applied[w.Path]++
	}
	for path, n := range applied {
		if n != 1 {
			t.Errorf("%s was written %d times", path, n)
		}
	}
	seen := map[string]int{}
	defer func() { t.Logf("answers: %v", seen) }()
	for k := range keys {
		var first *response
		for c := range copies {
			if r := &answers[k][c]; r.Status == http.StatusOK && r.Header.Get("Idempotent-Replayed") == "" {
				if first != nil {
					t.Fatalf("key %d ran twice: %v and %v", k, *first, *r)
				}
				first = r
			}
		}
		if first == nil {
			t.Fatalf("key %d never ran: %v", k, answers[k])
		}
		var ran struct {
			Items []struct{ Body struct{ Name string } }
		}
		if err := json.Unmarshal(first.Body, &ran); err != nil || len(ran.Items) != 2 {
			t.Fatalf("key %d: %v", k, *first)
		}
		firstVariant := strings.HasSuffix(ran.Items[0].Body.Name, "-1")
		for c := range copies {
			r := answers[k][c]
			sameBody := (c/4 == 1) == firstVariant
			seen[fmt.Sprintf("%d replayed=%s", r.Status, r.Header.Get("Idempotent-Replayed"))]++
			switch {
			case &answers[k][c] == first:
			case r.Status == http.StatusConflict:
				checkIdemProblem(t, r, 409, "idempotency-key-in-use")
			case !sameBody:
				checkIdemProblem(t, r, 422, "idempotency-key-reused")
			case r.Header.Get("Idempotent-Replayed") != "true" || r.Status != first.Status || !bytes.Equal(r.Body, first.Body):
				t.Errorf("key %d copy %d: %v, want 409 or the first's answer replayed (%v)", k, c, r, *first)
			}
		}
	}
}
