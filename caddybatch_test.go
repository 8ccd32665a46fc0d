package caddybatch

import (
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// xcaddyBuild is the part of xcaddy's Builder JSON that xcaddy.json uses.
type xcaddyBuild struct {
	CaddyVersion string `json:"caddy_version"`
	Plugins      []struct {
		ModulePath string `json:"module_path"`
		Version    string `json:"version"`
	} `json:"plugins"`
	Replacements []struct {
		Old string `json:"old"`
		New string `json:"new"`
	} `json:"replacements"`
}

// TestXcaddyBuildMatchesGoMod keeps the declared custom build in step
// with what the module is built and tested against.
func TestXcaddyBuildMatchesGoMod(t *testing.T) {
	raw, err := os.ReadFile("xcaddy.json")
	if err != nil {
		t.Fatal(err)
	}
	var b xcaddyBuild
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("xcaddy.json: %v", err)
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	module := regexp.MustCompile(`(?m)^module (\S+)$`).FindSubmatch(gomod)
	caddy := regexp.MustCompile(`(?m)^\s*github\.com/caddyserver/caddy/v2 (v\S+)`).FindSubmatch(gomod)
	if module == nil || caddy == nil {
		t.Fatal("go.mod names no module or no github.com/caddyserver/caddy/v2 requirement")
	}
	if b.CaddyVersion != string(caddy[1]) {
		t.Errorf("xcaddy.json caddy_version %q, go.mod requires Caddy %s", b.CaddyVersion, caddy[1])
	}
	if len(b.Plugins) != 1 || b.Plugins[0].ModulePath != string(module[1]) || b.Plugins[0].Version == "" {
		t.Errorf("xcaddy.json plugins %+v, want this module, %s, with a version", b.Plugins, module[1])
	}
	if len(b.Replacements) != 1 || b.Replacements[0].Old != string(module[1]) || b.Replacements[0].New != "." {
		t.Errorf("xcaddy.json replacements %+v, want %s => . (this checkout)", b.Replacements, module[1])
	}
}
