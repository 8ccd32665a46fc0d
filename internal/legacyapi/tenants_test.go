package legacyapi

import (
	"net/http"
	"strings"
	"testing"
)

func TestTenants(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, with(func(c *Collection) { c.Tenants = true })...)
	run(t, srv, []step{
		{"GET", "/api/users?tenant=a", "", 200, `[]`},
		{"GET", "/api/users/1?tenant=a", "", 404, ""},
		{"POST", "/api/users?tenant=a", `{"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"POST", "/api/users?tenant=a", `{"id":1,"name":"A1"}`, 201, ""},
		{"POST", "/api/users", `{"name":"D"}`, 201, `{"id":1000,"name":"D"}`}, // numbering is per tenant
		{"POST", "/api/users?tenant=b&x=1", `{"name":"B"}`, 201, `{"id":1000,"name":"B"}`},
		{"GET", "/api/users?tenant=a", "", 200, `[{"id":1,"name":"A1"},{"id":1000,"name":"A"}]`},
		{"GET", "/api/users?limit=1&tenant=a", "", 200, `[{"id":1,"name":"A1"}]`},
		{"GET", "/api/users/1", "", 200, `{"id":1,"name":"Ada"}`},
		{"GET", "/api/users/1?tenant=", "", 200, `{"id":1,"name":"Ada"}`}, // empty is the default tenant
		{"PUT", "/api/users/1?tenant=a", `{"name":"A2"}`, 200, `{"id":1,"name":"A2"}`},
		{"PATCH", "/api/users/1000?tenant=a", `{"age":1}`, 200, `{"age":1,"id":1000,"name":"A"}`},
		{"DELETE", "/api/users/1000?tenant=b", "", 200, `{}`},
		{"DELETE", "/api/users/2?tenant=a", "", 404, ""},
		{"PUT", "/gadgets/a%20b?tenant=a", `{"name":"G"}`, 201, `{"id":"a b","name":"G"}`},
	})
	for _, c := range []struct {
		tenant, id, want string // want "" for absent
	}{
		{"", "1", `{"id":1,"name":"Ada"}`},
		{"", "1000", `{"id":1000,"name":"D"}`},
		{"a", "1", `{"id":1,"name":"A2"}`},
		{"a", "1000", `{"age":1,"id":1000,"name":"A"}`},
		{"a", "2", ""},
		{"b", "1000", ""},
		{"nobody", "1", ""},
	} {
		rec, ok := api.TenantItem("/api/users", c.tenant, c.id)
		if got := mustJSON(rec); ok != (c.want != "") || (ok && got != c.want) {
			t.Errorf("TenantItem(%q, %q) = %s, %v; want %s", c.tenant, c.id, got, ok, c.want)
		}
	}
	if got := api.TenantItems("/api/users", "a"); len(got) != 2 {
		t.Errorf("TenantItems a = %v", got)
	}
	if got, want := mustJSON(api.Items("/api/users")), mustJSON(api.TenantItems("/api/users", "")); got != want || len(api.Items("/api/users")) != 4 {
		t.Errorf("Items = %s, TenantItems default = %s", got, want)
	}
	if got := api.TenantItems("/api/users", "nobody"); got == nil || len(got) != 0 {
		t.Errorf("TenantItems of an unused tenant = %#v, want empty", got)
	}
	if got := api.TenantItems("/nope", ""); got != nil {
		t.Errorf("TenantItems of an undeclared collection = %#v, want nil", got)
	}
	if a := do(t, "POST", srv.URL+"/gadgets?tenant=a", `{"id":"z","name":"Z"}`); a.header.Get("Location") != srv.URL+"/gadgets/z" {
		t.Errorf("Location = %q, want it without the query", a.header.Get("Location"))
	}
}

func TestTenantParameterIgnoredWithoutTenants(t *testing.T) {
	t.Parallel()
	api, srv := start(t)
	run(t, srv, []step{
		{"POST", "/api/users?tenant=a", `{"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"GET", "/api/users/1?tenant=a", "", 200, `{"id":1,"name":"Ada"}`},
	})
	if _, ok := api.Item("/api/users", "1000"); !ok {
		t.Error("the POST did not land in the only tenant")
	}
	if n := len(api.TenantItems("/api/users", "a")); n != 0 {
		t.Errorf("tenant a has %d records", n)
	}
}

func TestAPIKey(t *testing.T) {
	t.Parallel()
	cols := fixture()
	cols[0].APIKey = "s3cret" // /api/users only
	cols[0].HonorKeys = true
	api, srv := startWith(t, cols...)
	tests := []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/api/users", "", 401},
		{"GET", "/api/users/", "", 401},
		{"GET", "/api/users?api_key=", "", 401},
		{"GET", "/api/users?api_key=wrong", "", 401},
		{"GET", "/api/users?API_KEY=s3cret", "", 401},
		{"HEAD", "/api/users/1", "", 401},
		{"POST", "/api/users", `{"name":"X"}`, 401},
		{"PUT", "/api/users/1?key=s3cret", `{"name":"X"}`, 401},
		{"PATCH", "/api/users/1", `{"name":"X"}`, 401},
		{"DELETE", "/api/users/1?api_key=s3cret2", "", 401},
		{"DELETE", "/api/users", "", 401}, // before the 405
		{"GET", "/api/users?api_key=s3cret", "", 200},
		{"GET", "/api/users/1?limit=1&api_key=s3cret", "", 200},
		{"GET", "/gadgets", "", 200},           // another collection, no key
		{"GET", "/api/users/1/posts", "", 200}, // a nested path is its own collection
		{"GET", "/nope", "", 404},
	}
	for _, tc := range tests {
		a := doH(t, tc.method, srv.URL+tc.path, tc.body, http.Header{"Idempotency-Key": {"k"}})
		if a.status != tc.status {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, a.status, tc.status)
		}
		if tc.status != 401 {
			continue
		}
		if a.header.Get("WWW-Authenticate") != `ApiKey realm="legacy"` || a.header.Get("Content-Type") != ctHTML ||
			(tc.method != "HEAD" && !strings.Contains(a.body, "<title>401 Unauthorized</title>")) {
			t.Errorf("%s %s: 401 with %v %q", tc.method, tc.path, a.header, a.body)
		}
	}
	if got := state(api); got != state(New(fixture()...)) {
		t.Errorf("refused requests changed the state: %s", got)
	}
	if got := api.Writes(); got != (Writes{}) {
		t.Errorf("Writes() = %+v after refused writes", got)
	}
	if a := do(t, "DELETE", srv.URL+"/api/users/1?api_key=s3cret", ""); a.status != 200 {
		t.Errorf("DELETE with the key: %d", a.status)
	}
}

