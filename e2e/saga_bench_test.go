package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// BenchmarkUpdate100 measures a 100-item all-or-nothing batch UPDATE
// through the module against the fake legacy API: one that succeeds
// (preflight, locks, writes), the same with its preflight read through
// the API's LIST filter (list_filter with preflight), one whose last item
// fails so that 99 items are proved and undone, and, in the same run, the
// 100 PATCHes sent one by one through a plain reverse_proxy. Each op is
// one batch (100 items); upstream-req/item is what it costs the legacy
// API. The journal is off: this measures the saga's locks, proofs and
// undos.
//
//	go test -run '^$' -bench Update100 -benchmem -count 10 ./e2e | tee update.txt
//	benchstat -col /outcome update.txt
func BenchmarkUpdate100(b *testing.B) {
	seed := make([]map[string]any, 100)
	var elems []string
	for i := range seed {
		seed[i] = map[string]any{"id": i + 1, "name": fmt.Sprintf("widget %d", i+1)}
		elems = append(elems, fmt.Sprintf(`{"id":%d,"name":"renamed %d"}`, i+1, i+1))
	}
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, FilterParam: "id__in", FilterComma: true, Seed: seed})
	upstream := httptest.NewServer(api)
	defer upstream.Close()
	defer api.Close()
	batchAddr, listAddr, plainAddr := freeAddr(b), freeAddr(b), freeAddr(b)
	loadCaddyfile(b, fmt.Sprintf(quietGlobalOptions+`http://%[1]s {
	route {
		batch {
			# The journal's cost is BenchmarkCreate100Journal's to measure.
			journal off
			resource /api/widgets {
				collection GET PATCH
				item GET PUT PATCH
			}
		}
		@fail {
			method PATCH
			path /api/widgets/100
			header X-Fail yes
		}
		respond @fail "injected failure" 500
		reverse_proxy %[3]s
	}
}
http://%[4]s {
	batch {
		journal off
		resource /api/widgets {
			collection GET PATCH
			item GET PUT PATCH
			list_filter "id__in={ids}" {
				preflight
			}
		}
	}
	reverse_proxy %[3]s
}
http://%[2]s {
	reverse_proxy %[3]s
}
`, batchAddr, plainAddr, upstream.Listener.Addr(), listAddr))
	defer caddy.Stop()

	body := []byte("[" + strings.Join(elems, ",") + "]")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	send := func(b *testing.B, method, url string, body []byte, want int, header ...string) {
		req, _ := http.NewRequest(method, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := client.Do(req)
		drain(b, resp, err, want)
	}
	url := "http://" + batchAddr + "/api/widgets"
	// perItem reports what the legacy API served per item.
	perItem := func(b *testing.B) func() {
		b.ReportAllocs()
		start := len(api.Requests())
		return func() {
			b.ReportMetric(float64(len(api.Requests())-start)/float64(b.N*100), "upstream-req/item")
			api.ResetLog()
		}
	}
	b.Run("outcome=succeeded", func(b *testing.B) {
		defer perItem(b)()
		for b.Loop() {
			send(b, "PATCH", url, body, http.StatusOK)
		}
	})
	b.Run("outcome=succeeded-list-preflight", func(b *testing.B) {
		defer perItem(b)()
		for b.Loop() {
			send(b, "PATCH", "http://"+listAddr+"/api/widgets", body, http.StatusOK)
		}
	})
	b.Run("outcome=rolled_back", func(b *testing.B) {
		defer perItem(b)()
		for b.Loop() {
			send(b, "PATCH", url, body, http.StatusBadGateway, "X-Fail", "yes")
		}
	})
	b.Run("outcome=plain-100-patches", func(b *testing.B) {
		defer perItem(b)()
		for b.Loop() {
			for i := 1; i <= 100; i++ {
				send(b, "PATCH", fmt.Sprintf("http://%s/api/widgets/%d", plainAddr, i), fmt.Appendf(nil, `{"name":"renamed %d"}`, i), http.StatusOK)
			}
		}
	})
}
