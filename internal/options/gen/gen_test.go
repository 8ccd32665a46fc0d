package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/options"
)

// TestGenerated holds README.md's syntax block and options table, and
// UnmarshalCaddyfile's syntax, to what go generate ./... writes from the
// options: a hand edit there, or an option added without go generate,
// fails here, naming the first line that differs.
func TestGenerated(t *testing.T) {
	files, err := generate("../../..", options.Forms())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if n, have, want, differ := firstDifference(f.old, f.new); differ {
			t.Errorf("%s line %d differs from what go generate ./... writes (run it):\nhave %q\nwant %q", f.name, n, have, want)
		}
	}
}

// TestGeneratorRefusesAFieldWithoutARow: every field of Options is some
// form's, and every form sets a field that exists, once.
func TestGeneratorRefusesAFieldWithoutARow(t *testing.T) {
	forms := options.Forms()
	var without []options.Form
	for _, f := range forms {
		if f.Field != "journal" {
			without = append(without, f)
		}
	}
	_, err := generate("../../..", append(without,
		options.Form{Option: "ghost", Args: "<n>", Field: "ghost"},
		options.Form{Option: "again", Args: "<n>", Field: "max_items"}))
	for _, want := range []string{
		"the field journal of Options is set by no row",
		"option ghost <n> sets ghost, which is no field",
		"options max_items <n> and again <n> both set max_items",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("generate says %v, want %q", err, want)
		}
	}
}

// firstDifference is the first line, counted from 1, at which have and
// want differ, and that line of each.
func firstDifference(have, want []byte) (n int, h, w string, differ bool) {
	hl, wl := bytes.Split(have, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := 0; i < max(len(hl), len(wl)); i++ {
		var a, b []byte
		if i < len(hl) {
			a = hl[i]
		}
		if i < len(wl) {
			b = wl[i]
		}
		if i >= len(hl) || i >= len(wl) || !bytes.Equal(a, b) {
			return i + 1, string(a), string(b), true
		}
	}
	return 0, "", "", false
}
