package caddybatch

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
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
	if len(b.Plugins) == 0 || b.Plugins[0].ModulePath != string(module[1]) || b.Plugins[0].Version == "" {
		t.Errorf("xcaddy.json plugins %+v, want this module, %s, with a version, first", b.Plugins, module[1])
	}
	// Every other plugin is one cmd/caddy builds in: at the version go.mod
	// requires, so that both builds are the same Caddy.
	main, err := os.ReadFile("cmd/caddy/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range b.Plugins[min(1, len(b.Plugins)):] {
		req := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(p.ModulePath) + ` (v\S+)`).FindSubmatch(gomod)
		switch {
		case req == nil:
			t.Errorf("xcaddy.json plugin %s is not required by go.mod", p.ModulePath)
		case string(req[1]) != p.Version:
			t.Errorf("xcaddy.json plugin %s %s, go.mod requires %s", p.ModulePath, p.Version, req[1])
		}
		if !strings.Contains(string(main), `_ "`+p.ModulePath+`"`) {
			t.Errorf("xcaddy.json plugin %s is not built into cmd/caddy", p.ModulePath)
		}
	}
	if len(b.Replacements) != 1 || b.Replacements[0].Old != string(module[1]) || b.Replacements[0].New != "." {
		t.Errorf("xcaddy.json replacements %+v, want %s => . (this checkout)", b.Replacements, module[1])
	}
}

// TestReadmeReadsInOneSitting keeps the README the operators' front
// door, short enough to read in one sitting: what grows goes to docs/,
// linked from it.
func TestReadmeReadsInOneSitting(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "\n"); n >= 450 {
		t.Errorf("README.md has %d lines, want under 450: move a section's detail to docs/ and link it", n)
	}
}
