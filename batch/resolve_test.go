package batch

import (
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// With idempotent_upstream, a write whose outcome is unknown is sent
// again with the same key; an answer that says nothing of what the first
// copy did (409: the first copy is still being served, as the
// Idempotency-Key draft answers; a 5xx of the upstream or of a proxy in
// front of it) must not count as proof that it did not take effect: the
// item is read instead, and undone if the first copy was applied.
func TestIdempotentResendThatProvesNothing(t *testing.T) {
	t.Parallel()
	idem := settings(func(s *policy.Settings) { s.IdempotentUpstream = true })
	for _, tc := range []struct {
		name   string
		resend answer
	}{
		{"409, the first copy still in progress", reply(409, `<h1>request in progress</h1>`, "Retry-After", "1")},
		{"503 from a proxy", reply(503, `no upstreams available`)},
		{"500", reply(500, ``)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake().seed("1", "2").
				on("PATCH", "/widgets/1", answer{effectThenErr: errLost}, tc.resend)
			before := f.state()
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1), idem, compensationRetries(1)))
			equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
			equal(t, "outcome", w.Outcome, "rolled_back")
			f.checkUnchanged(t, before)
		})
	}
}
