package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// BenchmarkEnvelope10 measures what the envelope saves a client that
// creates a user and 9 posts under it: one all-or-nothing envelope of the
// 10 creates, the posts naming the user through references, against the
// same 10 POSTs sent by the client one after another through a plain
// reverse_proxy (the user, its id read from the answer, then the posts),
// in one run, with Caddy as a process of its own (cmd/caddy, from
// caddyBinary) in front of the fake legacy API. Each op is one envelope's
// work (10 items): ns/op is the client's wait for it, caddy-cpu-ns/item
// the Caddy process's CPU time per operation (read from /proc, as
// BenchmarkGet100Process reads it), and upstream-req/item what it costs
// the legacy API; allocations are the test process's (client and fake
// API), not Caddy's. The fake API answers at once (upstream=fast), or
// each write after 10 ms (upstream=10ms), as BenchmarkCreate100Journal's
// does. The journal is off: its cost is BenchmarkCreate100Journal's to
// measure.
//
//	go test -run '^$' -bench Envelope10 -benchmem -count 8 ./e2e > envelope.txt
//	benchstat -col /path envelope.txt
func BenchmarkEnvelope10(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads the Caddy process's CPU time from /proc")
	}
	bin := caddyBinary(b)
	for _, upstream := range []struct {
		name  string
		delay time.Duration
	}{{"fast", 0}, {"10ms", 10 * time.Millisecond}} {
		b.Run("upstream="+upstream.name, func(b *testing.B) {
			api := legacyapi.New(
				legacyapi.Collection{Path: "/api/users", WriteDelay: upstream.delay},
				legacyapi.Collection{Path: "/api/users/*/posts", WriteDelay: upstream.delay},
			)
			counted := countedUpstream{served: new(atomic.Int64), handler: api}
			srv := httptest.NewServer(counted)
			defer srv.Close()
			defer api.Close()
			envelopeAddr, plainAddr := freeAddr(b), freeAddr(b)
			p := startCaddyProcess(b, bin, quietGlobalOptions+envelope10Sites(envelopeAddr, plainAddr, srv.Listener.Addr().String()), envelopeAddr)
			meter := &itemMeter{items: envelope10Posts + 1, cpuMetric: "caddy-cpu-ns/item", cpuClock: p.cpu, served: counted.served}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
			defer client.CloseIdleConnections()
			post := func(url string, body []byte) (*http.Response, error) {
				return client.Post(url, "application/json", bytes.NewReader(body))
			}

			b.Run("path=envelope", func(b *testing.B) {
				body := envelope10Body()
				meter.start(b)
				for b.Loop() {
					resp, err := post("http://"+envelopeAddr+"/api/batch", body)
					drain(b, resp, err, http.StatusOK)
				}
				meter.report(b)
			})
			b.Run("path=sequential", func(b *testing.B) {
				meter.start(b)
				for b.Loop() {
					resp, err := post("http://"+plainAddr+"/api/users", []byte(`{"name":"ada"}`))
					var user struct{ ID json.Number }
					if err == nil && resp.StatusCode == http.StatusCreated {
						err = json.NewDecoder(resp.Body).Decode(&user)
					}
					drain(b, resp, err, http.StatusCreated)
					for i := range envelope10Posts {
						resp, err := post("http://"+plainAddr+"/api/users/"+user.ID.String()+"/posts",
							fmt.Appendf(nil, `{"title":"post %d","author_id":%s}`, i, user.ID))
						drain(b, resp, err, http.StatusCreated)
					}
				}
				meter.report(b)
			})
		})
	}
}

// envelope10Posts are the posts BenchmarkEnvelope10 creates under its user.
const envelope10Posts = 9

// envelope10Body is the envelope of BenchmarkEnvelope10: a user, then the
// posts under it, each naming the user's id.
func envelope10Body() []byte {
	body := []byte(`{"atomicity": "all_or_nothing", "operations": [
	{"id": "u", "method": "POST", "url": "/api/users", "body": {"name": "ada"}}`)
	for i := range envelope10Posts {
		body = fmt.Appendf(body, `,
	{"id": "p%d", "method": "POST", "url": "/api/users/$u/posts", "body": {"title": "post %d", "author_id": "$u#/id"}}`, i, i)
	}
	return append(body, "\n]}"...)
}

// envelope10Sites is the Caddyfile of BenchmarkEnvelope10's two sites in
// front of upstream: the batch handler with its envelope, and a plain
// reverse_proxy.
func envelope10Sites(envelope, plain, upstream string) string {
	return fmt.Sprintf(`http://%[1]s {
	batch /api/* {
		# The journal's cost is BenchmarkCreate100Journal's to measure.
		journal off
		envelope /api/batch
		resource /api/users {
			collection GET POST
			item GET DELETE
		}
		resource /api/users/{user}/posts {
			collection GET POST
			item GET DELETE
		}
	}
	reverse_proxy %[3]s
}
http://%[2]s {
	reverse_proxy %[3]s
}
`, envelope, plain, upstream)
}
