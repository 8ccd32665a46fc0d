package caddybatch

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestCitationsExist keeps every citation of a section true: a Go
// comment or a document that cites a section of the README or of
// docs/x.md (the file, a comma, the section's title in double quotes)
// names a #-heading of that file (a bold line is not a section), and every
// relative markdown link to a .md file, or to #anchor in the same file,
// reaches a file that exists and, with an anchor, a heading or an
// <a id> of that name. Sections move; what cites them must move along.
func TestCitationsExist(t *testing.T) {
	docs := map[string]*document{} // by slash path from the repository root
	doc := func(name string) *document {
		if d, ok := docs[name]; ok {
			return d
		}
		raw, err := os.ReadFile(filepath.FromSlash(name))
		if err != nil {
			docs[name] = nil
			return nil
		}
		d := readDocument(string(raw))
		docs[name] = d
		return d
	}
	err := filepath.WalkDir(".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if p != "." && strings.HasPrefix(e.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		name := filepath.ToSlash(p)
		switch {
		case strings.HasSuffix(name, ".go"):
			for _, c := range goComments(t, name) {
				checkCitations(t, name, c.line, c.text, "", doc)
			}
		case strings.HasSuffix(name, ".md"):
			d := doc(name)
			for _, para := range d.prose {
				checkCitations(t, name, para.line, para.text, path.Dir(name), doc)
				checkLinks(t, name, para.line, para.text, d, doc)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 10 {
		t.Fatalf("read %d documents; the walk missed the README and docs/", len(docs))
	}
}

var (
	// The README or docs/x.md, or x.md (a document beside the citing
	// one), or a link [text](x.md), then a comma and the title quoted.
	citation = regexp.MustCompile(`(README|(?:\.\./)?(?:docs/)?[A-Za-z0-9_-]+\.md)\]?(?:\(([^()\s#]+\.md)\))?\)?, "([^"]+)"`)
	// [text](target) with a relative target: x.md, x.md#anchor, #anchor.
	mdLink = regexp.MustCompile(`\]\(([^()\s:]*?\.md)?(#[^()\s]+)?\)`)
)

// checkCitations checks the citations in text, which file cites at line.
// dir is the directory a document's relative names start from ("" for
// Go comments, which name docs/x.md from the repository's root).
func checkCitations(t *testing.T, file string, line int, text, dir string, doc func(string) *document) {
	t.Helper()
	for _, m := range citation.FindAllStringSubmatch(text, -1) {
		cited, target, title := m[1], m[2], m[3]
		name := path.Join(dir, cited) // a document beside the citing one
		switch {
		case target != "":
			name = path.Join(dir, target) // a link: from the citing document
		case cited == "README":
			name = "README.md"
		case strings.HasPrefix(cited, "docs/"):
			name = cited // docs/x.md is named from the root, in docs/ too
		}
		d := doc(name)
		if d == nil {
			t.Errorf("%s:%d cites %s, \"%s\": there is no %s", file, line, cited, title, name)
			continue
		}
		if !d.titles[plainTitle(title)] {
			t.Errorf("%s:%d cites %s, \"%s\": %s has no heading %q", file, line, cited, title, name, title)
		}
	}
}

// checkLinks checks the relative markdown links in text.
func checkLinks(t *testing.T, file string, line int, text string, self *document, doc func(string) *document) {
	t.Helper()
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		target, anchor := m[1], strings.TrimPrefix(m[2], "#")
		if target == "" && anchor == "" {
			continue
		}
		d, name := self, file
		if target != "" {
			name = path.Clean(path.Join(path.Dir(file), target))
			d = doc(name)
			if d == nil {
				t.Errorf("%s:%d links to %s: there is no %s", file, line, m[0][1:], name)
				continue
			}
		}
		if anchor != "" && !d.anchors[anchor] {
			t.Errorf("%s:%d links to %s: %s has no heading or <a id> with the anchor #%s", file, line, m[0][1:], name, anchor)
		}
	}
}

// document is what a markdown file offers citations and links: the
// titles of its headings, their GitHub anchors and its <a id>s, and its
// prose (paragraphs outside fenced code, lines joined) to be checked.
type document struct {
	titles  map[string]bool
	anchors map[string]bool
	prose   []span
}

// span is text and the line it starts at.
type span struct {
	line int
	text string
}

var explicitAnchor = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)

func readDocument(raw string) *document {
	d := &document{titles: map[string]bool{}, anchors: map[string]bool{}}
	seen := map[string]int{}
	fenced := false
	var para []string
	start := 0
	flush := func() {
		if len(para) > 0 {
			d.prose = append(d.prose, span{start, strings.Join(para, " ")})
		}
		para = nil
	}
	for i, line := range strings.Split(raw, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			flush()
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range explicitAnchor.FindAllStringSubmatch(line, -1) {
			d.anchors[m[1]] = true
		}
		if trimmed == "" {
			flush()
			continue
		}
		if h := strings.TrimLeft(line, "#"); h != line && len(line)-len(h) <= 6 && strings.HasPrefix(h, " ") {
			flush()
			title := strings.TrimSpace(strings.TrimRight(strings.TrimSpace(h), "#"))
			d.titles[plainTitle(title)] = true
			anchor := githubAnchor(title)
			if n := seen[anchor]; n > 0 {
				d.anchors[anchor+"-"+strconv.Itoa(n)] = true
			} else {
				d.anchors[anchor] = true
			}
			seen[anchor]++
			continue
		}
		if len(para) == 0 {
			start = i + 1
		}
		para = append(para, trimmed)
	}
	flush()
	return d
}

// plainTitle is a heading's or a citation's title without inline code
// marks, its blanks collapsed.
func plainTitle(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "`", "")), " ")
}

// githubAnchor is the anchor GitHub gives a heading: lower case, only
// letters, digits, blanks, hyphens and underscores kept, blanks as
// hyphens.
func githubAnchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// goComments are a Go file's comment groups, each as one line of text.
func goComments(t *testing.T, name string) []span {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var out []span
	for _, g := range f.Comments {
		out = append(out, span{fset.Position(g.Pos()).Line, strings.Join(strings.Fields(g.Text()), " ")})
	}
	return out
}
