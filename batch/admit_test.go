package batch

import (
	"errors"
	"net/http"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// brokenBody fails on the first read: the client's connection broke.
type brokenBody struct{}

func (brokenBody) Read([]byte) (int, error) { return 0, errors.New("connection reset") }
func (brokenBody) Close() error             { return nil }

// Admit is the one front door: every way a request can go (not a batch,
// a body that cannot be read, an operation that is off, bad input, a
// plan) comes out of it.
func TestAdmit(t *testing.T) {
	t.Parallel()
	pol := widgets(t, func(r *policy.ResourceSpec) { r.Batch = []string{"get", "create"} })
	m, _ := pol.Lookup("/widgets")
	broken := newRequest("POST", "/widgets", "")
	broken.Body = brokenBody{}
	tests := []struct {
		name    string
		r       *http.Request
		isBatch bool
		status  int // of the problem; 0 for a plan, or for no batch
	}{
		{"a list", newRequest("GET", "/widgets?limit=5", ""), false, 0},
		{"a single create", newRequest("POST", "/widgets", `{"name":"a"}`), false, 0},
		{"a batch GET", newRequest("GET", "/widgets?ids=1,2", ""), true, 0},
		{"a body that cannot be read", broken, true, 400},
		{"an operation that is off", newRequest("DELETE", "/widgets?ids=1", ""), true, 405},
		{"bad input", newRequest("GET", "/widgets?ids=", ""), true, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, isBatch, plan, prob := Admit(tt.r, m)
			equal(t, "isBatch", isBatch, tt.isBatch)
			switch {
			case tt.status != 0 && (prob == nil || prob.Status != tt.status):
				t.Errorf("problem %+v, want status %d", prob, tt.status)
			case tt.status == 0 && prob != nil:
				t.Errorf("problem %+v", prob)
			case tt.isBatch && tt.status == 0 && plan == nil:
				t.Error("no plan")
			}
		})
	}
}
