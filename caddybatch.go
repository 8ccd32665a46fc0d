// Package caddybatch is the module's root: importing it registers the
// http.handlers.batch Caddy module and the batch Caddyfile directive, so
// that "xcaddy build --with github.com/caddy-batch/caddy-batch" works.
// The code lives in caddymodule (Caddy glue), batch (the engine) and
// policy (the method map).
package caddybatch

import (
	// Registers the module and the directive.
	_ "github.com/caddy-batch/caddy-batch/caddymodule"
)
