package e2e

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchRestoreDeletedPost: for a legacy API whose PUT cannot create,
// restore_deleted post re-creates a deleted item by POST to the
// collection with the pre-image, id included; the record comes back with
// its original numeric id, including after a DELETE whose answer never
// came.
func TestBatchRestoreDeletedPost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  legacyapi.Fault
		status int
	}{
		{"the second DELETE fails with 500", legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/4", Status: 500, Body: htmlError}, 502},
		{"the second DELETE hangs after it was applied", legacyapi.Fault{Method: "DELETE", Path: "/api/widgets/4", Hang: true, AfterApply: true}, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := seededAPI()
			g := startGateway(t, api, `
	batch {
		concurrency  1
		item_timeout 300ms
		resource /api/widgets {`+resourceMethods+`
			restore_deleted post
		}
	}
	reverse_proxy UPSTREAM
`)
			api.Inject(tc.fault)
			before := api.Items("/api/widgets")
			b := checkProblem(t, g.do(t, "DELETE", "/api/widgets?ids=3,4,5", nil), tc.status)
			if b.Outcome != "rolled_back" {
				t.Errorf("outcome %q, want rolled_back: %+v", b.Outcome, b.Items)
			}
			sameState(t, api, "/api/widgets", before)
			for _, id := range []string{"3", "4"} {
				if rec, ok := api.Item("/api/widgets", id); !ok || rec["id"] != json.Number(id) {
					t.Errorf("widget %s is %v, want it back with its numeric id", id, rec)
				}
			}
			var posts []legacyapi.Request
			for _, req := range api.Requests() {
				if req.Method == "POST" {
					posts = append(posts, req)
				}
				if req.Method == "PUT" {
					t.Errorf("restore_deleted post sent %s %s", req.Method, req.Path)
				}
			}
			if len(posts) == 0 {
				t.Fatal("no POST re-created a deleted item")
			}
			for _, p := range posts {
				body, _ := decodeJSON(t, p.Body).(map[string]any)
				id, isNumber := body["id"].(float64)
				if p.Path != "/api/widgets" || !isNumber || !sameJSON(t, p.Body, before[strconv.Itoa(int(id))]) {
					t.Errorf("re-create %s %s %s, want POST /api/widgets with the pre-image, numeric id included", p.Method, p.Path, p.Body)
				}
			}
		})
	}
}

// TestBatchRestoreUpdatedPatch: restore_updated patch puts back only the
// fields the update changed, removing (null) those that did not exist.
func TestBatchRestoreUpdatedPatch(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		concurrency 1
		resource /api/widgets {
			collection GET PATCH
			item       GET PATCH
			restore_updated patch
		}
	}
	reverse_proxy UPSTREAM
`)
	before := api.Items("/api/widgets")
	r := g.do(t, "PATCH", "/api/widgets", `[{"id": 1, "name": "x", "color": "red"}, {"id": 2, "name": ""}]`)
	b := checkProblem(t, r, 422)
	if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" {
		t.Errorf("outcome %q, items %+v", b.Outcome, b.Items)
	}
	var patches []legacyapi.Request
	for _, req := range writes(api.Requests()) {
		if req.Path == "/api/widgets/1" {
			patches = append(patches, req)
		}
	}
	if len(patches) != 2 || patches[1].Method != "PATCH" ||
		!reflect.DeepEqual(decodeJSON(t, patches[1].Body), map[string]any{"name": "w1", "color": nil}) {
		t.Errorf("writes to widget 1: %s; want the update, then PATCH {\"name\":\"w1\",\"color\":null}", describeRequests(patches))
	}
	sameState(t, api, "/api/widgets", before)
}
