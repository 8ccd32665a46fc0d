package legacyapi

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestNormalize(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, with(func(c *Collection) { c.Normalize, c.PutCreates = true, true })...)
	tests := []struct {
		name, method, path, body string
		status                   int
		col, id                  string // where the write stores its record
		want                     string // that record, updated_at aside
	}{
		{"post trims and lower-cases", "POST", "/api/users", `{"name":"  Dee \n","email":" Dee@Example.COM ","note":" x ","n":1,"tags":[" a "],"updated_at":"1999"}`, 201,
			"/api/users", "1000", `{"email":"dee@example.com","id":1000,"n":1,"name":"Dee","note":"x","tags":[" a "]}`},
		{"post trims a string id", "POST", "/gadgets", `{"id":" g1 ","name":"G "}`, 201, "/gadgets", "g1", `{"id":"g1","name":"G"}`},
		{"put replaces normalised", "PUT", "/api/users/2", `{"name":" Bobby","email":"B@X.ORG","updated_at":null}`, 200,
			"/api/users", "2", `{"email":"b@x.org","id":2,"name":"Bobby"}`},
		{"patch normalises what it sends", "PATCH", "/api/users/10", `{"email":"CY@X.ORG ","updated_at":"2000-01-01T00:00:00Z"}`, 200,
			"/api/users", "10", `{"email":"cy@x.org","id":10,"name":"Cy","role":"admin"}`},
		{"put creates normalised", "PUT", "/gadgets/9", `{"name":"Cog  "}`, 201, "/gadgets", "9", `{"id":9,"name":"Cog"}`},
		{"email not a string is kept", "PATCH", "/api/users/1", `{"email":5}`, 200, "/api/users", "1", `{"email":5,"id":1,"name":"Ada"}`},
	}
	var stamps []string
	for _, tc := range tests {
		a := do(t, tc.method, srv.URL+tc.path, tc.body)
		if a.status != tc.status {
			t.Fatalf("%s: %d %s, want %d", tc.name, a.status, a.body, tc.status)
		}
		rec := decode(t, a.body).(map[string]any)
		stamp, _ := rec["updated_at"].(string)
		if _, err := time.Parse(time.RFC3339Nano, stamp); err != nil || len(stamp) != len("2026-01-01T00:00:00.000000000Z") {
			t.Errorf("%s: updated_at %#v, want a fixed-width RFC 3339 timestamp", tc.name, rec["updated_at"])
		}
		stamps = append(stamps, stamp)
		// The answer is the record as stored.
		if got, _ := api.Item(tc.col, tc.id); mustJSON(got) != mustJSON(rec) {
			t.Errorf("%s: answered %s, stored %s", tc.name, mustJSON(rec), mustJSON(got))
		}
		delete(rec, "updated_at")
		if got := mustJSON(rec); got != tc.want {
			t.Errorf("%s: stored %s, want %s", tc.name, got, tc.want)
		}
	}
	// Even a write that changes nothing gets a new updated_at.
	for range 2 {
		stamps = append(stamps, decode(t, do(t, "PATCH", srv.URL+"/api/users/1", `{}`).body).(map[string]any)["updated_at"].(string))
	}
	if !slices.IsSorted(stamps) || len(slices.Compact(slices.Clone(stamps))) != len(stamps) {
		t.Errorf("updated_at of the writes %q, want strictly increasing", stamps)
	}

	before := state(api)
	for _, body := range []string{`{"name":"   "}`, `{"name":"\t\n"}`} {
		if a := do(t, "POST", srv.URL+"/api/users", body); a.status != 422 {
			t.Errorf("POST %s: %d, want 422 once trimmed", body, a.status)
		}
	}
	if a := do(t, "PATCH", srv.URL+"/api/users/1", `{"name":" "}`); a.status != 422 {
		t.Errorf("PATCH blank name: %d, want 422", a.status)
	}
	if state(api) != before {
		t.Error("refused writes changed the state")
	}
	// Seeds are stored as given, and reads do not stamp.
	if a := do(t, "GET", srv.URL+"/gadgets/a%20b", ""); a.body != `{"id":"a b","name":"Spanner"}` {
		t.Errorf("seed read as %s", a.body)
	}
}

