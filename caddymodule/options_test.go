package caddymodule

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"
)

// TestOptionsTableIsDocumented holds UnmarshalCaddyfile's syntax to the
// options table: each option's line there, in the table's order, with
// each of its forms, and no option the table does not have.
func TestOptionsTableIsDocumented(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "caddyfile.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "UnmarshalCaddyfile" {
			doc = fn.Doc.Text()
		}
	}
	// The batch block's own lines are indented by four spaces; the
	// resource's and list_filter's are deeper.
	var got []string
	for _, line := range strings.Split(doc, "\n") {
		line, ok := strings.CutPrefix(line, "\t    ")
		if !ok || line == "" || line[0] == ' ' {
			continue
		}
		words := strings.Fields(line)
		if slices.Contains([]string{"resource", "envelope", "openapi", "}"}, words[0]) {
			continue
		}
		got = append(got, strings.Join(words, " "))
	}
	var want []string
	for _, o := range optionTable {
		for _, form := range o.forms {
			want = append(want, o.name+" "+form)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("UnmarshalCaddyfile's syntax lists the options\n%s\nand the table\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
