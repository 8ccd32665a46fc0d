// Command caddy is Caddy with its standard modules and caddy-batch: the
// offline alternative to xcaddy (go build ./cmd/caddy).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-batch/caddy-batch"
)

func main() {
	caddycmd.Main()
}