func TestNormalizeOffStoresAsSent(t *testing.T) {
	t.Parallel()
	api, srv := start(t)
	run(t, srv, []step{{"POST", "/api/users", `{"name":" Dee ","email":"D@X","updated_at":"mine"}`, 201,
		`{"email":"D@X","id":1000,"name":" Dee ","updated_at":"mine"}`}})
	if got := stored(api, "1000"); got != `{"email":"D@X","id":1000,"name":" Dee ","updated_at":"mine"}` {
		t.Errorf("stored %s", got)
	}
}

func TestFieldsAndReadOnly(t *testing.T) {
	t.Parallel()
	for _, normalize := range []bool{false, true} {
		t.Run(fmt.Sprint("Normalize=", normalize), func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) {
				c.Fields, c.ReadOnly, c.Normalize, c.PutCreates = []string{"name", "email", "role"}, []string{"role"}, normalize, true
			})...)
			steps := []struct {
				method, path, body string
				status             int
				id, want           string // the record stored under id afterwards, updated_at aside
			}{
				{"POST", "/api/users", `{"name":"Dee","secret":1,"role":"admin","id":5}`, 201, "5", `{"id":5,"name":"Dee"}`},
				{"PUT", "/api/users/10", `{"name":"Cy2","role":"guest","extra":true}`, 200, "10", `{"id":10,"name":"Cy2","role":"admin"}`},
				{"PATCH", "/api/users/10", `{"role":null,"email":"c@x","x":1}`, 200, "10", `{"email":"c@x","id":10,"name":"Cy2","role":"admin"}`},
				{"PATCH", "/api/users/10", `{"role":"guest"}`, 200, "10", `{"email":"c@x","id":10,"name":"Cy2","role":"admin"}`},
				{"PUT", "/api/users/2", `{"name":"B","role":"admin"}`, 200, "2", `{"id":2,"name":"B"}`},
				{"PUT", "/api/users/3", `{"name":"New","role":"admin","x":1}`, 201, "3", `{"id":3,"name":"New"}`},
				{"POST", "/api/users", `{"x":1,"name":""}`, 422, "1", `{"id":1,"name":"Ada"}`},
			}
			for _, s := range steps {
				a := do(t, s.method, srv.URL+s.path, s.body)
				if a.status != s.status {
					t.Errorf("%s %s %s: %d %s, want %d", s.method, s.path, s.body, a.status, a.body, s.status)
				}
				rec, _ := api.Item("/api/users", s.id)
				if a.status < 300 && mustJSON(decode(t, a.body)) != mustJSON(rec) {
					t.Errorf("%s %s: answered %s, stored %s", s.method, s.path, a.body, mustJSON(rec))
				}
				if _, has := rec["updated_at"]; has != (normalize && a.status < 300) {
					t.Errorf("%s %s: updated_at present = %v", s.method, s.path, has)
				}
				delete(rec, "updated_at")
				if got := mustJSON(rec); got != s.want {
					t.Errorf("%s %s %s: stored %s, want %s", s.method, s.path, s.body, got, s.want)
				}
			}
		})
	}

	t.Run("updated_at passes Fields", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.Fields = []string{"name"} })...)
		do(t, "POST", srv.URL+"/api/users", `{"name":"D","updated_at":"mine","x":1}`)
		if got := stored(api, "1000"); got != `{"id":1000,"name":"D","updated_at":"mine"}` {
			t.Errorf("stored %s", got)
		}
	})

	t.Run("read-only id", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.ReadOnly = []string{"id"} })...)
		run(t, srv, []step{
			{"POST", "/api/users", `{"id":1,"name":"X"}`, 201, `{"id":1000,"name":"X"}`},
			{"PUT", "/api/users/2", `{"id":7,"name":"B"}`, 200, `{"id":2,"name":"B"}`},
		})
		if got := stored(api, "1"); got != `{"id":1,"name":"Ada"}` {
			t.Errorf("user 1 = %s", got)
		}
	})
}