func TestPatternCollections(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, append(fixture(), Collection{Path: "/api/users/*/posts", ETags: true, FilterParam: "id"})...)
	run(t, srv, []step{
		{"GET", "/api/users/2/posts", "", 200, `[]`},
		{"GET", "/api/users/999/posts", "", 404, ""}, // no user 999
		{"POST", "/api/users/999/posts", `{"title":"x"}`, 404, ""},
		{"GET", "/api/users//posts", "", 404, ""},
		{"POST", "/api/users", `{"name":"New"}`, 201, `{"id":1000,"name":"New"}`},
		{"POST", "/api/users/1000/posts", `{"title":"t"}`, 201, `{"id":1000,"title":"t"}`},
		{"POST", "/api/users/2/posts", `{"title":"b"}`, 201, `{"id":1000,"title":"b"}`}, // numbering is per parent
		{"POST", "/api/users/2/posts", `{"title":"c"}`, 201, `{"id":1001,"title":"c"}`},
		{"GET", "/api/users/1000/posts", "", 200, `[{"id":1000,"title":"t"}]`},
		{"GET", "/api/users/2/posts?id=1001&id=1000", "", 200, `[{"id":1000,"title":"b"},{"id":1001,"title":"c"}]`},
		{"GET", "/api/users/2/posts?id=1001", "", 200, `[{"id":1001,"title":"c"}]`},
		{"GET", "/api/users/1/posts", "", 200, `[{"id":1,"title":"hello"}]`}, // the declared path wins
		{"DELETE", "/api/users/10", "", 200, `{}`},
		{"GET", "/api/users/10/posts", "", 404, ""},
	})

	a := do(t, "POST", srv.URL+"/api/users/1000/posts", `{"title":"u"}`)
	if a.header.Get("Location") != srv.URL+"/api/users/1000/posts/1001" || a.header.Get("ETag") == "" {
		t.Errorf("POST to a concrete path of a pattern: Location %q, ETag %q", a.header.Get("Location"), a.header.Get("ETag"))
	}
	if a := doH(t, "PUT", srv.URL+"/api/users/1000/posts/1001", `{"title":"v"}`, http.Header{"If-Match": {`"v1"`}}); a.status != 412 {
		t.Errorf("PUT with a stale If-Match: %d %s, want 412", a.status, a.body)
	}
	if a := do(t, "GET", srv.URL+"/api/users/1/posts/1", ""); a.status != 200 || a.header.Get("ETag") != "" {
		t.Errorf("GET of the declared path: %d, ETag %q; want 200 with no ETag, as declared", a.status, a.header.Get("ETag"))
	}

	if rec, ok := api.Item("/api/users/1000/posts", "1001"); !ok || mustJSON(rec) != `{"id":1001,"title":"u"}` {
		t.Errorf("Item = %s, %v", mustJSON(rec), ok)
	}
	if got := mustJSON(api.Items("/api/users/2/posts")); got != `{"1000":{"id":1000,"title":"b"},"1001":{"id":1001,"title":"c"}}` {
		t.Errorf("Items of user 2's posts = %s", got)
	}
	if got := api.Items("/api/users/3/posts"); got == nil || len(got) != 0 {
		t.Errorf("Items of a concrete path never used = %#v, want empty", got)
	}
	if got := api.Items("/api/users/3/comments"); got != nil {
		t.Errorf("Items of a path nothing serves = %#v, want nil", got)
	}

	api.Inject(Fault{Method: "POST", Path: "/api/users/2/posts", Status: 503, AfterApply: true, Times: 1})
	if a := do(t, "POST", srv.URL+"/api/users/2/posts", `{"title":"d"}`); a.status != 503 {
		t.Errorf("faulted POST: %d, want 503", a.status)
	}
	applied := api.AppliedWrites()
	if last := applied[len(applied)-1]; last.Path != "/api/users/2/posts" || len(api.Items("/api/users/2/posts")) != 3 {
		t.Errorf("last applied write %s %s, %d posts of user 2; want the faulted POST applied", last.Method, last.Path, len(api.Items("/api/users/2/posts")))
	}
}

func TestPatternCollectionParentInTenant(t *testing.T) {
	t.Parallel()
	cols := append(with(func(c *Collection) { c.Tenants = true }), Collection{Path: "/api/users/*/posts", Tenants: true})
	api, srv := startWith(t, cols...)
	run(t, srv, []step{
		{"POST", "/api/users?tenant=a", `{"name":"A"}`, 201, `{"id":1000,"name":"A"}`},
		{"POST", "/api/users/1000/posts?tenant=a", `{"title":"t"}`, 201, `{"id":1000,"title":"t"}`},
		{"GET", "/api/users/1000/posts", "", 404, ""}, // user 1000 is tenant a's only
		{"GET", "/api/users/2/posts?tenant=a", "", 404, ""},
		{"GET", "/api/users/2/posts", "", 200, `[]`},
	})
	if _, ok := api.TenantItem("/api/users/1000/posts", "a", "1000"); !ok {
		t.Errorf("TenantItem of a concrete path of a pattern: not found")
	}
}
