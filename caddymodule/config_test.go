package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-batch/caddy-batch/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestAdapt pins the Caddyfile → JSON adaptation of every option:
// testdata/adapt/NAME.caddyfile must adapt to NAME.json (go test -update
// rewrites them), and the JSON must provision.
func TestAdapt(t *testing.T) {
	files, _ := filepath.Glob("testdata/adapt/*.caddyfile")
	if len(files) == 0 {
		t.Fatal("no golden files")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			in, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(in, map[string]any{"filename": file})
			if err != nil {
				t.Fatal(err)
			}
			if len(warnings) > 0 {
				t.Errorf("warnings: %v", warnings)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			pretty.WriteByte('\n')
			golden := strings.TrimSuffix(file, ".caddyfile") + ".json"
			if *update {
				if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(pretty.Bytes(), want) {
				t.Errorf("adapted JSON differs from %s (go test -update rewrites it):\n%s", golden, pretty.Bytes())
			}
			var cfg caddy.Config
			if err := json.Unmarshal(out, &cfg); err != nil {
				t.Fatal(err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Errorf("the adapted config does not provision: %v", err)
			}
		})
	}
}

// TestExampleIsValid keeps Caddyfile.example working.
func TestExampleIsValid(t *testing.T) {
	in, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(in, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Fatal(err)
	}
}

// TestCaddyfileErrors holds each malformed directive to an error that
// names the option and its line.
func TestCaddyfileErrors(t *testing.T) {
	tests := []struct{ name, body, want string }{
		{"argument after batch", "batch /api/* extra", "wrong argument count"},
		{"unknown option", "batch {\n\tparallelism 4\n}", `unknown batch option "parallelism"`},
		{"resource without path", "batch {\n\tresource {\n\t}\n}", "resource needs a collection path template"},
		{"resource with two paths", "batch {\n\tresource /a /b\n}", "wrong argument count"},
		{"collection without methods", "batch {\n\tresource /a {\n\t\tcollection\n\t}\n}", "collection needs one or more methods"},
		{"item without methods", "batch {\n\tresource /a {\n\t\titem\n\t}\n}", "item needs one or more methods"},
		{"batch without operations", "batch {\n\tresource /a {\n\t\tbatch\n\t}\n}", "batch needs operations (get create update delete) or none"},
		{"item_path without value", "batch {\n\tresource /a {\n\t\titem_path\n\t}\n}", "wrong argument count"},
		{"unknown atomicity", "batch {\n\tatomicity maybe\n}", `unknown atomicity "maybe" (want all_or_nothing or partial)`},
		{"unknown operation in atomicity", "batch {\n\tatomicity upsert partial\n}", `unknown batch operation "upsert"`},
		{"atomicity with three values", "batch {\n\tatomicity get partial now\n}", "atomicity takes a mode, or an operation and a mode"},
		{"allow_override with a bad value", "batch {\n\tallow_override yes\n}", "allow_override takes no value, or on or off"},
		{"zero max_items", "batch {\n\tmax_items 0\n}", `max_items must be a whole number greater than zero, not "0"`},
		{"negative concurrency", "batch {\n\tconcurrency -2\n}", `concurrency must be a whole number greater than zero, not "-2"`},
		{"max_items not a number", "batch {\n\tmax_items many\n}", `max_items must be a whole number greater than zero, not "many"`},
		{"negative compensation_retries", "batch {\n\tcompensation_retries -1\n}", `compensation_retries must be a whole number, zero or more, not "-1"`},
		{"zero max_body_size", "batch {\n\tmax_body_size 0\n}", `max_body_size must be a size greater than zero, e.g. 1MiB, not "0"`},
		{"bad max_body_size", "batch {\n\tmax_body_size lots\n}", `max_body_size must be a size greater than zero`},
		{"zero item_timeout", "batch {\n\titem_timeout 0s\n}", `item_timeout must be a duration greater than zero, e.g. 10s, not "0s"`},
		{"bad batch_timeout", "batch {\n\tbatch_timeout soon\n}", `batch_timeout must be a duration greater than zero`},
		{"bad compensation_timeout", "batch {\n\tcompensation_timeout -1s\n}", `compensation_timeout must be a duration greater than zero`},
		{"option without value", "batch {\n\tids_param\n}", "ids_param takes one value"},
		{"option with two values", "batch {\n\tid_field a b\n}", "id_field takes one value"},
		{"ids_param that is the method override parameter", "batch {\n\tids_param _method\n}", `ids_param must not be "_method"`},
		{"unknown delete_semantics", "batch {\n\tdelete_semantics soft\n}", `unknown delete_semantics "soft" (want imperative or declarative)`},
		{"unknown restore_deleted", "batch {\n\trestore_deleted patch\n}", `unknown restore_deleted "patch" (want put or post)`},
		{"unknown restore_updated", "batch {\n\trestore_updated post\n}", `unknown restore_updated "post" (want put or patch)`},
		{"option error inside a resource", "batch {\n\tresource /a {\n\t\tmax_items 0\n\t}\n}", "max_items must be a whole number greater than zero"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := ":8080 {\n" + tt.body + "\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(config), map[string]any{"filename": "Caddyfile"})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Caddyfile:") {
				t.Fatalf("error %v\nwant it to contain %q and the file:line", err, tt.want)
			}
		})
	}
}

