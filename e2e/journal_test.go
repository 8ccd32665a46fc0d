package e2e

import (
	"errors"
	"io/fs"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// journalPrefix is where the journals are in storage.
const journalPrefix = "batch/v1/journal"

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

// journalLeft is what the journal holds in a file system storage once
// the removals under way ended (a saga that left nothing behind is
// answered once its end marker is stored, and the rest goes after), or
// 5s passed.
func journalLeft(t *testing.T, dir string) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := journalKeys(t, dir)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
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
			if left := journalLeft(t, dir); len(left) != 0 {
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
