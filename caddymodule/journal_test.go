package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// memStorage is a certmagic.Storage in memory that counts its writes and
// can be made to fail them.
type memStorage struct {
	mu     sync.Mutex
	keys   map[string][]byte
	stores int
	fail   error // returned by Store when set
}

func newMemStorage() *memStorage { return &memStorage{keys: map[string][]byte{}} }

func (s *memStorage) Lock(context.Context, string) error   { return nil }
func (s *memStorage) Unlock(context.Context, string) error { return nil }

func (s *memStorage) Store(_ context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.stores++
	s.keys[key] = bytes.Clone(value)
	return nil
}

func (s *memStorage) Load(_ context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.keys[key]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return bytes.Clone(v), nil
}

func (s *memStorage) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.keys {
		if k == key || strings.HasPrefix(k, key+"/") {
			delete(s.keys, k)
		}
	}
	return nil
}

func (s *memStorage) Exists(ctx context.Context, key string) bool {
	_, err := s.Load(ctx, key)
	return err == nil
}

func (s *memStorage) List(_ context.Context, prefix string, recursive bool) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.keys {
		rest, ok := strings.CutPrefix(k, prefix+"/")
		if !ok {
			continue
		}
		if first, _, nested := strings.Cut(rest, "/"); nested && !recursive {
			k = prefix + "/" + first
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fs.ErrNotExist
	}
	return out, nil
}

func (s *memStorage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	v, err := s.Load(ctx, key)
	return certmagic.KeyInfo{Key: key, Size: int64(len(v)), IsTerminal: true}, err
}

func (s *memStorage) String() string { return "memStorage" }

func (s *memStorage) count() (keys, stores int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys), s.stores
}

// directSender sends a saga's sub-requests straight to the upstream, as
// a gateway's chain would; before each write it calls check.
type directSender struct {
	base   string
	client *http.Client
	check  func(req *batch.SubRequest)
}

func (s *directSender) Send(ctx context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	if s.check != nil {
		s.check(sr)
	}
	u := s.base + sr.Path
	if sr.RawQuery != "" {
		u += "?" + sr.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, sr.Method, u, bytes.NewReader(sr.Body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", batch.ErrNotSent, err)
	}
	req.Header = sr.Header.Clone()
	if sr.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return &batch.SubResponse{Status: resp.StatusCode, Header: resp.Header, Body: body}, err
}

// planOf plans a batch as the handler configured by site's one batch
// block would (a Caddyfile batch directive).
func planOf(t *testing.T, directive, method, target, body string, header ...string) (*Handler, *batch.Plan) {
	t.Helper()
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(directive)); err != nil {
		t.Fatal(err)
	}
	p, err := h.buildPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	h.policy = p
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	r.Header.Set("Authorization", "Bearer journal-test")
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] != "" {
			r.Header.Set(header[i], header[i+1])
		}
	}
	m, ok := p.Lookup(r.URL.EscapedPath())
	if !ok {
		t.Fatalf("no resource at %s", target)
	}
	_, isBatch, plan, prob := batch.Admit(r, m)
	switch {
	case !isBatch:
		t.Fatalf("%s %s is no batch", method, target)
	case prob != nil:
		t.Fatalf("%s %s: %s", method, target, prob.Detail)
	}
	return &h, plan
}

// storedItem finds, in what the journal holds in storage, the item whose
// recorded request is method on path.
func storedItems(t *testing.T, s certmagic.Storage, saga string) []batch.ItemSnapshot {
	t.Helper()
	ctx := context.Background()
	keys, err := s.List(ctx, path.Join(journalPrefix, saga), false)
	if err != nil {
		t.Fatalf("reading the journal back: %v", err)
	}
	slices.Sort(keys)
	var items []batch.ItemSnapshot
	for _, k := range keys {
		if !strings.HasPrefix(path.Base(k), "seg.") {
			continue
		}
		b, err := s.Load(ctx, k)
		if err != nil {
			t.Fatalf("reading the journal back: %v", err)
		}
		var seg struct {
			Intent *struct {
				Snapshot *batch.Snapshot `json:"snapshot"`
			} `json:"intent"`
			Items []struct {
				Index int                `json:"i"`
				Item  batch.ItemSnapshot `json:"item"`
			} `json:"items"`
		}
		if err := json.Unmarshal(b, &seg); err != nil {
			t.Fatalf("decoding %s: %v", k, err)
		}
		if seg.Intent != nil {
			items = seg.Intent.Snapshot.Items
		}
		for _, it := range seg.Items {
			items[it.Index] = it.Item
		}
	}
	return items
}

// journalPrefix is where the journals are in storage.
const journalPrefix = "batch/v1/journal"

// newJournals keeps journals in s, under a lease of a minute.
func newJournals(s certmagic.Storage) *durable.Journals {
	return durable.NewJournals(durableStorage(s), durable.NewLeases(time.Minute), zap.NewNop())
}

