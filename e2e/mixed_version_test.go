package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestMixedVersionCluster runs a cluster of two Caddy processes on one
// real Redis, one of this build (on the Redis fast path: its locks and
// stores by script) and one of the build before it (the module's own
// Lock and Store), as a cluster upgraded one instance at a time runs
// (docs/durability.md, "The Redis fast path"): a batch on either holds
// its items against a single write on the other, both ways, and a key
// used on the new one is replayed by the old. The old binary is
// $BATCH_TEST_OLD_CADDY, or built from the revision
// testdata/mixed-version.rev names (git archive, no worktree).
func TestMixedVersionCluster(t *testing.T) {
	if !hasRedisServer() {
		t.Skip("redis-server is not installed")
	}
	bin, old := caddyBinary(t), oldCaddyBinary(t)
	host, port, prefix := redisServer(t)
	option := redisOption(host, port, prefix)
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 500 * time.Millisecond, Seed: records("w", 1, 10)})
	site := clusterSite(newUpstream(t, api))
	a := startInstance(t, bin, option, site)
	b := startInstance(t, old, option, site)
	eventually(t, 5*time.Second, "the new instance's log of its storage path", func() bool {
		return strings.Contains(a.logs.String(), `"path":"redis"`)
	})
	t.Run("a batch on the new instance holds its items against the old", func(t *testing.T) {
		testClusterLocks(t, api, a, b)
	})
	t.Run("a batch on the old instance holds its items against the new", func(t *testing.T) {
		testClusterLocks(t, api, b, a)
	})
	t.Run("a key used on the new instance is replayed by the old", func(t *testing.T) {
		testClusterReplay(t, api, a, b)
	})
	t.Run("a key running on the old instance is in use on the new, then replayed by it", func(t *testing.T) {
		testKeyInUseAcross(t, api, b, a)
	})
	t.Run("a key running on the new instance is in use on the old, then replayed by it", func(t *testing.T) {
		testKeyInUseAcross(t, api, a, b)
	})
}

// testKeyInUseAcross: while a keyed batch runs on a (the upstream slow),
// the same request with its key sent to b is told the key is in use and
// sends nothing upstream; once a answered, b replays a's answer. On
// the fast path the claim checks the key's lock and record in one
// script, and an older build's claim takes the lock: either way each
// sees the other's claim (docs/durability.md, "The Redis fast path").
func testKeyInUseAcross(t *testing.T, api *legacyapi.API, a, b *gateway) {
	key := []string{"Idempotency-Key", "in-use-" + a.URL, "Authorization", "Bearer alice"}
	body := `[{"id": 5, "name": "a"}, {"id": 6, "name": "b"}]`
	api.ResetLog()
	var wg sync.WaitGroup
	var first response
	var firstErr error
	wg.Go(func() { first, firstErr = a.try("PATCH", "/api/widgets", body, key...) })
	eventually(t, 5*time.Second, "the batch's first write", func() bool { return len(writes(api.Requests())) > 0 })
	checkIdemProblem(t, b.do(t, "PATCH", "/api/widgets", body, key...), 409, "idempotency-key-in-use")
	wg.Wait()
	if firstErr != nil || first.Status != 200 {
		t.Fatalf("the batch: %v, %v", first, firstErr)
	}
	api.ResetLog()
	checkReplay(t, api, first, b.do(t, "PATCH", "/api/widgets", body, key...))
}

// oldCaddyBinary is the cmd/caddy of the revision before the Redis fast
// path: $BATCH_TEST_OLD_CADDY, or built from testdata/mixed-version.rev.
func oldCaddyBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("BATCH_TEST_OLD_CADDY"); bin != "" {
		return bin
	}
	rev, err := os.ReadFile("testdata/mixed-version.rev")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git to build the old revision with")
	}
	dir := t.TempDir()
	archive := exec.Command("git", "-C", "..", "archive", strings.TrimSpace(string(rev)))
	var tarball, stderr bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, &stderr
	if err := archive.Run(); err != nil {
		t.Skipf("the old revision is not in this clone's history: %v: %s", err, stderr.String())
	}
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("extracting the old revision: %v: %s", err, out)
	}
	bin := filepath.Join(dir, "old-caddy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/caddy")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the old revision: %v: %s", err, out)
	}
	return bin
}
