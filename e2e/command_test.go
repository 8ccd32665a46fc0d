package e2e

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// runCLI runs the built caddy with args against g's admin endpoint, and
// returns what it printed and its exit status.
func runCLI(t *testing.T, bin string, g *gateway, args ...string) (string, int) {
	t.Helper()
	if !strings.Contains(strings.Join(args, " "), "--address") {
		args = append(args, "--address", g.admin)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("caddy %s: %v", strings.Join(args, " "), err)
	return "", 0
}

// TestSagaCLI runs caddy batch sagas, saga, retry and resolve against a
// running Caddy: each subcommand's table and --json, and its exit
// status (0 done, 1 an error, 3 a retry that left items behind).
func TestSagaCLI(t *testing.T) {
	bin := caddyBinary(t)
	api := seededAPI()
	g := startAdminGateway(t, api, operatedSite("put"))
	if out, code := runCLI(t, bin, g, "batch", "sagas"); code != 0 || !strings.Contains(out, "no sagas") {
		t.Errorf("sagas with none: exit %d\n%s", code, out)
	}
	if out, code := runCLI(t, bin, g, "batch", "sagas", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("sagas --json with none: exit %d\n%s", code, out)
	}
	saga := leaveWidget17Behind(t, g)

	out, code := runCLI(t, bin, g, "batch", "sagas")
	if code != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, saga) || !strings.Contains(out, "left_behind") {
		t.Errorf("sagas: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, bin, g, "batch", "sagas", "--json", "--state", "left_behind")
	var list []summaryJSON
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != saga {
		t.Errorf("sagas --json: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, bin, g, "batch", "saga", saga)
	if code != 0 || !strings.Contains(out, "rollback_failed") || !strings.Contains(out, `"w17"`) {
		t.Errorf("saga: exit %d\n%s", code, out)
	}
	out, code = runCLI(t, bin, g, "batch", "saga", saga, "--json")
	var v sagaJSON
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.ID != saga {
		t.Errorf("saga --json: exit %d\n%s", code, out)
	}
	if out, code = runCLI(t, bin, g, "batch", "saga", "0123456789abcdef0123456789abcdef"); code != 1 || !strings.Contains(out, "404") {
		t.Errorf("saga of an unknown id: exit %d\n%s", code, out)
	}
	if out, code = runCLI(t, bin, g, "batch", "retry", saga, "--header", "Authorization: Bearer s3cret"); code != 3 || !strings.Contains(out, "left_behind") {
		t.Errorf("retry with the cause unfixed: exit %d, want 3\n%s", code, out)
	}
	if out, code = runCLI(t, bin, g, "batch", "resolve", saga); code != 1 || !strings.Contains(out, "--reason") {
		t.Errorf("resolve without a reason: exit %d\n%s", code, out)
	}
	g.reload(t, operatedSite("post"))
	if out, code = runCLI(t, bin, g, "batch", "retry", saga, "--header", "Authorization: Bearer s3cret", "--json"); code != 0 || !strings.Contains(out, `"state":"resolved"`) {
		t.Errorf("retry after the fix: exit %d\n%s", code, out)
	}
	if _, ok := api.Item("/api/widgets", "17"); !ok {
		t.Error("widget 17 was not put back")
	}
	g.reload(t, operatedSite("put"))
	saga = leaveWidget17Behind(t, g)
	if out, code = runCLI(t, bin, g, "batch", "resolve", saga, "--reason", "restored by hand"); code != 0 || !strings.Contains(out, "resolved "+saga) {
		t.Errorf("resolve: exit %d\n%s", code, out)
	}
	if out, code = runCLI(t, bin, g, "batch", "sagas", "--address", "127.0.0.1:1"); code != 1 {
		t.Errorf("sagas of an unreachable endpoint: exit %d\n%s", code, out)
	}
}
