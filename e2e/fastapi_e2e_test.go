package e2e

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// The gateway in front of an API written as FastAPI's tutorials write it
// (docs/legacy-apis.md, FastAPI): the collection at /api/users/, items
// at /api/users/{id}, nested items under an int parent. Each test judges
// the order in which the API carried writes out and its final state.

// fastAPISite declares the users by hand as the recipe does, their
// items under {user:integer}, and orgs' items under a parent with no
// format (the API keys orgs by text).
const fastAPISite = `
	batch {
		id_format integer
		stamped_fields updated_at
		restore_updated patch
		resource /api/users/ {
			item_path  /api/users/{id}
			collection GET POST PATCH DELETE
			item       GET PATCH DELETE
			list_filter "id={id}"
			atomicity delete partial
		}
		resource /api/users/{user:integer}/items/ {
			item_path  /api/users/{user}/items/{id}
			collection GET POST PATCH DELETE
			item       GET PATCH DELETE
			atomicity delete partial
		}
		resource /api/orgs/{org}/items {` + resourceMethods + `
		}
	}
	handle /metrics {
		metrics
	}
	reverse_proxy UPSTREAM
`

// fastAPIGateway serves user 20 with item 5, and org 00042 with item 5.
func fastAPIGateway(t *testing.T) *gateway {
	t.Helper()
	api := legacyapi.NewRecording(
		legacyapi.Collection{Path: "/api/users", FastAPI: true, Seed: []map[string]any{{"id": 20, "name": "Ada"}}},
		legacyapi.Collection{Path: "/api/users/*/items", FastAPI: true},
		legacyapi.Collection{Path: "/api/orgs/*/items", PutCreates: true},
	)
	g := startGateway(t, api, fastAPISite)
	for _, path := range []string{"/api/users/20/items/", "/api/orgs/00042/items"} {
		if r, err := send(http.DefaultClient, "http://"+g.upstream, "POST", path, `{"id": 5, "name": "pen"}`); err != nil || r.Status != http.StatusOK && r.Status != http.StatusCreated {
			t.Fatalf("seeding %s: %v %v", path, r, err)
		}
	}
	api.ResetLog()
	return g
}

// writer is a write through the gateway: a batch on a collection, or a
// single PATCH of an item.
type writer struct{ method, path, body string }

func batchOn(collection, name string) writer {
	return writer{"PATCH", collection, `[{"id": 5, "name": "` + name + `"}]`}
}

func singleOn(item, name string) writer { return writer{"PATCH", item, `{"name": "` + name + `"}`} }

// heldOverlap starts first, holds its write at the API (sent, as first
// spelled it, to firstSent), starts second, and releases the first
// after a while. It returns the writes the API carried out, in order.
func heldOverlap(t *testing.T, g *gateway, first writer, firstSent string, second writer) []string {
	t.Helper()
	held, release := heldUntilReleased(legacyapi.Fault{Method: "PATCH", Path: firstSent, Times: 1})
	g.API.Inject(held)
	defer release()
	done := make(chan error, 2)
	for i, w := range []writer{first, second} {
		go func() {
			r, err := send(http.DefaultClient, g.URL, w.method, w.path, w.body)
			if err == nil && r.Status/100 != 2 {
				err = &statusError{r}
			}
			done <- err
		}()
		if i == 0 {
			eventually(t, 5*time.Second, "the first write to reach the API", func() bool { return received(g.API, "PATCH", firstSent) })
		}
	}
	// Long enough for the second to reach the API, were it not held
	// back by the first's lock.
	time.Sleep(300 * time.Millisecond)
	release()
	for range 2 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	var order []string
	for _, r := range g.API.AppliedWrites() {
		order = append(order, r.Method+" "+r.Path)
	}
	return order
}

type statusError struct{ r response }

func (e *statusError) Error() string { return "answered " + e.r.String() }

// Two spellings of one parent are one item's lock: batches and single
// writes wait for each other, each sent upstream as its client spelled
// it, and the API carries them out one after the other.
func TestFastAPIParentSpellingsShareALock(t *testing.T) {
	tests := []struct {
		name          string
		first, second writer
		firstSent     string
		order         []string
		final         string
	}{
		{"a batch, then a single write spelled canonically",
			batchOn("/api/users/020/items/", "batch"), singleOn("/api/users/20/items/5", "single"), "/api/users/020/items/5",
			[]string{"PATCH /api/users/020/items/5", "PATCH /api/users/20/items/5"}, "single"},
		{"a single write spelled otherwise, then a batch",
			singleOn("/api/users/020/items/5", "single"), batchOn("/api/users/20/items", "batch"), "/api/users/020/items/5",
			[]string{"PATCH /api/users/020/items/5", "PATCH /api/users/20/items/5"}, "batch"},
		{"two batches",
			batchOn("/api/users/+20/items/", "one"), batchOn("/api/users/0020/items/", "two"), "/api/users/+20/items/5",
			[]string{"PATCH /api/users/+20/items/5", "PATCH /api/users/0020/items/5"}, "two"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := fastAPIGateway(t)
			if order := heldOverlap(t, g, tt.first, tt.firstSent, tt.second); !slices.Equal(order, tt.order) {
				t.Errorf("the API carried out %q, want %q", order, tt.order)
			}
			if item, _ := g.API.Item("/api/users/20/items", "5"); item["name"] != tt.final {
				t.Errorf("item 5 of user 20 is %v, want the last writer's %q", item, tt.final)
			}
			// The resource is named without its variables' formats.
			checkLabels(t, g.scrape(t), "{user:integer}")
		})
	}
}

