// Command gen writes the batch directive's documentation from its one
// source, package options: the syntax block and the options table of
// README.md, and the syntax block of UnmarshalCaddyfile's doc comment
// (caddymodule/caddyfile.go). The options' lines and rows come from
// optionTable's forms, in its order; each row's meaning and default
// from the doc comment of the field of Options the form sets, which
// ends "Default: <value>.". The rest of the directive's syntax (envelope,
// openapi, the resource block) is written here.
//
// Run it with go generate ./...; TestGenerated fails when a file
// differs from what it would write.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/caddy-batch/caddy-batch/internal/options"
)

func main() {
	root := flag.String("root", ".", "the repository's root directory")
	flag.Parse()
	files, err := generate(*root, options.Forms())
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	for _, f := range files {
		if bytes.Equal(f.old, f.new) {
			continue
		}
		if err := os.WriteFile(f.path, f.new, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
}

// file is a file gen writes: what it holds, and what it should.
type file struct {
	path     string // as the generator was given root
	name     string // from the repository's root
	old, new []byte
}

// generate reads the files under root and returns each with the
// regions gen writes rewritten from forms.
func generate(root string, forms []options.Form) ([]file, error) {
	fields, err := fieldDocs(filepath.Join(root, "internal", "options", "options.go"))
	if err != nil {
		return nil, err
	}
	rows, err := tableRows(forms, fields)
	if err != nil {
		return nil, err
	}
	lines := syntax(forms)
	readme, err := rewrite(root, "README.md", func(text string) (string, error) {
		text, err := between(text, "<!-- options:syntax:begin -->\n", "<!-- options:syntax:end -->\n", readmeSyntax(lines))
		if err != nil {
			return "", err
		}
		return between(text, "<!-- options:table:begin -->\n", "<!-- options:table:end -->\n", rows)
	})
	if err != nil {
		return nil, err
	}
	// The doc comment holds no markers, which go doc would show: the
	// region is the code block from the directive's first line to its
	// closing brace.
	caddyfile, err := rewrite(root, "caddymodule/caddyfile.go", func(text string) (string, error) {
		return between(text, "//\tbatch [<matcher>] {\n", "//\t}\n", commentSyntax(lines))
	})
	if err != nil {
		return nil, err
	}
	return []file{readme, caddyfile}, nil
}

// rewrite reads the file name under root and returns it with its new
// text.
func rewrite(root, name string, with func(string) (string, error)) (file, error) {
	path := filepath.Join(root, filepath.FromSlash(name))
	old, err := os.ReadFile(path)
	if err != nil {
		return file{}, err
	}
	text, err := with(string(old))
	if err != nil {
		return file{}, fmt.Errorf("%s: %w", name, err)
	}
	return file{path: path, name: name, old: old, new: []byte(text)}, nil
}

// between replaces the text from the line begin to the line end, both
// included, with region, which starts with begin and ends with end.
func between(text, begin, end, region string) (string, error) {
	i := lineIndex(text, 0, begin)
	if i < 0 {
		return "", fmt.Errorf("no line %q", strings.TrimSuffix(begin, "\n"))
	}
	j := lineIndex(text, i+len(begin), end)
	if j < 0 {
		return "", fmt.Errorf("no line %q after %q", strings.TrimSuffix(end, "\n"), strings.TrimSuffix(begin, "\n"))
	}
	return text[:i] + region + text[j+len(end):], nil
}

// lineIndex is the index of the first whole line, at or after from,
// that is line, or -1.
func lineIndex(text string, from int, line string) int {
	for i := from; i < len(text); {
		if strings.HasPrefix(text[i:], line) {
			return i
		}
		n := strings.IndexByte(text[i:], '\n')
		if n < 0 {
			break
		}
		i += n + 1
	}
	return -1
}

// fieldDoc is what the doc comment of a field of Options says.
type fieldDoc struct {
	meaning, def string
}

// fieldDocs reads the doc comments of the fields of Options, by their
// JSON names, from its source.
func fieldDocs(path string) (map[string]fieldDoc, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var spec *ast.TypeSpec
	if obj := f.Scope.Lookup("Options"); obj != nil {
		spec, _ = obj.Decl.(*ast.TypeSpec)
	}
	if spec == nil {
		return nil, fmt.Errorf("%s declares no type Options", path)
	}
	st, ok := spec.Type.(*ast.StructType)
	if !ok {
		return nil, fmt.Errorf("%s: Options is not a struct", path)
	}
	docs := map[string]fieldDoc{}
	for _, fld := range st.Fields.List {
		if fld.Tag == nil || len(fld.Names) != 1 {
			return nil, fmt.Errorf("%s: every field of Options is one name with a JSON tag", path)
		}
		tag, _ := strconv.Unquote(fld.Tag.Value)
		name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
		text := strings.Join(strings.Fields(fld.Doc.Text()), " ")
		i := strings.LastIndex(text, "Default: ")
		if i < 0 || !strings.HasSuffix(text, ".") {
			return nil, fmt.Errorf("%s: the doc comment of Options.%s does not end with \"Default: <value>.\"", path, fld.Names[0].Name)
		}
		docs[name] = fieldDoc{
			meaning: strings.TrimSpace(text[:i]),
			def:     strings.TrimSuffix(text[i+len("Default: "):], "."),
		}
	}
	return docs, nil
}

// tableRows is the README's options table: a row per form, and every
// field of Options set by exactly one form.
func tableRows(forms []options.Form, fields map[string]fieldDoc) (string, error) {
	var b strings.Builder
	b.WriteString("<!-- options:table:begin -->\n")
	b.WriteString("| Caddyfile | JSON | default | meaning |\n|---|---|---|---|\n")
	var errs []error
	set := map[string]string{}
	for _, f := range forms {
		doc, ok := fields[f.Field]
		if !ok {
			errs = append(errs, fmt.Errorf("option %s %s sets %s, which is no field of Options", f.Option, f.Args, f.Field))
			continue
		}
		if prev, ok := set[f.Field]; ok {
			errs = append(errs, fmt.Errorf("options %s and %s %s both set %s: a field is one form's", prev, f.Option, f.Args, f.Field))
		}
		set[f.Field] = f.Option + " " + f.Args
		fmt.Fprintf(&b, "| `%s %s` | `%s` | %s | %s |\n", cell(f.Option), cell(f.Args), f.Field, cell(defaultCell(doc.def)), cell(doc.meaning))
	}
	for name := range fields {
		if _, ok := set[name]; !ok {
			errs = append(errs, fmt.Errorf("the field %s of Options is set by no row of optionTable", name))
		}
	}
	b.WriteString("<!-- options:table:end -->\n")
	return b.String(), errors.Join(errs...)
}

// cell escapes the pipes of a table cell's text.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// defaultCell writes a default as the Caddyfile does: a flag's false
// and true are off and on, and a value is code.
func defaultCell(def string) string {
	word, rest, _ := strings.Cut(def, " ")
	switch word {
	case "false":
		word = "off"
	case "true":
		word = "on"
	case "none", "off", "on":
	default:
		word = "`" + word + "`"
	}
	return strings.TrimSpace(word + " " + rest)
}

// line is a line of the directive's syntax, depth blocks deep.
type line struct {
	depth int
	text  string
}

// syntax is the directive's syntax: the options' lines, a line per
// form in forms' order, their values in one column, then the rest of
// the block.
func syntax(forms []options.Form) []line {
	width := len("envelope")
	for _, f := range forms {
		width = max(width, len(f.Option))
	}
	pad := func(name, args string) line { return line{1, fmt.Sprintf("%-*s %s", width, name, args)} }
	lines := []line{{0, "batch [<matcher>] {"}}
	for _, f := range forms {
		lines = append(lines, pad(f.Option, f.Args))
	}
	return append(lines,
		pad("envelope", "<path>"),
		pad("jobs", "<path>"),
		pad("openapi", "[<file>] {"),
		line{2, "prefix  <path>"},
		line{2, "publish <path>"},
		line{2, "include <pattern...>"},
		line{2, "exclude <pattern...>"},
		line{1, "}"},
		line{0, ""},
		line{1, "resource <collection path template> {"},
		line{2, "collection <METHOD...>"},
		line{2, "item       <METHOD...>"},
		line{2, "item_path  <template>"},
		line{2, "batch      get|create|update|delete...|none"},
		line{2, "list_filter <query template> {"},
		line{3, "items   <JSON pointer>"},
		line{3, "max_ids <n>"},
		line{3, "preflight"},
		line{2, "}"},
		line{2, "# any option above, for this resource alone"},
		line{1, "}"},
		line{0, "}"},
	)
}

// readmeSyntax is the README's syntax block, indented with tabs.
func readmeSyntax(lines []line) string {
	var b strings.Builder
	b.WriteString("<!-- options:syntax:begin -->\n```caddyfile\n")
	for _, l := range lines {
		if l.text != "" {
			b.WriteString(strings.Repeat("\t", l.depth) + l.text)
		}
		b.WriteString("\n")
	}
	b.WriteString("```\n<!-- options:syntax:end -->\n")
	return b.String()
}

// commentSyntax is the code block of UnmarshalCaddyfile's doc comment,
// indented with four spaces a block.
func commentSyntax(lines []line) string {
	var b strings.Builder
	for _, l := range lines {
		if l.text == "" {
			b.WriteString("//\n")
			continue
		}
		b.WriteString("//\t" + strings.Repeat("    ", l.depth) + l.text + "\n")
	}
	return b.String()
}
