package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// TestMaxResponseSizeThroughCaddy: the Caddyfile's max_response_size
// reaches the engine, and the answer streamed to the client carries its
// Content-Length.
func TestMaxResponseSizeThroughCaddy(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(paddedBody(r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:], 1000))
	}))
	defer upstream.Close()
	addr := freeAddr(t)
	loadCaddyfile(t, memoryConfig(addr, upstream.Listener.Addr().String(), "max_response_size 2500\n\t\tconcurrency 1"))
	defer func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	}()
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Get("http://" + addr + "/api/blobs?ids=1,2,3,4")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 502 || resp.Header.Get("Content-Type") != problem.ContentType {
		t.Fatalf("%d %s: want 502 problem+json", resp.StatusCode, raw)
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(raw)) {
		t.Errorf("Content-Length %q, for an answer of %d bytes", cl, len(raw))
	}
	var b batchwire.Response
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	want := []string{"succeeded", "succeeded", "failed", "not_attempted"}
	if got := b.Outcomes(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	if it := b.Items[2]; it.Body != nil || !strings.Contains(it.Error, "max_response_size (2500 bytes)") {
		t.Errorf("items[2]: body %s, error %q; want the body left out, and why", it.Body, it.Error)
	}
}