// A parent with no format is its text: org 00042 is not org 42 to an API
// that keys orgs by text, so their items' writes do not wait for each
// other, and the batch on 00042 reaches its own item.
func TestParentWithoutFormatIsItsText(t *testing.T) {
	g := fastAPIGateway(t)
	order := heldOverlap(t, g, batchOn("/api/orgs/00042/items", "batch"), "/api/orgs/00042/items/5", writer{"PUT", "/api/orgs/42/items/5", `{"name": "other"}`})
	want := []string{"PUT /api/orgs/42/items/5", "PATCH /api/orgs/00042/items/5"}
	if !slices.Equal(order, want) {
		t.Errorf("the API carried out %q, want %q: the write to org 42 waited for org 00042's", order, want)
	}
	if item, _ := g.API.Item("/api/orgs/00042/items", "5"); item["name"] != "batch" {
		t.Errorf("org 00042's item 5 is %v", item)
	}
}

var adviceRE = regexp.MustCompile("declare the resource as `([^`]+)`")

// An operator who declares FastAPI's users by hand, as its route is
// spelled or without the slash, and follows the gateway's advice
// literally, reaching the declaration under which a batch GET, UPDATE,
// CREATE and DELETE work in one step.
func TestFastAPIRedirectAdvice(t *testing.T) {
	for _, declared := range []string{"resource /api/users/", "resource /api/users"} {
		t.Run(declared, func(t *testing.T) {
			api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/users", FastAPI: true, AssignIDs: true, Seed: []map[string]any{{"id": 20, "name": "Ada"}}})
			g := startGateway(t, api, declaredUsersSite(declared))
			advice := batchFourOps(t, g)
			if advice != "resource /api/users/ { item_path /api/users/{id} }" {
				t.Fatalf("under %q the advice is %q", declared, advice)
			}
			loadCaddyfile(t, g.config(declaredUsersSite(advice)))
			if again := batchFourOps(t, g); again != "" {
				t.Fatalf("under the advised %q the advice is %q", advice, again)
			}
			if user, _ := api.Item("/api/users", "20"); user["name"] != "Ann" || len(api.Items("/api/users")) != 1 {
				t.Errorf("users %v: want user 20 renamed, the created user deleted", api.Items("/api/users"))
			}
		})
	}
}

// declaredUsersSite declares the users as declaration says ("resource <path>",
// or "resource <path> { item_path <template> }"), with FastAPI's methods.
func declaredUsersSite(declaration string) string {
	open := strings.TrimSuffix(declaration, " }")
	if open == declaration {
		open += " {"
	}
	return `
	batch {
		id_format integer
		restore_updated patch
		atomicity delete partial
		` + strings.Replace(open, " { ", " {\n\t\t\t", 1) + `
			collection GET POST PATCH DELETE
			item       GET PATCH DELETE
		}
	}
	reverse_proxy UPSTREAM
`
}

// batchFourOps sends a batch GET, UPDATE, CREATE and DELETE to the users
// and returns the advice of the first that failed with one; "" when all
// four succeeded.
func batchFourOps(t *testing.T, g *gateway) string {
	t.Helper()
	created := ""
	for _, op := range []struct{ method, path, body string }{
		{"GET", "/api/users/?ids=20", ""},
		{"PATCH", "/api/users/", `[{"id": 20, "name": "Ann"}]`},
		{"POST", "/api/users/", `[{"name": "Bob"}]`},
		{"DELETE", "/api/users/?ids=", ""},
	} {
		path := op.path
		if op.method == "DELETE" {
			path += created
		}
		r := g.do(t, op.method, path, optionalBody(op.body))
		b := r.batch(t)
		if r.Status/100 == 2 && b.Outcome == "succeeded" {
			if op.method == "POST" {
				created = b.Items[0].ID
			}
			continue
		}
		for _, it := range b.Items {
			if m := adviceRE.FindStringSubmatch(it.Error); m != nil {
				return m[1]
			}
		}
		t.Fatalf("%s %s: %s, with no advice", op.method, path, r)
	}
	return ""
}