func TestSelectParam(t *testing.T) {
	t.Parallel()
	tests := []struct {
		param, query, wantItem, wantList string
	}{
		{"$select[]", "?$select[]=name", `{"id":10,"name":"Cy"}`, `[{"id":1,"name":"Ada"},{"id":2,"name":"Bob"},{"id":10,"name":"Cy"}]`},
		{"$select[]", "?%24select%5B%5D=role&$select[]=nope", `{"id":10,"role":"admin"}`, `[{"id":1},{"id":2},{"id":10,"role":"admin"}]`},
		{"fields", "?fields=role,name&limit=1", `{"id":10,"name":"Cy","role":"admin"}`, `[{"id":1,"name":"Ada"}]`},
		{"fields", "?fields=id", `{"id":10}`, `[{"id":1},{"id":2},{"id":10}]`},
		{"fields", "?fields=", `{"id":10,"name":"Cy","role":"admin"}`, ""},
		{"fields", "?fields=,", `{"id":10,"name":"Cy","role":"admin"}`, ""},
		{"fields", "?$select[]=name", `{"id":10,"name":"Cy","role":"admin"}`, ""}, // another collection's parameter
		{"", "?fields=name", `{"id":10,"name":"Cy","role":"admin"}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.param+tc.query, func(t *testing.T) {
			_, srv := startWith(t, with(func(c *Collection) { c.SelectParam = tc.param })...)
			get := do(t, "GET", srv.URL+"/api/users/10"+tc.query, "")
			if get.status != 200 || get.body != tc.wantItem {
				t.Errorf("GET item: %d %s, want %s", get.status, get.body, tc.wantItem)
			}
			if head := do(t, "HEAD", srv.URL+"/api/users/10"+tc.query, ""); head.header.Get("Content-Length") != fmt.Sprint(len(tc.wantItem)) {
				t.Errorf("HEAD Content-Length %q, want that of %s", head.header.Get("Content-Length"), tc.wantItem)
			}
			if tc.wantList != "" {
				if list := do(t, "GET", srv.URL+"/api/users"+tc.query, ""); list.body != tc.wantList {
					t.Errorf("GET list: %s, want %s", list.body, tc.wantList)
				}
			}
		})
	}

	t.Run("writes applied whole, answers shaped", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.SelectParam, c.PutCreates = "fields", true })...)
		steps := []struct {
			method, path, body, answer string
			status                     int
			id, stored                 string
		}{
			{"POST", "/api/users?fields=name", `{"name":"Dee","age":4}`, `{"id":1000,"name":"Dee"}`, 201, "1000", `{"age":4,"id":1000,"name":"Dee"}`},
			{"PUT", "/api/users/2?fields=age", `{"name":"B","age":5}`, `{"age":5,"id":2}`, 200, "2", `{"age":5,"id":2,"name":"B"}`},
			{"PUT", "/api/users/7?fields=nope", `{"name":"G"}`, `{"id":7}`, 201, "7", `{"id":7,"name":"G"}`},
			{"PATCH", "/api/users/10?fields=role&fields=age", `{"age":6}`, `{"age":6,"id":10,"role":"admin"}`, 200, "10", `{"age":6,"id":10,"name":"Cy","role":"admin"}`},
			{"DELETE", "/api/users/1?fields=name", "", `{}`, 200, "1", "absent"},
		}
		for _, s := range steps {
			a := do(t, s.method, srv.URL+s.path, s.body)
			if a.status != s.status || a.body != s.answer {
				t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.answer)
			}
			if got := stored(api, s.id); got != s.stored {
				t.Errorf("%s %s: stored %s, want %s", s.method, s.path, got, s.stored)
			}
		}
	})

	t.Run("with Normalize", func(t *testing.T) {
		api, srv := startWith(t, with(func(c *Collection) { c.SelectParam, c.Normalize = "fields", true })...)
		run(t, srv, []step{{"POST", "/api/users?fields=email", `{"name":" D ","email":"D@X"}`, 201, `{"email":"d@x","id":1000}`}})
		if rec, _ := api.Item("/api/users", "1000"); rec["name"] != "D" || rec["updated_at"] == nil {
			t.Errorf("stored %v", rec)
		}
	})
}
