package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

// railsAPI is a legacy API with state, in the habits that leave deletes
// behind: a PUT of a missing id is 404 (it cannot create), and a POST
// ignores the id it is given unless postKeepsIDs. Writes to failPath
// answer 500.
type railsAPI struct {
	mu           sync.Mutex
	items        map[string]string
	next         int
	postKeepsIDs bool
	failPath     string
	auth         []string // the Authorization of each write and undo
	posts        int
}

func newRailsAPI(ids ...string) *railsAPI {
	a := &railsAPI{items: map[string]string{}, next: 100}
	for _, id := range ids {
		a.items[id] = fmt.Sprintf(`{"id":"%s","name":"person %s","email":"p%s@example.com"}`, id, id, id)
	}
	return a
}

func (a *railsAPI) Send(_ context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := strings.TrimPrefix(sr.Path, "/widgets/")
	if sr.Method != http.MethodGet {
		a.auth = append(a.auth, sr.Header.Get("Authorization"))
	}
	if sr.Method != http.MethodGet && sr.Path == a.failPath {
		return answer(500, ""), nil
	}
	switch {
	case sr.Method == http.MethodPost:
		a.posts++
		var v map[string]any
		_ = json.Unmarshal(sr.Body, &v)
		if _, ok := v["id"].(string); !ok || !a.postKeepsIDs {
			a.next++
			v["id"] = fmt.Sprint(a.next)
		}
		b, _ := json.Marshal(v)
		a.items[v["id"].(string)] = string(b)
		return answer(201, string(b)), nil
	case a.items[id] == "":
		return answer(404, ""), nil
	case sr.Method == http.MethodGet:
		return answer(200, a.items[id]), nil
	case sr.Method == http.MethodDelete:
		delete(a.items, id)
		return answer(204, ""), nil
	}
	a.items[id] = string(sr.Body)
	return answer(200, string(sr.Body)), nil
}

func answer(status int, body string) *batch.SubResponse {
	r := &batch.SubResponse{Status: status, Header: http.Header{}}
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
		r.Body = []byte(body)
	}
	return r
}

func (a *railsAPI) has(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.items[id] != ""
}

