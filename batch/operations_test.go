package batch

// An envelope's admission: its input rules, and what holds of every
// envelope AdmitEnvelope accepts.

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

func TestEnvelopeInputRules(t *testing.T) {
	t.Parallel()
	ops := func(list ...string) string { return `{"operations": [` + strings.Join(list, ",") + `]}` }
	create := `{"id": "u", "method": "POST", "url": "/users", "body": {"name": "a"}}`
	for _, tt := range []struct {
		name, body string
		status     int
		detail     string
	}{
		{"not JSON", `{`, 400, "not valid"},
		{"no operations", `{"operations": []}`, 400, "no operations"},
		{"unknown member", `{"operations": [], "atomic": true}`, 400, `unknown field "atomic"`},
		{"operation's unknown member", ops(`{"id": "a", "method": "GET", "url": "/users/1", "dependson": ["x"]}`), 400, `unknown field "dependson"`},
		{"bad op id", ops(`{"id": "a b", "method": "GET", "url": "/users/1"}`), 400, "must be one or more of"},
		{"duplicate op id", ops(create, create), 400, `both have id "u"`},
		{"unknown method", ops(`{"id": "a", "method": "HEAD", "url": "/users/1"}`), 400, "not an operation's"},
		{"url matching no resource", ops(`{"id": "a", "method": "GET", "url": "/nothing/1"}`), 400, "matches no resource"},
		{"absolute url", ops(`{"id": "a", "method": "GET", "url": "http://evil.test/users/1"}`), 400, "must be a path"},
		{"POST on an item", ops(`{"id": "a", "method": "POST", "url": "/users/1", "body": {}}`), 400, "goes to a collection"},
		{"PATCH on a collection", ops(`{"id": "a", "method": "PATCH", "url": "/users", "body": {}}`), 400, "goes to an item"},
		{"method the map refuses", ops(`{"id": "a", "method": "PUT", "url": "/users/1/tags/2", "body": {}}`), 405, "PUT is not allowed on /users/1/tags/2"},
		{"a write that could not be undone", ops(`{"id": "a", "method": "DELETE", "url": "/users/1/tags/2"}`), 400, "does not allow PUT on the item"},
		{"a # in a url", ops(create, `{"id": "b", "method": "GET", "url": "/users/$u#/id"}`), 400, "percent-encoded"},
		{"forward reference", ops(`{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {}}`, create), 400, `"u", which is no earlier operation`},
		{"self reference", ops(`{"id": "u", "method": "POST", "url": "/users", "body": {"boss": "$u"}}`), 400, "no earlier operation"},
		{"forward depends_on", ops(`{"id": "a", "method": "GET", "url": "/users/1", "depends_on": ["u"]}`, create), 400, "depends_on names"},
		{"hostile id", ops(`{"id": "a", "method": "GET", "url": "/users/%2e%2e"}`), 400, "dot segment"},
		{"body on a DELETE", ops(`{"id": "a", "method": "DELETE", "url": "/users/1", "body": {"x": 1}}`), 400, "has no body"},
		{"no body on a PATCH", ops(`{"id": "a", "method": "PATCH", "url": "/users/1"}`), 400, "needs a body"},
		{"array body", ops(`{"id": "a", "method": "POST", "url": "/users", "body": [1]}`), 400, "must be a JSON object"},
		{"bad pointer", ops(create, `{"id": "b", "method": "GET", "url": "/users/$u%23id"}`), 400, "not a JSON pointer"},
		{"atomicity without allow_override", `{"atomicity": "partial", "operations": [` + create + `]}`, 400, "allow_override is off"},
		{"unscoped query on a write", ops(`{"id": "a", "method": "PATCH", "url": "/users/1?$select=name", "body": {}}`), 400, "scope_query"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, prob := admitEnvelope(t, shop(t), tt.body)
			if prob == nil {
				t.Fatalf("admitted; want %d", tt.status)
			}
			equal(t, "status", prob.Status, tt.status)
			if !strings.Contains(prob.Detail, tt.detail) {
				t.Errorf("detail %q, want it to say %q", prob.Detail, tt.detail)
			}
		})
	}
	t.Run("more operations than max_items", func(t *testing.T) {
		_, prob := admitEnvelope(t, shop(t, func(s *policy.Settings) { s.MaxItems = 1 }), ops(create, `{"id": "b", "method": "GET", "url": "/users/1"}`))
		if prob == nil || prob.Status != 413 {
			t.Fatalf("got %+v, want 413", prob)
		}
	})
	t.Run("body over max_body_size", func(t *testing.T) {
		_, prob := admitEnvelope(t, shop(t, func(s *policy.Settings) { s.MaxBodySize = 20 }), ops(create))
		if prob == nil || prob.Status != 413 {
			t.Fatalf("got %+v, want 413", prob)
		}
	})
}

