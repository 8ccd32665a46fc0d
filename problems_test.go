package caddybatch

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// problemType is a problem answer's type as the code makes one:
// problem.New(status, "type", ...), or the admin API's
// adminProblem(w, status, "type", ...).
var problemType = regexp.MustCompile(`(?:problem\.New\(|adminProblem\(w,\s*)[^,]+,\s*"([a-z0-9-]+)"`)

// TestEveryProblemTypeDocumented keeps the README's list of problem
// types whole: every type the code answers with has its entry (an
// <a id="problem-<type>"> anchor), which the answer's type URI names.
func TestEveryProblemTypeDocumented(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	err = filepath.WalkDir(".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && p != "." && strings.HasPrefix(e.Name(), ".") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range problemType.FindAllStringSubmatch(string(src), -1) {
			seen[m[1]] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 20 {
		t.Fatalf("found %d problem types in the code; the pattern no longer finds them", len(seen))
	}
	for typ, file := range seen {
		if !strings.Contains(string(readme), `<a id="problem-`+typ+`">`) {
			t.Errorf("%s answers problem type %q, which the README's list of problem types does not name", file, typ)
		}
	}
}
