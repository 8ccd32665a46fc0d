package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/certmagic"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// BenchmarkCreate100Journal measures what the saga journal costs: a
// 100-item all-or-nothing batch CREATE that succeeds, with the journal
// off and on, against the same fake legacy API, with Caddy's file system
// storage in a temporary directory on the disk the tests run on. Each op
// is one batch (100 items).
//
//   - upstream=fast: the fake API answers at once (about 0.1 ms a write
//     here), so the journal's storage writes are nearly all of the cost.
//   - upstream=10ms: every write takes 10 ms, as a legacy database does.
//   - journal=on-nosync: the file system storage without its fsync (a
//     test-only storage), to tell the disk's cost from the journal's own.
//
// Run:
//
//	go test -run '^$' -bench Create100Journal -benchmem -count 10 ./e2e | tee journal.txt
//	benchstat -col /journal journal.txt
func BenchmarkCreate100Journal(b *testing.B) {
	elems := make([]string, 100)
	for i := range elems {
		elems[i] = fmt.Sprintf(`{"name":"thing %d","price":12.5}`, i)
	}
	body := []byte("[" + strings.Join(elems, ",") + "]")
	for _, upstream := range []struct {
		name  string
		delay time.Duration
	}{{"fast", 0}, {"10ms", 10 * time.Millisecond}} {
		for _, journal := range []string{"off", "on", "on-nosync"} {
			if journal == "on-nosync" && upstream.delay > 0 {
				continue
			}
			b.Run("upstream="+upstream.name+"/journal="+journal, func(b *testing.B) {
				api := legacyapi.New(legacyapi.Collection{Path: "/api/widgets", AssignIDs: true, WriteDelay: upstream.delay})
				srv := httptest.NewServer(api)
				defer srv.Close()
				defer api.Close()
				storage, option := "file_system "+b.TempDir(), "journal on"
				switch journal {
				case "off":
					option = "journal off"
				case "on-nosync":
					storage = "nosync_benchmark " + b.TempDir()
				}
				addr := freeAddr(b)
				loadCaddyfile(b, fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	storage %[3]s
	log {
		output discard
	}
}
http://%[1]s {
	batch {
		%[4]s
		resource /api/widgets {
			collection GET POST
			item GET DELETE
		}
	}
	reverse_proxy %[2]s
}
`, addr, srv.Listener.Addr(), storage, option))
				defer caddy.Stop()
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
				defer client.CloseIdleConnections()
				b.ReportAllocs()
				for b.Loop() {
					req, _ := http.NewRequest("POST", "http://"+addr+"/api/widgets", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					drain(b, resp, err, http.StatusCreated)
				}
			})
		}
	}
}

// noSyncStorage is Caddy's file system storage whose Store skips the
// fsync (benchmarks only): what is stored survives the process, not the
// machine.
type noSyncStorage struct {
	certmagic.FileStorage
}

func init() { caddy.RegisterModule(noSyncStorage{}) }

func (noSyncStorage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.storage.nosync_benchmark", New: func() caddy.Module { return new(noSyncStorage) }}
}

func (s *noSyncStorage) CertMagicStorage() (certmagic.Storage, error) { return s, nil }

func (s *noSyncStorage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	s.Path = d.Val()
	return nil
}

func (s *noSyncStorage) Store(_ context.Context, key string, value []byte) error {
	name := s.Filename(key)
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(name), ".tmp")
	if err != nil {
		return err
	}
	if _, err := f.Write(value); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), name)
}
