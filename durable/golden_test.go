package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/policy"
)

// The files under testdata/stored-v1 are what this gateway stored before
// the stored formats could change (journal format 1, snapshot format 1,
// Idempotency-Key record version 1), each under its storage key. They
// are never regenerated: a cluster is upgraded one instance at a time,
// so every later build must still finish, replay and respect what an
// older instance left in the shared storage. A new format gets files of
// its own beside these.
//
// What is there (docs/durability.md):
//   - journal 92b087ccc774f11242a1dde6d7d995bd: a dead saga (its lease
//     lapsed in 2026), an all-or-nothing PATCH of widgets 1 and 2 in
//     tenant a, with Authorization and Idempotency-Key golden-saga;
//     widget 1 was written and answered, widget 2's write was about to
//     be sent when the gateway died;
//   - journal 0158e24a9ffcbc6eece9d3e213bd848c: a live saga (leased until
//     2126) writing widget 1, which no other instance may take over;
//   - five Idempotency-Key records of keys golden-<name>, each with the
//     fingerprint HashFields("PATCH", "/widgets", "", "fp-<name>"):
//     replay (done, answer kept), not-kept (done, answer too large),
//     abandoned (in flight, its lease lapsed), in-flight (in flight,
//     leased until 2126) and expired (done, its time up);
//   - under jobs/, a storage of its own: the bulk jobs' formats
//     (jobsgolden_test.go). storedV1 holds them under keys beginning
//     jobs/, which nothing reads.
const (
	goldenDir       = "testdata/stored-v1"
	goldenDeadSaga  = "92b087ccc774f11242a1dde6d7d995bd"
	goldenLiveSaga  = "0158e24a9ffcbc6eece9d3e213bd848c"
	goldenOwner     = "vm/16883/f78fe060147ac66077fbc3d50fe72dca"
	goldenAuthority = "Bearer golden"
)

// storedV1 is a storage holding every golden file under its key.
func storedV1(t *testing.T) *memStorage {
	t.Helper()
	return storedFrom(t, goldenDir)
}

