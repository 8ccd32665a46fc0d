package e2e

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// itemLimiter stands in for a rate limiter such as caddy-ratelimit (not a
// dependency): it lets the first Allow requests through and refuses the
// rest as caddy-ratelimit does, with Retry-After and a 429 handler error.
type itemLimiter struct {
	Allow int64 `json:"allow"`
}

// limiterSeen counts the requests every itemLimiter has seen.
var limiterSeen atomic.Int64

func init() {
	caddy.RegisterModule(itemLimiter{})
	httpcaddyfile.RegisterHandlerDirective("batchtest_limit", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		if !h.NextArg() {
			return nil, h.ArgErr()
		}
		n, err := strconv.ParseInt(h.Val(), 10, 64)
		return itemLimiter{Allow: n}, err
	})
}

func (itemLimiter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.batchtest_limit", New: func() caddy.Module { return new(itemLimiter) }}
}

func (l itemLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if limiterSeen.Add(1) > l.Allow {
		w.Header().Set("Retry-After", "7")
		return caddyhttp.Error(http.StatusTooManyRequests, errors.New("rate limit exceeded"))
	}
	return next.ServeHTTP(w, r)
}

// TestRateLimitCountsItems: a rate limiter ordered after batch, as the
// README advises ("order rate_limit after batch"), counts items, not
// batches; the items it refuses never reach the upstream, and the batch
// answer carries their Retry-After.
func TestRateLimitCountsItems(t *testing.T) {
	api := seededAPI()
	upstream := httptest.NewServer(api)
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	g := &gateway{API: api, client: &http.Client{}, addr: freeAddr(t), upstream: upstream.Listener.Addr().String()}
	g.URL = "http://" + g.addr
	config := strings.Replace(g.config(`
	batch {
		concurrency 1
		resource /api/widgets {`+resourceMethods+`
			atomicity partial
		}
	}
	batchtest_limit 3
	reverse_proxy UPSTREAM
`), "{\n", "{\n\torder batchtest_limit after batch\n", 1)
	limiterSeen.Store(0)
	loadCaddyfile(t, config)
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})

	r := g.do(t, "GET", "/api/widgets?ids=1,2,3,4,5", nil)
	b := checkEnvelope(t, r, 207, "partial")
	if st := b.Statuses(); !slices.Equal(st, []int{200, 200, 200, 429, 429}) {
		t.Errorf("item statuses %v", st)
	}
	if got := limiterSeen.Load(); got != 5 {
		t.Errorf("the limiter saw %d requests, want one per item: 5", got)
	}
	if got := len(api.Requests()); got != 3 {
		t.Errorf("the legacy API got %d requests, want the 3 the limiter let through:%s", got, describeRequests(api.Requests()))
	}
	if got := r.Header.Get("Retry-After"); got != "7" {
		t.Errorf("Retry-After %q, want the limiter's 7", got)
	}
	if r := g.do(t, "GET", "/api/widgets/1", nil); r.Status != 429 {
		t.Errorf("a single GET after the batch used up the limit: %v", r)
	}
}
