package legacyapi

import (
	"net/http"
	"strings"
	"testing"
)

// fastAPIUsers is a FastAPI users collection with nested items.
func fastAPIUsers() []Collection {
	return []Collection{
		{Path: "/api/users", FastAPI: true, AssignIDs: true, Seed: []map[string]any{{"id": 20, "name": "Ada"}}},
		{Path: "/api/users/*/items", FastAPI: true, AssignIDs: true},
	}
}

func TestFastAPIRedirectsTheOtherSpelling(t *testing.T) {
	t.Parallel()
	t.Run("the other spelling is redirected 307, nothing applied", func(t *testing.T) {
		api, srv := startWith(t, fastAPIUsers()...)
		for _, tc := range []struct{ method, path, to string }{
			{"POST", "/api/users?x=1", "/api/users/?x=1"},
			{"GET", "/api/users", "/api/users/"},
			{"PATCH", "/api/users/20/", "/api/users/20"},
			{"DELETE", "/api/users/20/", "/api/users/20"},
			{"GET", "/api/users/20/items", "/api/users/20/items/"},
		} {
			a, err := send(noRedirects, tc.method, srv.URL+tc.path, `{"name":"Bob"}`, nil)
			if err != nil {
				t.Fatal(err)
			}
			if a.status != http.StatusTemporaryRedirect || a.header.Get("Location") != srv.URL+tc.to {
				t.Errorf("%s %s: %d to %q, want 307 to %s", tc.method, tc.path, a.status, a.header.Get("Location"), tc.to)
			}
		}
		if got := stored(api, "20"); got != `{"id":20,"name":"Ada"}` || len(api.Items("/api/users")) != 1 {
			t.Errorf("a redirected write was applied: %s, %d users", got, len(api.Items("/api/users")))
		}
		for _, path := range []string{"/api/users/", "/api/users/20", "/api/users/20/items/"} {
			if a := do(t, "GET", srv.URL+path, ""); a.status != http.StatusOK {
				t.Errorf("GET %s: %d, want the routed spelling served", path, a.status)
			}
		}
	})
}

func TestFastAPIAnswers(t *testing.T) {
	t.Parallel()
	t.Run("HEAD is 405 with an Allow that lacks it", func(t *testing.T) {
		_, srv := startWith(t, fastAPIUsers()...)
		for _, path := range []string{"/api/users/", "/api/users/20"} {
			a := do(t, "HEAD", srv.URL+path, "")
			if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") == "" || strings.Contains(a.header.Get("Allow"), "HEAD") {
				t.Errorf("HEAD %s: %d, Allow %q", path, a.status, a.header.Get("Allow"))
			}
		}
	})

	t.Run("a create is 200 with the record and no Location", func(t *testing.T) {
		api, srv := startWith(t, fastAPIUsers()...)
		a := do(t, "POST", srv.URL+"/api/users/", `{"name":"Bob"}`)
		if a.status != http.StatusOK || a.header.Get("Location") != "" || !strings.Contains(a.body, `"id":1000`) {
			t.Errorf("POST: %d, Location %q, %s", a.status, a.header.Get("Location"), a.body)
		}
		if got := stored(api, "1000"); got != `{"id":1000,"name":"Bob"}` {
			t.Errorf("stored %s", got)
		}
	})

	t.Run("a validation error is a 422 with detail", func(t *testing.T) {
		_, srv := startWith(t, fastAPIUsers()...)
		a := do(t, "PATCH", srv.URL+"/api/users/20", `{"name":""}`)
		detail, _ := decode(t, a.body).(map[string]any)["detail"].([]any)
		if a.status != http.StatusUnprocessableEntity || len(detail) != 1 || !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
			t.Errorf("PATCH: %d %s %s, want a 422 with a detail list", a.status, a.header.Get("Content-Type"), a.body)
		}
	})

	t.Run("ids and parents are int path parameters", func(t *testing.T) {
		api, srv := startWith(t, fastAPIUsers()...)
		if a := do(t, "GET", srv.URL+"/api/users/020", ""); a.status != http.StatusOK || !strings.Contains(a.body, "Ada") {
			t.Errorf("GET /api/users/020: %d %s", a.status, a.body)
		}
		do(t, "POST", srv.URL+"/api/users/020/items/", `{"name":"pen"}`)
		a := do(t, "PATCH", srv.URL+"/api/users/%2B20/items/01000", `{"name":"ink"}`)
		if rec, ok := api.Item("/api/users/20/items", "1000"); a.status != http.StatusOK || !ok || rec["name"] != "ink" {
			t.Errorf("PATCH through another spelling of the parent: %d %s, stored %v", a.status, a.body, rec)
		}
		if a := do(t, "GET", srv.URL+"/api/users/ada/items/", ""); a.status != http.StatusNotFound {
			t.Errorf("GET under a parent that is no integer: %d", a.status)
		}
	})
}
