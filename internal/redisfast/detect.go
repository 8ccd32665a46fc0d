// Package redisfast is the Redis fast path of the storage
// (docs/durability.md, "The Redis fast path"): where Caddy's storage is
// the caddy-storage-redis module talking to one Redis, with values
// neither compressed nor encrypted, a store, a delete and the storage
// locks each cost one round trip (a Lua script) instead of the module's
// several commands one after another, and locks taken or released at
// the same moment share one. What it stores is byte for byte what the
// module's own Store would, under the same keys, and its locks are the
// module's (the same keys, SET NX with the same lifetime), so that an
// instance on the fast path and one without it, of this build or an
// older, share one storage. It never imports the module: its init
// registers a Caddy module ID that a second registration would panic
// on. It reads the module's configuration from its exported fields
// (JSON) and reaches the client through its GetClient.
package redisfast

import (
	"context"
	"encoding/json"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-batch/caddy-batch/durable"
)

// modulePath is the module whose storage the fast path stands in for;
// moduleVersion the versions whose envelope and locks it was proven
// against (redisfast's tests compare it with the module's own Store and
// Lock).
const (
	modulePath    = "github.com/pberkel/caddy-storage-redis"
	moduleVersion = "v1.8."
)

// config is what the fast path reads of the module's configuration.
type config struct {
	ClientType     string   `json:"client_type"`
	Address        []string `json:"address"`
	KeyPrefix      string   `json:"key_prefix"`
	EncryptionKey  string   `json:"encryption_key"`
	Compression    string   `json:"compression"`
	RouteByLatency bool     `json:"route_by_latency"`
	RouteRandomly  bool     `json:"route_randomly"`
}

// clientGetter is the module's way to its client.
type clientGetter interface{ GetClient() any }

// For is the fast path over s, the certmagic storage, and generic, the
// storage as durable sees it otherwise; or nil and why not: anything
// the fast path cannot prove it stores as the module would sends every
// call the generic way.
func For(s any, generic durable.Storage) (*Store, string) {
	t := reflect.TypeOf(s)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().PkgPath() != modulePath {
		return nil, "not the caddy-storage-redis module"
	}
	if v := builtVersion(s); !strings.HasPrefix(v, moduleVersion) {
		return nil, "caddy-storage-redis " + v + " is not a version the fast path was proven against (" + moduleVersion + "x)"
	}
	getter, ok := s.(clientGetter)
	if !ok {
		return nil, "the module has no GetClient"
	}
	raw, err := json.Marshal(s)
	var c config
	if err == nil {
		err = json.Unmarshal(raw, &c)
	}
	switch {
	case err != nil:
		return nil, "its configuration could not be read: " + err.Error()
	case c.Compression != "":
		return nil, "compression is on"
	case c.EncryptionKey != "":
		return nil, "encryption is on"
	case c.RouteByLatency || c.RouteRandomly:
		return nil, "reads may go to replicas (route_by_latency, route_randomly)"
	}
	conn, why := connection(getter.GetClient(), c)
	if conn == nil {
		return nil, why
	}
	return newStore(generic, conn, c.KeyPrefix), ""
}

// connection is how the fast path reaches the one Redis that holds
// every key: a plain client, so that go-redis never routes by slot and a
// script may name any key.
func connection(client any, c config) (func(context.Context) (*redis.Client, error), string) {
	switch cl := client.(type) {
	case *redis.Client:
		return func(context.Context) (*redis.Client, error) { return cl, nil }, ""
	case *redis.ClusterClient:
		if c.ClientType != "failover" {
			return nil, "a Redis cluster (scripts over several keys fail with CROSSSLOT)"
		}
		// Sentinel: one master holds every key.
		return func(ctx context.Context) (*redis.Client, error) { return cl.MasterForKey(ctx, c.KeyPrefix) }, ""
	}
	return nil, "a Redis client the fast path does not know"
}

// builtVersion is the version of the module built into this binary:
// from the build's record of its modules, or, where there is none (a
// test binary), from the path of the file s's methods were compiled
// from, which names the module's version.
func builtVersion(s any) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			switch {
			case d.Path != modulePath:
			case d.Replace != nil:
				return d.Replace.Version
			default:
				return d.Version
			}
		}
	}
	m, ok := reflect.TypeOf(s).MethodByName("GetClient")
	if !ok {
		return "(unknown)"
	}
	file, _ := runtime.FuncForPC(m.Func.Pointer()).FileLine(m.Func.Pointer())
	_, v, ok := strings.Cut(file, modulePath+"@")
	if !ok {
		return "(unknown)"
	}
	v, _, _ = strings.Cut(v, "/")
	return v
}
