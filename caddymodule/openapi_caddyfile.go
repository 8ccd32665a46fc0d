package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-batch/caddy-batch/internal/options"
	"github.com/caddy-batch/caddy-batch/policy"
)

// openapiWords are the subdirectives of an openapi block.
var openapiWords = []string{"prefix", "publish", "include", "exclude"}

// unmarshalOpenAPI reads openapi [<file>] { prefix <path>; publish
// <path>; include <pattern...>; exclude <pattern...> }. A relative file
// name is taken from the Caddyfile's directory, as import does, and the
// document's hash goes into the config, so that a reload after editing
// only the document is a new config.
func (h *Handler) unmarshalOpenAPI(d *caddyfile.Dispenser, seen map[string]caddyfile.Token) error {
	if err := options.Once(d, seen, "openapi", d.Token()); err != nil {
		return err
	}
	c := &OpenAPIConfig{}
	if d.NextArg() {
		if err := c.locate(d); err != nil {
			return err
		}
	}
	if d.NextArg() {
		return d.Errf("openapi takes one file, not %q too", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if !slices.Contains(openapiWords, name) {
			if n := policy.Nearest(name, openapiWords); n != "" {
				return d.Errf("unknown openapi option %q: did you mean %s?", name, n)
			}
			return d.Errf("unknown openapi option %q (this block takes %s)", name, strings.Join(openapiWords, ", "))
		}
		if err := options.Once(d, seen, name, d.Token()); err != nil {
			return err
		}
		args := d.RemainingArgs()
		switch {
		case len(args) == 0:
			return d.Errf("%s needs a value, e.g. %s", name, map[string]string{
				"prefix": "prefix /api", "publish": "publish /api/openapi.json",
				"include": "include /users*", "exclude": "exclude /internal/*"}[name])
		case name == "prefix" || name == "publish":
			if len(args) != 1 {
				return d.Errf("%s takes one path, not %q", name, strings.Join(args, " "))
			}
			if name == "prefix" {
				c.Prefix = &args[0]
			} else {
				c.Publish = args[0]
			}
		case name == "include":
			c.Include = args
		default:
			c.Exclude = args
		}
	}
	if c.File == "" && c.Publish == "" {
		at := caddyfile.NewDispenser([]caddyfile.Token{seen["openapi"]})
		at.Next()
		return at.Err("openapi without a file publishes the declared resources: give it publish <path>, or the document's file")
	}
	h.OpenAPI = c
	return nil
}

// locate takes the file the dispenser is on from the Caddyfile's
// directory, and hashes it.
func (c *OpenAPIConfig) locate(d *caddyfile.Dispenser) error {
	file := d.Val()
	if !filepath.IsAbs(file) {
		file = filepath.Join(filepath.Dir(d.File()), file)
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return d.Errf("openapi %s: %v", d.Val(), err)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return d.Errf("openapi: reading the document: %v (a relative name is taken from the Caddyfile's directory)", err)
	}
	sum := sha256.Sum256(data)
	c.File, c.SHA256 = abs, hex.EncodeToString(sum[:])
	return nil
}
