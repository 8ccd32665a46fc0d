package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// Batch reads through the legacy API's own LIST filter (docs/list-filter.md),
// through Caddy, against the fake legacy API's
// LISTs in the styles of real APIs. Each test counts the requests the API
// received, and reads its final state where a batch wrote.

// listSite is a gateway in front of /api/widgets that reads it through
// the filter given (the list_filter line, and its block if any).
func listSite(filter string, options ...string) string {
	return `
	batch {
		` + strings.Join(options, "\n\t\t") + `
		resource /api/widgets {` + resourceMethods + `
			` + filter + `
		}
	}
	reverse_proxy UPSTREAM
`
}

// widgetsAPI serves /api/widgets with widgets 1..n, in the habits c gives.
func widgetsAPI(c legacyapi.Collection, n int) *legacyapi.API {
	c.Path, c.Seed = "/api/widgets", records("w", 1, n)
	return legacyapi.NewRecording(c)
}

// idsList is "1,2,…,n".
func idsList(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	return strings.Join(ids, ",")
}

// checkItems fails the test unless every item of b is widget w<id> with
// status 200, in request order 1..n.
func checkItems(t testing.TB, b batchAnswer, n int) {
	t.Helper()
	if len(b.Items) != n {
		t.Fatalf("%d items, want %d", len(b.Items), n)
	}
	for i, it := range b.Items {
		if it.ID != fmt.Sprint(i+1) || it.Status != 200 || !strings.Contains(string(it.Body), fmt.Sprintf(`"w%d"`, i+1)) {
			t.Fatalf("item %d: %+v", i, it)
		}
	}
}

func TestListFilterStyles(t *testing.T) {
	for _, tt := range []struct {
		name, filter string
		col          legacyapi.Collection
		lists        int
	}{
		{"json-server: the key repeated", `list_filter "id={id}"`, legacyapi.Collection{FilterParam: "id"}, 2},
		{"django-filter: a comma list, paged", `list_filter "id__in={ids}&page_size=50" {
				items /results
			}`, legacyapi.Collection{FilterParam: "id__in", FilterComma: true, PageSize: 10}, 2},
		{"JSON:API: a bracketed name", `list_filter "filter[id]={ids}" {
				max_ids 100
			}`, legacyapi.Collection{FilterParam: "filter[id]", FilterComma: true}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := widgetsAPI(tt.col, 100)
			g := startGateway(t, api, listSite(tt.filter))
			b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids="+idsList(100), nil), 200, "succeeded")
			checkItems(t, b, 100)
			if reqs := api.Requests(); len(reqs) != tt.lists {
				t.Errorf("the legacy API received %d requests, want %d LISTs:%s", len(reqs), tt.lists, describeRequests(reqs))
			}
			line := batchLogLine(t)
			if line["list_requests"] != float64(tt.lists) || line["fallbacks"] != float64(0) {
				t.Errorf("log line %v, want list_requests %d and fallbacks 0", line, tt.lists)
			}
		})
	}
}

// batchLogLine is the one log line of the last batch.
func batchLogLine(t testing.TB) map[string]any {
	t.Helper()
	var last map[string]any
	for _, e := range testLogs.entries("http.handlers.batch") {
		if e["msg"] == "batch" {
			last = e
		}
	}
	if last == nil {
		t.Fatalf("no batch log line in %v", testLogs.entries("http.handlers.batch"))
	}
	return last
}

// Whatever the LIST leaves out is read with its own GET: a page cut
// short, an item the caller may not see (403), an item that does not
// exist (404).
func TestListFilterFallsBack(t *testing.T) {
	t.Run("a page capped silently", func(t *testing.T) {
		api := widgetsAPI(legacyapi.Collection{FilterParam: "id__in", FilterComma: true, PageSize: 10, MaxPageSize: 10}, 30)
		g := startGateway(t, api, listSite(`list_filter "id__in={ids}&page_size=100" {
				items /results
			}`))
		b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids="+idsList(30), nil), 200, "succeeded")
		checkItems(t, b, 30)
		if n := len(sent(api, "GET", "/api/widgets")); n != 1 {
			t.Errorf("%d LISTs, want 1", n)
		}
		if n := len(api.Requests()); n != 1+20 {
			t.Errorf("%d requests, want the LIST and the 20 items its page left out", n)
		}
		if line := batchLogLine(t); line["fallbacks"] != float64(20) {
			t.Errorf("log line %v, want fallbacks 20", line)
		}
	})
	t.Run("what the caller may not see, and what is not there", func(t *testing.T) {
		api := widgetsAPI(legacyapi.Collection{FilterParam: "id", Hidden: []string{"2"}}, 3)
		g := startGateway(t, api, listSite(`list_filter "id={id}"`, "atomicity partial"))
		b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids=1,2,3,9", nil), 207, "partial")
		if got := b.Statuses(); fmt.Sprint(got) != "[200 403 200 404]" {
			t.Errorf("statuses %v, want [200 403 200 404]", got)
		}
		if reqs := api.Requests(); len(reqs) != 3 || !received(api, "GET", "/api/widgets/2") || !received(api, "GET", "/api/widgets/9") {
			t.Errorf("requests:%s; want the LIST, then GET 2 and GET 9", describeRequests(reqs))
		}
	})
	t.Run("a LIST that ignores the filter", func(t *testing.T) {
		// The API knows no id__in: it answers its first page of
		// everything, which holds some of the batch and others.
		api := widgetsAPI(legacyapi.Collection{PageSize: 5}, 20)
		g := startGateway(t, api, listSite(`list_filter "id__in={ids}" {
				items /results
			}`))
		b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids=3,12,18", nil), 200, "succeeded")
		for i, id := range []string{"3", "12", "18"} {
			if it := b.Items[i]; it.ID != id || !strings.Contains(string(it.Body), `"w`+id+`"`) {
				t.Errorf("item %d: %+v", i, it)
			}
		}
		if len(sent(api, "GET", "/api/widgets/3")) != 0 || len(sent(api, "GET", "/api/widgets/12")) != 1 || len(sent(api, "GET", "/api/widgets/18")) != 1 {
			t.Errorf("requests:%s; want 3 from the LIST's page, 12 and 18 alone", describeRequests(api.Requests()))
		}
	})
}

