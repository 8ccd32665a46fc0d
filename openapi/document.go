// Package openapi reads the legacy API's OpenAPI document into the
// resources the gateway serves (Import), and writes the document as the
// gateway serves it, batch operations added (Publish). It knows nothing
// of Caddy: the Caddy module reads the file and hands over its bytes.
//
// The parser is github.com/getkin/kin-openapi (docs/openapi.md, "From OpenAPI"):
// maintained, it reads OpenAPI 3.0 and 3.1, brings three small modules,
// and records the line of every element, so an error names the line as
// well as the JSON pointer.
package openapi

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v4"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
)

// Document is a parsed input document.
type Document struct {
	// File names the document in errors, as the configuration names it.
	File string
	// Version is the document's openapi field, e.g. "3.1.0".
	Version string

	model *openapi3.T
	// raw is the document as JSON, which the publication decodes as
	// generic JSON and adds to, so that nothing the gateway does not
	// know of is lost.
	raw []byte
}

// Error is a mistake in a document, placed by JSON pointer and, where
// the parser recorded it, by line.
type Error struct {
	File    string
	Pointer string // e.g. "/paths/~1users~1{id}.json"
	Line    int    // 0 when unknown
	Msg     string // what is wrong, and what to do
}

func (e *Error) Error() string {
	where := e.File + "#" + e.Pointer
	switch {
	case e.Line > 0 && e.Pointer == "":
		where = fmt.Sprintf("%s:%d", e.File, e.Line)
	case e.Line > 0:
		where = fmt.Sprintf("%s:%d (#%s)", e.File, e.Line, e.Pointer)
	}
	return "openapi " + where + ": " + e.Msg
}

// Parse reads an OpenAPI 3.0 or 3.1 document, in YAML or JSON. Only
// references inside the document are followed: a document that points
// at other files or URLs is refused, as the gateway reads one file.
func Parse(file string, data []byte) (*Document, error) {
	fail := func(pointer string, line int, format string, args ...any) (*Document, error) {
		return nil, &Error{File: file, Pointer: pointer, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	loader := openapi3.NewLoader()
	loader.IncludeOrigin = true
	loader.IsExternalRefsAllowed = false
	model, err := loader.LoadFromData(data)
	if err != nil || !strings.HasPrefix(model.OpenAPI, "3.0") && !strings.HasPrefix(model.OpenAPI, "3.1") {
		return nil, notOpenAPI(file, data, err)
	}
	if err := validate(file, model); err != nil {
		return nil, err
	}
	raw, err := model.MarshalJSON()
	if err != nil {
		return fail("", 0, "%v", err)
	}
	return &Document{File: file, Version: model.OpenAPI, model: model, raw: raw}, nil
}

// notOpenAPI says why a document the parser refused, or read as no
// OpenAPI 3.0 or 3.1, is not one the gateway can use. The document is
// read again for its version fields, on this path only.
func notOpenAPI(file string, data []byte, loadErr error) error {
	fail := func(pointer, format string, args ...any) error {
		return &Error{File: file, Pointer: pointer, Msg: fmt.Sprintf(format, args...)}
	}
	var head struct {
		OpenAPI string `yaml:"openapi"`
		Swagger string `yaml:"swagger"`
	}
	if err := yaml.Unmarshal(data, &head); err != nil {
		return fail("", "not YAML or JSON (%v): give the API's OpenAPI document", err)
	}
	switch {
	case head.Swagger != "":
		return fail("/swagger", "a Swagger %s document, not OpenAPI 3: convert it (swagger2openapi, or the API framework's OpenAPI 3 output)", head.Swagger)
	case head.OpenAPI == "":
		return fail("", "not an OpenAPI document (no openapi field): give the API's OpenAPI 3.0 or 3.1 document")
	case !strings.HasPrefix(head.OpenAPI, "3.0") && !strings.HasPrefix(head.OpenAPI, "3.1"):
		return fail("/openapi", "OpenAPI %s: the gateway reads 3.0 and 3.1 documents", head.OpenAPI)
	}
	return fail("", "%v: fix the document (the gateway reads references inside it only)", loadErr)
}

// validate refuses a document the gateway cannot read right. It
// tolerates what it does not read and what the publication puts right:
// the info section (Django REST framework's generateschema writes an
// empty version), examples, and the patterns of schemas (written for the
// API's own regular expressions, which are not Go's).
func validate(file string, model *openapi3.T) error {
	err := model.Validate(context.Background(), openapi3.EnableMultiError(),
		openapi3.DisableExamplesValidation(), openapi3.DisableSchemaPatternValidation())
	var errs []error
	for _, e := range flattenKin(err) {
		var section *openapi3.SectionValidationError
		if errors.As(e, &section) && section.Section == "info" {
			continue
		}
		errs = append(errs, invalid(file, e))
	}
	return errors.Join(errs...)
}

// flattenKin lists the errors a kin-openapi MultiError holds.
func flattenKin(err error) []error {
	var multi openapi3.MultiError
	if errors.As(err, &multi) && len(multi) > 0 {
		var out []error
		for _, e := range multi {
			out = append(out, flattenKin(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// invalid places a validation error: its JSON pointer from the path and
// operation it is in, its line from the deepest element the parser
// recorded one for.
func invalid(file string, err error) error {
	e := &Error{File: file, Msg: err.Error() + ": fix the document"}
	var tokens []string
	for cur := err; cur != nil; cur = errors.Unwrap(cur) {
		switch c := cur.(type) {
		case *openapi3.SectionValidationError:
			tokens = append(tokens, c.Section)
		case *openapi3.PathValidationError:
			if len(tokens) == 0 {
				tokens = append(tokens, "paths")
			}
			tokens = append(tokens, c.Path)
		case *openapi3.OperationValidationError:
			tokens = append(tokens, strings.ToLower(c.Method))
		}
		if line := originLine(cur); line > 0 {
			e.Line = line
		}
	}
	e.Pointer = jsonvalue.Pointer(tokens...)
	return e
}

// originLine reads the line kin-openapi's typed errors carry in their
// Origin field, when they do.
func originLine(err error) int {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return 0
	}
	f := v.Elem().FieldByName("Origin")
	if !f.IsValid() {
		return 0
	}
	if o, ok := f.Interface().(*openapi3.Origin); ok && o != nil && o.Key != nil {
		return o.Key.Line
	}
	return 0
}
