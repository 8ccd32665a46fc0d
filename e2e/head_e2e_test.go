package e2e

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// HEAD where the legacy API has none (docs/wire-format.md, "HEAD"): the map's Allow
// says HEAD wherever it says GET, so a HEAD the API answers 405 is sent
// again as GET and answered without the body; learnt, a resource's HEADs
// go as GETs at once until the config is reloaded.

// headSite is the gateway in front of headAPI: FastAPI's users and teams
// (no HEAD), widgets whose API has HEAD, and reports that allow no GET.
// Items are far larger than max_body_size, which a single request does
// not bound, and which a body held whole would not fit.
const headSite = `
	batch {
		max_body_size 1KiB
		resource /api/users/ {
			item_path  /api/users/{id}
			collection GET POST
			item       GET PATCH DELETE
		}
		resource /api/teams/ {
			item_path  /api/teams/{id}
			collection GET POST
			item       GET PATCH DELETE
		}
		resource /api/widgets {` + resourceMethods + `
		}
		resource /api/reports {
			collection POST
			atomicity partial
		}
	}
	reverse_proxy UPSTREAM
`

func headAPI() *legacyapi.API {
	big := []map[string]any{{"id": 20, "name": "Ada", "bio": strings.Repeat("x", 256<<10)}}
	return legacyapi.NewRecording(
		legacyapi.Collection{Path: "/api/users", FastAPI: true, Seed: big},
		legacyapi.Collection{Path: "/api/teams", FastAPI: true, Seed: big},
		legacyapi.Collection{Path: "/api/widgets", Seed: big},
	)
}

// sentUpstream is "METHOD path" of each request the API received under
// prefix since the log was reset.
func sentUpstream(api *legacyapi.API, prefix string) []string {
	var out []string
	for _, r := range api.Requests() {
		if strings.HasPrefix(r.Path, prefix) {
			out = append(out, r.Method+" "+r.Path)
		}
	}
	return out
}

// checkHeadAsGet sends HEAD path and checks that it is answered as the
// API answers GET path, with no body, and that the API was sent want.
func checkHeadAsGet(t *testing.T, g *gateway, path string, want ...string) {
	t.Helper()
	get := g.do(t, "GET", path, nil)
	g.API.ResetLog()
	head := g.do(t, "HEAD", path, nil)
	if head.Status != get.Status || len(head.Body) != 0 || get.Status != http.StatusOK {
		t.Errorf("HEAD %s: %d with %d bytes, want GET's %d with none", path, head.Status, len(head.Body), get.Status)
	}
	for _, name := range []string{"Content-Type", "Content-Length"} {
		if head.Header.Get(name) != get.Header.Get(name) {
			t.Errorf("HEAD %s: %s %q, GET's %q", path, name, head.Header.Get(name), get.Header.Get(name))
		}
	}
	if got := sentUpstream(g.API, path); !slices.Equal(got, want) {
		t.Errorf("HEAD %s sent %q upstream, want %q", path, got, want)
	}
}

func TestHeadWhereTheAPIHasNone(t *testing.T) {
	g := startGateway(t, headAPI(), headSite)
	if got := g.do(t, "GET", "/api/users/20", nil); len(got.Body) <= 256<<10 || got.Header.Get("Content-Length") != strconv.Itoa(len(got.Body)) {
		t.Fatalf("GET: %d bytes, Content-Length %s", len(got.Body), got.Header.Get("Content-Length"))
	}

	// First an item's HEAD, then a collection's: each is refused and sent
	// again as GET; then the resource's HEADs go as GETs at once.
	checkHeadAsGet(t, g, "/api/users/20", "HEAD /api/users/20", "GET /api/users/20")
	checkHeadAsGet(t, g, "/api/users/", "GET /api/users/")
	checkHeadAsGet(t, g, "/api/users/20", "GET /api/users/20")
	checkHeadAsGet(t, g, "/api/teams/", "HEAD /api/teams/", "GET /api/teams/")
	checkHeadAsGet(t, g, "/api/teams/20", "GET /api/teams/20")

	// What was learnt lives as long as the config.
	loadCaddyfile(t, g.config(headSite))
	checkHeadAsGet(t, g, "/api/users/20", "HEAD /api/users/20", "GET /api/users/20")

	// An API with HEAD gets the HEAD alone.
	checkHeadAsGet(t, g, "/api/widgets/20", "HEAD /api/widgets/20")
	checkHeadAsGet(t, g, "/api/widgets/20", "HEAD /api/widgets/20")

	// A HEAD the map does not allow is the gateway's 405.
	g.API.ResetLog()
	r := g.do(t, "HEAD", "/api/reports", nil)
	if r.Status != http.StatusMethodNotAllowed || strings.Contains(r.Header.Get("Allow"), "HEAD") || len(sentUpstream(g.API, "/api/reports")) != 0 {
		t.Errorf("HEAD /api/reports: %d, Allow %q, sent %q; want the gateway's 405", r.Status, r.Header.Get("Allow"), sentUpstream(g.API, "/api/reports"))
	}
}
