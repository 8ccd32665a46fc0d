package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/itemlock"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// Storage item locks (item_locks storage) are tested as two instances of
// a cluster would use them: two lockers, each with its own local table
// (its own process) and its own storage value, over one storage.

// noTryLock hides a storage's TryLock, for the path that waits in Lock.
type noTryLock struct{ certmagic.Storage }

// TestStorageLocksFileSystem: two instances over one file_system folder
// exclude each other, release, and time out with ErrLocked; with TryLock
// and without.
func TestStorageLocksFileSystem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Run("TryLock", func(t *testing.T) {
		testStorageLocksExclude(t, &certmagic.FileStorage{Path: dir}, &certmagic.FileStorage{Path: dir})
	})
	t.Run("Lock", func(t *testing.T) {
		testStorageLocksExclude(t, noTryLock{&certmagic.FileStorage{Path: dir}}, noTryLock{&certmagic.FileStorage{Path: dir}})
	})
}

// testStorageLocksExclude checks storage locks between two instances,
// one over a and one over b (two values of one shared storage).
func testStorageLocksExclude(t *testing.T, a, b certmagic.Storage) {
	one := durable.NewItemLocks(new(itemlock.Local), a, nil)
	two := durable.NewItemLocks(new(itemlock.Local), b, nil)
	ctx := context.Background()
	const key = "/api/widgets/1"

	unlock, err := one.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Held by the other instance: the wait ends with ctx, with ErrLocked.
	wait, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = two.Lock(wait, key)
	cancel()
	if !errors.Is(err, itemlock.ErrLocked) {
		t.Fatalf("a held lock taken again: %v", err)
	}
	if took := time.Since(start); took < 250*time.Millisecond || took > 3*time.Second {
		t.Errorf("gave up after %s, want about the 300ms the context allowed", took)
	}
	// Other items, and other spellings that a lock name would fold into
	// one, are other locks.
	for _, other := range []string{"/api/widgets/2", "/api/Widgets/1", "/api/widgets/1 "} {
		quick, cancel := context.WithTimeout(ctx, 5*time.Second)
		u, err := two.Lock(quick, other)
		cancel()
		if err != nil {
			t.Errorf("%q is locked with %q: %v", other, key, err)
			continue
		}
		u()
	}

	// Released: the waiter gets it, and only after the release.
	var released time.Time
	var mu sync.Mutex
	go func() {
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		released = time.Now()
		mu.Unlock()
		unlock()
		unlock() // a second release is harmless
	}()
	long, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unlock2, err := two.Lock(long, key)
	if err != nil {
		t.Fatalf("the lock was not handed over after its release: %v", err)
	}
	mu.Lock()
	if released.IsZero() || time.Now().Before(released) {
		t.Error("the waiter got the lock before it was released")
	}
	mu.Unlock()
	unlock2()
	u, err := one.Lock(long, key)
	if err != nil {
		t.Fatalf("the first instance cannot lock again after the second let go: %v", err)
	}
	u()
}

// TestStorageLocksGateway: with item_locks storage, the gateway's single
// writes and batches wait for a lock another instance holds in the shared
// storage (409 after their timeout, nothing sent), and the other instance
// waits for the gateway's batch.
func TestStorageLocksGateway(t *testing.T) {
	dir := t.TempDir()
	testStorageLocksGateway(t, "storage file_system "+dir, &certmagic.FileStorage{Path: dir})
}

// testStorageLocksGateway runs a gateway with storage (the global
// option) and plays the other instance over other, the same storage.
func testStorageLocksGateway(t *testing.T, storage string, other certmagic.Storage) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/slow", WriteDelay: 700 * time.Millisecond, Seed: records("s", 1, 5)})
	g := startGatewayStorage(t, api, newUpstream(t, api), storage, `
	batch {
		item_locks storage
		item_timeout 400ms
		batch_timeout 600ms
		resource /api/slow {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	elsewhere := durable.NewItemLocks(new(itemlock.Local), other, nil)
	ctx := context.Background()

	unlock, err := elsewhere.Lock(ctx, "/api/slow/1")
	if err != nil {
		t.Fatal(err)
	}
	r := g.do(t, "PATCH", "/api/slow/1", `{"name": "single"}`)
	checkIdemProblem(t, r, 409, "item-locked")
	r = g.do(t, "PATCH", "/api/slow", `[{"id": 2, "name": "b"}, {"id": 1, "name": "a"}]`)
	if r.Status != 409 {
		t.Errorf("a batch on an item locked elsewhere: %v", r)
	}
	if w := writes(api.Requests()); len(w) > 0 {
		t.Errorf("writes sent while another instance held the item:%s", describeRequests(w))
	}
	unlock()
	if r := g.do(t, "PATCH", "/api/slow/1", `{"name": "single"}`); r.Status != 200 {
		t.Errorf("after the release: %v", r)
	}

	// The gateway's batch holds item 3 while its slow write runs; the
	// other instance cannot have it until the batch is over.
	var wg sync.WaitGroup
	var batchDone time.Time
	var batchErr error
	wg.Go(func() {
		_, batchErr = g.try("PATCH", "/api/slow", `[{"id": 3, "name": "c"}]`)
		batchDone = time.Now()
	})
	eventually(t, 5*time.Second, "the batch's write to reach the API", func() bool { return api.InFlight() > 0 })
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = elsewhere.Lock(short, "/api/slow/3")
	cancel()
	if !errors.Is(err, itemlock.ErrLocked) {
		t.Errorf("another instance locked an item a running batch holds: %v", err)
	}
	long, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unlock, err = elsewhere.Lock(long, "/api/slow/3")
	if err != nil {
		t.Fatalf("the batch never let item 3 go: %v", err)
	}
	got := time.Now()
	unlock()
	wg.Wait()
	if batchErr != nil {
		t.Fatal(batchErr)
	}
	if got.Before(batchDone.Add(-time.Second)) {
		t.Errorf("the other instance had item 3 at %s, long before the batch ended at %s", got, batchDone)
	}
}
