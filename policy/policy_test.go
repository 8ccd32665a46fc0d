package policy

import (
	"strings"
	"testing"
)

func specs() []ResourceSpec {
	partial := Defaults()
	partial.SetAtomicity(Partial)
	return []ResourceSpec{
		{Path: "/api/users", CollectionMethods: []string{"GET", "POST", "PATCH", "DELETE"}, ItemMethods: []string{"GET", "PUT", "PATCH", "DELETE"}, Settings: Defaults()},
		{Path: "/api/users/{user}/posts", CollectionMethods: []string{"GET", "POST"}, ItemMethods: []string{"GET", "DELETE"}, Settings: partial},
		{Path: "/api/users/me/posts", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: Defaults()},
		{Path: "/api/reports", CollectionMethods: []string{"get"}, ItemMethods: []string{"get"}, Settings: Defaults()},
		{Path: "/v1/things/", ItemPath: "/v1/thing/{id}/", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: Defaults()},
		{Path: "/v2/things/", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET"}, Settings: Defaults()},
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

func TestNewRefuses(t *testing.T) {
	all := []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
	base := func(mod func(*ResourceSpec)) []ResourceSpec {
		s := ResourceSpec{Path: "/a", CollectionMethods: all, ItemMethods: all, Settings: Defaults()}
		mod(&s)
		return []ResourceSpec{s}
	}
	tests := []struct {
		name  string
		specs []ResourceSpec
		want  string
	}{
		{"relative template", base(func(s *ResourceSpec) { s.Path = "a" }), `resource "a": path: template "a" must start with /`},
		{"root template", base(func(s *ResourceSpec) { s.Path = "/" }), `template "/" has no segment`},
		{"empty segment", base(func(s *ResourceSpec) { s.Path = "/a//b" }), `has an empty segment`},
		{"dot segment", base(func(s *ResourceSpec) { s.Path = "/a/../b" }), `has a dot segment`},
		{"partial variable", base(func(s *ResourceSpec) { s.Path = "/a/x{y}" }), `mixes a variable with text`},
		{"wildcard", base(func(s *ResourceSpec) { s.Path = "/a/*" }), `mixes a variable with text`},
		{"bad variable name", base(func(s *ResourceSpec) { s.Path = "/a/{1x}" }), `variable "{1x}" must be a name`},
		{"variable twice", base(func(s *ResourceSpec) { s.Path = "/a/{x}/b/{x}" }), `uses variable {x} twice`},
		{"id in collection", base(func(s *ResourceSpec) { s.Path = "/a/{id}/b" }), `variable {id} is reserved`},
		{"item path without id", base(func(s *ResourceSpec) { s.ItemPath = "/a/one" }), `item_path "/a/one": must contain {id}`},
		{"item path unknown variable", base(func(s *ResourceSpec) { s.ItemPath = "/a/{x}/{id}" }), `variable {x} is not in the collection's path`},
		{"unknown method", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET", "BREW"} }), `item: unknown method "BREW"`},
		{"no methods", base(func(s *ResourceSpec) { s.CollectionMethods, s.ItemMethods = nil, nil }), `declare at least one method`},
		{"unknown batch op", base(func(s *ResourceSpec) { s.Batch = []string{"get", "upsert"} }), `batch: unknown batch operation "upsert"`},
		{"batch op without its item method", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET"}; s.Batch = []string{"delete"} }),
			`batch delete needs DELETE on the collection and DELETE on the item`},
		{"batch op without its collection method", base(func(s *ResourceSpec) { s.CollectionMethods = []string{"GET"}; s.Batch = []string{"create"} }),
			`batch create needs POST on the collection and nothing on the item`},
		{"create cannot be undone", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET"} }),
			`batch create can run all_or_nothing, where a created item is undone with DELETE on the item`},
		{"update cannot be restored with put", base(func(s *ResourceSpec) { s.ItemMethods = []string{"GET", "PATCH"} }),
			`batch update can run all_or_nothing, where the pre-image is read with GET on the item and put back with PUT (restore_updated put)`},
		{"delete cannot be restored with post", base(func(s *ResourceSpec) {
			s.CollectionMethods = []string{"GET", "DELETE"}
			s.Settings.RestoreDeleted = RestorePost
		}), `batch delete can run all_or_nothing, where the pre-image is read with GET on the item and re-created with POST on the collection (restore_deleted post)`},
		{"override makes all_or_nothing reachable", base(func(s *ResourceSpec) {
			s.ItemMethods = []string{"GET"}
			s.Batch = []string{"create"}
			s.Settings.SetAtomicity(Partial)
			s.Settings.AllowOverride = true
		}), `batch create can run all_or_nothing`},
		{"zero limit", base(func(s *ResourceSpec) { s.Settings.MaxItems = 0 }), `max_items must be greater than zero`},
		{"zero concurrency", base(func(s *ResourceSpec) { s.Settings.Concurrency = 0 }), `concurrency must be greater than zero`},
		{"negative retries", base(func(s *ResourceSpec) { s.Settings.CompensationRetries = -1 }), `compensation_retries must not be negative`},
		{"empty id field", base(func(s *ResourceSpec) { s.Settings.IDField = "" }), `id_field must not be empty`},
		{"same path twice", append(base(func(*ResourceSpec) {}), base(func(*ResourceSpec) {})...),
			`resource "/a": path "/a" is the same route as the collection path "/a" of resource "/a"`},
		{"same route, other variable names", []ResourceSpec{
			{Path: "/u/{a}/p", CollectionMethods: []string{"GET"}, Settings: Defaults()},
			{Path: "/u/{b}/p", CollectionMethods: []string{"GET"}, Settings: Defaults()},
		}, `resource "/u/{b}/p": path "/u/{b}/p" is the same route as the collection path "/u/{a}/p"`},
		{"collection is another's item", []ResourceSpec{
			{Path: "/u", ItemMethods: []string{"GET"}, Settings: Defaults()},
			{Path: "/u/{x}", CollectionMethods: []string{"GET"}, Settings: Defaults()},
		}, `resource "/u/{x}": path "/u/{x}" is the same route as the item path "/u/{id}" of resource "/u"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.specs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New() error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

func TestPartialNeedsNoUndo(t *testing.T) {
	s := Defaults()
	s.SetAtomicity(Partial)
	_, err := New([]ResourceSpec{{Path: "/a", CollectionMethods: []string{"POST", "DELETE"}, ItemMethods: []string{"DELETE"}, Settings: s}})
	if err != nil {
		t.Fatalf("partial create and delete need no undo methods, got %v", err)
	}
}

func TestParseMethod(t *testing.T) {
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
