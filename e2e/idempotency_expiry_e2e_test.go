package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/durable"
)

// TestIdempotencyExpiry: after idempotency_ttl the key runs anew, and a
// sweep deletes expired records and only those.
func TestIdempotencyExpiry(t *testing.T) {
	api := seededAPI()
	dir := t.TempDir()
	g := startIdemGateway(t, api, dir, `
	batch {
		idempotency_ttl 1s
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	storage := &certmagic.FileStorage{Path: dir}
	ctx := context.Background()
	send := func(key string) response {
		return g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}]`, "Idempotency-Key", key)
	}
	if r := send("ttl"); r.Status != 200 {
		t.Fatalf("%v", r)
	}
	if r := send("ttl"); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not replayed within the ttl: %v", r)
	}
	if n, err := sweepAt(ctx, storage, time.Now()); n != 0 || err != nil {
		t.Errorf("a sweep within the ttl deleted %d records (%v)", n, err)
	}
	time.Sleep(1100 * time.Millisecond)
	api.ResetLog()
	if r := send("ttl"); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" || len(writes(api.Requests())) != 1 {
		t.Errorf("an expired key did not run anew: %v", r)
	}
	if r := send("other"); r.Status != 200 {
		t.Fatalf("%v", r)
	}
	if keys, _ := storage.List(ctx, durable.IdempotencyPrefix, false); len(keys) != 2 {
		t.Fatalf("records %v, want 2", keys)
	}
	n, err := sweepAt(ctx, storage, time.Now().Add(2*time.Second))
	if n != 2 || err != nil {
		t.Errorf("the sweep deleted %d records (%v), want 2", n, err)
	}
	if keys, _ := storage.List(ctx, durable.IdempotencyPrefix, false); len(keys) != 0 {
		t.Errorf("records left after the sweep: %v", keys)
	}
	if n, err := sweepAt(ctx, &certmagic.FileStorage{Path: t.TempDir()}, time.Now()); n != 0 || err != nil {
		t.Errorf("a sweep of an empty storage: %d, %v", n, err)
	}
}

// The batch app sweeps expired records itself, every sweep_interval.
func TestIdempotencySweptByTheApp(t *testing.T) {
	api := seededAPI()
	dir := t.TempDir()
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+dir+"\n\tbatch {\n\t\trecovery_interval 1s\n\t\tsweep_interval 1s\n\t}", `
	batch {
		idempotency_ttl 1s
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	if r := g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}]`, "Idempotency-Key", "swept"); r.Status != 200 {
		t.Fatalf("%v", r)
	}
	storage := &certmagic.FileStorage{Path: dir}
	if keys, _ := storage.List(context.Background(), durable.IdempotencyPrefix, false); len(keys) != 1 {
		t.Fatalf("records %v, want the batch's", keys)
	}
	eventually(t, 10*time.Second, "the app to sweep the expired record", func() bool {
		keys, _ := storage.List(context.Background(), durable.IdempotencyPrefix, false)
		return len(keys) == 0
	})
}
