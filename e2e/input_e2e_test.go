package e2e

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
	"github.com/caddy-batch/caddy-batch/internal/problem"
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

// refusedUntouched checks a batch the gateway refused with 400: an
// invalid-batch problem+json whose detail holds each of want, and a
// legacy API that received nothing and holds what it held.
func refusedUntouched(t *testing.T, api *legacyapi.API, r response, before map[string]map[string]any, want ...string) {
	t.Helper()
	b := checkProblem(t, r, http.StatusBadRequest)
	if !strings.HasSuffix(b.Type, "#problem-invalid-batch") {
		t.Errorf("type %q, want invalid-batch", b.Type)
	}
	for _, s := range want {
		if !strings.Contains(b.Detail, s) {
			t.Errorf("detail %q does not name %q", b.Detail, s)
		}
	}
	if reqs := api.Requests(); len(reqs) > 0 {
		t.Errorf("the legacy API received:%s", describeRequests(reqs))
	}
	sameState(t, api, "/api/widgets", before)
}

// TestBareCollectionDeleteInput: while batch DELETE is on, a DELETE of
// the collection without the ids parameter is a bad batch, however it
// names DELETE (a POST with an override included), since many legacy
// APIs read it as "delete everything"; while batch DELETE is off, it
// passes through as any request the map allows.
func TestBareCollectionDeleteInput(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
			batch get create update
		}
	}
	reverse_proxy UPSTREAM
