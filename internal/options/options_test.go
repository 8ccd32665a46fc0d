package options

import (
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestOptionsTableTakesEveryShape: a row can read an option with a
// block, and one whose first word selects its form, and the block
// reads on after them as before. The rows are the test's own, of the
// shapes openapi <file> { ... } and max_in_flight auto [<min> <max>]
// have; the table is restored after it.
func TestOptionsTableTakesEveryShape(t *testing.T) {
	saved := optionTable
	t.Cleanup(func() { optionTable = saved })
	var block, forms []string
	optionTable = append(slices.Clone(saved),
		option{name: "with_block", forms: []form{{"<file> { ... }", "with_block"}},
			read: func(o *Options, a optionArgs) error {
				block = append(block, a.args...)
				for n := a.d.Nesting(); a.d.NextBlock(n); {
					block = append(block, a.d.Val()+"="+strings.Join(a.d.RemainingArgs(), " "))
				}
				return nil
			},
			apply: func(*Options, *Level) error { return nil }},
		option{name: "with_forms", forms: []form{{"<n>", "with_forms"}, {"auto [<min> <max>]", "with_forms_auto"}},
			read: func(o *Options, a optionArgs) error {
				if len(a.args) > 0 && a.args[0] == "auto" {
					forms = append(forms, "auto "+strings.Join(a.args[1:], " "))
					return nil
				}
				forms = append(forms, strings.Join(a.args, " "))
				return nil
			},
			apply: func(*Options, *Level) error { return nil }},
	)
	read := func(block string) Options {
		t.Helper()
		var o Options
		d := caddyfile.NewTestDispenser(block)
		d.Next()
		for seen := map[string]caddyfile.Token{}; d.NextBlock(0); {
			if err := o.UnmarshalOption(d, seen, nil); err != nil {
				t.Fatal(err)
			}
		}
		return o
	}
	o := read("batch {\n\twith_block api.yaml {\n\t\tpublish /openapi.json\n\t\tstrict\n\t}\n\tmax_items 5\n\twith_forms auto 4 64\n\tconcurrency 3\n}")
	read("resource {\n\twith_forms 8\n}")
	if want := []string{"api.yaml", "publish=/openapi.json", "strict="}; !slices.Equal(block, want) {
		t.Errorf("the block read %q, want %q", block, want)
	}
	if want := []string{"auto 4 64", "8"}; !slices.Equal(forms, want) {
		t.Errorf("the forms read %q, want %q", forms, want)
	}
	if o.MaxItems != 5 || o.Concurrency != 3 {
		t.Errorf("the options after them: max_items %d, concurrency %d", o.MaxItems, o.Concurrency)
	}
}
