package legacyapi

import (
	"net/http"
	"strings"
	"testing"
)

func TestETagConditions(t *testing.T) {
	t.Parallel()
	// In the header columns "current" stands for the target's ETag just
	// before the request.
	tests := []struct {
		name, method, path, body string
		ifMatch, ifNoneMatch     string
		status                   int
		changed                  bool
	}{
		{"put if-match current", "PUT", "/api/users/1", `{"name":"A"}`, "current", "", 200, true},
		{"put if-match in a list", "PUT", "/api/users/1", `{"name":"A"}`, `"v999", current`, "", 200, true},
		{"put if-match star", "PUT", "/api/users/1", `{"name":"A"}`, "*", "", 200, true},
		{"put if-match stale", "PUT", "/api/users/1", `{"name":"A"}`, `"v999"`, "", 412, false},
		{"put if-match weak tag never matches", "PUT", "/api/users/1", `{"name":"A"}`, "W/current", "", 412, false},
		{"put if-match before body checks", "PUT", "/api/users/1", `not json`, `"v999"`, "", 412, false},
		{"put blank if-match is no condition", "PUT", "/api/users/1", `{"name":"A"}`, " ", "", 200, true},
		{"put if-match star on missing", "PUT", "/gadgets/new", `{"name":"N"}`, "*", "", 412, false},
		{"put if-match on missing, no PutCreates", "PUT", "/api/users/7", `{"name":"N"}`, `"v1"`, "", 412, false},
		{"put if-none-match star on existing", "PUT", "/gadgets/a%20b", `{"name":"N"}`, "", "*", 412, false},
		{"put if-none-match weak current", "PUT", "/gadgets/a%20b", `{"name":"N"}`, "", "W/current", 412, false},
		{"put if-none-match other tag", "PUT", "/gadgets/a%20b", `{"name":"N"}`, "", `"v999"`, 200, true},
		{"put if-none-match star creates", "PUT", "/gadgets/new", `{"name":"N"}`, "", "*", 201, true},
		{"patch if-match current", "PATCH", "/api/users/2", `{"age":3}`, "current", "", 200, true},
		{"patch if-match stale", "PATCH", "/api/users/2", `{"age":3}`, `"v1"`, "", 412, false},
		{"patch if-match star on missing", "PATCH", "/api/users/7", `{"age":3}`, "*", "", 412, false},
		{"delete if-match current", "DELETE", "/api/users/10", "", "current", "", 200, true},
		{"delete if-match star", "DELETE", "/api/users/10", "", "*", "", 200, true},
		{"delete if-match stale", "DELETE", "/api/users/10", "", `"v1"`, "", 412, false},
		{"delete if-match star on missing", "DELETE", "/api/users/7", "", "*", "", 412, false},
		{"post if-none-match star, id exists", "POST", "/api/users", `{"id":1,"name":"X"}`, "", "*", 412, false},
		{"post if-none-match star, new id", "POST", "/api/users", `{"id":5,"name":"X"}`, "", "*", 201, true},
		{"post if-none-match star, no id", "POST", "/api/users", `{"name":"X"}`, "", "*", 201, true},
		{"post duplicate id without condition", "POST", "/api/users", `{"id":1,"name":"X"}`, "", "", 409, false},
		{"get ignores if-match", "GET", "/api/users/1", "", `"v999"`, "", 200, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) { c.ETags = true })...)
			current := do(t, "GET", srv.URL+tc.path, "").header.Get("ETag")
			hdr := http.Header{}
			if tc.ifMatch != "" {
				hdr.Set("If-Match", strings.ReplaceAll(tc.ifMatch, "current", current))
			}
			if tc.ifNoneMatch != "" {
				hdr.Set("If-None-Match", strings.ReplaceAll(tc.ifNoneMatch, "current", current))
			}
			before := state(api)
			a := doH(t, tc.method, srv.URL+tc.path, tc.body, hdr)
			if a.status != tc.status {
				t.Errorf("status = %d, want %d (body %q)", a.status, tc.status, a.body)
			}
			if a.status == 412 && (a.header.Get("Content-Type") != ctHTML || !strings.Contains(a.body, "412 Precondition Failed")) {
				t.Errorf("412 answer: %q %q, want an HTML page", a.header.Get("Content-Type"), a.body)
			}
			if changed := state(api) != before; changed != tc.changed {
				t.Errorf("state changed = %v, want %v", changed, tc.changed)
			}
		})
	}
}

