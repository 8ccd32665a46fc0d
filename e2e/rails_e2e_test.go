package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/batchwire"
	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The gateway in front of a Rails API-mode scaffold (docs/legacy-apis.md,
// Rails): 204 on DELETE, updated_at stamped on every save, ids read as
// Rails reads :id, ids assigned by the database, and a controller that
// commits a write and answers it late, after the gateway's item_timeout.
// Each test reads the legacy API's final state.

// railsAPI serves Rails-like users 40 and 41, every write committed at
// once and, when late, answered well after railsSite's item_timeout
// (which leaves a loaded machine time to deliver the write).
func railsAPI(late bool) *legacyapi.API {
	users := legacyapi.Collection{Path: "/api/users", Rails: true, AssignIDs: true, Seed: records("u", 40, 41)}
	if late {
		users.AnswerDelay = 1500 * time.Millisecond
	}
	return legacyapi.New(users)
}

// railsSite is the gateway in front of it, with the options given.
func railsSite(options ...string) string {
	return `
	batch {
		item_timeout 400ms
		compensation_timeout 5s
		compensation_retries 1
		id_format integer
		` + strings.Join(options, "\n\t\t") + `
		resource /api/users {` + resourceMethods + `
		}
	}
	reverse_proxy UPSTREAM
`
}

// An update Rails committed and answered after item_timeout: the read
// that learns what it did finds the batch's name and a new updated_at.
// With stamped_fields updated_at it is undone (the row as before, but for
// Rails' stamp); without, it is left, and the reason names
// stamped_fields, not a writer. Both keep the read in compensation.found.
func TestRailsUnknownUpdate(t *testing.T) {
	t.Run("stamped_fields updated_at: undone", func(t *testing.T) {
		api := railsAPI(true)
		g := startGateway(t, api, railsSite("stamped_fields updated_at"))
		before, _ := api.Item("/api/users", "40")
		b := checkProblem(t, g.do(t, "PATCH", "/api/users", `[{"id": 40, "name": "slow-40"}]`), http.StatusGatewayTimeout)
		if b.Outcome != "rolled_back" || b.Items[0].Outcome != "rolled_back" {
			t.Fatalf("outcome %s, item %+v: want rolled_back", b.Outcome, b.Items[0])
		}
		after, _ := api.Item("/api/users", "40")
		if !sameJSON(t, withoutStamp(after), withoutStamp(before)) || after["updated_at"] == before["updated_at"] {
			t.Errorf("user 40 is %v, want %v but for a new stamp", after, before)
		}
		checkFound(t, b.Items[0].Compensation, "slow-40")
	})
	t.Run("without stamped_fields: left, naming it", func(t *testing.T) {
		api := railsAPI(true)
		g := startGateway(t, api, railsSite())
		b := checkLeftBehind(t, g.do(t, "PATCH", "/api/users", `[{"id": 40, "name": "slow-40"}]`), 0, "stamped_fields")
		c := b.Items[0].Compensation
		if !strings.Contains(c.Error, `"updated_at"`) || strings.Contains(c.Error, "another writer") {
			t.Errorf("reason %q: want it to name updated_at and blame no writer", c.Error)
		}
		if after, _ := api.Item("/api/users", "40"); after["name"] != "slow-40" {
			t.Errorf("user 40 is %v, want it left as the batch's write made it", after)
		}
		checkFound(t, c, "slow-40")
	})
}

// A real second writer: another client renames user 40 (a member the
// batch sent) after the batch's unanswered write and before the read that
// resolves it. Even with stamped_fields, the item is left, and the reason
// names the writer and the member.
func TestRailsSecondWriterIsStillNamed(t *testing.T) {
	api := railsAPI(true)
	g := startGateway(t, api, railsSite("stamped_fields updated_at"))
	// The preflight's read passes; the read that resolves the write is
	// held until the other client has written.
	api.Inject(passThrough("GET", "/api/users/40", 1))
	held, release := heldUntilReleased(legacyapi.Fault{Method: "GET", Path: "/api/users/40", Times: 1})
	api.Inject(held)
	defer release()
	answered := make(chan response, 1)
	go func() {
		r, err := send(http.DefaultClient, g.URL, "PATCH", "/api/users", `[{"id": 40, "name": "slow-40"}]`)
		if err != nil {
			r = response{Body: []byte(err.Error())}
		}
		answered <- r
	}()
	eventually(t, 5*time.Second, "the batch's write to commit", func() bool { u, _ := api.Item("/api/users", "40"); return u["name"] == "slow-40" })
	other := make(chan error, 1)
	go func() {
		_, err := send(http.DefaultClient, "http://"+g.upstream, "PATCH", "/api/users/40", `{"name": "theirs"}`)
		other <- err
	}()
	eventually(t, 5*time.Second, "the other client's write to commit", func() bool { u, _ := api.Item("/api/users", "40"); return u["name"] == "theirs" })
	release()
	b := checkLeftBehind(t, <-answered, 0, `another writer changed "name"`)
	if c := b.Items[0].Compensation; strings.Contains(c.Error, "stamped_fields") {
		t.Errorf("reason %q names stamped_fields", c.Error)
	}
	checkFound(t, b.Items[0].Compensation, "theirs")
	if after, _ := api.Item("/api/users", "40"); after["name"] != "theirs" {
		t.Errorf("user 40 is %v, want the other client's", after)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
}

// An unknown create and an unknown delete behave as in front of any API:
// a create whose id the answer never said is left (rollback_failed, the
// row there); a delete is re-created by POST under a new id, reported
// rollback_failed naming it, since Rails assigns ids and its PUT cannot
// create.
func TestRailsUnknownCreateAndDelete(t *testing.T) {
	t.Run("create", func(t *testing.T) {
		api := railsAPI(true)
		g := startGateway(t, api, railsSite("stamped_fields updated_at"))
		checkLeftBehind(t, g.do(t, "POST", "/api/users", `[{"name": "slow"}]`), 0, "cannot be learned")
		if u, ok := api.Item("/api/users", "1000"); !ok || u["name"] != "slow" {
			t.Errorf("the API holds %v, want the create left under its own id", api.Items("/api/users"))
		}
	})
	t.Run("delete, restore_deleted put", func(t *testing.T) {
		api := railsAPI(true)
		g := startGateway(t, api, railsSite("stamped_fields updated_at"))
		checkLeftBehind(t, g.do(t, "DELETE", "/api/users?ids=41", nil), 0, "")
		if _, ok := api.Item("/api/users", "41"); ok {
			t.Error("user 41 is back: Rails' PUT cannot create it")
		}
	})
	t.Run("delete, restore_deleted post", func(t *testing.T) {
		api := railsAPI(true)
		g := startGateway(t, api, railsSite("stamped_fields updated_at", "restore_deleted post"))
		before, _ := api.Item("/api/users", "41")
		checkLeftBehind(t, g.do(t, "DELETE", "/api/users?ids=41", nil), 0, `another id ("1000")`)
		if _, ok := api.Item("/api/users", "41"); ok {
			t.Error("user 41 is back under its own id")
		}
		if u, _ := api.Item("/api/users", "1000"); u["name"] != before["name"] {
			t.Errorf("the API holds %v, want user 41's row back under 1000", api.Items("/api/users"))
		}
	})
}

// What else a Rails scaffold does, through the gateway: a batch GET reads
// through an index filtered by id[] (ids canonical under id_format
// integer), and a batch DELETE's items are Rails' 204s with no body.
func TestRailsAnswersAndListFilter(t *testing.T) {
	users := legacyapi.Collection{Path: "/api/users", Rails: true, AssignIDs: true, FilterParam: "id[]", Seed: records("u", 1, 3)}
	api := legacyapi.New(users)
	g := startGateway(t, api, `
	batch {
		id_format integer
		stamped_fields updated_at
		resource /api/users {`+resourceMethods+`
			list_filter "id[]={id}"
		}
	}
	reverse_proxy UPSTREAM
`)
	// Single reads fail: the batch GET must read through the LIST.
	for id := 1; id <= 3; id++ {
		api.Inject(legacyapi.Fault{Method: "GET", Path: fmt.Sprintf("/api/users/%d", id), Status: 500, Body: htmlError, Times: 1})
	}
	b := checkEnvelope(t, g.do(t, "GET", "/api/users?ids=1,02,3", nil), 200, "succeeded")
	for i, it := range b.Items {
		if it.ID != fmt.Sprint(i+1) || !strings.Contains(string(it.Body), fmt.Sprintf(`"u%d"`, i+1)) {
			t.Errorf("item %d: %+v", i, it)
		}
	}
	api.ClearFaults()
	b = checkEnvelope(t, g.do(t, "DELETE", "/api/users?ids=1,2", nil), 200, "succeeded")
	for _, it := range b.Items {
		if it.Status != http.StatusNoContent || it.Body != nil || it.BodyText != "" {
			t.Errorf("item %+v: want 204 with no body", it)
		}
	}
	if n := len(api.Items("/api/users")); n != 1 {
		t.Errorf("%d users left, want 1", n)
	}
}

// checkFound fails the test unless c holds the read that found the item,
// with name.
func checkFound(t testing.TB, c *batchwire.Compensation, name string) {
	t.Helper()
	if c == nil || !strings.Contains(string(c.Found), fmt.Sprintf(`"name":%q`, name)) || !strings.Contains(string(c.Found), `"updated_at"`) {
		t.Errorf("compensation %+v: want found to hold the read, name %q", c, name)
	}
}
