package batch

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/policy"
)

// One decision answers every write refused its item's lock: the client
// gone, the locks down, the batch's deadline, another writer.
func TestRefuseLock(t *testing.T) {
	t.Parallel()
	gone, leave := context.WithCancel(context.Background())
	leave()
	expired, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	live := context.Background()
	locked := errors.Join(itemlock.ErrLocked, context.DeadlineExceeded)
	for _, c := range []struct {
		name       string
		err        error
		wait       LockWait
		status     int
		typ        string
		retryAfter string
		detail     string
	}{
		{"client gone", locked, LockWait{Client: gone, ItemTimeout: time.Second}, 499, "", "", "the client went away"},
		{"client gone from a batch", locked, LockWait{Client: gone, Batch: gone, BatchTimeout: time.Minute}, 499, "", "", "the client went away"},
		{"locks unavailable", errors.New("storage down"), LockWait{Client: live, ItemTimeout: time.Second}, 503, "item-lock-unavailable", "1", "the item locks are unavailable"},
		{"batch deadline", locked, LockWait{Client: live, Batch: expired, BatchTimeout: 3 * time.Second, ItemTimeout: time.Second}, 409, "item-locked", "1", "held /w/1 until batch_timeout (3s) ran out"},
		{"item timeout", locked, LockWait{Client: live, Batch: live, BatchTimeout: time.Minute, ItemTimeout: 2 * time.Second}, 409, "item-locked", "1", "held /w/1 for item_timeout (2s)"},
		{"single write", locked, LockWait{Client: live, ItemTimeout: 2 * time.Second}, 409, "item-locked", "1", "held /w/1 for item_timeout (2s)"},
		{"a batch's item named", locked, LockWait{Client: live, Batch: expired, BatchTimeout: time.Second, Item: `item 3 (id "1")`}, 409, "item-locked", "1", `item 3 (id "1"): another write through the gateway held /w/1`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := RefuseLock("/w/1", c.err, c.wait)
			equal(t, "status", ref.Status, c.status)
			equal(t, "type", ref.Type, c.typ)
			equal(t, "Retry-After", ref.RetryAfter, c.retryAfter)
			if !strings.Contains(ref.Detail, c.detail) || !strings.Contains(ref.Detail, "nothing was sent") {
				t.Errorf("detail %q, want it to say %q and that nothing was sent", ref.Detail, c.detail)
			}
		})
	}
}

// A batch refused because another writer holds one of its items names
// that item by its index and id, as every problem about an item does,
// besides the path the upstream knows it by; its status, type and
// Retry-After are a lock refusal's.
func TestSagaLockRefusalNamesTheItem(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		locks, release := heldBy(t, "/widgets/3")
		defer release()
		f := newFake().seed("1", "3", "5")
		p := mustPlan(t, newRequest(http.MethodDelete, "/widgets?ids=1,03,5", ""), idFormat(policy.IDInteger), batchTimeout(30*time.Millisecond))
		w := write(t, newBatchRun(p, Runtime{Send: f, Locks: locks}, noBackoff).do(context.Background()))
		equal(t, "status", w.Code, http.StatusConflict)
		if !strings.HasSuffix(w.Type, "#problem-batch-failed") {
			t.Errorf("type %q, want a failed batch's", w.Type)
		}
		equal(t, "Retry-After", w.Header.Get("Retry-After"), "1")
		equal(t, "sent", len(f.sent()), 0)
		for _, want := range []string{`item 1 (id "3")`, "/widgets/3", "batch_timeout"} {
			if !strings.Contains(w.Detail, want) {
				t.Errorf("detail %q does not say %q", w.Detail, want)
			}
		}
	})
}

