package openapi

import (
	"errors"
	"strings"
	"testing"
)

// TestDocumentErrors: a document the gateway cannot use is refused with
// the file, the JSON pointer, the line where known, and what to do.
func TestDocumentErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"not YAML", "{{{", []string{"api.yaml", "not YAML or JSON"}},
		{"no openapi field", `{"name": "not a document"}`, []string{"api.yaml#:", "not an OpenAPI document", "3.0 or 3.1"}},
		{"Swagger 2", "swagger: '2.0'\ninfo: {title: x, version: '1'}\npaths: {}\n", []string{"api.yaml#/swagger", "Swagger 2.0", "convert it"}},
		{"OpenAPI 4", "openapi: 4.0.0\n", []string{"api.yaml#/openapi", "reads 3.0 and 3.1"}},
		{"a path parameter not declared", "openapi: 3.0.3\ninfo: {title: x, version: '1'}\npaths:\n  /users/{id}:\n    get:\n      responses:\n        '200': {description: ok}\n",
			[]string{"api.yaml:4 (#/paths)", "GET /users/{id}", "fix the document"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("api.yaml", []byte(tc.doc))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nwant it to hold %q", err, w)
				}
			}
		})
	}
}

// TestImportRefusesWhatTheMapCannotExpress: a variable that is not a
// whole segment is an error at the path's line, with the exclude that
// leaves it out; excluding it imports the rest.
func TestImportRefusesWhatTheMapCannotExpress(t *testing.T) {
	t.Parallel()
	doc := `openapi: 3.0.3
info: {title: x, version: '1'}
paths:
  /files:
    get:
      responses:
        '200': {description: ok}
  /files/{name}.json:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    get:
      responses:
        '200': {description: ok}
`
	d, err := Parse("files.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Import(d, Options{})
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%v, want an *Error", err)
	}
	if e.Pointer != "/paths/~1files~1{name}.json" || e.Line != 8 || !strings.Contains(e.Msg, "exclude /files/*") {
		t.Errorf("%+v", e)
	}
	if !strings.Contains(err.Error(), "files.yaml:8 (#/paths/~1files~1{name}.json)") {
		t.Errorf("%v", err)
	}
	im, err := Import(d, Options{Exclude: []string{"/files/*"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Resources) != 1 || im.Resources[0].Path != "/files" || im.Resources[0].ItemPath != "" {
		t.Errorf("%+v", im.Resources)
	}
}

func TestIncludeExclude(t *testing.T) {
	t.Parallel()
	d := load(t, "express.yaml")
	prefix := "/v2"
	im, err := Import(d, Options{Prefix: &prefix, Include: []string{"/users*"}, Exclude: []string{"/users/{id}/orders*"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Resources) != 1 || im.Resources[0].Path != "/v2/users" || im.Resources[0].ItemPath != "/v2/users/{id}" {
		t.Fatalf("%+v", im.Resources)
	}
	if !im.Paths["/users/{id}"] || im.Paths["/health"] || im.Paths["/users/{id}/orders"] {
		t.Errorf("paths %v", im.Paths)
	}
	if _, err := Import(d, Options{Include: []string{"/nothing*"}}); err == nil || !strings.Contains(err.Error(), "no path to import") {
		t.Errorf("%v", err)
	}
}

func TestGlob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"/users*", "/users", true},
		{"/users*", "/users/{id}/posts", true},
		{"/internal/*", "/internal", false},
		{"*/admin/*", "/v1/admin/x", true},
		{"/a*b*b", "/ab", false},
		{"/exact", "/exact", true},
		{"/exact", "/exact/", false},
	} {
		if got := Glob(tc.pattern, tc.s); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v", tc.pattern, tc.s, got)
		}
	}
}