// storedFrom is a storage holding every file under the dirs, each under
// its key: its path below its dir.
func storedFrom(t *testing.T, dirs ...string) *memStorage {
	t.Helper()
	s := newMemStorage()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			return s.Store(context.Background(), filepath.ToSlash(rel), b)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// goldenWidgets is the policy the golden sagas ran under.
func goldenWidgets(t *testing.T) *policy.Policy {
	t.Helper()
	s := policy.Defaults()
	s.Concurrency = 1
	s.ScopeQuery = []string{"tenant"}
	p, err := policy.New([]policy.ResourceSpec{{
		Path:              "/widgets",
		CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"},
		ItemMethods:       []string{"GET", "PUT", "PATCH", "DELETE"},
		Settings:          s,
		Gateway:           policy.GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// widgetStore is an upstream with state: each widget's body, and an ETag
// that names its name.
type widgetStore struct {
	mu   sync.Mutex
	body map[string]string // by path
	log  []string
}

func (w *widgetStore) Send(_ context.Context, sr *batch.SubRequest) (*batch.SubResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf("%s %s?%s auth=%q", sr.Method, sr.Path, sr.RawQuery, sr.Header.Get("Authorization")))
	cur, ok := w.body[sr.Path]
	if !ok {
		return &batch.SubResponse{Status: 404, Header: http.Header{}}, nil
	}
	if sr.Method == http.MethodPut {
		cur = string(sr.Body)
		w.body[sr.Path] = cur
	}
	var v struct{ Name string }
	_ = json.Unmarshal([]byte(cur), &v)
	return &batch.SubResponse{Status: 200, Body: []byte(cur),
		Header: http.Header{"Content-Type": {"application/json"}, "Etag": {`"v-` + v.Name + `"`}}}, nil
}

// A journal stored by an older instance is read whole and finished: the
// dead saga is taken over once (the live one is not), its origin, key,
// credentials and items come back as they were, and its resumption undoes
// widget 1 with the stored pre-image, finds widget 2 unchanged, and
// leaves nothing of the dead saga in storage.
func TestStoredV1JournalsStillRecover(t *testing.T) {
	inBubble(t, testStoredV1JournalsStillRecover)
}

func testStoredV1JournalsStillRecover(t *testing.T) {
	s := storedV1(t)
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	p := goldenWidgets(t)
	up := &widgetStore{body: map[string]string{
		"/widgets/1": `{"id":1,"name":"after"}`,
		"/widgets/2": `{"id":2,"name":"before"}`,
	}}
	type finished struct {
		r   *Recovered
		res *batch.Result
		err error
	}
	done := make(chan finished, 2)
	finish := func(r *Recovered) error {
		res, err := batch.Resume(context.Background(), r.Snapshot, p.Lookup, nil, batch.Runtime{Send: up, Journal: r.Journal})
		done <- finished{r, res, err}
		return err
	}
	failed := func(saga, doing string, err error) { t.Errorf("%s: %s: %v", saga, doing, err) }
	if err := js.Scan(context.Background(), finish, failed); err != nil {
		t.Fatal(err)
	}
	// The live saga's owner, an older instance, renews its lease as
	// older builds do; the dead one's stays as it was for a lease.
	time.Sleep(time.Minute / 2)
	renewed, _ := json.Marshal(Lease{Owner: goldenOwner, Expires: time.Now().Add(time.Minute)})
	if err := s.Store(context.Background(), leaseKey(goldenLiveSaga), renewed); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute / 2)
	if err := js.Scan(context.Background(), finish, failed); err != nil {
		t.Fatal(err)
	}
	f := <-done
	if f.err != nil {
		t.Fatalf("resuming the stored saga: %v", f.err)
	}
	r := f.r
	if r.Saga != goldenDeadSaga || r.Dead.Owner != goldenOwner || !reflect.DeepEqual(r.Origin, Origin{Server: "srv0", Method: "PATCH", URI: "/widgets?tenant=a", Host: "example.com", RemoteAddr: "192.0.2.1:4711"}) {
		t.Errorf("took over %s from %+v, origin %+v", r.Saga, r.Dead, r.Origin)
	}
	snap := r.Snapshot
	if snap.Op != "update" || snap.Path != "/widgets" || snap.Query != "tenant=a" || snap.Key != "golden-saga" ||
		snap.Header.Get("Authorization") != goldenAuthority || len(snap.Items) != 2 {
		t.Errorf("snapshot %+v", snap)
	}
	if f.res.Outcome != batch.RolledBack {
		t.Errorf("outcome %s: %s", f.res.Outcome, f.res.Detail)
	}
	want := map[string]string{"/widgets/1": `{"id":1,"name":"before"}`, "/widgets/2": `{"id":2,"name":"before"}`}
	up.mu.Lock()
	for path, body := range want {
		if up.body[path] != body {
			t.Errorf("%s is %s, want %s; requests: %s", path, up.body[path], body, strings.Join(up.log, "; "))
		}
	}
	for _, line := range up.log {
		if !strings.Contains(line, "?tenant=a ") || !strings.Contains(line, goldenAuthority) {
			t.Errorf("sent outside the saga's tenant or credentials: %s", line)
		}
	}
	up.mu.Unlock()
	removed(t, goldenDeadSaga)
	for _, k := range keysUnder(s, "batch/v1/journal/") {
		if strings.Contains(k, goldenDeadSaga) && k != endKey(goldenDeadSaga) {
			t.Errorf("%s left in storage after the saga ended", k)
		}
	}
	// A takeover writes its lease before Scan returns.
	if l, err := js.leaseOf(context.Background(), goldenLiveSaga); err != nil || l.Owner != goldenOwner {
		t.Errorf("saga %s, under a live lease, was taken over: %+v, %v", goldenLiveSaga, l, err)
	}
	select {
	case f := <-done:
		t.Errorf("saga %s, under a live lease, was taken over", f.r.Saga)
	default:
	}
}

// The lease an older instance stored is honoured: its saga is not taken
// over, and is read as that instance's until its time.
func TestStoredV1LeaseIsHonoured(t *testing.T) {
	t.Parallel()
	s := storedV1(t)
	js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
	l, err := js.leaseOf(context.Background(), goldenLiveSaga)
	if err != nil || l.Owner != goldenOwner || l.Expires.Year() != 2126 {
		t.Fatalf("lease %+v, %v", l, err)
	}
	st, err := js.load(context.Background(), goldenLiveSaga)
	if err != nil || len(st.snap.Items) != 1 || st.next != 1 {
		t.Fatalf("live journal: %+v, %v", st, err)
	}
	if ph := st.snap.Items[0].Phase; ph != batch.PhaseSending {
		t.Errorf("widget 1's phase %v, want sending", ph)
	}
}

// goldenClaim is the claim of golden-<name> again, with the fingerprint
// its record was stored with (or another).
func goldenClaim(name, fingerprint string) Claim {
	key, lock := IdempotencyRecord("golden-"+name, Credentials(http.Header{"Authorization": {goldenAuthority}}, nil), "/widgets", "/widgets", "update")
	return Claim{Record: key, Lock: lock, Fingerprint: HashFields("PATCH", "/widgets", "", fingerprint),
		Resource: "/widgets", Op: "update", Wait: time.Second, TTL: time.Hour, MaxRun: time.Minute}
}

// Idempotency-Key records stored by an older instance are found under the
// same names and decided as they were: the kept answer is replayed as it
// was stored, another request with the key is refused, an answer too
// large stays not kept, a lapsed claim is abandoned, a live one in
// flight, and an expired record counts as absent.
func TestStoredV1IdempotencyRecordsStillDecide(t *testing.T) {
	t.Parallel()
	s := storedV1(t)
	keys := NewKeys(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	for _, c := range []struct {
		name, fingerprint string
		want              Verdict
	}{
		{"replay", "fp-replay", Replay},
		{"replay", "fp-other", Mismatch},
		{"not-kept", "fp-not-kept", NotKept},
		{"abandoned", "fp-abandoned", Abandoned},
		{"in-flight", "fp-in-flight", InFlight},
		{"expired", "fp-expired", Proceed},
	} {
		d, err := keys.Claim(ctx, goldenClaim(c.name, c.fingerprint))
		if err != nil || d.Verdict != c.want {
			t.Errorf("%s with %s: %v (%v), want %v", c.name, c.fingerprint, d.Verdict, err, c.want)
			continue
		}
		if d.Held != nil {
			d.Held.Release()
		}
		switch c.want {
		case Replay:
			a := d.Record.Answer
			if a.Status != 200 || a.Header.Get("Preference-Applied") != "return=minimal" ||
				!strings.HasPrefix(string(a.Body), `{"atomicity":"all-or-nothing","outcome":"succeeded"`) || d.Record.Outcome != "succeeded" {
				t.Errorf("replayed %d %v %s (%s)", a.Status, a.Header, a.Body, d.Record.Outcome)
			}
		case NotKept:
			if d.Record.AnswerSize == 0 || d.Record.Answer == nil || d.Record.Answer.Body != nil {
				t.Errorf("not kept: %+v", d.Record)
			}
		}
	}
}

// An expired record an older instance stored (with no expiry index) is
// swept, once the sweep filed it under its expiry; the others stay.
func TestStoredV1ExpiredRecordIsSwept(t *testing.T) {
	t.Parallel()
	s := storedV1(t)
	before := keysUnder(s, IdempotencyPrefix+"/")
	swept, err := NewSweeper(s, zap.NewNop()).Sweep(context.Background(), time.Now())
	if err != nil || swept.Deleted != 1 || swept.Indexed != len(before) {
		t.Fatalf("swept %+v, %v; want every record indexed, 1 deleted", swept, err)
	}
	expired, _ := IdempotencyRecord("golden-expired", Credentials(http.Header{"Authorization": {goldenAuthority}}, nil), "/widgets", "/widgets", "update")
	if _, err := s.Load(context.Background(), expired); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the expired record is still there: %v", err)
	}
	if after := keysUnder(s, IdempotencyPrefix+"/"); len(after) != len(before)-1 {
		t.Errorf("%d records left of %d, want one fewer", len(after), len(before))
	}
}

// keysUnder lists the storage's keys that start with prefix.
func keysUnder(s *memStorage, prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}
