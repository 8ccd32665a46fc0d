package caddymodule

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/problem"
)

// TestBatchRefusedByTheGateway: every batch the gateway refuses is
// problem+json with a detail that says what is wrong (for an item, which
// one), and the legacy API receives nothing at all.
func TestBatchRefusedByTheGateway(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		max_items     5
		max_body_size 1KiB
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
			batch get
		}
	}
	reverse_proxy UPSTREAM
`)
	big := `[{"name": "` + strings.Repeat("x", 2000) + `"}]`
	tests := []struct {
		name         string
		method, path string
		body         string
		contentType  string
		status       int
		item         int    // the item the detail must name; -1 for none
		id           string // the id it must name too, if any
	}{
		{"body is not JSON", "POST", "/api/widgets", `[{"name": "a"},`, "", 400, -1, ""},
		{"update body is an object", "PATCH", "/api/widgets", `{"id": 1, "name": "a"}`, "", 400, -1, ""},
		{"update body is not JSON", "PATCH", "/api/widgets", `[{"id": 1`, "", 400, -1, ""},
		{"an element is not an object", "POST", "/api/widgets", `[{"name": "a"}, 7]`, "", 400, 1, ""},
		{"empty array", "POST", "/api/widgets", `[]`, "", 400, -1, ""},
		{"empty ids", "GET", "/api/widgets?ids=", "", "", 400, -1, ""},
		{"empty ids on delete", "DELETE", "/api/widgets?ids=", "", "", 400, -1, ""},
		{"an empty id", "DELETE", "/api/widgets?ids=1,,2", "", "", 400, 1, ""},
		{"an update element without the id field", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"name": "b"}]`, "", 400, 1, ""},
		{"an update element with an empty id", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "", "name": "b"}]`, "", 400, 1, ""},
		{"the same id twice in an update", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "1", "name": "b"}]`, "", 400, 1, "1"},
		{"the same id twice in a delete", "DELETE", "/api/widgets?ids=1,2,1", "", "", 400, 2, "1"},
		{"too many ids", "GET", "/api/widgets?ids=1,2,3,4,5,6", "", "", 413, -1, ""},
		{"too many ids on delete", "DELETE", "/api/widgets?ids=1,2,3,4,5,6", "", "", 413, -1, ""},
		{"too many elements", "POST", "/api/widgets", `[{},{},{},{},{},{}]`, "", 413, -1, ""},
		{"body too large", "POST", "/api/widgets", big, "", 413, -1, ""},
		{"create body of another type", "POST", "/api/widgets", `[{"name": "a"}]`, "text/plain", 415, -1, ""},
		{"update body of another type", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}]`, "application/xml", 415, -1, ""},
		{"batch delete is off", "DELETE", "/api/gadgets?ids=1,2", "", "", 405, -1, ""},
		{"batch create is off", "POST", "/api/gadgets", `[{"name": "a"}]`, "", 405, -1, ""},
		{"batch update is off", "PATCH", "/api/gadgets", `[{"id": 1, "name": "a"}]`, "", 405, -1, ""},
		{"hostile id ..", "GET", "/api/widgets?ids=1,..", "", "", 400, 1, ".."},
		{"hostile id .", "DELETE", "/api/widgets?ids=1,.", "", "", 400, 1, "."},
		{"hostile id %2e%2e", "GET", "/api/widgets?ids=1,%2e%2e", "", "", 400, 1, ".."},
		{"hostile id %2E%2E on delete", "DELETE", "/api/widgets?ids=1,%2E%2E", "", "", 400, 1, ".."},
		{"hostile id 1%2F2", "DELETE", "/api/widgets?ids=1,1%2F2", "", "", 400, 1, "1/2"},
		{"hostile id a%5Cb", "GET", "/api/widgets?ids=1,a%5Cb", "", "", 400, 1, "a\\b"},
		{"hostile id %00", "DELETE", "/api/widgets?ids=1,%00", "", "", 400, 1, "\x00"},
		{"hostile id %0A", "GET", "/api/widgets?ids=1,x%0Ay", "", "", 400, 1, "x\ny"},
		{"hostile update id ..", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "..", "name": "b"}]`, "", 400, 1, ".."},
		{"hostile update id with /", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "1/../2", "name": "b"}]`, "", 400, 1, "1/../2"},
		{"hostile update id with \\", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "a\\b", "name": "b"}]`, "", 400, 1, "a\\b"},
		{"hostile update id with NUL", "PATCH", "/api/widgets", `[{"id": 1, "name": "a"}, {"id": "a\u0000", "name": "b"}]`, "", 400, 1, "a\x00"},
		{"hostile create id ..", "POST", "/api/widgets", `[{"name": "a"}, {"id": "..", "name": "b"}]`, "", 400, 1, ".."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			before := api.Items("/api/widgets")
			var body any
			if tt.body != "" {
				body = []byte(tt.body)
			}
			var header []string
			if tt.contentType != "" {
				header = []string{"Content-Type", tt.contentType}
			}
			r := g.do(t, tt.method, tt.path, body, header...)
			if r.Status != tt.status {
				t.Fatalf("status %d, want %d: %s", r.Status, tt.status, r.Body)
			}
			if ct := r.Header.Get("Content-Type"); ct != problem.ContentType {
				t.Errorf("Content-Type %q, want %q", ct, problem.ContentType)
			}
			p := r.JSON(t)
			detail, _ := p["detail"].(string)
			if p["status"] != float64(tt.status) || p["title"] != http.StatusText(tt.status) || detail == "" {
				t.Errorf("problem %s", r.Body)
			}
			if tt.item >= 0 && !mentionsItem(detail, tt.item) {
				t.Errorf("detail %q does not name item %d", detail, tt.item)
			}
			if tt.id != "" && !strings.Contains(detail, tt.id) && !strings.Contains(detail, strconv.Quote(tt.id)) {
				t.Errorf("detail %q does not name the id %q", detail, tt.id)
			}
			if tt.status == 405 && r.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			if reqs := api.Requests(); len(reqs) > 0 {
				t.Errorf("the legacy API received:%s", describeRequests(reqs))
			}
			sameState(t, api, "/api/widgets", before)
		})
	}
}
