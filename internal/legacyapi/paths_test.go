package legacyapi

import (
	"net/http"
	"strings"
	"testing"
)

func TestLenientIDs(t *testing.T) {
	t.Parallel()
	seed := []map[string]any{{"id": 0, "name": "Zero"}, {"id": 3, "name": "Three"}, {"id": "7", "name": "Seven"}}
	t.Run("reads", func(t *testing.T) {
		_, srv := startWith(t, Collection{Path: "/n", LenientIDs: true, Seed: seed})
		tests := []struct {
			segment string
			status  int
			name    string
		}{
			{"3", 200, "Three"}, {"03", 200, "Three"}, {"+3", 200, "Three"}, {"%2B3", 200, "Three"}, {"+003", 200, "Three"},
			{"3.json", 200, "Three"}, {"3.JSON", 200, "Three"}, {"3.Json", 200, "Three"}, {"+03.json", 200, "Three"},
			{"0", 200, "Zero"}, {"00", 200, "Zero"}, {"+0", 200, "Zero"}, {"0.json", 200, "Zero"},
			{"7", 200, "Seven"}, {"007", 200, "Seven"},
			{"3x", 404, ""}, {"x3", 404, ""}, {"+", 404, ""}, {".json", 404, ""}, {"-3", 404, ""}, {"3.5", 404, ""},
			{"++3", 404, ""}, {"3.json.json", 404, ""}, {"3.jsonx", 404, ""}, {"%203", 404, ""}, {"3.xml", 404, ""},
			{"4", 404, ""}, {"04.json", 404, ""},
		}
		for _, tc := range tests {
			for _, method := range []string{"GET", "HEAD"} {
				a := do(t, method, srv.URL+"/n/"+tc.segment, "")
				if a.status != tc.status || (method == "GET" && tc.name != "" && !strings.Contains(a.body, `"`+tc.name+`"`)) {
					t.Errorf("%s /n/%s: %d %s, want %d %s", method, tc.segment, a.status, a.body, tc.status, tc.name)
				}
				if tc.status == 404 && a.header.Get("Content-Type") != ctHTML {
					t.Errorf("%s /n/%s: 404 as %q", method, tc.segment, a.header.Get("Content-Type"))
				}
			}
		}
	})

	t.Run("writes", func(t *testing.T) {
		api, srv := startWith(t, Collection{Path: "/n", LenientIDs: true, PutCreates: true, Seed: seed})
		for _, s := range []struct {
			method, path, body string
			status             int
			answer             string
		}{
			{"PUT", "/n/03", `{"name":"Tri"}`, 200, `{"id":3,"name":"Tri"}`},
			{"PATCH", "/n/+3.json", `{"age":3}`, 200, `{"age":3,"id":3,"name":"Tri"}`},
			{"PATCH", "/n/3x", `{"age":3}`, 404, ""},
			{"PUT", "/n/3x", `{"name":"X"}`, 404, ""}, // PutCreates cannot create what names nothing
			{"DELETE", "/n/00", "", 200, `{}`},
			{"DELETE", "/n/0", "", 404, ""},
			{"POST", "/n/3x", `{}`, 404, ""},
			{"POST", "/n/3", `{}`, 405, ""},
		} {
			a := do(t, s.method, srv.URL+s.path, s.body)
			if a.status != s.status || (s.answer != "" && a.body != s.answer) {
				t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.answer)
			}
		}
		a := do(t, "PUT", srv.URL+"/n/0012.JSON", `{"name":"Twelve"}`)
		if a.status != 201 || a.body != `{"id":12,"name":"Twelve"}` || a.header.Get("Location") != srv.URL+"/n/12" {
			t.Errorf("PUT create: %d %s Location %q", a.status, a.body, a.header.Get("Location"))
		}
		got := map[string]string{}
		for id, rec := range api.Items("/n") {
			got[id] = mustJSON(rec)
		}
		want := map[string]string{"3": `{"age":3,"id":3,"name":"Tri"}`, "7": `{"id":"7","name":"Seven"}`, "12": `{"id":12,"name":"Twelve"}`}
		if mustJSON(got) != mustJSON(want) {
			t.Errorf("stored %v, want %v", got, want)
		}
	})

	t.Run("off by default", func(t *testing.T) {
		_, srv := startWith(t, Collection{Path: "/n", Seed: seed})
		run(t, srv, []step{{"GET", "/n/3", "", 200, ""}, {"GET", "/n/03", "", 404, ""}, {"GET", "/n/3.json", "", 404, ""}})
	})
}

