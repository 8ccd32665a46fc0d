package batch

import (
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// TestCompensationBudgetIsTheSagas: what the gateway is told the longest
// compensation of an item takes (CompensationBudget, which bounds how
// long an Idempotency-Key's claim is renewed) is what a saga gives it,
// backoffs included.
func TestCompensationBudgetIsTheSagas(t *testing.T) {
	t.Parallel()
	for _, retries := range []int{0, 1, 3, 8} {
		p := mustPlan(t, newRequest("DELETE", "/widgets?ids=1", ""), compensationRetries(retries))
		run := newBatchRun(p, Runtime{}, compensationBackoff)
		got := CompensationBudget(*run.state[0].tgt.settings)
		if want := compensationBudget(run.state[0].tgt.settings, run.backoff); got != want {
			t.Errorf("compensation_retries %d: CompensationBudget %s, the saga's budget %s", retries, got, want)
		}
	}
	// Three retries of 30s wait 100ms, 200ms and 400ms between them.
	s := policy.Defaults()
	if got, want := CompensationBudget(s), 4*30*time.Second+700*time.Millisecond; got != want {
		t.Errorf("CompensationBudget(defaults) = %s, want %s", got, want)
	}
}

// TestPlanSaga: a plan is a saga when it writes all-or-nothing.
func TestPlanSaga(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, method string
		mods         []specMod
		want         bool
	}{
		{"all-or-nothing delete", "DELETE", nil, true},
		{"partial delete", "DELETE", []specMod{partial}, false},
		{"get", "GET", nil, false},
	} {
		p := mustPlan(t, newRequest(tt.method, "/widgets?ids=1", ""), tt.mods...)
		if got := p.Saga(); got != tt.want {
			t.Errorf("%s: Saga() = %v, want %v", tt.name, got, tt.want)
		}
	}
}
