package e2e

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestDirectiveOrderKeepsTheRest: in its place before authentication,
// batch still works with what comes before it (rewrite) and after it
// (handle, handle_path), and its method map and declarative delete still
// answer.
func TestDirectiveOrderKeepsTheRest(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	rewrite /w /api/widgets?{query}
	batch {
		resource /api/widgets {`+resourceMethods+`
			delete_semantics declarative
		}
		resource /v1/api/gadgets {`+resourceMethods+`
		}
	}
	handle_path /v1/* {
		reverse_proxy UPSTREAM
	}
	handle {
		reverse_proxy UPSTREAM
	}
`)
	t.Run("rewrite before batch", func(t *testing.T) {
		b := checkEnvelope(t, g.do(t, "GET", "/w?ids=1,2", nil), 200, "succeeded")
		if !slices.Equal(b.IDs(), []string{"1", "2"}) || !sameJSON(t, b.Items[1].Body, map[string]any{"id": 2, "name": "w2"}) {
			t.Errorf("items %+v", b.Items)
		}
	})
	t.Run("handle_path after batch", func(t *testing.T) {
		api.ResetLog()
		checkEnvelope(t, g.do(t, "DELETE", "/v1/api/gadgets?ids=3,4", nil), 200, "succeeded")
		for _, id := range []string{"3", "4"} {
			if _, ok := api.Item("/api/gadgets", id); ok {
				t.Errorf("gadget %s was not deleted", id)
			}
		}
		for _, req := range api.Requests() {
			if !strings.HasPrefix(req.Path, "/api/gadgets/") {
				t.Errorf("the legacy API got %s %s: handle_path did not strip /v1", req.Method, req.Path)
			}
		}
	})
	t.Run("handle after batch", func(t *testing.T) {
		b := checkEnvelope(t, g.do(t, "PATCH", "/api/widgets", `[{"id": 5, "name": "five"}]`), 200, "succeeded")
		if rec, _ := api.Item("/api/widgets", "5"); rec["name"] != "five" {
			t.Errorf("widget 5 is %v; answer %+v", rec, b.Items)
		}
	})
	t.Run("method map and declarative delete", func(t *testing.T) {
		api.ResetLog()
		if r := g.do(t, "OPTIONS", "/api/widgets", nil); r.Status != 204 || r.Header.Get("Allow") != "GET, HEAD, POST, PATCH, DELETE, OPTIONS" {
			t.Errorf("OPTIONS: %v %q", r, r.Header.Get("Allow"))
		}
		if r := g.do(t, "PUT", "/api/widgets", map[string]any{"id": 1}); r.Status != 405 {
			t.Errorf("PUT on the collection: %v", r)
		}
		if r := g.do(t, "BREW", "/api/widgets/1", nil); r.Status != 501 {
			t.Errorf("BREW: %v", r)
		}
		if reqs := api.Requests(); len(reqs) > 0 {
			t.Errorf("refused requests reached the legacy API:%s", describeRequests(reqs))
		}
		if r := g.do(t, "DELETE", "/api/widgets/999", nil); r.Status != 204 {
			t.Errorf("declarative DELETE of a missing item: %v", r)
		}
	})
}

// TestEncodeAndBatch: encode in a route before batch compresses the
// batch answer; the sub-requests never are (their bodies stay JSON
// items). A site-level encode, ordered after batch, compresses what
// passes through but not a batch answer.
func TestEncodeAndBatch(t *testing.T) {
	const ids = "/api/widgets?ids=1,2,3,4,5,6,7,8,9,10" // an answer above encode's 512-byte minimum
	check := func(t *testing.T, g *gateway, wantGzip bool) {
		t.Helper()
		r := g.do(t, "GET", ids, nil, "Accept-Encoding", "gzip")
		if r.Status != 200 {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		body := r.Body
		if ce := r.Header.Get("Content-Encoding"); (ce == "gzip") != wantGzip {
			t.Fatalf("Content-Encoding %q, want gzip: %v", ce, wantGzip)
		}
		if wantGzip {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if body, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		strictJSON(t, body)
		b := response{Status: r.Status, Header: r.Header, Body: body}.batch(t)
		for i, it := range b.Items {
			if !sameJSON(t, it.Body, map[string]any{"id": i + 1, "name": "w" + strconv.Itoa(i+1)}) {
				t.Errorf("item %d body %s, body_text %q: the sub-request's answer was not plain JSON", i, it.Body, it.BodyText)
			}
		}
		for _, req := range g.API.Requests() {
			if strings.Contains(req.Header.Get("Accept-Encoding"), "br") {
				t.Errorf("%s %s carries the client's Accept-Encoding", req.Method, req.Path)
			}
		}
	}
	t.Run("encode in a route before batch", func(t *testing.T) {
		g := startGateway(t, seededAPI(), `
	route {
		encode gzip
		batch {
			resource /api/widgets {`+resourceMethods+`
			}
		}
	}
	reverse_proxy UPSTREAM
`)
		check(t, g, true)
	})
	t.Run("encode at the site, after batch", func(t *testing.T) {
		g := startGateway(t, seededAPI(), `
	encode {
		gzip
		minimum_length 1
	}
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
		check(t, g, false)
		r := g.do(t, "GET", "/api/widgets", nil, "Accept-Encoding", "gzip") // a LIST passes through
		if r.Status != 200 || r.Header.Get("Content-Encoding") != "gzip" {
			t.Errorf("a request that passed through: %d, Content-Encoding %q", r.Status, r.Header.Get("Content-Encoding"))
		}
	})
}

// upstreamAnswers serves api with extra headers on the answers to the
// given paths, which the fake cannot send itself.
func upstreamAnswers(t *testing.T, api *legacyapi.API, header map[string][2]string) string {
	t.Helper()
	upstream := httptest.NewServer(headerRewriter{Handler: api, rewrite: func(r *http.Request, h http.Header) {
		if kv, ok := header[r.URL.Path]; ok {
			h.Set(kv[0], kv[1])
		}
	}})
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	return upstream.Listener.Addr().String()
}
