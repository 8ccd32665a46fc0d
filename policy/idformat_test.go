package policy

import (
	"net/url"
	"strings"
	"testing"
)

// Canonical is the one place an id's spellings become one text.
func TestIDFormatCanonical(t *testing.T) {
	t.Parallel()
	const uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	tests := []struct {
		format IDFormat
		id     string
		want   string // "" when refused
	}{
		{IDAny, "03", "03"},
		{IDAny, "3.json", "3.json"},
		{IDAny, "", ""},
		{IDAny, "ABC", "ABC"},

		{IDInteger, "3", "3"},
		{IDInteger, "03", "3"},
		{IDInteger, "+3", "3"},
		{IDInteger, "+003", "3"},
		{IDInteger, "-3", "-3"},
		{IDInteger, "-03", "-3"},
		{IDInteger, "0", "0"},
		{IDInteger, "000", "0"},
		{IDInteger, "-0", "0"},
		{IDInteger, "+0", "0"},
		{IDInteger, "10", "10"},
		{IDInteger, "123456789012345678901234567890", "123456789012345678901234567890"},
		{IDInteger, "", ""},
		{IDInteger, "+", ""},
		{IDInteger, "-", ""},
		{IDInteger, "+-3", ""},
		{IDInteger, "--3", ""},
		{IDInteger, "3.0", ""},
		{IDInteger, "3.json", ""},
		{IDInteger, "1e3", ""},
		{IDInteger, " 3", ""},
		{IDInteger, "3 ", ""},
		{IDInteger, "0x1F", ""},
		{IDInteger, "1_000", ""},
		{IDInteger, "٣", ""}, // ARABIC-INDIC DIGIT THREE
		{IDInteger, "３", ""}, // FULLWIDTH DIGIT THREE
		{IDInteger, "3x", ""},

		{IDUUID, uuid, uuid},
		{IDUUID, strings.ToUpper(uuid), uuid},
		{IDUUID, "0F8fad5bD9CB469FA16570867728950e", uuid},
		{IDUUID, "00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000000"},
		{IDUUID, "", ""},
		{IDUUID, "42", ""},
		{IDUUID, "{" + uuid + "}", ""},
		{IDUUID, "urn:uuid:" + uuid, ""},
		{IDUUID, "0f8fad5bd-9cb-469f-a165-70867728950e", ""}, // a hyphen out of place
		{IDUUID, "0f8fad5b-d9cb-469f-a165-70867728950", ""},  // a digit short
		{IDUUID, "0f8fad5b-d9cb-469f-a165-70867728950e0", ""},
		{IDUUID, "0f8fad5bd9cb469fa16570867728950", ""},
		{IDUUID, "0f8fad5bd9cb469fa16570867728950g", ""},
		{IDUUID, "0f8fad5b-d9cb-469f-a165-70867728950g", ""},
		{IDUUID, "0f8fad5b-d9cb-469f-a16-570867728950e-", ""}, // four hyphens, one out of place
		{IDUUID, "0f8fad5b-d9cb-469f-a165-7086772895-e", ""},
	}
	for _, tt := range tests {
		got, err := tt.format.Canonical(tt.id)
		switch {
		case tt.want == "" && tt.format != IDAny:
			if err == nil {
				t.Errorf("%s Canonical(%q) = %q; want it refused", tt.format, tt.id, got)
			} else if !strings.Contains(err.Error(), "id_format "+tt.format.String()) || !strings.Contains(err.Error(), "set id_format any") {
				t.Errorf("%s Canonical(%q): %v; want the option named, and what to do", tt.format, tt.id, err)
			}
		case err != nil:
			t.Errorf("%s Canonical(%q): %v; want %q", tt.format, tt.id, err, tt.want)
		case got != tt.want:
			t.Errorf("%s Canonical(%q) = %q; want %q", tt.format, tt.id, got, tt.want)
		}
	}
}

func TestParseIDFormat(t *testing.T) {
	t.Parallel()
	for _, f := range []IDFormat{IDAny, IDInteger, IDUUID} {
		if got, err := ParseIDFormat(f.String()); err != nil || got != f {
			t.Errorf("ParseIDFormat(%q) = %v, %v", f.String(), got, err)
		}
	}
	_, err := ParseIDFormat("int")
	if err == nil || err.Error() != `unknown id_format "int" (want any, integer or uuid)` {
		t.Errorf("ParseIDFormat(int): %v", err)
	}
}

// A single write's lock key is the item path of its canonical id, the
// key a batch locks the same item under; an id that is not of the
// format is taken as written.
func TestItemKeyCanonicalID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		format     IDFormat
		path, want string
	}{
		{IDAny, "/u/03", "/u/03"},
		{IDInteger, "/u/03", "/u/3"},
		{IDInteger, "/u/%2B3/", "/u/3"},
		{IDInteger, "/u/3.json", "/u/3.json"},
		{IDUUID, "/u/0F8FAD5BD9CB469FA16570867728950E", "/u/0f8fad5b-d9cb-469f-a165-70867728950e"},
		{IDUUID, "/u/x", "/u/x"},
	}
	for _, tt := range tests {
		s := Defaults()
		s.IDFormat = tt.format
		p, err := New([]ResourceSpec{{Path: "/u", CollectionMethods: []string{"GET"}, ItemMethods: []string{"GET", "PUT"}, Settings: s, Gateway: GatewayDefaults()}})
		if err != nil {
			t.Fatal(err)
		}
		m, ok := p.Lookup(tt.path)
		if !ok || !m.Item {
			t.Fatalf("%s: not an item", tt.path)
		}
		if got := m.ItemKey(); got != tt.want {
			t.Errorf("%s ItemKey(%s) = %q; want %q", tt.format, tt.path, got, tt.want)
		}
		coll, _ := p.Lookup("/u")
		id, _ := url.PathUnescape(strings.Trim(strings.TrimPrefix(tt.path, "/u/"), "/"))
		if canonical, err := tt.format.Canonical(id); err == nil && coll.ItemPath(canonical) != m.ItemKey() {
			t.Errorf("%s: a batch locks %q, a single write %q", tt.path, coll.ItemPath(canonical), m.ItemKey())
		}
	}
}
