package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// BenchmarkCreate100Journal measures what the saga journal costs: a
// 100-item all-or-nothing batch CREATE that succeeds, with the journal on
// and off, in one Caddy, in one run, against the same fake legacy API,
// with Caddy's file system storage in a temporary directory (on the disk
// the tests run on: the file system storage syncs every file it writes).
// Each op is one batch (100 items).
//
//	go test -run '^$' -bench Create100Journal -benchmem -count 10 ./caddymodule | tee journal.txt
//	benchstat -col /journal journal.txt
func BenchmarkCreate100Journal(b *testing.B) {
	api := legacyapi.New(
		legacyapi.Collection{Path: "/api/widgets", AssignIDs: true},
		legacyapi.Collection{Path: "/api/gadgets", AssignIDs: true},
	)
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	addr := freeAddr(b)
	loadCaddyfile(b, fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	storage file_system %[3]s
	log {
		output discard
	}
}
http://%[1]s {
	batch {
		resource /api/widgets {
			collection GET POST
			item GET DELETE
		}
		resource /api/gadgets {
			collection GET POST
			item GET DELETE
			journal off
		}
	}
	reverse_proxy %[2]s
}
`, addr, upstream.Listener.Addr(), b.TempDir()))
	defer caddy.Stop()

	elems := make([]string, 100)
	for i := range elems {
		elems[i] = fmt.Sprintf(`{"name":"thing %d","price":12.5}`, i)
	}
	body := []byte("[" + strings.Join(elems, ",") + "]")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, bc := range []struct{ journal, collection string }{{"on", "widgets"}, {"off", "gadgets"}} {
		b.Run("journal="+bc.journal, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", "http://"+addr+"/api/"+bc.collection, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					b.Fatalf("%d, want 201", resp.StatusCode)
				}
			}
		})
	}
}
