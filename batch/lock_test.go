package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// A batch that cannot get its locks within batch_timeout is refused with
// 409 and Retry-After, and sends nothing.
func TestLockConflict(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var locks itemlock.Local
		unlock, _ := locks.Lock(context.Background(), "/widgets/2")
		defer unlock()
		f := newFake().seed("1", "2")
		p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), batchTimeout(30*time.Millisecond))
		w := write(t, newBatchRun(p, Runtime{Send: f, Locks: &locks}, noBackoff).do(context.Background()))
		equal(t, "status", w.Code, 409)
		equal(t, "Retry-After", w.Header.Get("Retry-After"), "1")
		equal(t, "sent", len(f.sent()), 0)
		if !strings.Contains(w.Detail, "/widgets/2") {
			t.Errorf("detail %q does not name the locked item", w.Detail)
		}
		// The lock the batch did get (on 1) was let go.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if u, err := locks.Lock(ctx, "/widgets/1"); err != nil {
			t.Errorf("the refused batch kept a lock: %v", err)
		} else {
			u()
		}
	})
}

// A created item is locked as soon as its id is known, until the saga
// ends: a write that arrives meanwhile waits for the undo.
func TestCreatedIDIsLocked(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var locks itemlock.Local
		created := make(chan struct{})
		f := newFake()
		f.on("POST", "/widgets", answer{}, answer{status: 500, body: `{}`, hook: func(context.Context, *SubRequest) { <-created }})
		f.on("GET", "/widgets/1000", answer{delay: 30 * time.Millisecond}) // the proof read is slow
		done := make(chan *Result)
		p := mustPlan(t, newRequest("POST", "/widgets", elements(2)), concurrency(1))
		go func() {
			done <- newBatchRun(p, Runtime{Send: f, Locks: &locks}, noBackoff).do(context.Background())
		}()
		// Item 0 is created and answered before item 1 is sent.
		synctest.Wait()
		if n := len(f.sentWith("POST")); n != 2 {
			t.Fatalf("%d creates sent, want 2 (the second blocked in its hook)", n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := locks.Lock(ctx, "/widgets/1000")
		cancel()
		if !errors.Is(err, itemlock.ErrLocked) {
			t.Errorf("the created item was not locked: %v", err)
		}
		close(created)
		unlock, err := locks.Lock(context.Background(), "/widgets/1000")
		if err != nil {
			t.Fatal(err)
		}
		// Whoever gets the lock next comes after the undo: the proof read
		// and the delete were both sent while the saga held it.
		if got := f.sentWith("DELETE"); len(got) != 1 {
			t.Errorf("the created item's lock was let go before its undo: %d deletes sent", len(got))
		}
		unlock()
		res := <-done
		equal(t, "outcome", res.Outcome, RolledBack)
	})
}

// failing fails one batch's write of one item with 500, whatever the
// fake would answer.
type failing struct {
	*fakeAPI
	mu   sync.Mutex
	fail map[string]bool // "v=<batch> <path>"
}

func (s *failing) Send(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	if req.Method == "PATCH" {
		s.mu.Lock()
		bad := s.fail[string(req.Body)+" "+req.Path]
		s.mu.Unlock()
		if bad {
			return &SubResponse{Status: 500, Body: []byte(`{}`)}, nil
		}
	}
	return s.fakeAPI.Send(ctx, req)
}

