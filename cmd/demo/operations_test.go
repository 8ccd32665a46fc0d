package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// demo is the running demo of the documents' session: where its gateway and
// admin endpoint listen, its config file, and the saga id the last caddy
// batch command showed (docs/operations.md writes <saga> for it).
type demo struct {
	gateway, admin, config string
	saga                   string
	job                    jobPlaceholders
}

var (
	sagaIDs   = regexp.MustCompile(`\b[0-9a-f]{32}\b`)
	dateTimes = regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`)
	blanks    = regexp.MustCompile(`[ \t]+`)
)

// caddy runs a step of docs/operations.md's worked example: caddy
// reload (after the edit it asks for: uncommenting the users'
// restore_deleted post), or a caddy batch command, in this process,
// against the demo's admin endpoint; its output is compared with the
// document's, saga ids and times written <saga> and <time>, and runs of
// blanks as one.
func (d *demo) caddy(t *testing.T, s step) {
	args := shellWords(t, s.command)
	switch {
	case len(args) == 4 && args[1] == "reload" && args[2] == "--config" && args[3] == "Caddyfile.example":
		d.reload(t)
		return
	case len(args) < 3 || args[1] != "batch":
		t.Fatalf("the session runs caddy reload --config Caddyfile.example and caddy batch ..., not %q", s.command)
	}
	for i, a := range args {
		if a == "<saga>" {
			args[i] = d.saga
		}
	}
	cmd, ok := caddycmd.Commands()["batch"]
	if !ok {
		t.Fatal("caddy batch is not registered")
	}
	root := &cobra.Command{Use: "batch"}
	cmd.CobraFunc(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs(append(args[2:], "--address", d.admin))
	if err := root.Execute(); err != nil {
		t.Fatalf("%s: %v\n%s", s.command, err, out.String())
	}
	if id := sagaIDs.FindString(out.String()); id != "" {
		d.saga = id
	}
	got := normalize(dateTimes.ReplaceAllString(sagaIDs.ReplaceAllString(out.String(), "<saga>"), "<time>"))
	if want := normalize(s.output); got != want {
		t.Errorf("%s printed\n%s\ndocs/operations.md shows\n%s", s.command, got, want)
	}
}

func normalize(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(blanks.ReplaceAllString(l, " "))
	}
	return strings.Join(lines, "\n")
}

// reload makes the edit docs/operations.md asks for and loads the
// config, as caddy reload does.
func (d *demo) reload(t *testing.T) {
	raw, err := os.ReadFile(d.config)
	if err != nil {
		t.Fatal(err)
	}
	const commented = "\t\t\t# restore_deleted post\n"
	if bytes.Count(raw, []byte(commented)) != 1 {
		t.Fatal("Caddyfile.example no longer has the users' restore_deleted post commented out, as docs/operations.md says")
	}
	raw = bytes.Replace(raw, []byte(commented), []byte("\t\t\trestore_deleted post\n"), 1)
	if err := os.WriteFile(d.config, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, map[string]any{"filename": d.config})
	if err == nil {
		err = caddy.Load(cfg, false)
	}
	if err != nil {
		t.Fatalf("reloading: %v", err)
	}
}
