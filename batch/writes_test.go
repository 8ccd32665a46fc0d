package batch

import (
	"context"
	"sync/atomic"
	"testing"
)

// beginCounter is a journal that counts the sagas begun in it.
type beginCounter struct {
	NoJournal
	begun atomic.Int32
}

func (j *beginCounter) Begin(context.Context, *Plan) error {
	j.begun.Add(1)
	return nil
}

// Whether an envelope writes is decided by its operations: one of reads
// only is no saga (no journal, no locks, nothing to undo, no
// Idempotency-Key record); one with a write among its operations is.
func TestEnvelopeWritesByItsOperations(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		body   string
		writes bool
		locked []string
	}{
		{"reads only", `{"operations": [
			{"id": "a", "method": "GET", "url": "/users/7"},
			{"id": "b", "method": "GET", "url": "/reports/1"}
		]}`, false, nil},
		{"a write among reads", `{"operations": [
			{"id": "a", "method": "GET", "url": "/users/7"},
			{"id": "b", "method": "PATCH", "url": "/users/7", "body": {"name": "b"}, "depends_on": ["a"]}
		]}`, true, []string{"/users/7"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			api := newShopAPI("/users", "/reports").put("/users/7", map[string]any{"id": 7}).put("/reports/1", map[string]any{"id": 1})
			p, prob := admitEnvelope(t, shop(t), c.body)
			if prob != nil {
				t.Fatal(prob.Detail)
			}
			equal(t, "Writes", p.Writes(), c.writes)
			j, locks := &beginCounter{}, &recordingLocks{}
			res := Run(context.Background(), p, Runtime{Send: api, Locks: locks, Journal: j})
			equal(t, "outcome", res.Outcome, Succeeded)
			equal(t, "sagas journaled", j.begun.Load() == 1, c.writes)
			equalSlices(t, "locked", locks.taken(), c.locked)
		})
	}
}