// Fifty concurrent all-or-nothing batches over ten ids, some failing: no
// deadlock, and the final state is that of a serial order of the
// batches that succeeded (those that failed leave no trace).
func TestConcurrentBatchesSerialize(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const batches, nIDs = 50, 10
		for round := range 3 {
			f := newFake()
			f.jitter = 2 * time.Millisecond
			for i := range nIDs {
				f.put(widget(fmt.Sprint(i)), map[string]any{"id": fmt.Sprint(i), "v": -1.0})
			}
			s := &failing{fakeAPI: f, fail: map[string]bool{}}
			var locks itemlock.Local
			idsOf := make([][]string, batches)
			results := make([]*Result, batches)
			var wg sync.WaitGroup
			for b := range batches {
				perm := rand.Perm(nIDs)[:2+rand.IntN(4)]
				var elems []string
				for _, i := range perm {
					id := fmt.Sprint(i)
					idsOf[b] = append(idsOf[b], id)
					elems = append(elems, fmt.Sprintf(`{"id":"%s","v":%d}`, id, b))
				}
				if rand.IntN(3) == 0 {
					last := idsOf[b][len(idsOf[b])-1]
					s.mu.Lock()
					s.fail[fmt.Sprintf(`{"v":%d} /widgets/%s`, b, last)] = true
					s.mu.Unlock()
				}
				p := mustPlan(t, newRequest("PATCH", "/widgets", "["+strings.Join(elems, ",")+"]"), concurrency(3), batchTimeout(20*time.Second))
				wg.Go(func() {
					results[b] = newBatchRun(p, Runtime{Send: s, Locks: &locks}, noBackoff).do(context.Background())
				})
			}
			wg.Wait()

			// The serial order is the order in which batches wrote: a batch
			// holds every lock from before its first write to after its last
			// undo, so no two batches' writes interleave.
			var order []int
			seen := map[int]bool{}
			for _, c := range f.sentWith("PATCH") {
				var b int
				if _, err := fmt.Sscanf(c.Body, `{"v":%d}`, &b); err == nil && !seen[b] {
					seen[b] = true
					order = append(order, b)
				}
			}
			want := map[string]string{}
			for i := range nIDs {
				want[fmt.Sprint(i)] = fmt.Sprintf(`{"id":"%d","v":-1}`, i)
			}
			for _, b := range order {
				switch results[b].Outcome {
				case Succeeded:
					for _, id := range idsOf[b] {
						want[id] = fmt.Sprintf(`{"id":"%s","v":%d}`, id, b)
					}
				case RolledBack:
				default:
					t.Fatalf("round %d: batch %d ended %s: %s", round, b, results[b].Outcome, results[b].Detail)
				}
			}
			got := f.state()
			for id, w := range want {
				jsonEqual(t, fmt.Sprintf("round %d: widget %s", round, id), got[widget(id)], w)
			}
		}
	})
}

// brokenLocks fail without another holder: a storage that is down.
type brokenLocks struct{}

func (brokenLocks) Lock(context.Context, string) (func(), error) {
	return nil, errors.New("storage unreachable")
}

// Locks that fail (not another writer) refuse the batch with 503, not
// 409, and send nothing.
func TestLocksUnavailable(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1", ""))
	w := write(t, newBatchRun(p, Runtime{Send: f, Locks: brokenLocks{}}, noBackoff).do(context.Background()))
	equal(t, "status", w.Code, 503)
	equal(t, "sent", len(f.sent()), 0)
}

// A batch locks its items under their parents' canonical spellings,
// {user:integer}'s 020 as 20, while the requests it sends keep the
// client's; a parent with no format is locked as spelled. A path spelled
// canonically is locked under the name it always had.
func TestLockNamesCanonicalParents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		template, collection, held string
		locked                     bool
	}{
		{"/users/{user:integer}/posts", "/users/020/posts", "/users/20/posts/5", true},
		{"/users/{user:integer}/posts", "/users/20/posts", "/users/20/posts/5", true},
		{"/users/{user}/posts", "/users/20/posts", "/users/20/posts/5", true},
		{"/users/{user}/posts", "/users/020/posts", "/users/20/posts/5", false},
		{"/users/{user:integer}/posts", "/users/020/posts", "/users/7/posts/5", false},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			var locks itemlock.Local
			unlock, _ := locks.Lock(context.Background(), tt.held)
			defer unlock()
			f := newFake().put(tt.collection+"/5", map[string]any{"id": "5"})
			f.collections[tt.collection] = true
			p := mustPlan(t, newRequest("DELETE", tt.collection+"?ids=5", ""), declared(t, "resource "+tt.template), batchTimeout(30*time.Millisecond))
			w := write(t, newBatchRun(p, Runtime{Send: f, Locks: &locks}, noBackoff).do(context.Background()))
			if tt.locked {
				equal(t, tt.template+" "+tt.collection+": status", w.Code, 409)
				equal(t, "sent", len(f.sent()), 0)
				if !strings.Contains(w.Detail, tt.held) {
					t.Errorf("detail %q does not name the lock %s", w.Detail, tt.held)
				}
				return
			}
			equal(t, tt.template+" "+tt.collection+": status", w.Code, 200)
			equalSlices(t, "sent", f.sent(), []string{"GET " + tt.collection + "/5", "DELETE " + tt.collection + "/5"})
		})
	}
}