// widgetsRestoring is the policy of /widgets (string ids) whose deletes
// are restored by restore.
func widgetsRestoring(t *testing.T, restore policy.Restore) *policy.Policy {
	t.Helper()
	s := policy.Defaults()
	s.RestoreDeleted = restore
	s.CompensationRetries = 0
	s.ScopeQuery = []string{"tenant"}
	p, err := policy.New([]policy.ResourceSpec{{
		Path:              "/widgets",
		CollectionMethods: []string{"GET", "POST", "DELETE"},
		ItemMethods:       []string{"GET", "PUT", "DELETE"},
		Settings:          s,
		Gateway:           policy.GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// leaveBehind runs an all-or-nothing DELETE of widgets 1 and 2, the
// second failing, in front of api (whose PUT cannot create): widget 1
// is deleted and cannot be put back, so the saga is kept.
func leaveBehind(t *testing.T, js *Journals, api *railsAPI) string {
	t.Helper()
	p := widgetsRestoring(t, policy.RestorePut)
	r := httptest.NewRequest("DELETE", "/widgets?ids=1,2&tenant=acme", nil)
	r.Header.Set("Authorization", "Bearer client-secret")
	r.Header.Set("Accept", "application/json")
	m, _ := p.Lookup("/widgets")
	_, _, plan, prob := batch.Admit(r, m)
	if prob != nil {
		t.Fatal(prob.Detail)
	}
	j := js.New(Origin{Server: "srv0", Method: "DELETE", URI: "/widgets?ids=1,2&tenant=acme", Host: "example.com",
		RemoteAddr: "192.0.2.7:5000", Resource: "/widgets", ScopeQuery: []string{"tenant"}})
	api.failPath = "/widgets/2"
	res := batch.Run(context.Background(), plan, batch.Runtime{Send: api, Journal: j})
	api.failPath = ""
	if res.Outcome != batch.RollbackFailed {
		t.Fatalf("outcome %s, want rollback_failed: %s", res.Outcome, res.Detail)
	}
	return j.Saga()
}

// A saga that leaves items behind is kept, and its journal removed: it is
// listed from its summary (URI redacted), shown whole with its pre-image
// and no credential value, and nothing stored holds the client's
// credential.
func TestKeptSagaIsListedAndShownWithoutCredentials(t *testing.T) {
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	api := newRailsAPI("1", "2")
	saga := leaveBehind(t, js, api)
	ctx := context.Background()

	list, err := js.ListSagas(ctx, SagaQuery{})
	if err != nil || len(list) != 1 {
		t.Fatalf("listed %+v, %v; want the one kept saga", list, err)
	}
	got := list[0]
	if got.ID != saga || got.State != StateLeftBehind || got.Items != 2 || got.LeftBehind != 1 || got.Ended == nil ||
		got.URI != "/widgets?ids=1,2&tenant=[redacted]" || got.Resource != "/widgets" || got.Reason == "" {
		t.Errorf("summary %+v", got)
	}
	v, err := js.Saga(ctx, saga)
	if err != nil {
		t.Fatal(err)
	}
	if v.Headers["Authorization"] != "[redacted]" || v.Headers["Accept"] != "application/json" || v.ClientAddress != "192.0.2.7:5000" {
		t.Errorf("headers %v, client %q", v.Headers, v.ClientAddress)
	}
	it := v.Items[0]
	if it.Outcome != batch.RollbackFailed || !strings.Contains(string(it.Preimage), "p1@example.com") || it.Reason == "" ||
		it.Request == nil || it.Request.Headers["Authorization"] != "[redacted]" || it.Undo == nil || it.Undo.Method != "PUT" {
		t.Errorf("item 0 %+v", it)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, b := range s.keys {
		if strings.HasPrefix(k, journalPrefix) {
			t.Errorf("journal key %s left after the saga ended", k)
		}
		if bytes.Contains(b, []byte("client-secret")) {
			t.Errorf("%s holds the client's credential: %s", k, b)
		}
	}
}

// After the cause is fixed (restore_deleted post, an API that keeps the
// ids it is given), a retry with the operator's credential puts the
// item back, and the saga is gone from storage; a second retry of the
// same id is unknown.
func TestRetryFinishesAKeptSaga(t *testing.T) {
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	api := newRailsAPI("1", "2")
	saga := leaveBehind(t, js, api)
	api.postKeepsIDs = true
	api.auth = nil
	res := retry(t, js, saga, widgetsRestoring(t, policy.RestorePost), api)
	if res.Outcome != batch.RolledBack || !api.has("1") {
		t.Fatalf("retry: %s (%s); widget 1 back: %v", res.Outcome, res.Detail, api.has("1"))
	}
	if strings.Join(api.auth, " ") != "Bearer operator" {
		t.Errorf("the retry's writes carried %q, want the operator's credential only", api.auth)
	}
	if keys, _ := s.count(); keys != 0 {
		t.Errorf("%d keys left after the retry: %v", keys, s.keys)
	}
	if _, err := js.Revive(context.Background(), saga, nil); !errors.Is(err, ErrUnknownSaga) {
		t.Errorf("a retry of a finished saga: %v, want ErrUnknownSaga", err)
	}
}

// retry revives saga and undoes what it left, under p.
func retry(t *testing.T, js *Journals, saga string, p *policy.Policy, api *railsAPI) *batch.Result {
	t.Helper()
	rv, err := js.Revive(context.Background(), saga, http.Header{"Authorization": {"Bearer operator"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := batch.Retry(context.Background(), rv.Snapshot, rv.Prev, p.Lookup, nil, batch.Runtime{Send: api, Journal: rv.Journal})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// While the cause persists a retry leaves the item and says why; a POST
// restore that the API gave another id is recorded and never sent again.
func TestRetryNeverResendsARestoreThatGotAnotherID(t *testing.T) {
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	api := newRailsAPI("1", "2")
	saga := leaveBehind(t, js, api)
	if res := retry(t, js, saga, widgetsRestoring(t, policy.RestorePut), api); res.Outcome != batch.RollbackFailed || api.has("1") {
		t.Fatalf("retry with the cause unfixed: %s", res.Outcome)
	}
	post := widgetsRestoring(t, policy.RestorePost)
	res := retry(t, js, saga, post, api)
	if res.Outcome != batch.RollbackFailed || api.posts != 1 {
		t.Fatalf("retry by POST: %s, %d posts", res.Outcome, api.posts)
	}
	v, err := js.Saga(context.Background(), saga)
	if err != nil || v.State != StateLeftBehind || v.Items[0].Compensation == nil || v.Items[0].Compensation.CreatedID != "101" {
		t.Fatalf("after the POST that got id 101: %+v, %v", v, err)
	}
	if res := retry(t, js, saga, post, api); res.Outcome != batch.RollbackFailed || api.posts != 1 {
		t.Errorf("a second retry: %s, %d posts; want the restore never sent again", res.Outcome, api.posts)
	}
	if v, _ := js.Saga(context.Background(), saga); v == nil || v.Items[0].Compensation.CreatedID != "101" {
		t.Errorf("the new id is no longer shown after a second retry: %+v", v)
	}
}

// keptFailing is a storage whose stores of kept sagas fail while fail is
// set.
type keptFailing struct {
	*memStorage
	mu   sync.Mutex
	fail bool
}

func (s *keptFailing) Store(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	fail := s.fail
	s.mu.Unlock()
	if fail && strings.HasPrefix(key, sagasPrefix) {
		return errors.New("the storage is unreachable")
	}
	return s.memStorage.Store(ctx, key, value)
}

// A saga whose kept copy cannot be stored keeps its journal (and lease)
// and is kept once the storage works again: never both lost.
func TestKeepingThatFailsKeepsTheJournal(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := &keptFailing{memStorage: newMemStorage(), fail: true}
		js := NewJournals(s, NewLeases(60*time.Millisecond), zap.NewNop())
		saga := leaveBehind(t, js, newRailsAPI("1", "2"))
		ctx := context.Background()
		list, err := js.ListSagas(ctx, SagaQuery{})
		if err != nil || len(list) != 1 || list[0].State != StateRunning {
			t.Fatalf("while the kept copy cannot be stored: %+v, %v; want its journal, running", list, err)
		}
		s.mu.Lock()
		s.fail = false
		s.mu.Unlock()
		deadline := time.Now().Add(5 * time.Second)
		for owned.has(saga) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		list, err = js.ListSagas(ctx, SagaQuery{})
		if err != nil || len(list) != 1 || list[0].State != StateLeftBehind {
			t.Fatalf("after the storage came back: %+v, %v; want it kept", list, err)
		}
		keys, _ := js.sagas(ctx)
		if len(keys) != 0 {
			t.Errorf("journals left: %v", keys)
		}
	})
}

// storeIntent stores a journal's segment 0 as a batch would, owned by
// owner until expires.
func storeIntent(t *testing.T, s Storage, saga, owner string, started, expires time.Time) {
	t.Helper()
	in := &intent{Saga: saga, Owner: owner, Expires: expires, Started: started,
		Origin:   Origin{Server: "srv0", Method: "PATCH", URI: "/widgets", Resource: "/widgets"},
		Snapshot: &batch.Snapshot{Version: batch.SnapshotVersion, Op: "update", Path: "/widgets", Items: []batch.ItemSnapshot{{ID: "1"}}}}
	b, _ := json.Marshal(segment{Version: journalVersion, Intent: in})
	if err := s.Store(context.Background(), segmentKey(saga, 0), b); err != nil {
		t.Fatal(err)
	}
}

// A listing names every saga by state, newest first, in pages; a
// journal whose owner's lease lapsed is orphaned, one that recovery gave
// up on is stuck with the reason; a running saga cannot be resolved, a
// kept one can, and an unknown id is unknown.
func TestListingStatesPagesAndResolve(t *testing.T) {
	s := newMemStorage()
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	now := time.Now()
	storeIntent(t, s, "aa01", "another/1", now.Add(-4*time.Second), now.Add(time.Minute))
	storeIntent(t, s, "aa02", "another/2", now.Add(-3*time.Second), now.Add(-time.Second))
	storeIntent(t, s, "aa03", Owner(), now.Add(-2*time.Second), now.Add(-time.Second))
	js.MarkStuck(ctx, "aa03", "no resource is configured for /widgets")
	kept := leaveBehind(t, js, newRailsAPI("1", "2"))

	list, err := js.ListSagas(ctx, SagaQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range list {
		got = append(got, s.ID[:4]+":"+s.State)
	}
	want := kept[:4] + ":left_behind aa03:stuck aa02:orphaned aa01:running"
	if strings.Join(got, " ") != want {
		t.Errorf("listed %v, want %s", got, want)
	}
	if list[1].Reason != "no resource is configured for /widgets" || list[2].Reason != "" {
		t.Errorf("reasons %q, %q", list[1].Reason, list[2].Reason)
	}
	page, _ := js.ListSagas(ctx, SagaQuery{Limit: 2, After: list[1].ID})
	if len(page) != 2 || page[0].ID != "aa02" || page[1].ID != "aa01" {
		t.Errorf("the page after %s: %+v", list[1].ID, page)
	}
	only, _ := js.ListSagas(ctx, SagaQuery{State: StateStuck})
	if len(only) != 1 || only[0].ID != "aa03" {
		t.Errorf("stuck only: %+v", only)
	}
	counts, err := js.CountSagas(ctx)
	if err != nil || counts[StateRunning] != 1 || counts[StateOrphaned] != 1 || counts[StateStuck] != 1 || counts[StateLeftBehind] != 1 {
		t.Errorf("counts %v, %v", counts, err)
	}

	if _, err := js.Resolve(ctx, "aa01"); !errors.Is(err, ErrSagaRunning) {
		t.Errorf("resolving a running saga: %v", err)
	}
	if _, err := js.Revive(ctx, "aa01", nil); !errors.Is(err, ErrSagaRunning) {
		t.Errorf("retrying a running saga: %v", err)
	}
	if _, err := js.Resolve(ctx, "ffff"); !errors.Is(err, ErrUnknownSaga) {
		t.Errorf("resolving an unknown saga: %v", err)
	}
	v, err := js.Resolve(ctx, kept)
	if err != nil || v.State != StateLeftBehind || strings.Join(v.ItemIDs(), ",") != "1" {
		t.Fatalf("resolve: %+v, %v", v, err)
	}
	if _, err := js.Resolve(ctx, "aa03"); err != nil {
		t.Fatalf("resolving a stuck saga: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.keys {
		if strings.Contains(k, kept) || strings.Contains(k, "aa03") {
			t.Errorf("%s left after the saga was resolved", k)
		}
	}
}

// loadCounting counts the loads and lists of keys under a prefix.
type loadCounting struct {
	*memStorage
	mu     sync.Mutex
	prefix string
	reads  int
}

func (s *loadCounting) Load(ctx context.Context, key string) ([]byte, error) {
	s.count(key)
	return s.memStorage.Load(ctx, key)
}

func (s *loadCounting) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	s.count(prefix)
	return s.memStorage.List(ctx, prefix, recursive)
}

func (s *loadCounting) count(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if strings.HasPrefix(key, s.prefix) {
		s.reads++
	}
}

// Kept sagas do not slow the recovery scan: a scan with 1,000 of them
// reads none.
func TestScanReadsNoKeptSaga(t *testing.T) {
	s := &loadCounting{memStorage: newMemStorage(), prefix: sagasPrefix}
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	for i := range 1000 {
		k := &Kept{Version: keptVersion, Saga: fmt.Sprintf("%032x", i), Snapshot: &batch.Snapshot{Op: "delete"}}
		if err := js.storeKept(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	storeIntent(t, s, "bb01", "another/1", time.Now(), time.Now().Add(time.Minute))
	fail := func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
	if err := js.Scan(ctx, func(*Recovered) error { return nil }, fail); err != nil {
		t.Fatal(err)
	}
	if s.reads != 0 {
		t.Errorf("the scan read %d keys of kept sagas", s.reads)
	}
	counts, _ := js.CountSagas(ctx)
	if counts[StateLeftBehind] != 1000 || s.reads != 1 {
		t.Errorf("counted %v with %d reads of kept sagas; want 1000 from one listing", counts, s.reads)
	}
}

// goldenKeptSaga is the kept saga under testdata/kept-v1 (kept-saga
// format 1): an all-or-nothing DELETE of widgets 1 and 2 in tenant acme
// (string ids), whose second DELETE failed and whose first could not be
// put back by a PUT (the API cannot create by PUT); the client sent
// Authorization: Bearer client-secret, erased from what was kept. Never
// regenerated: later builds must list, show and retry what an older
// instance kept.
const goldenKeptSaga = "859c533d87c33c77a93ae0dc5d000c92"

// The golden journals and kept saga side by side: the live journal is
// running, the dead one orphaned, the kept saga left behind; the kept
// saga is shown with widget 1's pre-image and no credential, and a
// retry under restore_deleted post finishes it.
func TestGoldenSagasListedShownRetried(t *testing.T) {
	s := storedFrom(t, goldenDir, "testdata/kept-v1")
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	list, err := js.ListSagas(ctx, SagaQuery{})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, s := range list {
		states[s.ID] = s.State
	}
	want := map[string]string{goldenLiveSaga: StateRunning, goldenDeadSaga: StateOrphaned, goldenKeptSaga: StateLeftBehind}
	if !reflect.DeepEqual(states, want) {
		t.Errorf("states %v, want %v", states, want)
	}
	v, err := js.Saga(ctx, goldenKeptSaga)
	if err != nil || v.Items[0].ID != "1" || !strings.Contains(string(v.Items[0].Preimage), "p1@example.com") ||
		v.Headers["Authorization"] != "[redacted]" || v.URI != "/widgets?ids=1,2&tenant=[redacted]" {
		t.Fatalf("the golden kept saga: %+v, %v", v, err)
	}
	api := newRailsAPI("2")
	api.postKeepsIDs = true
	if res := retry(t, js, goldenKeptSaga, widgetsRestoring(t, policy.RestorePost), api); res.Outcome != batch.RolledBack || !api.has("1") {
		t.Errorf("retry of the golden kept saga: %s (%s)", res.Outcome, res.Detail)
	}
	if _, err := js.Saga(ctx, goldenKeptSaga); !errors.Is(err, ErrUnknownSaga) {
		t.Errorf("the golden kept saga after its retry: %v", err)
	}
}

// A saga taken over (epoch 1) and left behind is kept, and its
// journal's removal leaves the end marker for the old owner to learn
// how it ended, until a scan clears it a lease later. An operator's
// retry meanwhile is refused as for a saga running: a journal written
// under the marker would be listed as no saga, and every scan would take
// it for what is left of a removal, and clear it, were the retry's
// process to die. Once the scan cleared the marker, the retry goes.
func TestNoRetryUnderAnEndMarker(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := newMemStorage()
		p := widgets(t)
		j, gone := dieMidWrite(t, s, p, 2)
		defer close(gone)
		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		ended := make(chan *batch.Result, 1)
		finish := func(r *Recovered) error {
			res, err := batch.Resume(context.Background(), r.Snapshot, p.Lookup, nil, batch.Runtime{Send: undoRefused{}, Journal: r.Journal})
			ended <- res
			return err
		}
		failed := func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
		scanAfterLease(t, js, finish, failed)
		if res := <-ended; res.Outcome != batch.RollbackFailed {
			t.Fatalf("recovered: %s (%s), want rollback_failed", res.Outcome, res.Detail)
		}
		if left := s.keysUnder(journalPrefix); !slices.Equal(left, []string{endKey(j.Saga())}) {
			t.Fatalf("left %v, want the end marker only", left)
		}
		ctx := context.Background()
		if _, err := js.Revive(ctx, j.Saga(), nil); !errors.Is(err, ErrSagaRunning) {
			t.Fatalf("a retry under the end marker: %v, want ErrSagaRunning", err)
		}
		if list, err := js.ListSagas(ctx, SagaQuery{}); err != nil || len(list) != 1 || list[0].State != StateLeftBehind {
			t.Errorf("listed %+v, %v; want the kept saga, left behind", list, err)
		}
		time.Sleep(js.leases.Length)
		if err := js.Scan(ctx, finish, failed); err != nil {
			t.Fatal(err)
		}
		rv, err := js.Revive(ctx, j.Saga(), nil)
		if err != nil {
			t.Fatalf("a retry once the marker is cleared: %v", err)
		}
		rv.abandon()
	})
}

// undoRefused is an upstream where every widget shows the dead saga's
// write, and widget 1's undo is refused.
type undoRefused struct{}

func (undoRefused) Send(_ context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	id := strings.TrimPrefix(sr.Path, "/widgets/")
	json := http.Header{"Content-Type": {"application/json"}}
	switch {
	case sr.Method == http.MethodGet:
		return &batch.SubResponse{Status: http.StatusOK, Header: json, Body: []byte(`{"id":` + id + `,"name":"new"}`)}, nil
	case id == "1":
		return &batch.SubResponse{Status: http.StatusInternalServerError, Header: http.Header{}}, nil
	}
	return &batch.SubResponse{Status: http.StatusOK, Header: json, Body: []byte(`{"id":` + id + `,"name":"old"}`)}, nil
}
