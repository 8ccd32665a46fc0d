// Package e2e holds the end-to-end tests of the module: every test that
// starts a Caddy, in the test process or as the built cmd/caddy, in front
// of the fake legacy API (internal/legacyapi). It sees the module from
// outside, as an operator and a client do: its Caddyfile and JSON config,
// the admin endpoint, the metrics of the running config, the storage and
// the logs. The unit tests sit beside their code and start no Caddy.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The module under test, registered as a Caddy built with it has it.
	_ "github.com/caddy-batch/caddy-batch"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The end-to-end tests run a real Caddy in this process (one at a time:
// Caddy's running config is global), with the module in front of the fake
// legacy API over loopback. Caddy's admin endpoint is off, and every port
// is picked free, so packages can test in parallel.

// globalOptions keep Caddy off the admin port, off the disk, and logging
// into testLogs, where tests read the batch log line and access logs.
const globalOptions = `{
	admin off
	auto_https off
	persist_config off
	grace_period 2s
	log {
		output batchtest
		format json
		level DEBUG
	}
}
`

// quietGlobalOptions are the global options of the benchmarks and
// measurements: as globalOptions keep Caddy off the admin port and the
// disk, and it logs nothing, since reverse_proxy's debug lines would be
// most of what is measured.
const quietGlobalOptions = `{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
}
`

// gateway is a running Caddy in front of a fake legacy API.
type gateway struct {
	URL    string
	API    *legacyapi.API
	client *http.Client

	addr, upstream string // host:port of the site and of the fake API
	// storage is the storage global option: a test's own folder unless a
	// test shares one, so that no record outlives the test.
	storage string
	// admin is the admin endpoint's address (host:port) where a test
	// turns it on; off otherwise.
	admin string
	// logs is the output of an instance run as a process of its own.
	logs *syncBuffer
	// globals are more global options (an events block, say).
	globals string
}

// startGateway serves the site body (Caddyfile directives, with UPSTREAM
// standing for the fake API's address) on a free loopback port.
func startGateway(t testing.TB, api *legacyapi.API, site string) *gateway {
	t.Helper()
	upstream := httptest.NewServer(api)
	t.Cleanup(func() {
		api.Close()
		upstream.Close()
	})
	return startGatewayTo(t, api, upstream.Listener.Addr().String(), site)
}

// startGatewayTo is startGateway for a fake API the test serves itself at
// upstream (host:port), e.g. to take it down and bring it back.
func startGatewayTo(t testing.TB, api *legacyapi.API, upstream, site string) *gateway {
	t.Helper()
	return startGatewayStorage(t, api, upstream, "storage file_system "+t.TempDir(), site)
}

// startGatewayStorage is startGatewayTo with the storage global option
// given, e.g. "storage redis { ... }".
func startGatewayStorage(t testing.TB, api *legacyapi.API, upstream, storage, site string) *gateway {
	t.Helper()
	g := &gateway{API: api, client: gatewayClient(t, 60*time.Second), addr: freeAddr(t), upstream: upstream, storage: storage}
	g.start(t, site)
	return g
}

// gatewayClient is a client of one gateway's own, its idle connections
// closed when the test ends. Through the shared default transport, a
// connection kept alive to an earlier test's gateway at the same address
// (its port freed and handed out again) could be reused, and a request
// that cannot be replayed (a DELETE) answered EOF. Its dials try again
// when the connection is reset before it is made: a config loaded again
// closes the old listener, and Linux resets the connections still in
// that listener's queue (SO_REUSEPORT); nothing was sent on them.
func gatewayClient(t testing.TB, timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		for try := 1; ; try++ {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err == nil || try == 3 || !errors.Is(err, syscall.ECONNRESET) {
				return conn, err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: timeout, Transport: tr}
}

// start runs Caddy with g's config serving site.
func (g *gateway) start(t testing.TB, site string) {
	t.Helper()
	g.URL = "http://" + g.addr
	loadCaddyfile(t, g.config(site))
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})
	testLogs.reset()
}

// storageDir is the folder of g's file system storage.
func (g *gateway) storageDir(t testing.TB) string {
	t.Helper()
	dir, ok := strings.CutPrefix(g.storage, "storage file_system ")
	if !ok || strings.ContainsAny(dir, " \n") {
		t.Fatalf("the gateway's storage is no file system folder: %q", g.storage)
	}
	return dir
}

