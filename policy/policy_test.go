package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func specs() []ResourceSpec {
	partial := Defaults()
	partial.SetAtomicity(Partial)
	return []ResourceSpec{
		{Path: "/api/users", CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"}, ItemMethods: []string{"GET", "PUT", "PATCH", "DELETE"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		{Path: "/api/users/{user}/posts", CollectionMethods: []string{"GET", "POST"}, ItemMethods: []string{"GET", "DELETE"}, Settings: partial, Gateway: GatewayDefaults()},
		{Path: "/api/users/me/posts", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		{Path: "/api/reports", CollectionMethods: []string{"get"}, ItemMethods: []string{"get"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		{Path: "/v1/things/", ItemPath: "/v1/thing/{id}/", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		{Path: "/v2/things/", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
	}
}

func mustPolicy(t testing.TB) *Policy {
	t.Helper()
	p, err := New(specs())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLookup(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct {
		path       string
		collection string // "" when nothing matches
		item       bool
	}{
		{"/api/users", "/api/users", false},
		{"/api/users/", "/api/users", false},
		{"/api/users/7", "/api/users", true},
		{"/api/users/7/", "/api/users", true},
		{"/api/users//7", "/api/users", true},
		{"//api/users", "/api/users", false},
		{"/api/users/7/posts", "/api/users/{user}/posts", false},
		{"/api/users/7/posts/3", "/api/users/{user}/posts", true},
		{"/api/users/me/posts", "/api/users/me/posts", false},
		{"/api/users/me/posts/3", "/api/users/me/posts", true},
		{"/api/users/m%65/posts", "/api/users/me/posts", false},
		{"/api/users/a%2Fb", "/api/users", true},
		{"/api/users/x/../7", "/api/users", true},
		{"/api/users/%2e%2e/reports", "/api/reports", false},
		{"/api/x/../users/./7", "/api/users", true},
		{"/api/reports/1", "/api/reports", true},
		{"/v1/things", "/v1/things/", false},
		{"/v1/thing/3", "/v1/things/", true},
		{"/api", "", false},
		{"/", "", false},
		{"", "", false},
		{"/api/users/7/posts/3/comments", "", false},
		{"/elsewhere/1", "", false},
		{"/../api/users", "", false},
		{"/api/users/%zz", "", false},
		{"/API/users", "", false},
	}
	for _, tt := range tests {
		m, ok := p.Lookup(tt.path)
		if tt.collection == "" {
			if ok {
				t.Errorf("Lookup(%q) matched %q, want no match", tt.path, m.Resource.Collection)
			}
			continue
		}
		if !ok || m.Resource.Collection.String() != tt.collection || m.Item != tt.item {
			t.Errorf("Lookup(%q) = %+v, %v; want collection %q item %v", tt.path, m, ok, tt.collection, tt.item)
		}
	}
}

func TestAllow(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct{ path, allow string }{
		{"/api/users", "GET, HEAD, POST, PATCH, DELETE, OPTIONS"},
		{"/api/users/1", "GET, HEAD, PUT, PATCH, DELETE, OPTIONS"},
		{"/api/reports/1", "GET, HEAD, OPTIONS"},
		{"/api/users/1/posts/2", "GET, HEAD, DELETE, OPTIONS"},
	}
	for _, tt := range tests {
		m, _ := p.Lookup(tt.path)
		if got := m.Allow(); got != tt.allow {
			t.Errorf("Allow(%q) = %q, want %q", tt.path, got, tt.allow)
		}
		if got := m.Methods().String(); got != tt.allow {
			t.Errorf("Methods(%q) = %q, want %q", tt.path, got, tt.allow)
		}
	}
}

func TestItemPath(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct{ collection, id, want string }{
		{"/api/users", "7", "/api/users/7"},
		{"/api/users/", "7", "/api/users/7"},
		{"/api/users", "a b", "/api/users/a%20b"},
		{"/api/users", "é", "/api/users/%C3%A9"},
		{"/api/users", "a/b", "/api/users/a%2Fb"},
		{"/api/users", "a?b#c", "/api/users/a%3Fb%23c"},
		{"/api/users/42/posts", "3", "/api/users/42/posts/3"},
		{"/api/users/x%2Fy/posts", "3", "/api/users/x%2Fy/posts/3"},
		{"/v1/things", "9", "/v1/thing/9/"},
		{"/v2/things", "9", "/v2/things/9/"},
		{"/v2/things/", "9", "/v2/things/9/"},
	}
	for _, tt := range tests {
		m, ok := p.Lookup(tt.collection)
		if !ok || m.Item {
			t.Fatalf("Lookup(%q) = %+v, %v", tt.collection, m, ok)
		}
		if got := m.ItemPath(tt.id); got != tt.want {
			t.Errorf("ItemPath(%q, %q) = %q, want %q", tt.collection, tt.id, got, tt.want)
		}
	}
}

func TestBatchEnabled(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t)
	tests := []struct {
		path string
		want [opCount]bool
	}{
		{"/api/users", [opCount]bool{true, true, true, true}},
		{"/api/users/1/posts", [opCount]bool{true, true, false, false}},
		{"/api/reports", [opCount]bool{true, false, false, false}},
	}
	for _, tt := range tests {
		m, _ := p.Lookup(tt.path)
		for op := range opCount {
			if got := m.Resource.BatchEnabled(op); got != tt.want[op] {
				t.Errorf("%s: BatchEnabled(%s) = %v, want %v", tt.path, op, got, tt.want[op])
			}
		}
	}
}

// TestNewRefuses checks that each configuration that cannot work is
// refused with an *Error placed at the resource and option to blame, so
// that the Caddyfile adapter can name the line. The messages themselves
// are pinned by caddymodule's TestConfigMistakes.
func TestNewRefuses(t *testing.T) {
	t.Parallel()
	all := []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
	base := func(mod func(*ResourceSpec)) []ResourceSpec {
		s := ResourceSpec{Path: "/a", CollectionMethods: all, ItemMethods: all, Settings: Defaults(), Gateway: GatewayDefaults()}
		mod(&s)
		return []ResourceSpec{s}
	}
	tests := []struct {
		name     string
		specs    []ResourceSpec
		resource int
		option   string
		want     string
	}{
		{"no resources", nil, -1, "", `no resources: declare at least one`},
		{"relative template", base(func(s *ResourceSpec) { s.Path = "a" }), 0, "", `resource a: template "a" must start with /: write "/a"`},
		{"root template", base(func(s *ResourceSpec) { s.Path = "/" }), 0, "", `template "/" has no segment`},
		{"empty segment", base(func(s *ResourceSpec) { s.Path = "/a//b" }), 0, "", `has an empty segment`},
		{"dot segment", base(func(s *ResourceSpec) { s.Path = "/a/../b" }), 0, "", `has a dot segment`},
		{"partial variable", base(func(s *ResourceSpec) { s.Path = "/a/x{y}" }), 0, "", `mixes a variable with text`},
		{"unbalanced braces", base(func(s *ResourceSpec) { s.Path = "/a/{y" }), 0, "", `has unbalanced braces`},
		{"wildcard", base(func(s *ResourceSpec) { s.Path = "/a/*" }), 0, "", `has a wildcard`},
		{"bad variable name", base(func(s *ResourceSpec) { s.Path = "/a/{1x}" }), 0, "", `variable "{1x}" must be named`},
		{"variable twice", base(func(s *ResourceSpec) { s.Path = "/a/{x}/b/{x}" }), 0, "", `uses variable {x} twice`},
		{"id in collection", base(func(s *ResourceSpec) { s.Path = "/a/{id}/b" }), 0, "", `the path uses {id}, which is the item's id`},
		{"item path without id", base(func(s *ResourceSpec) { s.ItemPath = "/a/one" }), 0, "item_path", `item_path /a/one has no {id}`},
		{"item path with another variable", base(func(s *ResourceSpec) { s.ItemPath = "/a/{x}" }), 0, "item_path", `has no {id}: an item's path must contain {id}, where each id goes (did you mean /a/{id}?)`},
		{"item path unknown variable", base(func(s *ResourceSpec) { s.ItemPath = "/a/{x}/{id}" }), 0, "item_path", `uses {x}, which the collection's path /a does not have`},
		{"unknown method", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET", "BREW"} }), 0, "item", `item: unknown method "BREW"`},
		{"misspelt method", base(func(s *ResourceSpec) { s.CollectionMethods = []string{"PUTT"} }), 0, "collection", `did you mean PUT?`},
		{"no methods", base(func(s *ResourceSpec) { s.CollectionMethods, s.ItemMethods = nil, nil }), 0, "", `no methods`},
		{"unknown batch op", base(func(s *ResourceSpec) { s.Batch = []string{"get", "upsert"} }), 0, "batch", `batch: unknown batch operation "upsert"`},
		{"batch op without its item method", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET"}; s.Batch = []string{"delete"} }), 0, "batch",
			`batch delete needs DELETE on the collection and DELETE on the item, and the map does not allow DELETE on the item`},
		{"batch op without its collection method", base(func(s *ResourceSpec) { s.CollectionMethods = []string{"GET"}; s.Batch = []string{"create"} }), 0, "batch",
			`batch create needs POST on the collection, and the map does not allow POST on the collection`},
		{"create cannot be undone", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET"}; s.Batch = []string{"create"} }), 0, "item",
			`batch create runs all_or_nothing, and a failed batch is undone: a created item is deleted (DELETE on the item)`},
		{"update cannot be restored with put", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET", "PATCH"}; s.Batch = []string{"update"} }), 0, "item",
			`allow PUT on the item, set restore_updated patch, set atomicity update partial or leave update out of batch`},
		{"update cannot be restored at all", base(func(s *ResourceSpec) { s.ItemMethods = []string{"PATCH"}; s.Batch = []string{"update"} }), 0, "item",
			`allow GET, PUT on the item, set atomicity update partial or leave update out of batch`},
		{"delete cannot be restored with post", base(func(s *ResourceSpec) {
			s.CollectionMethods = []string{"GET", "DELETE"}
			s.Settings.RestoreDeleted = RestorePost
		}), 0, "collection", `re-created (POST on the collection, restore_deleted post); the map does not allow POST on the collection`},
		{"override makes all_or_nothing reachable", base(func(s *ResourceSpec) {
			s.ItemMethods = []string{"GET"}
			s.Batch = []string{"create"}
			s.Settings.SetAtomicity(Partial)
			s.Settings.AllowOverride = true
		}), 0, "item", `Setting it partial alone does not help while allow_override is on: allow DELETE on the item, turn allow_override off or leave create out of batch`},
		{"zero limit", base(func(s *ResourceSpec) { s.Settings.MaxItems = 0 }), 0, "max_items", `resource /a: max_items must be greater than zero, not 0`},
		{"zero concurrency", base(func(s *ResourceSpec) { s.Settings.Concurrency = 0 }), 0, "concurrency", `concurrency must be greater than zero`},
		{"negative timeout", base(func(s *ResourceSpec) { s.Settings.ItemTimeout = -time.Second }), 0, "item_timeout", `item_timeout must be greater than zero, not -1s`},
		{"negative idempotency_ttl", base(func(s *ResourceSpec) { s.Gateway.IdempotencyTTL = -time.Hour }), 0, "idempotency_ttl", `idempotency_ttl must be greater than zero, not -1h0m0s`},
		{"negative retries", base(func(s *ResourceSpec) { s.Settings.CompensationRetries = -1 }), 0, "compensation_retries", `compensation_retries must be 0 or more, not -1`},
		{"empty id field", base(func(s *ResourceSpec) { s.Settings.IDField = "" }), 0, "id_field", `id_field must not be empty`},
		{"empty scope_query name", base(func(s *ResourceSpec) { s.Settings.ScopeQuery = []string{"tenant", ""} }), 0, "scope_query", `scope_query holds an empty name`},
		{"scope_query names the ids parameter", base(func(s *ResourceSpec) { s.Settings.ScopeQuery = []string{"ids"} }), 0, "scope_query", `scope_query must not name "ids", the ids parameter`},
		{"scope_query names a custom ids parameter", base(func(s *ResourceSpec) { s.Settings.IDsParam, s.Settings.ScopeQuery = "keys", []string{"keys"} }), 0, "scope_query",
			`scope_query must not name "keys", the ids parameter`},
		{"scope_query names _method", base(func(s *ResourceSpec) { s.Settings.ScopeQuery = []string{"_method"} }), 0, "scope_query", `scope_query must not name "_method"`},
		{"scope_query names one twice", base(func(s *ResourceSpec) { s.Settings.ScopeQuery = []string{"tenant", "key", "tenant"} }), 0, "scope_query", `scope_query names "tenant" twice: keep one`},
		{"scope_headers names what is not a header", base(func(s *ResourceSpec) { s.Gateway.ScopeHeaders = []string{"X-API-Key", "api key"} }), 0, "scope_headers",
			`scope_headers names "api key", which is not a header name`},
		{"empty scope_headers name", base(func(s *ResourceSpec) { s.Gateway.ScopeHeaders = []string{""} }), 0, "scope_headers", `scope_headers names "", which is not a header name`},
		{"scope_headers names Authorization", base(func(s *ResourceSpec) { s.Gateway.ScopeHeaders = []string{"authorization"} }), 0, "scope_headers",
			`scope_headers names authorization, which always identifies a client`},
		{"scope_headers names one twice", base(func(s *ResourceSpec) { s.Gateway.ScopeHeaders = []string{"X-API-Key", "x-api-key"} }), 0, "scope_headers", `scope_headers names "x-api-key" twice: keep one`},
		{"empty stamped_fields name", base(func(s *ResourceSpec) { s.Settings.StampedFields = []string{"updated_at", ""} }), 0, "stamped_fields", `stamped_fields holds an empty name`},
		{"stamped_fields names the id field", base(func(s *ResourceSpec) { s.Settings.StampedFields = []string{"updated_at", "id"} }), 0, "stamped_fields",
			`stamped_fields must not name "id", the id field (id_field)`},
		{"stamped_fields names a custom id field", base(func(s *ResourceSpec) { s.Settings.IDField, s.Settings.StampedFields = "uuid", []string{"uuid"} }), 0, "stamped_fields",
			`stamped_fields must not name "uuid", the id field`},
		{"stamped_fields names one twice", base(func(s *ResourceSpec) { s.Settings.StampedFields = []string{"modified", "modified"} }), 0, "stamped_fields", `stamped_fields names "modified" twice: keep one`},
		{"same path twice", append(base(func(*ResourceSpec) {}), base(func(*ResourceSpec) {})...), 1, "",
			`resource /a is declared twice (resources[0] and resources[1]): merge them into one`},
		{"same path twice, with lines", []ResourceSpec{
			{Path: "/u", CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults(), Line: 3},
			{Path: "/u", CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults(), Line: 9},
		}, 1, "", `resource /u is declared twice (lines 3 and 9): merge them into one`},
		{"same route, other variable names", []ResourceSpec{
			{Path: "/u/{a}/p", CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
			{Path: "/u/{b}/p", CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		}, 1, "", `resource /u/{b}/p: the path is the same route as resource /u/{a}/p`},
		{"collection is another's item", []ResourceSpec{
			{Path: "/u", ItemMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
			{Path: "/u/{x}", CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		}, 1, "", `resource /u/{x}: the path is the same route as /u/{id}, the items of resource /u`},
		{"item is another's collection", []ResourceSpec{
			{Path: "/u/{x}", CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
			{Path: "/u", ItemMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()},
		}, 1, "item_path", `resource /u: the item path /u/{id} is the same route as resource /u/{x}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.specs)
			for _, e := range Flatten(err) {
				var pe *Error
				if !errors.As(e, &pe) {
					t.Errorf("%v is not placed (not an *Error)", e)
					continue
				}
				if pe.Resource == tt.resource && pe.Option == tt.option && strings.Contains(pe.Error(), tt.want) {
					return
				}
			}
			t.Fatalf("New() error = %v\nwant one, placed at resource %d option %q, that contains %q", err, tt.resource, tt.option, tt.want)
		})
	}
}

// TestNearest checks the typo suggestions: near enough to help, never a
// guess at a word that is merely short.
func TestNearest(t *testing.T) {
	t.Parallel()
	names := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
	tests := []struct{ in, want string }{
		{"DELET", "DELETE"},
		{"delet", "DELETE"},
		{"PSOT", ""}, // a swap is two edits, too many in four letters
		{"GETS", "GET"},
		{"FETCH", ""},
		{"BREW", ""},
		{"OPTION", "OPTIONS"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := Nearest(tt.in, names); got != tt.want {
			t.Errorf("Nearest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestPartialNeedsNoUndo(t *testing.T) {
	t.Parallel()
	s := Defaults()
	s.SetAtomicity(Partial)
	_, err := New([]ResourceSpec{{Path: "/a", CollectionMethods: []string{"POST", "DELETE"}, ItemMethods: []string{"DELETE"}, Settings: s, Gateway: GatewayDefaults()}})
	if err != nil {
		t.Fatalf("partial create and delete need no undo methods, got %v", err)
	}
}

func TestParseMethod(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		if _, ok := ParseMethod(m); !ok {
			t.Errorf("ParseMethod(%q) not standard", m)
		}
	}
	for _, m := range []string{"get", "BREW", "TRACE", ""} {
		if _, ok := ParseMethod(m); ok {
			t.Errorf("ParseMethod(%q) standard", m)
		}
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	// Not parallel: testing.AllocsPerRun panics in a parallel test.
	p := mustPolicy(t)
	for _, path := range []string{"/api/users/7", "/api/users/7/posts/3", "/api/users/me/posts/", "/elsewhere/x"} {
		allocs := testing.AllocsPerRun(100, func() { p.Lookup(path) })
		if allocs != 0 {
			t.Errorf("Lookup(%q) allocates %v times", path, allocs)
		}
	}
}

func BenchmarkLookup(b *testing.B) {
	p := mustPolicy(b)
	for b.Loop() {
		p.Lookup("/api/users/42/posts/7")
	}
}

// ItemPaths builds the same paths as ItemPath, whatever the collection's
// variables hold, a value spelled like its internal mark included.
func TestItemPaths(t *testing.T) {
	t.Parallel()
	p, err := New([]ResourceSpec{{
		Path: "/u/{user}/posts", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"},
		ItemPath: "/u/{user}/posts/{id}/full", Settings: Defaults(), Gateway: GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/u/ada/posts", "/u/a%20b/posts", "/u/%00id%00/posts", "/u/x%2Fy/posts/"} {
		m, ok := p.Lookup(path)
		if !ok {
			t.Fatalf("%s: no match", path)
		}
		paths := m.ItemPaths()
		for _, id := range []string{"1", "a b", "%00id%00", "é"} {
			if got, want := paths.Path(id), m.ItemPath(id); got != want {
				t.Errorf("%s id %q: %q, want %q", path, id, got, want)
			}
		}
	}
}
