// Package caddybatch is the module's root: importing it registers the
// http.handlers.batch Caddy module and the batch Caddyfile directive
// (package caddymodule), and the batch app, its global option, the
// admin.api.batch module and the caddy batch subcommands (package
// batchapp), so that "xcaddy build --with
// github.com/caddy-batch/caddy-batch" works. The engine (batch), the
// method map (policy) and what outlives a request (durable) know
// nothing of Caddy.
package caddybatch

import (
	// Register the modules, the directive, the global option and the
	// subcommands.
	_ "github.com/caddy-batch/caddy-batch/batchapp"
	_ "github.com/caddy-batch/caddy-batch/caddymodule"
)
