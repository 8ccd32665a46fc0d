// Command demo is the quick start: it serves the bundled demo legacy API
// (an in-memory REST server) on 127.0.0.1:3000 and, in the same process,
// Caddy with caddy-batch in front of it as Caddyfile.example configures
// it (on :8080). Stop it with Ctrl-C.
//
//	go run ./cmd/demo
package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-batch/caddy-batch"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

func main() {
	config := flag.String("config", "Caddyfile.example", "the Caddyfile to serve")
	upstream := flag.String("upstream", "127.0.0.1:3000", "where the demo legacy API listens")
	flag.Parse()

	stop, err := start(*config, *upstream)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("demo legacy API on http://%s; the gateway as %s configures it (http://localhost:8080 for Caddyfile.example)", *upstream, *config)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	<-signals
	if err := stop(); err != nil {
		log.Fatal(err)
	}
}

// start serves the demo legacy API on upstreamAddr and Caddy from the
// Caddyfile at configPath, whose {$UPSTREAM} is the API's address.
func start(configPath, upstreamAddr string) (stop func() error, err error) {
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return nil, fmt.Errorf("reading the config (run the demo from the repository's root, or pass -config): %w", err)
	}
	ln, err := net.Listen("tcp", upstreamAddr)
	if err != nil {
		return nil, fmt.Errorf("starting the demo legacy API: %w", err)
	}
	api := legacyapi.New(demoData()...)
	srv := &http.Server{Handler: describedAPI(api)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("demo legacy API: %v", err)
		}
	}()
	closeAPI := func() error {
		api.Close()
		return srv.Close()
	}
	if err := os.Setenv("UPSTREAM", ln.Addr().String()); err != nil {
		return nil, errors.Join(err, closeAPI())
	}
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, map[string]any{"filename": configPath})
	if err == nil {
		err = caddy.Load(cfgJSON, true)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("starting Caddy with %s: %w", configPath, err), closeAPI())
	}
	return func() error { return errors.Join(caddy.Stop(), closeAPI()) }, nil
}

// legacyOpenAPI is the demo legacy API's OpenAPI document, written by
// hand as a real API's is; Caddyfile.example imports the same file.
//
//go:embed legacy-openapi.yaml
var legacyOpenAPI []byte

// describedAPI serves the API's own OpenAPI document at /openapi.yaml,
// as many legacy APIs do, and the API everywhere else.
func describedAPI(api http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.HandleFunc("GET /openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(legacyOpenAPI)
	})
	return mux
}

// demoData is the demo legacy API's content: users (whose PUT cannot
// create, as in many legacy APIs, and whose LIST filters by ?id=, as
// json-server's does), their posts (any user's, a 404 for a user that
// does not exist), and read-only reports.
func demoData() []legacyapi.Collection {
	return []legacyapi.Collection{
		{Path: "/api/users", FilterParam: "id", Seed: []map[string]any{
			{"id": 1, "name": "ada", "email": "ada@example.com"},
			{"id": 2, "name": "bob", "email": "bob@example.com"},
			{"id": 3, "name": "cy", "email": "cy@example.com"},
		}},
		{Path: "/api/users/1/posts", Seed: []map[string]any{
			{"id": 1, "name": "notes on the analytical engine"},
		}},
		{Path: "/api/users/2/posts", Seed: []map[string]any{}},
		// The posts of every other user, one created at run time included.
		{Path: "/api/users/*/posts"},
		{Path: "/api/reports", Seed: []map[string]any{
			{"id": 1, "name": "q1", "total": 120},
			{"id": 2, "name": "q2", "total": 95},
		}},
	}
}
