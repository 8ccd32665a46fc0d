package legacyapi

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// railsUsers is a Rails-mode users collection with nested posts.
func railsUsers(change func(*Collection)) []Collection {
	users := Collection{Path: "/api/users", Rails: true, AssignIDs: true, Seed: []map[string]any{{"id": 3, "name": "Ada"}, {"id": 30, "name": "Bob"}}}
	posts := Collection{Path: "/api/users/*/posts", Rails: true, AssignIDs: true, ParentField: "user_id"}
	if change != nil {
		change(&users)
		change(&posts)
	}
	return []Collection{users, posts}
}

func TestRails(t *testing.T) {
	t.Parallel()
	t.Run("ids read as Rails reads :id", func(t *testing.T) {
		_, srv := startWith(t, railsUsers(nil)...)
		for _, tc := range []struct {
			segment string
			status  int
			name    string
		}{
			{"3", 200, "Ada"}, {"3-foo", 200, "Ada"}, {"3.json", 200, "Ada"}, {"03", 200, "Ada"}, {"+3", 200, "Ada"},
			{"3-ada-lovelace.json", 200, "Ada"}, {"30x", 200, "Bob"}, {"3x0", 200, "Ada"},
			{"foo-3", 404, ""}, {"-3", 404, ""}, {".json", 404, ""}, {"4", 404, ""},
		} {
			a := do(t, "GET", srv.URL+"/api/users/"+tc.segment, "")
			if a.status != tc.status || tc.name != "" && !strings.Contains(a.body, `"`+tc.name+`"`) {
				t.Errorf("GET /api/users/%s: %d %s, want %d %s", tc.segment, a.status, a.body, tc.status, tc.name)
			}
		}
	})

	t.Run("saves are stamped, seeds included; DELETE is 204", func(t *testing.T) {
		api, srv := startWith(t, railsUsers(nil)...)
		seed, _ := api.Item("/api/users", "3")
		stamp0, _ := seed["updated_at"].(string)
		if stamp0 == "" {
			t.Fatalf("seed %v has no updated_at", seed)
		}
		a := do(t, "PATCH", srv.URL+"/api/users/3-ada", `{"name":"Ann","updated_at":"1999-01-01T00:00:00Z"}`)
		rec := decode(t, a.body).(map[string]any)
		if a.status != 200 || rec["name"] != "Ann" || rec["updated_at"] == stamp0 || rec["updated_at"] == "1999-01-01T00:00:00Z" {
			t.Errorf("PATCH: %d %s, want a new stamp", a.status, a.body)
		}
		a = do(t, "DELETE", srv.URL+"/api/users/30.json", "")
		if a.status != http.StatusNoContent || a.body != "" {
			t.Errorf("DELETE: %d %q, want 204 with no body", a.status, a.body)
		}
		if _, ok := api.Item("/api/users", "30"); ok {
			t.Error("DELETE left the record")
		}
	})

	t.Run("a nested create takes its parent from the path", func(t *testing.T) {
		api, srv := startWith(t, railsUsers(nil)...)
		a := do(t, "POST", srv.URL+"/api/users/3-ada/posts", `{"title":"hi","user_id":30}`)
		rec := decode(t, a.body).(map[string]any)
		if a.status != 201 || mustJSON(rec["user_id"]) != "3" || a.header.Get("Location") != srv.URL+"/api/users/3-ada/posts/1000" {
			t.Errorf("POST: %d %s Location %q, want user_id 3", a.status, a.body, a.header.Get("Location"))
		}
		if got, _ := api.Item("/api/users/3-ada/posts", "1000"); mustJSON(got["user_id"]) != "3" {
			t.Errorf("stored %v", got)
		}
		if a := do(t, "POST", srv.URL+"/api/users/4/posts", `{"title":"hi"}`); a.status != 404 {
			t.Errorf("POST under a missing user: %d", a.status)
		}
	})

	t.Run("a write commits, then answers late", func(t *testing.T) {
		api, srv := startWith(t, railsUsers(func(c *Collection) { c.AnswerDelay = time.Hour })...)
		if _, err := send(fresh(50*time.Millisecond), "PATCH", srv.URL+"/api/users/3", `{"name":"Late"}`, nil); err == nil {
			t.Fatal("want a client timeout")
		}
		if rec, _ := api.Item("/api/users", "3"); rec["name"] != "Late" {
			t.Errorf("record %v: want the write committed before its answer", rec)
		}
		eventually(t, "the handler returned", func() bool { return api.InFlight() == 0 })
		put := background("PATCH", srv.URL+"/api/users/3", `{"name":"Later"}`, nil)
		eventually(t, "the PATCH is committed", func() bool { rec, _ := api.Item("/api/users", "3"); return rec["name"] == "Later" })
		if a := do(t, "GET", srv.URL+"/api/users/3", ""); a.status != 200 {
			t.Errorf("GET during the wait: %d", a.status)
		}
		api.Close()
		if a := <-put; a.status != 200 || !strings.Contains(a.body, `"Later"`) {
			t.Errorf("PATCH after Close: %d %s", a.status, a.body)
		}
	})

	t.Run("off by default", func(t *testing.T) {
		_, srv := startWith(t, Collection{Path: "/n", Seed: []map[string]any{{"id": 3, "name": "Ada"}}})
		run(t, srv, []step{{"GET", "/n/3-foo", "", 404, ""}, {"GET", "/n/3", "", 200, `{"id":3,"name":"Ada"}`}, {"DELETE", "/n/3", "", 200, `{}`}})
	})

	func() {
		defer func() {
			if recover() == nil {
				t.Error("New accepted a negative AnswerDelay")
			}
		}()
		New(Collection{Path: "/x", AnswerDelay: -time.Second})
	}()
}
