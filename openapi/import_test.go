package openapi

import (
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

func load(t testing.TB, file string) *Document {
	t.Helper()
	data, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(file, data)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// gateway builds the method map the gateway would serve for a document,
// with the default settings, as the Caddy module does.
func gateway(t testing.TB, im *Imported) (*policy.Policy, []Gap) {
	t.Helper()
	var specs []policy.ResourceSpec
	var gaps []Gap
	for _, r := range im.Resources {
		s := r.Spec(policy.Defaults(), policy.GatewayDefaults())
		gaps = append(gaps, Derive(&s, false)...)
		specs = append(specs, s)
	}
	p, err := policy.New(specs)
	if err != nil {
		t.Fatal(err)
	}
	return p, gaps
}

// route is what the gateway answers on one of the document's paths.
type route struct {
	allow    string // the Allow header: what OPTIONS lists, every other standard method is 405
	batch    string // the batch operations on, for a collection
	idFormat string
}

// checkRoutes looks every document path up in the gateway's map, with
// each variable filled, and compares what it allows.
func checkRoutes(t *testing.T, p *policy.Policy, prefix string, want map[string]route) {
	t.Helper()
	for path, w := range want {
		concrete := prefix + fill(path)
		m, ok := p.Lookup(concrete)
		if !ok {
			if w.allow != "" {
				t.Errorf("%s (%s): not served; want Allow %q", path, concrete, w.allow)
			}
			continue
		}
		if w.allow == "" {
			t.Errorf("%s: served, want it left out", path)
			continue
		}
		if got := m.Allow(); got != w.allow {
			t.Errorf("%s: Allow %q, want %q", path, got, w.allow)
		}
		// What the gateway answers each method: 405 for a standard one
		// the document does not declare, 501 for one the map does not know.
		for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "TRACE", "PROPFIND"} {
			want := policy.MethodAccepted
			switch {
			case method == "TRACE" || method == "PROPFIND":
				want = policy.MethodNotImplemented
			case !strings.Contains(", "+w.allow+",", ", "+method+","):
				want = policy.MethodNotAllowed
			}
			if d := m.JudgeMethod(httptest.NewRequest(method, concrete, nil)); d.Refusal != want {
				t.Errorf("%s %s: %+v, want %v", method, path, d, want)
			}
		}
		if !m.Item {
			var on []string
			for _, op := range []policy.Op{policy.OpGet, policy.OpCreate, policy.OpUpdate, policy.OpDelete} {
				if m.Resource.BatchEnabled(op) {
					on = append(on, op.String())
				}
			}
			if got := strings.Join(on, " "); got != w.batch {
				t.Errorf("%s: batch %q, want %q", path, got, w.batch)
			}
		}
		if got := m.Resource.Settings.IDFormat.String(); w.idFormat != "" && got != w.idFormat {
			t.Errorf("%s: id_format %s, want %s", path, got, w.idFormat)
		}
	}
}

// fill puts a value in every {variable} of a document path.
func fill(path string) string {
	var b strings.Builder
	in := false
	for _, c := range path {
		switch {
		case c == '{':
			in = true
			b.WriteString("7")
		case c == '}':
			in = false
		case !in:
			b.WriteRune(c)
		}
	}
	return b.String()
}

func TestImportDjangoRESTFramework(t *testing.T) {
	t.Parallel()
	im, err := Import(load(t, "drf.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, gaps := gateway(t, im)
	checkRoutes(t, p, "", map[string]route{
		// The collection allows PATCH and DELETE too: batch update and
		// delete are served there.
		"/api/authors/":      {allow: "GET, HEAD, POST, PATCH, DELETE, OPTIONS", batch: "get create update delete", idFormat: "integer"},
		"/api/authors/{id}/": {allow: "GET, HEAD, PUT, PATCH, DELETE, OPTIONS", idFormat: "integer"},
		// No PUT on a book, no POST on the collection: a deleted book
		// could not be re-created, so batch delete stays off.
		"/api/books/":        {allow: "GET, HEAD, OPTIONS", batch: "get", idFormat: "any"},
		"/api/books/{isbn}/": {allow: "GET, HEAD, DELETE, OPTIONS", idFormat: "any"},
		"/api/stats/":        {allow: "GET, HEAD, OPTIONS", batch: ""},
	})
	if len(gaps) != 1 || gaps[0].Op != policy.OpDelete || gaps[0].Resource != "/api/books/" {
		t.Fatalf("gaps %+v, want batch delete of /api/books/", gaps)
	}
	if w := gaps[0].Warning(); !strings.Contains(w, "resource /api/books/ { atomicity delete partial }") || !strings.Contains(w, "restore_deleted post") {
		t.Errorf("the warning names no recipe: %s", w)
	}
	// Trailing slashes are kept on the paths the gateway sends.
	for _, r := range im.Resources {
		if r.DocPath == "/api/authors/" && (r.Path != "/api/authors/" || r.ItemPath != "/api/authors/{id}/") {
			t.Errorf("authors: %s and %s, want the trailing slashes kept", r.Path, r.ItemPath)
		}
	}
}

func TestImportFastAPI(t *testing.T) {
	t.Parallel()
	d := load(t, "fastapi.json")
	if d.Version != "3.1.0" {
		t.Fatalf("version %s", d.Version)
	}
	im, err := Import(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, gaps := gateway(t, im)
	checkRoutes(t, p, "", map[string]route{
		// No PATCH on an item: no batch update, and no PATCH on the
		// collection; a deleted item is put back with its PUT.
		"/items/":                 {allow: "GET, HEAD, POST, DELETE, OPTIONS", batch: "get create delete", idFormat: "integer"},
		"/items/{item_id}":        {allow: "GET, HEAD, PUT, DELETE, OPTIONS", idFormat: "integer"},
		"/users/{user_id}/items/": {allow: "POST, OPTIONS", batch: ""},
		// An anyOf [uuid, null] item parameter reads as a uuid. No PUT:
		// an update is undone with PATCH.
		"/tags":          {allow: "GET, HEAD, PATCH, OPTIONS", batch: "get update", idFormat: "uuid"},
		"/tags/{tag_id}": {allow: "GET, HEAD, PATCH, OPTIONS", idFormat: "uuid"},
	})
	if len(gaps) != 0 {
		t.Errorf("gaps %+v, want none", gaps)
	}
}

func TestImportExpressSwaggerJSDoc(t *testing.T) {
	t.Parallel()
	im, err := Import(load(t, "express.yaml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if im.Prefix != "/api/v1" {
		t.Fatalf("prefix %q, want the servers url's path", im.Prefix)
	}
	p, gaps := gateway(t, im)
	checkRoutes(t, p, "/api/v1", map[string]route{
		"/users": {allow: "GET, HEAD, POST, DELETE, OPTIONS", batch: "get create delete", idFormat: "uuid"},
		// TRACE is not in the map: the gateway answers it 501.
		"/users/{id}":                  {allow: "GET, HEAD, PUT, DELETE, OPTIONS", idFormat: "uuid"},
		"/users/{id}/orders":           {allow: "GET, HEAD, POST, PATCH, DELETE, OPTIONS", batch: "get create update delete", idFormat: "integer"},
		"/users/{id}/orders/{orderId}": {allow: "GET, HEAD, PATCH, DELETE, OPTIONS", idFormat: "integer"},
		"/health":                      {allow: "GET, HEAD, OPTIONS", batch: ""},
	})
	if len(gaps) != 0 {
		t.Errorf("gaps %+v", gaps)
	}
	m, _ := p.Lookup("/api/v1/users/7")
	if d := m.JudgeMethod(httptest.NewRequest("TRACE", "/api/v1/users/7", nil)); d.Refusal != policy.MethodNotImplemented {
		t.Errorf("TRACE: %+v, want 501", d)
	}
}

// A parent parameter's schema gives its variable a format, so that every
// spelling of the parent names one item's lock; the path sent keeps the
// client's spelling. A parameter of another schema is its text.
func TestImportedParentsAreCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file, collection, sent, key string
	}{
		{"fastapi.json", "/users/020/items/", "/users/020/items/5/", "/users/20/items/5/"},
		{"express.yaml", "/api/v1/users/0F8FAD5BD9CB469FA16570867728950E/orders", "/api/v1/users/0F8FAD5BD9CB469FA16570867728950E/orders/5", "/api/v1/users/0f8fad5b-d9cb-469f-a165-70867728950e/orders/5"},
		{"drf.yaml", "/api/authors/", "/api/authors/5/", "/api/authors/5/"},
	}
	for _, tt := range tests {
		im, err := Import(load(t, tt.file), Options{})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := gateway(t, im)
		m, ok := p.Lookup(tt.collection)
		if !ok || m.Item {
			t.Fatalf("%s: %s is no collection", tt.file, tt.collection)
		}
		if sent, key := m.ItemPaths().Path("5"), m.ItemPaths().Key("5"); sent != tt.sent || key != tt.key {
			t.Errorf("%s: sent %s locked %s, want %s and %s", tt.file, sent, key, tt.sent, tt.key)
		}
	}
}