// heldBy is a lock table in which another writer holds key until the
// returned release.
func heldBy(t *testing.T, key string) (*itemlock.Local, func()) {
	l := &itemlock.Local{}
	unlock, err := l.Lock(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return l, unlock
}

// leavingClient is a client that goes away as soon as its batch waits
// for key, whose lock another writer holds, after skip earlier waits
// for it: locks is the table, ctx the client's request.
func leavingClient(t *testing.T, key string, skip int) (itemlock.Locker, func(), context.Context) {
	held, release := heldBy(t, key)
	ctx, leave := context.WithCancel(context.Background())
	return &leaveOnWait{Local: held, key: key, skip: skip, leave: leave}, release, ctx
}

type leaveOnWait struct {
	*itemlock.Local
	key   string
	skip  int
	leave context.CancelFunc
	mu    sync.Mutex
	waits int
}

func (l *leaveOnWait) Lock(ctx context.Context, key string) (func(), error) {
	if key == l.key {
		l.mu.Lock()
		if l.waits++; l.waits > l.skip {
			l.leave()
		}
		l.mu.Unlock()
	}
	return l.Local.Lock(ctx, key)
}

// A partial batch's write that cannot lock its item is answered as a
// single write would be, by what kept the lock from it: the other items
// go on.
func TestPartialWriteRefusedItsLock(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		locks      func(t *testing.T) (itemlock.Locker, func(), context.Context)
		mods       []specMod
		status     int
		detail     string
		retryAfter string
	}{
		{"another writer held it", heldWith("/widgets/1"),
			[]specMod{itemTimeout(20 * time.Millisecond)}, 409, "held /widgets/1 for item_timeout (20ms)", "1"},
		{"batch_timeout ran out", heldWith("/widgets/1"),
			[]specMod{itemTimeout(10 * time.Second), batchTimeout(40 * time.Millisecond)}, 409, "until batch_timeout (40ms) ran out", "1"},
		{"the locks are unavailable", broken("/widgets/1"), nil, 503, "the item locks are unavailable", "1"},
		{"the client went away", func(t *testing.T) (itemlock.Locker, func(), context.Context) {
			return leavingClient(t, "/widgets/1", 0)
		},
			[]specMod{itemTimeout(10 * time.Second)}, 499, "the client went away", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			locks, release, client := c.locks(t)
			defer release()
			f := newFake().seed("1", "2")
			p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`), append(c.mods, partial, concurrency(1))...)
			w := write(t, newBatchRun(p, Runtime{Send: f, Locks: locks}, noBackoff).do(client))
			it := w.Items[0]
			equal(t, "item 0 status", it.Status, c.status)
			if !strings.Contains(it.Error, c.detail) {
				t.Errorf("item 0 error %q, want %q", it.Error, c.detail)
			}
			equal(t, "item 0 Retry-After", it.Headers["Retry-After"], c.retryAfter)
			equal(t, "the answer's Retry-After", w.Header.Get("Retry-After"), c.retryAfter)
			for _, call := range f.sentWith("PATCH") {
				if call.Path == "/widgets/1" {
					t.Errorf("the refused write was sent")
				}
			}
		})
	}
}

// heldWith is a lock table in which another writer holds key, and a
// client that stays.
func heldWith(key string) func(t *testing.T) (itemlock.Locker, func(), context.Context) {
	return func(t *testing.T) (itemlock.Locker, func(), context.Context) {
		l, release := heldBy(t, key)
		return l, release, context.Background()
	}
}

// broken is locks that fail for key, and a client that stays.
func broken(key string) func(t *testing.T) (itemlock.Locker, func(), context.Context) {
	return func(*testing.T) (itemlock.Locker, func(), context.Context) {
		return brokenOn{key}, func() {}, context.Background()
	}
}

// brokenOn are locks that fail, without another holder, for one key: a
// storage that is down.
type brokenOn struct{ key string }

func (b brokenOn) Lock(_ context.Context, key string) (func(), error) {
	if key == b.key {
		return nil, errors.New("storage unreachable")
	}
	return func() {}, nil
}

// A saga whose client leaves while it waits for its locks is not told
// 409 (no other writer made it fail): 499, nothing sent.
func TestSagaLockClientGone(t *testing.T) {
	t.Parallel()
	locks, release, client := leavingClient(t, "/widgets/2", 0)
	defer release()
	f := newFake().seed("1", "2")
	p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), batchTimeout(10*time.Second))
	res := newBatchRun(p, Runtime{Send: f, Locks: locks}, noBackoff).do(client)
	equal(t, "status", res.Status, 499)
	equal(t, "sent", len(f.sent()), 0)
}

// An envelope's operation whose item is known only as it runs, and held
// by another writer, fails as a batch's write would: 409 with
// Retry-After, 499 when the client left meanwhile, 503 when the locks
// failed; the envelope is undone.
func TestEnvelopeLateLockRefused(t *testing.T) {
	t.Parallel()
	body := `{"operations": [
		{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
		{"id": "e", "method": "PATCH", "url": "/users/$u", "body": {"b": 2}}
	]}`
	for _, c := range []struct {
		name       string
		locks      func(t *testing.T) (itemlock.Locker, func(), context.Context)
		status     int
		retryAfter string
	}{
		{"another writer held it", heldWith("/users/100"), 409, "1"},
		// The first wait for the created user is the create's own
		// (lockCreated), which gives up quietly.
		{"the client went away", func(t *testing.T) (itemlock.Locker, func(), context.Context) {
			return leavingClient(t, "/users/100", 1)
		}, 499, ""},
		{"the locks are unavailable", broken("/users/100"), 503, "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			locks, release, client := c.locks(t)
			defer release()
			api := newShopAPI("/users")
			p, prob := admitEnvelope(t, shop(t, func(s *policy.Settings) { s.ItemTimeout = 50 * time.Millisecond }), body)
			if prob != nil {
				t.Fatal(prob.Detail)
			}
			w := write(t, Run(client, p, Runtime{Send: api, Locks: locks}))
			equal(t, "operation e's status", w.Items[1].Status, c.status)
			equal(t, "Retry-After", w.Header.Get("Retry-After"), c.retryAfter)
			equal(t, "outcome", w.Outcome, "rolled_back")
			if writes := api.writes(); len(writes) != 2 { // the create and its undo
				t.Errorf("writes %v, want the create and its undo", writes)
			}
		})
	}
}

// failingBegin is a journal whose storage is down: Begin fails.
type failingBegin struct{ NoJournal }

func (failingBegin) Begin(context.Context, *Plan) error { return errors.New("storage down") }

// A saga whose journal cannot be begun sends nothing and answers 503
// with the Retry-After of every answer the gateway's own storage failed
// (docs/wire-format.md), as a storage lock that fails does: the client
// is told when to try again.
func TestJournalBeginFailureAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	api := newFake().seed("1", "2")
	p := mustPlan(t, newRequest(http.MethodDelete, "/widgets?ids=1,2", ""))
	w := write(t, Run(context.Background(), p, Runtime{Send: api, Locks: &recordingLocks{}, Journal: failingBegin{}}))
	equal(t, "status", w.Code, http.StatusServiceUnavailable)
	equal(t, "writes sent", len(api.writes()), 0)
	equal(t, "Retry-After", w.Header.Get("Retry-After"), gatewayRetryAfter)
}