// FuzzAdmitEnvelope holds what every envelope AdmitEnvelope accepts must
// hold, whatever the client sent: every operation whose item is known goes
// to an item (or a collection) of the resource its url matched, under one
// escaped segment; references and depends_on name only earlier
// operations; the limits hold.
func FuzzAdmitEnvelope(f *testing.F) {
	for _, b := range []string{
		userWithPosts,
		`{"operations": [{"id": "a", "method": "GET", "url": "/users/1"}]}`,
		`{"operations": [{"id": "a", "method": "DELETE", "url": "/users/%2e%2e"}]}`,
		`{"operations": [{"id": "a", "method": "GET", "url": "/users/1/../../admin"}]}`,
		`{"operations": [{"id": "a", "method": "GET", "url": "/users/$a"}]}`,
		`{"operations": [{"id": "a", "method": "POST", "url": "/users", "body": {"id": "1/2"}}]}`,
		`{"operations": [{"id": "a", "method": "POST", "url": "/users", "body": {"x": "$$a"}}, {"id": "b", "method": "PATCH", "url": "/users/$a%23%2Fx", "body": {"y": ["$a#/z"]}}]}`,
		`{"atomicity": "partial", "operations": [{"id": "a", "method": "PUT", "url": "/users/7?tenant=x", "body": {}}]}`,
		`{"operations": [{"id": "a", "method": "GET", "url": "//evil/users/1"}]}`, `{}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(b))
	}
	e := shop(f, func(s *policy.Settings) { s.MaxItems, s.MaxBodySize = fuzzMaxItems, 4096 })
	f.Fuzz(func(t *testing.T, body []byte) {
		r := &http.Request{
			Method: http.MethodPost, URL: &url.URL{Path: "/batch"}, Header: http.Header{},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		}
		p, prob := AdmitEnvelope(r, e)
		if prob != nil {
			if prob.Status != http.StatusMethodNotAllowed { // a method the map refuses
				checkProblem(t, prob.Status)
			}
			return
		}
		if len(p.Items) == 0 || len(p.Items) > fuzzMaxItems {
			t.Fatalf("%d operations (max_items %d)", len(p.Items), fuzzMaxItems)
		}
		for i, it := range p.Items {
			for _, j := range it.operation.deps {
				if j >= i {
					t.Fatalf("operation %d depends on %d, which is not earlier", i, j)
				}
			}
			if it.tgt == nil {
				continue
			}
			path := it.tgt.collectionPath
			if it.tgt.kind != policy.OpCreate {
				if reason := badID(it.ID); reason != "" {
					t.Fatalf("operation %d: id %q was accepted, but %s", i, it.ID, reason)
				}
				path = it.tgt.paths.Path(it.ID)
			}
			m, ok := e.Lookup(path)
			if !ok || m.Resource != it.operation.resource || m.Item != (it.tgt.kind != policy.OpCreate) {
				t.Fatalf("operation %d goes to %s, which is not the %s it was admitted for", i, path, it.operation.resource.Collection)
			}
		}
	})
}

// TestEnvelopeDependsOnIsLinear: whether a write waits for an earlier
// write of the same item is decided by looking at each operation once.
// Here every read waits for every read before it, and the last write for
// the last read alone: the paths back to the first write are 2^96, which
// a walk of every path would never finish.
func TestEnvelopeDependsOnIsLinear(t *testing.T) {
	t.Parallel()
	ops := []string{`{"id": "w0", "method": "PATCH", "url": "/users/7", "body": {"a": 1}}`}
	for k := 1; k < 99; k++ {
		var deps []string
		for d := 1; d < k; d++ {
			deps = append(deps, fmt.Sprintf(`"r%d"`, d))
		}
		ops = append(ops, fmt.Sprintf(`{"id": "r%d", "method": "GET", "url": "/users/1", "depends_on": [%s]}`, k, strings.Join(deps, ",")))
	}
	ops = append(ops, `{"id": "w1", "method": "PATCH", "url": "/users/7", "body": {"b": 2}, "depends_on": ["r98"]}`)
	_, prob := admitEnvelope(t, shop(t), `{"operations": [`+strings.Join(ops, ",")+`]}`)
	if prob == nil || prob.Status != 400 || !strings.Contains(prob.Detail, `operations "w1" and "w0" both write /users/7`) {
		t.Fatalf("got %+v", prob)
	}
}
