// Command caddy is Caddy with its standard modules, caddy-batch and the
// Redis storage module (the storage a cluster of gateways shares): the
// offline alternative to xcaddy (go build ./cmd/caddy).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/pberkel/caddy-storage-redis"

	_ "github.com/caddy-batch/caddy-batch"
)

func main() {
	caddycmd.Main()
}
