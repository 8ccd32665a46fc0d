package policy

import (
	"strings"
	"testing"
)

// nested is /api/users/{user}/items under id_format integer, the user
// variable written as parent (e.g. "{user:integer}", "{user}"), its
// imported formats as imported.
func nested(t *testing.T, parent string, imported map[string]IDFormat) *Policy {
	t.Helper()
	s := Defaults()
	s.IDFormat = IDInteger
	p, err := New([]ResourceSpec{{
		Path: "/api/users/" + parent + "/items", CollectionMethods: []string{"GET", "PATCH"}, ItemMethods: []string{"GET", "PUT", "PATCH"},
		Formats: imported, Settings: s, Gateway: GatewayDefaults(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A variable's format makes every spelling of a parent one lock, the
// batch's (ItemPaths.Key) and the single write's (ItemKey) alike, while
// the path sent upstream keeps the client's spelling. A variable with no
// format is its text, whatever id_format says of the item's own id.
func TestVariableFormatsNameOneLock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, parent string
		imported     map[string]IDFormat
		collection   string // as the client spelled it
		sent, key    string // item 05's path sent upstream, and its lock
	}{
		{"integer written", "{user:integer}", nil, "/api/users/020/items", "/api/users/020/items/05", "/api/users/20/items/5"},
		{"integer imported", "{user}", map[string]IDFormat{"user": IDInteger}, "/api/users/%2B20/items", "/api/users/+20/items/05", "/api/users/20/items/5"},
		{"written wins over imported", "{user:any}", map[string]IDFormat{"user": IDInteger}, "/api/users/020/items", "/api/users/020/items/05", "/api/users/020/items/5"},
		{"uuid", "{user:uuid}", nil, "/api/users/0F8FAD5BD9CB469FA16570867728950E/items", "/api/users/0F8FAD5BD9CB469FA16570867728950E/items/05", "/api/users/0f8fad5b-d9cb-469f-a165-70867728950e/items/5"},
		{"no format: its text, not id_format's", "{user}", nil, "/api/users/00042/items", "/api/users/00042/items/05", "/api/users/00042/items/5"},
		{"a slug under an integer format is kept as written", "{user:integer}", nil, "/api/users/ada-lovelace/items", "/api/users/ada-lovelace/items/05", "/api/users/ada-lovelace/items/5"},
	}
	for _, tt := range tests {
		p := nested(t, tt.parent, tt.imported)
		coll, ok := p.Lookup(tt.collection)
		if !ok || coll.Item {
			t.Fatalf("%s: %s is not the collection", tt.name, tt.collection)
		}
		paths := coll.ItemPaths()
		if got := paths.Path("05"); got != tt.sent {
			t.Errorf("%s: sent %q, want %q", tt.name, got, tt.sent)
		}
		if got := paths.Key("5"); got != tt.key {
			t.Errorf("%s: batch's lock %q, want %q", tt.name, got, tt.key)
		}
		item, _ := p.Lookup(tt.sent)
		if got := item.ItemKey(); got != tt.key {
			t.Errorf("%s: single write's lock %q, want %q", tt.name, got, tt.key)
		}
	}
}

// Lock names of paths spelled canonically are what they were before
// variables had formats: instances of a cluster upgraded one at a time
// keep excluding each other.
func TestCanonicalLockKeysDoNotChange(t *testing.T) {
	t.Parallel()
	for _, parent := range []string{"{user}", "{user:integer}"} {
		p := nested(t, parent, nil)
		coll, _ := p.Lookup("/api/users/20/items")
		if got := coll.ItemPaths().Key("5"); got != "/api/users/20/items/5" {
			t.Errorf("%s: batch's lock %q", parent, got)
		}
		item, _ := p.Lookup("/api/users/20/items/5")
		if got := item.ItemKey(); got != "/api/users/20/items/5" {
			t.Errorf("%s: single write's lock %q", parent, got)
		}
	}
}

func TestVariableFormatRefused(t *testing.T) {
	t.Parallel()
	tests := []struct{ path, itemPath, want string }{
		{"/u/{user:int}/items", "", `variable "{user:int}": unknown format "int" (want any, integer or uuid)`},
		{"/u/{user:}/items", "", `unknown format ""`},
		{"/u/{:integer}/items", "", `variable "{:integer}" must be named`},
		{"/u", "/u/{id:integer}", `the id's format is id_format's to say: write {id} and set id_format integer`},
		{"/u/{user:integer}/items", "/u/{user:uuid}/items/{id}", `item_path /u/{user:uuid}/items/{id} writes {user:uuid}, and the collection's path {user:integer}: write the variable's format once`},
	}
	for _, tt := range tests {
		_, err := New([]ResourceSpec{{Path: tt.path, ItemPath: tt.itemPath, CollectionMethods: []string{"GET"}, Settings: Defaults(), Gateway: GatewayDefaults()}})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %s: %v, want %q", tt.path, tt.itemPath, err, tt.want)
		}
	}
}

// An OpenAPI path names a variable without its format.
func TestTemplatePlain(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"/u/{user:integer}/items/": "/u/{user}/items/",
		"/u/{user}/items":          "/u/{user}/items",
		"/v1:batch/{x:uuid}":       "/v1:batch/{x}",
	} {
		tm, err := ParseTemplate(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := tm.Plain(); got != want {
			t.Errorf("Plain(%s) = %s, want %s", raw, got, want)
		}
	}
}