func TestTrailingSlash(t *testing.T) {
	t.Parallel()
	cols := with(func(c *Collection) { c.TrailingSlash, c.HonorKeys = true, true })
	cols[0].APIKey = "k"
	api, srv := startWith(t, cols...)
	seed := state(api)
	key := http.Header{"Idempotency-Key": {"once"}}
	for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		for _, path := range []string{"/api/users", "/api/users/1?api_key=k&tenant=a", "/gadgets/a%20b", "/gadgets/new", "/api/users/1/posts", "/api/users/1/posts/1"} {
			a, err := send(noRedirects, method, srv.URL+path, `{"name":"X"}`, key)
			if err != nil {
				t.Fatal(err)
			}
			p, q, _ := strings.Cut(path, "?")
			want := srv.URL + p + "/"
			if q != "" {
				want += "?" + q
			}
			if a.status != 301 || a.header.Get("Location") != want || a.header.Get("Content-Type") != ctHTML ||
				(method != "HEAD" && !strings.Contains(a.body, "301 Moved Permanently")) {
				t.Errorf("%s %s: %d Location %q %q, want 301 to %s", method, path, a.status, a.header.Get("Location"), a.body, want)
			}
		}
	}
	if got := state(api); got != seed {
		t.Errorf("redirected requests changed the state: %s", got)
	}
	if got := api.Writes(); got != (Writes{}) {
		t.Errorf("Writes() = %+v after redirects", got)
	}
	if got := api.AppliedWrites(); len(got) != 0 {
		t.Errorf("AppliedWrites() = %v after redirects", got)
	}
	api.mu.Lock()
	if n := len(api.keys); n != 0 {
		t.Errorf("redirects stored %d Idempotency-Keys", n)
	}
	api.mu.Unlock()

	// The slashed URLs are the API.
	for _, s := range []struct {
		method, path, body string
		status             int
		wantBody           string
	}{
		{"GET", "/api/users/?api_key=k&limit=1", "", 200, `[{"id":1,"name":"Ada"}]`},
		{"GET", "/api/users/1/?api_key=k", "", 200, `{"id":1,"name":"Ada"}`},
		{"GET", "/api/users/?limit=1", "", 401, ""},
		{"PUT", "/api/users/1/?api_key=k", `{"name":"Ann"}`, 200, `{"id":1,"name":"Ann"}`},
		{"PATCH", "/gadgets/a%20b/", `{"n":1}`, 200, `{"id":"a b","n":1,"name":"Spanner"}`},
		{"DELETE", "/api/users/2/?api_key=k", "", 200, `{}`},
		{"PUT", "/gadgets/new/", `{"name":"N"}`, 201, `{"id":"new","name":"N"}`},
		{"GET", "/api/users/1/posts/1/", "", 200, `{"id":1,"title":"hello"}`},
		{"GET", "/api/users/1//?api_key=k", "", 404, ""},
		{"GET", "/api/users/1/x/?api_key=k", "", 404, ""},
		{"POST", "/api/users/1/?api_key=k", `{}`, 405, ""},
	} {
		a := doH(t, s.method, srv.URL+s.path, s.body, key)
		if a.status != s.status || (s.wantBody != "" && a.body != s.wantBody) {
			t.Errorf("%s %s: %d %s, want %d %s", s.method, s.path, a.status, a.body, s.status, s.wantBody)
		}
	}
	a := doH(t, "POST", srv.URL+"/gadgets/", `{"id":"x/y","name":"Bolt"}`, key)
	if loc := a.header.Get("Location"); a.status != 201 || loc != srv.URL+"/gadgets/x%2Fy/" {
		t.Fatalf("POST: %d Location %q", a.status, loc)
	}
	if a := do(t, "GET", a.header.Get("Location"), ""); a.status != 200 || a.body != `{"id":"x/y","name":"Bolt"}` {
		t.Errorf("GET Location: %d %s", a.status, a.body)
	}
	if a := doH(t, "PUT", srv.URL+"/gadgets/q/", `{}`, nil); a.header.Get("Location") != srv.URL+"/gadgets/q/" {
		t.Errorf("PUT create Location %q", a.header.Get("Location"))
	}
	for _, answer := range []CreateAnswer{AnswerSeeOther, AnswerCreated} {
		_, srv := startWith(t, Collection{Path: "/s", TrailingSlash: true, CreateAnswer: answer})
		a, err := send(noRedirects, "POST", srv.URL+"/s/", `{}`, nil)
		if err != nil || a.header.Get("Location") != srv.URL+"/s/1000/" {
			t.Errorf("CreateAnswer %d: %v Location %q", answer, err, a.header.Get("Location"))
		}
	}

	// Faults match the path exactly as received.
	api.Inject(Fault{Path: "/api/users/1", Status: 503, Times: 1})
	api.Inject(Fault{Path: "/api/users/10/", Status: 502, Times: 1})
	if a, _ := send(noRedirects, "GET", srv.URL+"/api/users/1", "", nil); a.status != 503 {
		t.Errorf("fault on the unslashed path: %d", a.status)
	}
	if a, _ := send(noRedirects, "GET", srv.URL+"/api/users/10", "", nil); a.status != 301 {
		t.Errorf("unslashed path with a fault on the slashed one: %d", a.status)
	}
	if a, _ := send(noRedirects, "GET", srv.URL+"/api/users/10/", "", nil); a.status != 502 {
		t.Errorf("fault on the slashed path: %d", a.status)
	}
}

func TestTrailingSlashWithLenientIDs(t *testing.T) {
	t.Parallel()
	_, srv := startWith(t, Collection{Path: "/n", TrailingSlash: true, LenientIDs: true, Seed: []map[string]any{{"id": 3}}})
	for _, s := range []struct {
		path     string
		status   int
		location string
	}{
		{"/n/03/", 200, ""},
		{"/n/3.json/", 200, ""},
		{"/n/03", 301, "/n/03/"},
		{"/n/3x", 404, ""},
		{"/n/3x/", 404, ""},
	} {
		a, err := send(noRedirects, "GET", srv.URL+s.path, "", nil)
		if loc := strings.TrimPrefix(a.header.Get("Location"), srv.URL); err != nil || a.status != s.status || loc != s.location {
			t.Errorf("GET %s: %v %d Location %q, want %d %q", s.path, err, a.status, loc, s.status, s.location)
		}
	}
}
