package legacyapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// listIDs is the ids of a LIST answer's records, plain or paged.
func listIDs(t *testing.T, body string) string {
	t.Helper()
	v := decode(t, body)
	if page, ok := v.(map[string]any); ok {
		v = page["results"]
	}
	var ids []string
	for _, rec := range v.([]any) {
		ids = append(ids, fmt.Sprint(rec.(map[string]any)["id"]))
	}
	return strings.Join(ids, ",")
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	seed := []map[string]any{{"id": 1}, {"id": 2}, {"id": 3}, {"id": "a,b"}, {"id": 10}}
	for _, tt := range []struct {
		name  string
		col   Collection
		query string
		want  string
	}{
		{"json-server: the key repeated", Collection{FilterParam: "id"}, "id=3&id=1&id=99", "1,3"},
		{"json-server: a value is one id, commas included", Collection{FilterParam: "id"}, "id=a,b&id=2", "2,a,b"},
		{"django-filter: a comma list", Collection{FilterParam: "id__in", FilterComma: true}, "id__in=10,2,a%2Cb", "2,10,a,b"},
		{"JSON:API: an escaped key", Collection{FilterParam: "filter[id]", FilterComma: true}, "filter%5Bid%5D=1,3", "1,3"},
		{"JSON:API: the key as written", Collection{FilterParam: "filter[id]", FilterComma: true}, "filter[id]=2", "2"},
		{"a filter asked twice adds up, once each", Collection{FilterParam: "id__in", FilterComma: true}, "id__in=1&id__in=1,2", "1,2"},
		{"the filter present and empty holds nothing", Collection{FilterParam: "id"}, "id=", ""},
		{"an API that knows no filter answers everything", Collection{}, "id__in=1,2", "1,2,3,10,a,b"},
		{"another API's filter is ignored", Collection{FilterParam: "id"}, "id__in=1,2", "1,2,3,10,a,b"},
		{"hidden records are left out", Collection{FilterParam: "id", Hidden: []string{"2"}}, "id=1&id=2", "1"},
		{"hidden records are left out of everything", Collection{Hidden: []string{"2", "3"}}, "", "1,10,a,b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.col.Path, tt.col.Seed = "/w", seed
			_, srv := startWith(t, tt.col)
			a := do(t, "GET", srv.URL+"/w?"+tt.query, "")
			if a.status != 200 {
				t.Fatalf("%d %s", a.status, a.body)
			}
			if got := listIDs(t, a.body); got != tt.want {
				t.Errorf("LIST ?%s holds %q, want %q", tt.query, got, tt.want)
			}
		})
	}
}

func TestListPages(t *testing.T) {
	t.Parallel()
	_, srv := startWith(t, Collection{Path: "/w", PageSize: 2, MaxPageSize: 3, FilterParam: "id__in", FilterComma: true,
		Seed: []map[string]any{{"id": 1}, {"id": 2}, {"id": 3}, {"id": 4}, {"id": 5}}})
	page := func(query string) map[string]any {
		t.Helper()
		a := do(t, "GET", srv.URL+"/w?"+query, "")
		if a.status != 200 {
			t.Fatalf("?%s: %d %s", query, a.status, a.body)
		}
		return decode(t, a.body).(map[string]any)
	}
	p := page("")
	if p["count"] != json.Number("5") || p["previous"] != nil || !strings.HasSuffix(fmt.Sprint(p["next"]), "/w?page=2") ||
		!strings.HasPrefix(fmt.Sprint(p["next"]), "http://") || listIDs(t, mustJSON(p)) != "1,2" {
		t.Errorf("page 1: %v", p)
	}
	p = page("page=3")
	if p["next"] != nil || !strings.Contains(fmt.Sprint(p["previous"]), "page=2") || listIDs(t, mustJSON(p)) != "5" {
		t.Errorf("page 3: %v", p)
	}
	// Asked for 100 a page, capped at 3 without a word: the next link is
	// all that tells.
	p = page("id__in=1,2,3,4,5&page_size=100")
	if p["count"] != json.Number("5") || listIDs(t, mustJSON(p)) != "1,2,3" || !strings.Contains(fmt.Sprint(p["next"]), "page=2") ||
		!strings.Contains(fmt.Sprint(p["next"]), "id__in=1%2C2%2C3%2C4%2C5") {
		t.Errorf("page_size 100 under a cap of 3: %v", p)
	}
	if a := do(t, "GET", srv.URL+"/w?page=4", ""); a.status != 404 || !strings.Contains(a.body, "Invalid page") {
		t.Errorf("a page past the end: %d %s", a.status, a.body)
	}
	if a := do(t, "GET", srv.URL+"/w?id__in=9", ""); a.status != 200 || listIDs(t, a.body) != "" {
		t.Errorf("nothing matches: %d %s", a.status, a.body)
	}
}

func TestHiddenItems(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, Collection{Path: "/w", Hidden: []string{"2"}, Seed: []map[string]any{{"id": 1}, {"id": 2}}})
	if a := do(t, "GET", srv.URL+"/w/2", ""); a.status != 403 || a.header.Get("Content-Type") != ctHTML {
		t.Errorf("GET of a hidden item: %d %s", a.status, a.body)
	}
	if a := do(t, "PATCH", srv.URL+"/w/2", `{"name":"x"}`); a.status != 200 {
		t.Errorf("PATCH of a hidden item: %d %s", a.status, a.body)
	}
	if rec, _ := api.Item("/w", "2"); rec["name"] != "x" {
		t.Errorf("the hidden item is %v", rec)
	}
}

// A LIST fault hits the LIST, not the items.
func TestListFault(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, Collection{Path: "/w", FilterParam: "id", Seed: []map[string]any{{"id": 1}}})
	api.Inject(Fault{Method: "GET", Path: "/w", Status: 500, Body: "down"})
	if a := do(t, "GET", srv.URL+"/w?id=1", ""); a.status != 500 {
		t.Errorf("the LIST: %d", a.status)
	}
	if a := do(t, "GET", srv.URL+"/w/1", ""); a.status != 200 {
		t.Errorf("the item: %d", a.status)
	}
}

// The LIST's filter, tenants and $select combine.
func TestListFilterTenantsSelect(t *testing.T) {
	t.Parallel()
	_, srv := startWith(t, Collection{Path: "/w", FilterParam: "id", Tenants: true, SelectParam: "fields", PutCreates: true,
		Seed: []map[string]any{{"id": 1, "name": "a", "color": "red"}}})
	do(t, "PUT", srv.URL+"/w/1?tenant=t", `{"name":"t1","color":"blue"}`)
	a := do(t, "GET", srv.URL+"/w?id=1&tenant=t&fields=name", "")
	if got := mustJSON(decode(t, a.body)); got != `[{"id":1,"name":"t1"}]` {
		t.Errorf("tenant t's user 1, name only: %s", got)
	}
}
