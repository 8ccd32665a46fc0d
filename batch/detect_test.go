package batch

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Detect tells a batch from a request that passes through, and gives a
// body it read back intact.
func TestDetect(t *testing.T) {
	t.Parallel()
	updateOff := func(r *policy.ResourceSpec) { r.Batch = []string{"get", "create", "delete"} }
	deleteOff := func(r *policy.ResourceSpec) { r.Batch = []string{"get", "create", "update"} }
	keys := settings(func(s *policy.Settings) { s.IDsParam = "keys" })
	tests := []struct {
		name           string
		method, target string
		body           string
		mods           []specMod
		op             policy.Op
		batch          bool
	}{
		{name: "GET with ids", method: "GET", target: "/widgets?ids=1,2", op: policy.OpGet, batch: true},
		{name: "GET with empty ids", method: "GET", target: "/widgets?ids=", op: policy.OpGet, batch: true},
		{name: "GET with a bare ids", method: "GET", target: "/widgets?page=2&ids", op: policy.OpGet, batch: true},
		{name: "GET with an escaped ids name", method: "GET", target: "/widgets?%69ds=1", op: policy.OpGet, batch: true},
		{name: "GET without ids (LIST)", method: "GET", target: "/widgets", op: policy.OpGet},
		{name: "GET with other parameters (LIST)", method: "GET", target: "/widgets?page=2&idsx=1&xids=2", op: policy.OpGet},
		{name: "GET with ids as a value only", method: "GET", target: "/widgets?q=ids", op: policy.OpGet},
		{name: "GET with a custom ids_param", method: "GET", target: "/widgets?keys=1", mods: []specMod{keys}, op: policy.OpGet, batch: true},
		{name: "GET with ids under a custom ids_param", method: "GET", target: "/widgets?ids=1", mods: []specMod{keys}, op: policy.OpGet},
		// A malformed parameter elsewhere in the query does not hide ids:
		// the request is a bad batch (Parse answers 400), not a LIST or a
		// DELETE of the whole collection passed to the legacy API.
		{name: "GET with ids after a bad escape", method: "GET", target: "/widgets?%zz=1&ids=1", op: policy.OpGet, batch: true},
		{name: "DELETE with ids after a bad escape", method: "DELETE", target: "/widgets?a%=&ids=1,2", op: policy.OpDelete, batch: true},
		{name: "DELETE with ids", method: "DELETE", target: "/widgets?ids=1", op: policy.OpDelete, batch: true},
		{name: "DELETE with empty ids", method: "DELETE", target: "/widgets?ids=", op: policy.OpDelete, batch: true},
		// A bare DELETE is a bad batch while batch delete is on, not a
		// "delete everything" passed to the legacy API.
		{name: "DELETE without ids, delete on", method: "DELETE", target: "/widgets?force=1", op: policy.OpDelete, batch: true},
		{name: "DELETE without ids, delete off", method: "DELETE", target: "/widgets", mods: []specMod{deleteOff}, op: policy.OpDelete},
		{name: "DELETE with ids, delete off", method: "DELETE", target: "/widgets?ids=1", mods: []specMod{deleteOff}, op: policy.OpDelete, batch: true},
		{name: "POST of an array", method: "POST", target: "/widgets", body: `[{"a":1}]`, op: policy.OpCreate, batch: true},
		{name: "POST of an array after whitespace", method: "POST", target: "/widgets", body: " \r\n\t [{}]", op: policy.OpCreate, batch: true},
		{name: "POST of an array after a lot of whitespace", method: "POST", target: "/widgets", body: strings.Repeat(" ", 3000) + "[]", op: policy.OpCreate, batch: true},
		{name: "POST of an object", method: "POST", target: "/widgets", body: `{"a":[1]}`, op: policy.OpCreate},
		{name: "POST of an object after whitespace", method: "POST", target: "/widgets", body: "\n {\"a\":1}", op: policy.OpCreate},
		{name: "POST of a string holding a bracket", method: "POST", target: "/widgets", body: `"[1]"`, op: policy.OpCreate},
		{name: "POST with no body", method: "POST", target: "/widgets", op: policy.OpCreate},
		{name: "PATCH of an object, update on", method: "PATCH", target: "/widgets", body: `{"a":1}`, op: policy.OpUpdate, batch: true},
		{name: "PATCH of an array, update on", method: "PATCH", target: "/widgets", body: `[{"id":1}]`, op: policy.OpUpdate, batch: true},
		{name: "PATCH with no body, update on", method: "PATCH", target: "/widgets", op: policy.OpUpdate, batch: true},
		{name: "PATCH of an object, update off", method: "PATCH", target: "/widgets", body: `{"a":1}`, mods: []specMod{updateOff}, op: policy.OpUpdate},
		{name: "PATCH of an array, update off", method: "PATCH", target: "/widgets", body: "  [{\"id\":1}]", mods: []specMod{updateOff}, op: policy.OpUpdate, batch: true},
		{name: "PUT", method: "PUT", target: "/widgets", body: `[{}]`},
		{name: "HEAD with ids", method: "HEAD", target: "/widgets?ids=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest(tt.method, tt.target, tt.body)
			m, _ := widgets(t, tt.mods...).Lookup("/widgets")
			op, isBatch, err := detectOp(r, m.Resource)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			equal(t, "batch", isBatch, tt.batch)
			if tt.batch || tt.method == "POST" || tt.method == "PATCH" {
				equal(t, "op", op, tt.op)
			}
			var got []byte
			if r.Body != nil {
				got, err = io.ReadAll(r.Body)
				if err != nil {
					t.Fatal(err)
				}
			}
			if string(got) != tt.body {
				t.Errorf("the body read after Detect = %q, want %q", got, tt.body)
			}
		})
	}
}

// A body that arrives a byte at a time is still given back whole.
func TestDetectGivesBackASlowBody(t *testing.T) {
	t.Parallel()
	body := "\n\n  " + `{"name":"` + strings.Repeat("x", 2000) + `"}`
	r, _ := http.NewRequest("POST", "/widgets", iotest.OneByteReader(strings.NewReader(body)))
	m, _ := widgets(t).Lookup("/widgets")
	_, isBatch, err := detectOp(r, m.Resource)
	if err != nil || isBatch {
		t.Fatalf("Detect = %v, %v", isBatch, err)
	}
	got, err := io.ReadAll(r.Body)
	if err != nil || !bytes.Equal(got, []byte(body)) {
		t.Fatalf("body after Detect: %d bytes, %v; want %d bytes", len(got), err, len(body))
	}
	if err := r.Body.Close(); err != nil {
		t.Fatal(err)
	}
}

// A detected batch body is what Parse then reads.
func TestDetectThenParse(t *testing.T) {
	t.Parallel()
	p := mustPlan(t, newRequest("POST", "/widgets", "   "+elements(3)))
	equal(t, "items", len(p.Items), 3)
	equal(t, "item 2 body", string(p.Items[2].Body), `{"name":"w2"}`)
}