func TestETagValues(t *testing.T) {
	t.Parallel()
	_, srv := startWith(t, with(func(c *Collection) { c.ETags = true })...)
	etag := func(a answer) string {
		t.Helper()
		tag := a.header.Get("ETag")
		if !strings.HasPrefix(tag, `"v`) || !strings.HasSuffix(tag, `"`) || len(tag) < 4 {
			t.Fatalf("ETag = %q (status %d), want a strong \"v<n>\"", tag, a.status)
		}
		return tag
	}
	u1 := srv.URL + "/api/users/1"
	seen := map[string]string{}
	distinct := func(what, tag string) {
		t.Helper()
		if prev, dup := seen[tag]; dup {
			t.Errorf("%s has ETag %s, already used by %s", what, tag, prev)
		}
		seen[tag] = what
	}

	got := etag(do(t, "GET", u1, ""))
	if head := etag(do(t, "HEAD", u1, "")); head != got {
		t.Errorf("HEAD ETag %s, GET %s", head, got)
	}
	if got != etag(do(t, "GET", u1, "")) {
		t.Error("ETag changed without a write")
	}
	distinct("seed", got)
	distinct("other seed", etag(do(t, "GET", srv.URL+"/api/users/2", "")))

	steps := []struct{ name, method, path, body string }{
		{"PUT", "PUT", "/api/users/1", `{"name":"Ada"}`}, // same content, still a write
		{"PATCH", "PATCH", "/api/users/1", `{"age":36}`},
		{"POST", "POST", "/api/users", `{"id":1000,"name":"Dee"}`},
		{"PUT create", "PUT", "/gadgets/9", `{"name":"Cog"}`},
	}
	for _, s := range steps {
		a := do(t, s.method, srv.URL+s.path, s.body)
		tag := etag(a)
		distinct(s.name, tag)
		read := s.path
		if loc := a.header.Get("Location"); loc != "" {
			read = strings.TrimPrefix(loc, srv.URL)
		}
		if now := etag(do(t, "GET", srv.URL+read, "")); now != tag {
			t.Errorf("%s answered ETag %s, a GET then %s", s.name, tag, now)
		}
	}

	// A deleted and re-created record does not get its old tag back.
	old := etag(do(t, "GET", srv.URL+"/api/users/2", ""))
	if a := do(t, "DELETE", srv.URL+"/api/users/2", ""); a.header.Get("ETag") != "" {
		t.Errorf("DELETE answered ETag %q", a.header.Get("ETag"))
	}
	again := etag(do(t, "POST", srv.URL+"/api/users", `{"id":2,"name":"Bob"}`))
	if again == old {
		t.Errorf("re-created record has its old ETag %s", old)
	}
	if a := do(t, "GET", srv.URL+"/api/users", ""); a.header.Get("ETag") != "" {
		t.Errorf("a list answered ETag %q", a.header.Get("ETag"))
	}
}

func TestNoETagsIgnoresConditions(t *testing.T) {
	t.Parallel()
	api, srv := start(t)
	if a := do(t, "GET", srv.URL+"/api/users/1", ""); a.header.Get("ETag") != "" {
		t.Errorf("ETag %q without ETags", a.header.Get("ETag"))
	}
	for _, s := range []struct {
		method, path, body, header string
		status                     int
	}{
		{"PUT", "/api/users/1", `{"name":"A"}`, "If-Match", 200},
		{"PATCH", "/api/users/1", `{"age":1}`, "If-Match", 200},
		{"PUT", "/gadgets/a%20b", `{"name":"A"}`, "If-None-Match", 200},
		{"POST", "/api/users", `{"id":2,"name":"B"}`, "If-None-Match", 409},
		{"DELETE", "/api/users/1", "", "If-Match", 200},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, http.Header{s.header: {`"nope"`, "*"}})
		if a.status != s.status {
			t.Errorf("%s %s with %s: %d, want %d", s.method, s.path, s.header, a.status, s.status)
		}
	}
	if _, ok := api.Item("/api/users", "1"); ok {
		t.Error("conditional DELETE was not applied")
	}
}