// TestProvisionErrors holds each configuration that cannot work to an
// error at provisioning that names the resource and the option.
func TestProvisionErrors(t *testing.T) {
	tests := []struct{ name, handler, want string }{
		{"no resources", `{}`, "no resources: declare at least one resource"},
		{"bad template", `{"resources":[{"path":"/a/x{y}","collection":["GET"]}]}`,
			`resource "/a/x{y}": path: template "/a/x{y}": segment "x{y}" mixes a variable with text`},
		{"same path twice", `{"resources":[{"path":"/a","collection":["GET"]},{"path":"/a/","collection":["GET"]}]}`,
			`resource "/a/": path "/a/" is the same route as the collection path "/a" of resource "/a"`},
		{"batch operation without its item method", `{"resources":[{"path":"/a","collection":["GET","DELETE"],"item":["GET"],"batch":["delete"]}]}`,
			`resource "/a": batch delete needs DELETE on the collection and DELETE on the item`},
		{"undo impossible", `{"resources":[{"path":"/a","collection":["POST"],"item":["GET"]}]}`,
			`resource "/a": batch create can run all_or_nothing, where a created item is undone with DELETE on the item`},
		{"unknown method", `{"resources":[{"path":"/a","collection":["FETCH"]}]}`, `resource "/a": collection: unknown method "FETCH"`},
		{"negative limit in JSON", `{"max_items":-1,"resources":[{"path":"/a","collection":["GET"]}]}`, "max_items must be greater than zero, not -1"},
		{"negative limit on a resource", `{"resources":[{"path":"/a","collection":["GET"],"concurrency":-3}]}`,
			`resource "/a": concurrency must be greater than zero, not -3`},
		{"negative retries", `{"compensation_retries":-1,"resources":[{"path":"/a","collection":["GET"]}]}`, "compensation_retries must not be negative"},
		{"unknown atomicity in JSON", `{"atomicity":"some","resources":[{"path":"/a","collection":["GET"]}]}`, `unknown atomicity "some"`},
		{"unknown operation in operation_atomicity", `{"operation_atomicity":{"upsert":"partial"},"resources":[{"path":"/a","collection":["GET"]}]}`,
			`operation_atomicity: unknown batch operation "upsert"`},
		{"unknown batch operation", `{"resources":[{"path":"/a","collection":["GET"],"item":["GET"],"batch":["list"]}]}`,
			`resource "/a": batch: unknown batch operation "list"`},
		{"ids_param that is the method override parameter", `{"ids_param":"_method","resources":[{"path":"/a","collection":["GET"]}]}`,
			`ids_param must not be "_method"`},
		{"item path without id", `{"resources":[{"path":"/a","collection":["GET"],"item_path":"/a/one"}]}`, `item_path "/a/one": must contain {id}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handler
			if err := json.Unmarshal([]byte(tt.handler), &h); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
			defer cancel()
			err := h.Provision(ctx)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestSettingsInheritance checks that defaults, handler options and
// resource options stack as documented.
func TestSettingsInheritance(t *testing.T) {
	var h Handler
	raw := `{
		"atomicity": "partial",
		"operation_atomicity": {"delete": "all_or_nothing"},
		"max_items": 7,
		"item_timeout": "2s",
		"resources": [
			{"path": "/plain", "collection": ["GET", "POST", "DELETE"], "item": ["GET", "PUT", "DELETE"]},
			{"path": "/tuned", "collection": ["GET"], "item": ["GET"], "atomicity": "all_or_nothing", "max_items": 3, "compensation_retries": 0, "allow_override": true}
		]
	}`
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	plain := policy.Defaults()
	plain.SetAtomicity(policy.Partial)
	plain.Atomicity[policy.OpDelete] = policy.AllOrNothing
	plain.MaxItems, plain.ItemTimeout = 7, 2*time.Second
	tuned := plain
	tuned.SetAtomicity(policy.AllOrNothing)
	tuned.MaxItems, tuned.CompensationRetries, tuned.AllowOverride = 3, 0, true

	for path, want := range map[string]policy.Settings{"/plain": plain, "/tuned": tuned} {
		m, ok := h.policy.Lookup(path)
		if !ok {
			t.Fatalf("no resource at %s", path)
		}
		if got := m.Resource.Settings; got != want {
			t.Errorf("%s settings\n got %+v\nwant %+v", path, got, want)
		}
	}
}
