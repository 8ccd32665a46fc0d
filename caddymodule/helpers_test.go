package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// The tests here start no Caddy: they adapt Caddyfiles, provision
// handlers and call the package's functions. The tests that run a Caddy
// are in e2e/.

const resourceMethods = `
			collection GET POST PATCH DELETE
			item       GET PUT PATCH DELETE`

// adminHash is the bcrypt hash (cost 4) of "s3cret", for the
// authentication directives of adapted sites.
const adminHash = "$2a$04$fboZ5hDttoymMM22j0cJkuF2CaZaCyt0HfAOn7bk0HxgeLL83S2im"

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