`)
	tests := []struct {
		name, method, path string
		header             []string
	}{
		{"DELETE", "DELETE", "/api/widgets", nil},
		{"DELETE with a trailing slash", "DELETE", "/api/widgets/", nil},
		{"DELETE with other parameters", "DELETE", "/api/widgets?all=1", nil},
		{"POST with X-HTTP-Method-Override: DELETE", "POST", "/api/widgets", []string{"X-HTTP-Method-Override", "DELETE"}},
		{"POST with X-HTTP-Method: delete", "POST", "/api/widgets", []string{"X-HTTP-Method", "delete"}},
		{"POST with _method=DELETE", "POST", "/api/widgets?_method=DELETE", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			before := api.Items("/api/widgets")
			r := g.do(t, tt.method, tt.path, nil, tt.header...)
			refusedUntouched(t, api, r, before, "ids parameter", "?ids=1,2", "delete everything")
			if n := len(api.Items("/api/widgets")); n != 20 {
				t.Errorf("the legacy API holds %d widgets, want all 20", n)
			}
		})
	}

	t.Run("batch DELETE off: it passes through", func(t *testing.T) {
		api.ResetLog()
		r := g.do(t, "POST", "/api/gadgets", nil, "X-HTTP-Method-Override", "DELETE")
		if r.Header.Get("Content-Type") == problem.ContentType {
			t.Errorf("the gateway answered: %s", r.Body)
		}
		if reqs := api.Requests(); len(reqs) != 1 || reqs[0].Method != "DELETE" || reqs[0].Path != "/api/gadgets" {
			t.Errorf("the legacy API received:%s; want the DELETE of the collection", describeRequests(reqs))
		}
	})
}

// TestIDFormatInput: under id_format integer, two spellings of one id
// are one item (a batch DELETE naming both is refused; a batch GET fetches
// it once) and an id that is not an integer is refused before anything
// is sent. A single write on another spelling of an item a batch writes
// takes the batch's lock.
func TestIDFormatInput(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		id_format integer
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	refused := []struct {
		name, method, path, body string
		want                     []string
	}{
		{"3 and 03 in a delete", "DELETE", "/api/widgets?ids=3,03", "", []string{"items 0 and 1", `"3"`}},
		{"+3 and 3 in an update", "PATCH", "/api/widgets", `[{"id": "+3", "name": "a"}, {"id": 3, "name": "b"}]`, []string{"items 0 and 1", `"3"`}},
		{"3x in a delete", "DELETE", "/api/widgets?ids=1,3x", "", []string{"item 1", `"3x"`, "not an integer", "id_format integer"}},
		{"3.json in a get", "GET", "/api/widgets?ids=3.json", "", []string{"item 0", `"3.json"`, "not an integer"}},
		{"a word in an update", "PATCH", "/api/widgets", `[{"id": "three", "name": "a"}]`, []string{"item 0", `"three"`, "not an integer"}},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			before := api.Items("/api/widgets")
			body := optionalBody(tt.body)
			refusedUntouched(t, api, g.do(t, tt.method, tt.path, body), before, tt.want...)
		})
	}

	t.Run("a batch GET fetches 3 and 03 once", func(t *testing.T) {
		api.ResetLog()
		b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids=3,03,%2B3", nil), 200, "succeeded")
		if got := b.IDs(); !slices.Equal(got, []string{"3", "3", "3"}) {
			t.Errorf("ids %v, want [3 3 3]", got)
		}
		if reqs := api.Requests(); len(reqs) != 1 || reqs[0].Path != "/api/widgets/3" {
			t.Errorf("the legacy API received:%s; want GET /api/widgets/3 once", describeRequests(reqs))
		}
	})

	t.Run("a single PATCH of 03 holds the lock of a batch on 3", func(t *testing.T) {
		api.ResetLog()
		held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: "/api/widgets/03", Times: 1})
		api.Inject(held)
		defer release()
		single := start(g.URL, "PATCH", "/api/widgets/03", `{"name": "single"}`)
		eventually(t, 5*time.Second, "the single PATCH at the upstream", func() bool { return received(api, "PATCH", "/api/widgets/03") })
		batch := start(g.URL, "DELETE", "/api/widgets?ids=3", "")
		time.Sleep(300 * time.Millisecond)
		if batch.answered() || received(api, "GET", "/api/widgets/3") {
			t.Fatalf("the batch on 3 went ahead while a single write of 03 was in flight:%s", describeRequests(api.Requests()))
		}
		release()
		single.answer(t)
		checkEnvelope(t, batch.answer(t), 200, "succeeded")
		if _, ok := api.Item("/api/widgets", "3"); ok {
			t.Error("widget 3 was not deleted")
		}
	})
}

// TestScopeQueryInput: an all-or-nothing write batch carries the query
// parameters scope_query names on every request it sends, and is refused,
// with nothing sent, when the client's query holds another; a partial
// batch keeps the whole query.
func TestScopeQueryInput(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		scope_query    tenant
		allow_override
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	refused := []struct{ name, method, path, body, param string }{
		{"a shaping parameter on a delete", "DELETE", "/api/widgets?ids=1,2&fields=name", "", `"fields"`},
		{"an escaped one on an update", "PATCH", "/api/widgets?tenant=a&%24select%5B%5D=name", `[{"id": 1, "name": "x"}]`, `"$select[]"`},
		{"one on a create", "POST", "/api/widgets?include=owner", `[{"name": "x"}]`, `"include"`},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			api.ResetLog()
			before := api.Items("/api/widgets")
			body := optionalBody(tt.body)
			refusedUntouched(t, api, g.do(t, tt.method, tt.path, body), before, tt.param, "scope_query", "Prefer: atomicity=partial")
		})
	}

	everyQuery := func(t *testing.T, query string) {
		t.Helper()
		reqs := api.Requests()
		if len(reqs) == 0 {
			t.Fatal("nothing reached the legacy API")
		}
		for _, r := range reqs {
			if r.RawQuery != query {
				t.Errorf("%s %s?%s, want %q", r.Method, r.Path, r.RawQuery, query)
			}
		}
	}
	t.Run("a scoped delete carries the tenant on its preflight and writes", func(t *testing.T) {
		api.ResetLog()
		checkEnvelope(t, g.do(t, "DELETE", "/api/widgets?ids=1,2&tenant=a", nil), 200, "succeeded")
		everyQuery(t, "tenant=a")
	})
	t.Run("a partial update keeps the whole query", func(t *testing.T) {
		api.ResetLog()
		checkEnvelope(t, g.do(t, "PATCH", "/api/widgets?fields=name&tenant=a", `[{"id": 3, "name": "x"}]`, "Prefer", "atomicity=partial"), 200, "succeeded")
		everyQuery(t, "fields=name&tenant=a")
	})
}