// A LIST that fails in any way sends its ids to their own GETs; the
// client never sees it, and a WARN line and the metric count it.
func TestListFilterFailures(t *testing.T) {
	for _, tt := range []struct {
		name   string
		fault  legacyapi.Fault
		reason string
	}{
		{"500", legacyapi.Fault{Status: 500, Body: htmlError}, "status"},
		{"an HTML page answered 200", legacyapi.Fault{Status: 200, Body: htmlError}, "body"},
		{"a dropped connection", legacyapi.Fault{Drop: true}, "no_answer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := widgetsAPI(legacyapi.Collection{FilterParam: "id"}, 4)
			tt.fault.Method, tt.fault.Path = "GET", "/api/widgets"
			api.Inject(tt.fault)
			g := startGateway(t, api, listSite(`list_filter "id={id}"`))
			before := metricValue(t, "list_fallbacks_total", "reason", tt.reason)
			b := checkEnvelope(t, g.do(t, "GET", "/api/widgets?ids=1,2,3,4", nil), 200, "succeeded")
			checkItems(t, b, 4)
			if n := metricValue(t, "list_fallbacks_total", "reason", tt.reason) - before; n != 1 {
				t.Errorf("caddy_http_batch_list_fallbacks_total{reason=%q} grew by %v, want 1", tt.reason, n)
			}
			warned := false
			for _, e := range testLogs.entries("http.handlers.batch") {
				warned = warned || e["level"] == "warn" && e["reason"] == tt.reason && e["ids"] == float64(4)
			}
			if !warned {
				t.Errorf("no WARN line for the LIST: %v", testLogs.entries("http.handlers.batch"))
			}
			if line := batchLogLine(t); line["list_requests"] != float64(1) || line["fallbacks"] != float64(4) {
				t.Errorf("log line %v, want list_requests 1 and fallbacks 4", line)
			}
		})
	}
}

// With preflight, an all-or-nothing update reads its pre-images through
// the LIST: 100 items cost the legacy API 2 LISTs and 100 writes, and a
// rollback puts every pre-image back.
func TestListFilterPreflight(t *testing.T) {
	api := widgetsAPI(legacyapi.Collection{FilterParam: "id__in", FilterComma: true, PutCreates: true}, 100)
	g := startGateway(t, api, listSite(`list_filter "id__in={ids}" {
				preflight
			}`))
	elems := make([]string, 100)
	for i := range elems {
		elems[i] = fmt.Sprintf(`{"id": %d, "name": "renamed %d"}`, i+1, i+1)
	}
	checkEnvelope(t, g.do(t, "PATCH", "/api/widgets", "["+strings.Join(elems, ",")+"]"), 200, "succeeded")
	if reqs := api.Requests(); len(reqs) != 102 || len(sent(api, "GET", "/api/widgets")) != 2 {
		t.Errorf("%d requests (%d LISTs), want 2 LISTs and 100 writes", len(reqs), len(sent(api, "GET", "/api/widgets")))
	}

	api.ResetLog()
	before := api.Items("/api/widgets")
	elems[99] = `{"id": 100, "name": ""}` // the legacy API's 422
	b := checkProblem(t, g.do(t, "PATCH", "/api/widgets", "["+strings.Join(elems[:10], ",")+","+elems[99]+"]"), 422)
	if b.Outcome != "rolled_back" {
		t.Errorf("outcome %q, want rolled_back", b.Outcome)
	}
	sameState(t, api, "/api/widgets", before)
	if n := len(sent(api, "GET", "/api/widgets")); n != 1 {
		t.Errorf("%d LISTs, want 1", n)
	}
	for _, r := range api.Requests() {
		if r.Method == http.MethodPatch && r.Header.Get("If-Match") != "" {
			t.Errorf("a write after a LIST pre-image carries If-Match %q", r.Header.Get("If-Match"))
		}
	}
}