func TestETagsTenantsKeysComposed(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, with(func(c *Collection) { c.ETags, c.Tenants, c.HonorKeys = true, true, true })...)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	created := doH(t, "POST", srv.URL+"/api/users?tenant=a", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*", "Idempotency-Key", "k"))
	ta, td := created.header.Get("ETag"), do(t, "GET", srv.URL+"/api/users/1", "").header.Get("ETag")
	if created.status != 201 || ta == "" || ta == td {
		t.Fatalf("create in tenant a: %d, ETag %q (default tenant's %q)", created.status, ta, td)
	}
	for _, s := range []struct {
		name, method, path, body string
		hdr                      http.Header
		status                   int
	}{
		{"other tenant's tag fails", "PUT", "/api/users/1?tenant=a", `{"name":"X"}`, hdr("If-Match", td), 412},
		{"and the other way round", "PATCH", "/api/users/1", `{"name":"X"}`, hdr("If-Match", ta), 412},
		{"missing in tenant b", "DELETE", "/api/users/1?tenant=b", "", hdr("If-Match", "*"), 412},
		{"absent in tenant b", "POST", "/api/users?tenant=b", `{"id":1,"name":"B1"}`, hdr("If-None-Match", "*"), 201},
		{"present in tenant a", "POST", "/api/users?tenant=a", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*"), 412},
		{"key replayed in its tenant", "POST", "/api/users?tenant=a", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*", "Idempotency-Key", "k"), 201},
		{"key is new in another tenant", "POST", "/api/users?tenant=c", `{"id":1,"name":"A1"}`, hdr("If-None-Match", "*", "Idempotency-Key", "k"), 201},
		{"own tag holds", "PATCH", "/api/users/1?tenant=a", `{"age":2}`, hdr("If-Match", ta), 200},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, s.hdr)
		if a.status != s.status {
			t.Errorf("%s: %d %q, want %d", s.name, a.status, a.body, s.status)
		}
		if s.name == "key replayed in its tenant" && (a.header.Get("ETag") != ta || a.header.Get("Idempotent-Replayed") != "true") {
			t.Errorf("%s: ETag %q replayed %q, want the first answer's %q", s.name, a.header.Get("ETag"), a.header.Get("Idempotent-Replayed"), ta)
		}
	}
	for tenant, want := range map[string]string{"": `{"id":1,"name":"Ada"}`, "a": `{"age":2,"id":1,"name":"A1"}`, "b": `{"id":1,"name":"B1"}`, "c": `{"id":1,"name":"A1"}`} {
		if rec, _ := api.TenantItem("/api/users", tenant, "1"); mustJSON(rec) != want {
			t.Errorf("tenant %q: %s, want %s", tenant, mustJSON(rec), want)
		}
	}
	if got, want := api.Writes(), (Writes{Applied: 4, Replayed: 1}); got != want {
		t.Errorf("Writes() = %+v, want %+v", got, want)
	}
}

func TestContentETags(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, with(func(c *Collection) { c.ContentETags, c.PutCreates = true, true })...)
	get := func(path string) (tag, body string) {
		t.Helper()
		a := do(t, "GET", srv.URL+path, "")
		tag = a.header.Get("ETag")
		if a.status != 200 || len(tag) != 18 || tag[0] != '"' || tag[17] != '"' {
			t.Fatalf("GET %s: %d ETag %q, want a strong hashed tag", path, a.status, tag)
		}
		if head := do(t, "HEAD", srv.URL+path, ""); head.header.Get("ETag") != tag {
			t.Errorf("HEAD %s: ETag %q, GET %q", path, head.header.Get("ETag"), tag)
		}
		return tag, a.body
	}
	u1, body1 := get("/api/users/1")
	if again, _ := get("/api/users/1"); again != u1 {
		t.Errorf("ETag changed without a write: %s, %s", u1, again)
	}
	list, _ := get("/api/users")
	if list == u1 {
		t.Error("a list and an item share a tag")
	}
	if other, _ := get("/api/users/2"); other == u1 {
		t.Error("two records share a tag")
	}

	// A write that leaves the content as it was leaves the tag too; the
	// write answers carry none.
	for _, s := range []struct{ method, path, body string }{
		{"PUT", "/api/users/1", `{"name":"Ada"}`},
		{"PATCH", "/api/users/1", `{}`},
	} {
		if a := do(t, s.method, srv.URL+s.path, s.body); a.status != 200 || a.header.Get("ETag") != "" {
			t.Errorf("%s: %d ETag %q", s.method, a.status, a.header.Get("ETag"))
		}
		if tag, _ := get("/api/users/1"); tag != u1 {
			t.Errorf("after a %s to equal content: %s, want %s", s.method, tag, u1)
		}
	}
	if a := do(t, "PATCH", srv.URL+"/api/users/1", `{"age":36}`); a.header.Get("ETag") != "" {
		t.Errorf("PATCH answered ETag %q", a.header.Get("ETag"))
	}
	changed, _ := get("/api/users/1")
	if changed == u1 {
		t.Error("ETag unchanged after a change")
	}
	if tag, _ := get("/api/users"); tag == list {
		t.Error("list ETag unchanged after a change")
	}

	// Conditions are never enforced.
	for _, s := range []struct {
		method, path, body, header, value string
		status                            int
	}{
		{"PUT", "/api/users/1", `{"name":"Ann"}`, "If-Match", u1, 200}, // stale
		{"PATCH", "/api/users/1", `{"name":"Ada","age":null}`, "If-Match", `"nope"`, 200},
		{"PUT", "/gadgets/a%20b", `{"name":"G"}`, "If-None-Match", "*", 200},
		{"PUT", "/gadgets/new", `{"name":"N"}`, "If-Match", "*", 201},
		{"POST", "/api/users", `{"id":2,"name":"B"}`, "If-None-Match", "*", 409},
		{"DELETE", "/api/users/2", "", "If-Match", `"nope"`, 200},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, http.Header{s.header: {s.value}})
		if a.status != s.status || a.header.Get("ETag") != "" {
			t.Errorf("%s %s with %s: %d ETag %q, want %d and none", s.method, s.path, s.header, a.status, a.header.Get("ETag"), s.status)
		}
	}
	if tag, body := get("/api/users/1"); tag != u1 || body != body1 {
		t.Errorf("back to %s: ETag %s, want the first %s", body, tag, u1)
	}
	if _, ok := api.Item("/api/users", "2"); ok {
		t.Error("conditional DELETE not applied")
	}
	if a := do(t, "GET", srv.URL+"/api/users/2", ""); a.status != 404 || a.header.Get("ETag") != "" {
		t.Errorf("404 with ETag %q", a.header.Get("ETag"))
	}
	if a := doH(t, "GET", srv.URL+"/api/users/1", "", http.Header{"If-None-Match": {u1}}); a.status != 200 {
		t.Errorf("GET with a matching If-None-Match: %d, want 200", a.status)
	}

	// The tag is that of the body answered, so a selection has its own.
	_, srv = startWith(t, with(func(c *Collection) { c.ContentETags, c.SelectParam = true, "fields" })...)
	whole := do(t, "GET", srv.URL+"/api/users/10", "").header.Get("ETag")
	part := do(t, "GET", srv.URL+"/api/users/10?fields=name", "")
	if part.header.Get("ETag") == whole || part.header.Get("ETag") != contentTag([]byte(part.body)) {
		t.Errorf("selected answer %s has ETag %q (whole %q)", part.body, part.header.Get("ETag"), whole)
	}
}
