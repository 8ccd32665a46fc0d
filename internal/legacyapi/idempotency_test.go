package legacyapi

import (
	"net/http"
	"slices"
	"testing"
	"time"
)

func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	keyed := with(func(c *Collection) { c.HonorKeys = true })
	type req struct{ method, path, body, key string }
	first := req{"POST", "/api/users", `{"name":"Dee"}`, "k1"}
	tests := []struct {
		name     string
		cols     []Collection
		second   req
		status   int
		replayed bool
		created  []string // user ids beyond the seeds after both requests
		writes   Writes
	}{
		{"same key and body replays", keyed, first, 201, true, []string{"1000"}, Writes{Applied: 1, Replayed: 1}},
		{"same key, other body", keyed, req{"POST", "/api/users", `{"name":"Eve"}`, "k1"}, 422, false, []string{"1000"}, Writes{Applied: 1}},
		{"same key, same JSON spelled otherwise", keyed, req{"POST", "/api/users", `{"name": "Dee"}`, "k1"}, 422, false, []string{"1000"}, Writes{Applied: 1}},
		{"other key", keyed, req{"POST", "/api/users", `{"name":"Dee"}`, "k2"}, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
		{"no key", keyed, req{"POST", "/api/users", `{"name":"Dee"}`, ""}, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
		{"same key, other query", keyed, req{"POST", "/api/users?src=x", `{"name":"Dee"}`, "k1"}, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
		{"same key, other path", keyed, req{"PUT", "/api/users/2", `{"name":"Dee"}`, "k1"}, 200, false, []string{"1000"}, Writes{Applied: 2}},
		{"keys ignored without HonorKeys", fixture(), first, 201, false, []string{"1000", "1001"}, Writes{Applied: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := startWith(t, tc.cols...)
			var answers [2]answer
			for i, r := range []req{first, tc.second} {
				hdr := http.Header{}
				if r.key != "" {
					hdr.Set("Idempotency-Key", r.key)
				}
				answers[i] = doH(t, r.method, srv.URL+r.path, r.body, hdr)
			}
			a := answers[1]
			if a.status != tc.status {
				t.Errorf("second answer %d %q, want %d", a.status, a.body, tc.status)
			}
			if replayed := a.header.Get("Idempotent-Replayed") == "true"; replayed != tc.replayed {
				t.Errorf("Idempotent-Replayed = %q, want replayed %v", a.header.Get("Idempotent-Replayed"), tc.replayed)
			}
			if tc.replayed && (a.body != answers[0].body || a.header.Get("Location") != answers[0].header.Get("Location") ||
				a.header.Get("Content-Type") != answers[0].header.Get("Content-Type")) {
				t.Errorf("replay %q %v differs from the first answer %q %v", a.body, a.header, answers[0].body, answers[0].header)
			}
			var created []string
			for id := range api.Items("/api/users") {
				if len(id) == 4 {
					created = append(created, id)
				}
			}
			slices.Sort(created)
			if !slices.Equal(created, tc.created) {
				t.Errorf("created %v, want %v", created, tc.created)
			}
			if got := api.Writes(); got != tc.writes {
				t.Errorf("Writes() = %+v, want %+v", got, tc.writes)
			}
		})
	}
}

func TestIdempotencyKeyReplaysWhatever(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, with(func(c *Collection) { c.HonorKeys = true })...)
	key := func(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }
	// A DELETE resent with its key is answered as the first, not 404.
	for range 2 {
		if a := doH(t, "DELETE", srv.URL+"/api/users/1", "", key("d")); a.status != 200 || a.body != "{}" {
			t.Errorf("DELETE: %d %q", a.status, a.body)
		}
	}
	// An error answer is stored and replayed too, even once the request
	// would succeed.
	doH(t, "PUT", srv.URL+"/api/users/1", `{"name":"Ada"}`, key("p"))
	do(t, "POST", srv.URL+"/api/users", `{"id":1,"name":"Ada"}`)
	if a := doH(t, "PUT", srv.URL+"/api/users/1", `{"name":"Ada"}`, key("p")); a.status != 404 || a.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("resent PUT: %d %q, want the stored 404", a.status, a.header.Get("Idempotent-Replayed"))
	}
	// Reads ignore the header.
	for range 2 {
		if a := doH(t, "GET", srv.URL+"/api/users/1", "", key("g")); a.status != 200 || a.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("GET: %d %v", a.status, a.header)
		}
	}
	if got, want := api.Writes(), (Writes{Applied: 2, Replayed: 2}); got != want {
		t.Errorf("Writes() = %+v, want %+v", got, want)
	}
}

// A write applied whose answer was lost, resent with its key, gets the
// first answer back and is applied once.
func TestIdempotencyKeyAfterLostAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		fault   Fault
		timeout time.Duration // of the first attempt's client
		applied bool          // whether the first attempt reached the state
	}{
		{"drop after apply", Fault{Drop: true, AfterApply: true}, 5 * time.Second, true},
		{"hang after apply", Fault{Hang: true, AfterApply: true}, 100 * time.Millisecond, true},
		{"error page after apply", Fault{Status: 502, AfterApply: true}, 5 * time.Second, true},
		{"error page before apply", Fault{Status: 503}, 5 * time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api, srv := startWith(t, with(func(c *Collection) { c.HonorKeys = true })...)
			f := tc.fault
			f.Method, f.Path, f.Times = "POST", "/api/users", 1
			api.Inject(f)
			hdr := http.Header{"Idempotency-Key": {"once"}}
			first, err := send(fresh(tc.timeout), "POST", srv.URL+"/api/users", `{"name":"Dee"}`, hdr)
			if err == nil && first.status == 201 {
				t.Fatalf("first attempt answered %d", first.status)
			}
			a, err := send(fresh(5*time.Second), "POST", srv.URL+"/api/users", `{"name":"Dee"}`, hdr)
			if err != nil || a.status != 201 || a.body != `{"id":1000,"name":"Dee"}` || a.header.Get("Location") != srv.URL+"/api/users/1000" {
				t.Fatalf("resend: %v %d %q %v", err, a.status, a.body, a.header)
			}
			if replayed := a.header.Get("Idempotent-Replayed") == "true"; replayed != tc.applied {
				t.Errorf("replayed = %v, want %v", replayed, tc.applied)
			}
			want := Writes{Applied: 1}
			if tc.applied {
				want.Replayed = 1
			}
			if got := api.Writes(); got != want {
				t.Errorf("Writes() = %+v, want %+v", got, want)
			}
			if n := len(api.Items("/api/users")); n != 4 {
				t.Errorf("%d users, want the 3 seeds and one created", n)
			}
			if n := len(api.Requests()); n != 2 {
				t.Errorf("%d requests logged, want 2", n)
			}
		})
	}
}
