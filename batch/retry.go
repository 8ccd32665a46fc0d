package batch

import (
	"context"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Retry undoes again, now, every item a finished saga left behind
// (docs/durability.md, "Kept sagas"): an operator fixed the cause (the
// legacy API, or the configuration: each undo is computed again under
// the current settings) and asks for the rest of the rollback. prev are
// the items as the saga answered them (their answers and compensations);
// what already rolled back stays so. Every undo is proved first, as in
// the saga itself. An item whose POST restore re-created it under
// another id (Compensation.CreatedID) is never sent again: that would
// make a duplicate. A saga that never ended (prev nil: a journal
// recovery could not finish) is finished as Resume finishes it, except
// that the undos not yet sent are computed under the current settings
// too. rt.Journal records it all, as Resume's does.
func Retry(ctx context.Context, snap *Snapshot, prev []ItemResult, lookup func(path string) (policy.Match, bool), env *Envelope, rt Runtime) (*Result, error) {
	return resume(ctx, snap, lookup, env, rt, func(run *batchRun) {
		for i := range run.items {
			if i < len(prev) {
				run.items[i].Body, run.items[i].BodyText, run.items[i].Headers = prev[i].Body, prev[i].BodyText, prev[i].Headers
				run.items[i].Compensation = prev[i].Compensation
			}
			run.reopen(i)
		}
	})
}

// undoAgain is item i's undo under the current settings (restore_deleted,
// restore_updated), proved as the first one was: what the batch's write
// left there has not changed since.
func (st *itemState) undoAgain(id string) *Undo {
	old := st.undo
	switch st.tgt.kind {
	case policy.OpDelete:
		return st.recreate(id)
	case policy.OpUpdate:
		u := st.restore(id)
		u.IfMatch, u.Proof = old.IfMatch, old.Proof
		return u
	}
	return old
}