// config is the whole Caddyfile that serves site on g's address.
func (g *gateway) config(site string) string {
	globals := globalOptions
	if g.storage != "" {
		globals = strings.Replace(globals, "{\n", "{\n\t"+g.storage+"\n", 1)
	}
	if g.admin != "" {
		globals = strings.Replace(globals, "admin off", "admin "+g.admin, 1)
	}
	if g.globals != "" {
		globals = strings.Replace(globals, "{\n", "{\n"+g.globals+"\n", 1)
	}
	return globals + "http://" + g.addr + " {\n" + strings.ReplaceAll(site, "UPSTREAM", g.upstream) + "\n}\n"
}

func loadCaddyfile(t testing.TB, config string) {
	t.Helper()
	if err := caddy.Load(adaptCaddyfile(t, config), true); err != nil {
		t.Fatalf("loading the config: %v", err)
	}
}

func adaptCaddyfile(t testing.TB, config string) []byte {
	t.Helper()
	cfgJSON, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(config), nil)
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v\n%s", err, config)
	}
	for _, w := range warnings {
		if !strings.Contains(w.Message, "not formatted") {
			t.Logf("caddyfile warning: %s", w)
		}
	}
	return cfgJSON
}

// drain fails a benchmark whose request got no answer, or another status
// than want, and reads the answer whole, so that its connection is kept
// for the next request.
func drain(b testing.TB, resp *http.Response, err error, want int) {
	b.Helper()
	if err := drained(resp, err, want); err != nil {
		b.Fatal(err)
	}
}

// drained is drain for any goroutine: it returns what went wrong.
func drained(resp *http.Response, err error, want int) error {
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d, want %d", resp.Request.Method, resp.Request.URL, resp.StatusCode, want)
	}
	return nil
}

// freeAddr is a loopback address nothing listens on, for a server a
// test starts later: a port below the kernel's ephemeral range
// (32768–60999 on Linux), where the source ports of the tests' own
// connections and the ports of their httptest servers never land
// between the pick and the bind, and never one this process handed out
// before.
func freeAddr(t testing.TB) string {
	t.Helper()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if _, taken := handedOut.LoadOrStore(port, true); taken {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue // another program's
		}
		l.Close()
		return addr
	}
	t.Fatal("no free port between 20000 and 32000 in 1000 tries")
	return ""
}

// handedOut are the ports freeAddr gave.
var handedOut sync.Map

// response is an answer of the gateway, read whole.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body as a JSON object.
func (r response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("body is not a JSON object: %v\n%s", err, r.Body)
	}
	return v
}

func (r response) String() string { return fmt.Sprintf("%d %s", r.Status, r.Body) }

// do sends a request; a non-nil body that is not []byte is sent as JSON.
// It fails the test on an error, so it is for the test's own goroutine:
// another goroutine uses try, and hands the error to the test's.
func (g *gateway) do(t testing.TB, method, path string, body any, header ...string) response {
	t.Helper()
	r, err := g.try(method, path, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// try sends a request as do does, and returns what went wrong instead of
// failing the test: it may be called from any goroutine.
func (g *gateway) try(method, path string, body any, header ...string) (response, error) {
	var reader io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		reader = bytes.NewReader(b)
	case string:
		reader = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return response{}, err
		}
		reader = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, g.URL+path, reader)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: raw}, nil
}

// testLogs collects what Caddy logs while a test runs.
var testLogs logBuffer

type logBuffer struct {
	mu    sync.Mutex
	lines [][]byte
	part  []byte
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.part = append(b.part, p...)
	for {
		i := bytes.IndexByte(b.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		b.lines = append(b.lines, bytes.Clone(b.part[:i]))
		b.part = b.part[i+1:]
	}
}

func (b *logBuffer) Close() error { return nil }

func (b *logBuffer) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines, b.part = nil, nil
}

// entries returns the decoded log entries whose logger is named logger.
func (b *logBuffer) entries(logger string) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range b.lines {
		var e map[string]any
		if json.Unmarshal(line, &e) == nil && e["logger"] == logger {
			out = append(out, e)
		}
	}
	return out
}

// logWriter is a log output module for the tests: "output batchtest".
type logWriter struct{}

func init() { caddy.RegisterModule(logWriter{}) }

func (logWriter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.logging.writers.batchtest", New: func() caddy.Module { return new(logWriter) }}
}
func (logWriter) String() string                                   { return "batchtest" }
func (logWriter) WriterKey() string                                { return "batchtest" }
func (logWriter) OpenWriter() (io.WriteCloser, error)              { return &testLogs, nil }
func (*logWriter) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { d.Next(); return nil }