// TestJournalWriteAhead runs an all-or-nothing update whose last item
// fails, so that every other item is written and then undone, and checks
// at the moment each write and each undo reaches the upstream that the
// journal in storage already says it is being sent; that the journal
// costs one storage write per request that changes the upstream, no
// more; and that nothing is left in storage at the end.
func TestJournalWriteAhead(t *testing.T) {
	api := seededAPI()
	api.Inject(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/5", Status: 500, Body: htmlError})
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	before := api.Items("/api/widgets")

	_, plan := planOf(t, `batch {
		concurrency 2
		resource /api/widgets {`+resourceMethods+`
		}
	}`, "PATCH", "/api/widgets", `[{"id":1,"name":"a"},{"id":2,"name":"b"},{"id":3,"name":"c"},{"id":4,"name":"d"},{"id":5,"name":"e"}]`)
	storage := newMemStorage()
	j := newJournals(storage).New(originOf(httptest.NewRequest("PATCH", "/api/widgets", nil)))
	var mu sync.Mutex
	var checked, changes int
	sender := &directSender{base: upstream.URL, client: upstream.Client(), check: func(req *batch.SubRequest) {
		if req.Method == http.MethodGet {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		changes++
		for _, it := range storedItems(t, storage, j.Saga()) {
			switch {
			case it.Phase == batch.PhaseSending && it.Sent != nil && it.Sent.Method == req.Method && it.Sent.Path == req.Path,
				it.Phase == batch.PhaseUndoing && it.Undo != nil && it.Undo.Method == req.Method && it.Undo.Path == req.Path:
				if got := it.Sent.Header.Get("Authorization"); got != "Bearer journal-test" {
					t.Errorf("the journal keeps Authorization %q, want the client's, for the undo", got)
				}
				checked++
				return
			}
		}
		t.Errorf("%s %s reached the upstream before the journal recorded it", req.Method, req.Path)
	}}
	res := batch.Run(context.Background(), plan, batch.Runtime{Send: sender, Journal: j})

	if res.Outcome != batch.RolledBack {
		t.Fatalf("outcome %s, want rolled_back: %s", res.Outcome, res.Detail)
	}
	// 5 PATCHes (the fifth failed) and 4 PUTs putting the pre-images back.
	if changes != 9 || checked != changes {
		t.Errorf("%d of %d writes and undos were recorded before they were sent, want 9 of 9", checked, changes)
	}
	keys, stores := storage.count()
	if stores > changes {
		t.Errorf("the journal wrote storage %d times for %d requests that change the upstream; want one each at the most", stores, changes)
	}
	if keys != 0 {
		t.Errorf("%d keys left in storage after the saga ended", keys)
	}
	if after := api.Items("/api/widgets"); !reflect.DeepEqual(after, before) {
		t.Errorf("the upstream was not put back:\n got %v\nwant %v", after, before)
	}
}

// TestJournalRefusesWhatItCannotRecord checks that a write whose record
// cannot be stored is not sent: the batch fails with nothing changed.
func TestJournalRefusesWhatItCannotRecord(t *testing.T) {
	api := seededAPI()
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	_, plan := planOf(t, `batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}`, "PATCH", "/api/widgets", `[{"id":1,"name":"a"},{"id":2,"name":"b"}]`)
	storage := newMemStorage()
	storage.fail = errors.New("the disk is full")
	pending := durable.Pending()
	j := newJournals(storage).New(originOf(httptest.NewRequest("PATCH", "/api/widgets", nil)))
	res := batch.Run(context.Background(), plan, batch.Runtime{Send: &directSender{base: upstream.URL, client: upstream.Client()}, Journal: j})
	if res.Outcome != batch.Failed || res.Items[0].Status != http.StatusServiceUnavailable {
		t.Errorf("outcome %s, item 0 %d; want failed, 503: %s", res.Outcome, res.Items[0].Status, res.Detail)
	}
	if w := writes(api.Requests()); len(w) != 0 {
		t.Errorf("writes reached the upstream with no journal:%s", describeRequests(w))
	}
	if n := durable.Pending(); n != pending {
		t.Errorf("%d sagas counted as running, %d before: the saga is still counted", n, pending)
	}
}

// journalKeys lists what the journal holds in a file system storage.
func journalKeys(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, filepath.FromSlash(journalPrefix)), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			out = append(out, path)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

// TestJournalLeavesNothing runs batches that succeed, are rolled back and
// leave items behind, on the file system storage, and checks that each
// kept a journal while it ran and left nothing in storage once it ended.
func TestJournalLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	api := seededAPI()
	g := startJournalGateway(t, api, dir, "", `
	batch {
		compensation_retries 0
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	slow := 300 * time.Millisecond
	for _, tc := range []struct {
		name, method, path, body string
		faults                   []legacyapi.Fault
		outcome                  string
	}{
		{"create succeeds", "POST", "/api/widgets", `[{"name":"x"},{"name":"y"}]`,
			[]legacyapi.Fault{{Method: "POST", Path: "/api/widgets", Delay: slow, Times: 1}}, "succeeded"},
		{"update succeeds", "PATCH", "/api/widgets", `[{"id":1,"name":"x"},{"id":2,"name":"y"}]`,
			[]legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/1", Delay: slow, Times: 1}}, "succeeded"},
		{"delete succeeds", "DELETE", "/api/gadgets?ids=3,4", "",
			[]legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/3", Delay: slow, Times: 1}}, "succeeded"},
		{"update rolled back", "PATCH", "/api/widgets", `[{"id":5,"name":"x"},{"id":6,"name":"y"}]`,
			[]legacyapi.Fault{{Method: "PATCH", Path: "/api/widgets/5", Delay: slow, Times: 1}, {Method: "PATCH", Path: "/api/widgets/6", Status: 500, Body: htmlError}}, "rolled_back"},
		{"delete leaves an item behind", "DELETE", "/api/gadgets?ids=7,8", "",
			[]legacyapi.Fault{{Method: "DELETE", Path: "/api/gadgets/7", Delay: slow, Times: 1}, {Method: "DELETE", Path: "/api/gadgets/8", Status: 500, Body: htmlError}, {Method: "PUT", Path: "/api/gadgets/7", Status: 500, Body: htmlError}}, "rollback_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api.ClearFaults()
			for _, f := range tc.faults {
				api.Inject(f)
			}
			done := make(chan response, 1)
			go func() {
				r, err := send(g.client, g.URL, tc.method, tc.path, tc.body)
				if err != nil {
					r = response{Status: -1, Body: []byte(err.Error())}
				}
				done <- r
			}()
			var during []string
			for deadline := time.Now().Add(slow); len(during) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				during = journalKeys(t, dir)
			}
			if len(during) == 0 {
				t.Error("no journal in storage while the batch ran")
			}
			r := <-done
			if got := r.JSON(t)["outcome"]; got != tc.outcome {
				t.Fatalf("outcome %v, want %s: %s", got, tc.outcome, r)
			}
			if left := journalKeys(t, dir); len(left) != 0 {
				t.Errorf("left in storage after the batch: %v", left)
			}
		})
	}
}

// startJournalGateway is startGateway with Caddy's storage in dir and the
// batch app's global options (e.g. "lease 1s").
func startJournalGateway(t *testing.T, api *legacyapi.API, dir, app, site string) *gateway {
	t.Helper()
	upstream := httptest.NewServer(api)
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	return startJournalGatewayTo(t, api, upstream.Listener.Addr().String(), dir, app, site)
}

func startJournalGatewayTo(t *testing.T, api *legacyapi.API, upstream, dir, app, site string) *gateway {
	t.Helper()
	return startJournalGatewayAt(t, api, upstream, freeAddr(t), dir, app, site)
}

// slowStorage is a storage whose every store takes a while, as a synced
// file does.
type slowStorage struct {
	*memStorage
	delay time.Duration
}

func (s slowStorage) Store(ctx context.Context, key string, value []byte) error {
	time.Sleep(s.delay)
	return s.memStorage.Store(ctx, key, value)
}

// TestJournalGroupCommit: writes that start together share one store of
// their records, and none is sent before its own record is stored.
func TestJournalGroupCommit(t *testing.T) {
	api := seededAPI()
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	var elems []string
	for i := range 16 {
		elems = append(elems, fmt.Sprintf(`{"name":"g%d"}`, i))
	}
	_, plan := planOf(t, `batch {
		concurrency 8
		resource /api/widgets {`+resourceMethods+`
		}
	}`, "POST", "/api/widgets", "["+strings.Join(elems, ",")+"]")
	mem := newMemStorage()
	storage := slowStorage{mem, 20 * time.Millisecond}
	j := newJournals(storage).New(originOf(httptest.NewRequest("POST", "/api/widgets", nil)))
	var mu sync.Mutex
	var recorded, writes int
	sender := &directSender{base: upstream.URL, client: upstream.Client(), check: func(req *batch.SubRequest) {
		if req.Method == http.MethodGet {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		writes++
		if counted(metrics.pending) < 1 {
			t.Error("caddy_http_batch_journals_pending does not count the saga in flight")
		}
		for _, it := range storedItems(t, storage, j.Saga()) {
			if it.Phase >= batch.PhaseSending && it.Sent != nil && it.Sent.Header.Get("Idempotency-Key") == req.Header.Get("Idempotency-Key") {
				recorded++
				return
			}
		}
		t.Errorf("a create reached the upstream before the journal recorded it")
	}}
	if res := batch.Run(context.Background(), plan, batch.Runtime{Send: sender, Journal: j}); res.Outcome != batch.Succeeded {
		t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
	}
	if n := counted(metrics.pending); n != 0 {
		t.Errorf("caddy_http_batch_journals_pending is %v after the saga ended, want 0", n)
	}
	if writes != 16 || recorded != writes {
		t.Errorf("%d of %d creates were recorded before they were sent, want 16 of 16", recorded, writes)
	}
	if _, stores := mem.count(); stores >= writes {
		t.Errorf("%d stores for %d creates sent 8 at a time: their records were not stored together", stores, writes)
	}
}
