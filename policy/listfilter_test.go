package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestListFilterQuery(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		template string
		ids      []string
		want     string
	}{
		{"id={id}", []string{"1", "2"}, "id=1&id=2"},
		{"id__in={ids}", []string{"1", "2"}, "id__in=1,2"},
		{"filter[id]={ids}", []string{"a,b", "c d"}, "filter[id]=a%2Cb,c+d"},
		{"x=1&id={id}&page_size=100", []string{"7"}, "x=1&id=7&page_size=100"},
		{"id=in.({ids})", []string{"1", "2"}, "id=in.(1,2)"},
		{"ids[]={id}&y=2", []string{"é"}, "ids[]=%C3%A9&y=2"},
	} {
		f, err := ParseListFilter(ListFilterSpec{Template: tt.template})
		if err != nil {
			t.Fatalf("%s: %v", tt.template, err)
		}
		if got := f.Query(tt.ids); got != tt.want {
			t.Errorf("%s with %q: %q, want %q", tt.template, tt.ids, got, tt.want)
		}
	}
}

func TestListFilterSplit(t *testing.T) {
	t.Parallel()
	ids := func(n int, prefix string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return out
	}
	for _, tt := range []struct {
		name     string
		template string
		maxIDs   int
		ids      []string
		room     int
		sizes    []int
	}{
		{"max_ids", "id={id}", 50, ids(120, ""), 4096, []int{50, 50, 20}},
		{"room, repeated pair", "id={id}", 50, ids(20, "xxxxxxxxx"), 60, []int{4, 4, 4, 4, 4}},
		{"room, joined", "id__in={ids}", 50, ids(20, "xxxxxxxxx"), 60, []int{4, 4, 4, 4, 4}},
		{"an id longer than the room goes alone", "id={id}", 50, []string{"a", strings.Repeat("z", 100), "b"}, 20, []int{1, 1, 1}},
		{"escapes count", "id={ids}", 50, []string{"é", "é", "é"}, len("id=%C3%A9,%C3%A9"), []int{2, 1}},
		{"none", "id={id}", 50, nil, 4096, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := ParseListFilter(ListFilterSpec{Template: tt.template, MaxIDs: tt.maxIDs})
			if err != nil {
				t.Fatal(err)
			}
			groups := f.Split(tt.ids, tt.room)
			var sizes []int
			var all []string
			for _, g := range groups {
				sizes = append(sizes, len(g))
				all = append(all, g...)
				if q := f.Query(g); len(g) > 1 && len(q) > tt.room {
					t.Errorf("a group's query is %d bytes, room %d: %s", len(q), tt.room, q)
				}
			}
			if !slices.Equal(sizes, tt.sizes) {
				t.Errorf("group sizes %v, want %v", sizes, tt.sizes)
			}
			if !slices.Equal(all, tt.ids) {
				t.Errorf("the groups hold %v, want %v in order", all, tt.ids)
			}
		})
	}
	// Every group fills its room as far as the next id allows.
	f, _ := ParseListFilter(ListFilterSpec{Template: "id={id}&page_size=100", MaxIDs: 1000})
	for room := 30; room < 200; room++ {
		ids := ids(40, "id")
		for _, g := range f.Split(ids, room) {
			if len(f.Query(g)) > room && len(g) > 1 {
				t.Fatalf("room %d: %s", room, f.Query(g))
			}
		}
	}
}

func TestParseListFilterRefuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		spec   ListFilterSpec
		option string
		holds  string
	}{
		{ListFilterSpec{Template: "id=1"}, "list_filter", "exactly one {id}"},
		{ListFilterSpec{Template: "id={id}&x={id}"}, "list_filter", "not 2"},
		{ListFilterSpec{Template: "id={id}&ids={ids}"}, "list_filter", "not 2"},
		{ListFilterSpec{Template: "?id={id}"}, "list_filter", "without ?"},
		{ListFilterSpec{Template: "id={id}&&x=1"}, "list_filter", "empty pair"},
		{ListFilterSpec{Template: ""}, "list_filter", "query pairs"},
		{ListFilterSpec{Template: "id={id}", Items: "results"}, "items", "start with /"},
		{ListFilterSpec{Template: "id={id}", Items: "/a~2b"}, "items", "~ must be followed"},
		{ListFilterSpec{Template: "id={id}", MaxIDs: -1}, "max_ids", "1 or more"},
	} {
		_, err := ParseListFilter(tt.spec)
		var pe *Error
		if err == nil || !strings.Contains(err.Error(), tt.holds) {
			t.Errorf("%+v: %v, want an error holding %q", tt.spec, err, tt.holds)
			continue
		}
		if errs := Flatten(err); len(errs) != 1 || !asError(errs[0], &pe) || pe.Option != tt.option {
			t.Errorf("%+v: %v, want one error of option %s", tt.spec, err, tt.option)
		}
	}
}

func asError(err error, pe **Error) bool {
	e, ok := err.(*Error)
	*pe = e
	return ok
}
