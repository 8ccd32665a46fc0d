package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

// The directive goes before "basicauth" while Caddy lists it (it does in
// v2.11.9, just before "basic_auth"), and before "basic_auth" in a Caddy
// that dropped the deprecated name, without a panic either way.
func TestOrderBeforeAuthentication(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		listed map[string]bool // Caddy's order, as far as it matters
		want   string
	}{
		{"a Caddy that lists basicauth", map[string]bool{"basicauth": true, "basic_auth": true}, "basicauth"},
		{"a Caddy that dropped basicauth", map[string]bool{"basic_auth": true}, "basic_auth"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ordered []string
			register := func(dir string, position httpcaddyfile.Positional, standardDir string) {
				if !c.listed[standardDir] {
					// What Caddy's RegisterDirectiveOrder does.
					panic("the 3rd argument '" + standardDir + "' must be a directive that exists in the standard distribution of Caddy")
				}
				if dir != "batch" || position != httpcaddyfile.Before {
					t.Errorf("ordered %s %s %s", dir, position, standardDir)
				}
				ordered = append(ordered, standardDir)
			}
			if got := orderBeforeAuthentication(register); got != c.want || len(ordered) != 1 || ordered[0] != c.want {
				t.Errorf("ordered before %q (calls that took: %v), want %q", got, ordered, c.want)
			}
		})
	}
}

// Adapted, a site with every authentication directive runs batch ahead
// of all of them, in Caddy's default order: basicauth (deprecated, still
// working), basic_auth and forward_auth.
func TestAdaptOrdersBatchBeforeAuthentication(t *testing.T) {
	t.Parallel()
	out := adaptCaddyfile(t, `{
	admin off
}
:8080 {
	forward_auth /c/* localhost:9091 {
		uri /verify
	}
	basic_auth /b/* {
		admin `+adminHash+`
	}
	basicauth /a/* {
		admin `+adminHash+`
	}
	batch /api/* {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy localhost:9092
}`)
	var handlers []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if h, ok := v["handler"].(string); ok {
				handlers = append(handlers, h)
			}
			for _, k := range []string{"apps", "http", "servers", "srv0", "routes", "handle"} {
				if c, ok := v[k]; ok {
					walk(c)
				}
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	var cfg any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	walk(cfg)
	// authentication twice (basicauth, basic_auth), then forward_auth's
	// reverse_proxy, then the site's.
	want := "batch authentication authentication reverse_proxy reverse_proxy"
	if got := strings.Join(handlers, " "); got != want {
		t.Errorf("handlers in order: %s\nwant %s", got, want)
	}
}
