package batch

import (
	"context"
	"fmt"
	"net/http"

	"github.com/caddy-batch/caddy-batch/policy"
)

// executeGraph is execute for an envelope: every operation starts as soon
// as everything it depends on has succeeded, in the order of the
// envelope, at most Concurrency at once. As in a batch, nothing new
// starts once the client went away, the batch's deadline passed, or, when
// all-or-nothing, an operation failed. In partial mode an operation whose
// dependency did not succeed is not attempted, with 424 (Failed
// Dependency).
func (run *batchRun) executeGraph(clientCtx, batchCtx context.Context) {
	writeCtx := context.WithoutCancel(clientCtx)
	n := len(run.items)
	started, ended, succeeded := make([]bool, n), make([]bool, n), make([]bool, n)
	finished := make(chan int)
	results := make([]bool, n)
	running, halted := 0, false
	for {
		halted = halted || clientCtx.Err() != nil || batchCtx.Err() != nil
		for i := 0; i < n && !halted && running < run.batchSettings.Concurrency; i++ {
			if started[i] {
				continue
			}
			ready, failedDep := run.dependencies(i, ended, succeeded)
			switch {
			case failedDep >= 0:
				started[i], ended[i] = true, true
				run.notAttempted(writeCtx, i, failedDep)
			case ready:
				started[i] = true
				running++
				run.started = append(run.started, i)
				go func() {
					results[i] = run.executeOperation(clientCtx, batchCtx, i)
					finished <- i
				}()
			}
		}
		if running == 0 {
			return
		}
		i := <-finished
		running--
		ended[i], succeeded[i] = true, results[i]
		if !results[i] && run.allOrNothing() {
			halted = true
		}
	}
}

// dependencies tells whether everything operation i depends on has
// succeeded (ready), or which of them ended without succeeding (-1 for
// none).
func (run *batchRun) dependencies(i int, ended, succeeded []bool) (ready bool, failed int) {
	ready = true
	for _, j := range run.plan.Items[i].operation.deps {
		switch {
		case !ended[j]:
			ready = false
		case !succeeded[j]:
			return false, j
		}
	}
	return ready, -1
}

// notAttempted settles an operation of a partial envelope that cannot run
// because an operation it depends on did not succeed.
func (run *batchRun) notAttempted(ctx context.Context, i, dep int) {
	_ = run.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.clearResponse()
		it.Status, it.Outcome, st.settled = http.StatusFailedDependency, NotAttempted, true
		it.Error = fmt.Sprintf("operation %q, which it depends on, did not succeed", run.plan.Items[dep].operation.id)
	})
}

// executeOperation runs one operation of an envelope: it fills in its
// references, and, where its url named its item only once filled, locks
// and preflights that item as the saga's first steps do for the others;
// then it sends it as a batch's item. It reports whether it succeeded.
func (run *batchRun) executeOperation(clientCtx, batchCtx context.Context, i int) bool {
	planned, ctx := &run.plan.Items[i], context.WithoutCancel(clientCtx)
	late := planned.tgt == nil || planned.tgt.kind == policy.OpCreate && planned.ID == "" || planned.rewrite
	if planned.tgt == nil || planned.operation.body != nil {
		if !run.fill(ctx, i) {
			return false
		}
	}
	if late && !planned.rewrite && !run.claimWrite(ctx, i) {
		return false
	}
	if late && run.isSaga() && run.state[i].tgt.kind.Writes() && run.items[i].ID != "" {
		if !run.lockLate(clientCtx, batchCtx, i) {
			return false
		}
		read := run.preflightRead(i)
		if read != nil && !read(batchCtx, i) {
			return false
		}
	}
	return run.executeItem(clientCtx, batchCtx, i)
}

// claimWrite checks an operation whose item became known as the envelope
// ran against the other operations that write the same item: one of each
// two must wait for the other, as orderWrites asks of those known up
// front. It settles the operation as failed (400, nothing sent) when it
// would race one of them.
func (run *batchRun) claimWrite(ctx context.Context, i int) bool {
	key := writeKey(run.state[i].tgt, run.items[i].ID)
	if key == "" {
		return true
	}
	run.mu.Lock()
	race := -1
	for _, w := range run.writers[key] {
		if w != i && !run.plan.dependsOn(i, w) && !run.plan.dependsOn(w, i) {
			race = w
		}
	}
	if race < 0 {
		run.writers[key] = append(run.writers[key], i)
	}
	run.mu.Unlock()
	if race >= 0 {
		d := sameItem(run.plan.Items[i].operation.id, run.plan.Items[race].operation.id, key)
		run.fail(ctx, i, http.StatusBadRequest, d.Detail, nil)
	}
	return race < 0
}

// lockLate locks an item whose id an envelope learned only as it ran, out
// of the order of keys: the wait is bounded by item_timeout, and an item
// it cannot lock fails the operation as RefuseLock says, nothing sent.
func (run *batchRun) lockLate(clientCtx, batchCtx context.Context, i int) bool {
	key := run.state[i].tgt.paths.Key(run.items[i].ID)
	if run.rt.Locks == nil || run.locks.has(key) {
		return true
	}
	unlock, ok := run.lockOne(clientCtx, batchCtx, i, run.items[i].ID)
	if ok {
		run.locks.add(key, unlock)
	}
	return ok
}

// dependents lists, for each item, the items that depend on it: an
// envelope's undo of an item waits for theirs.
func (run *batchRun) dependents() [][]int {
	out := make([][]int, len(run.plan.Items))
	for j, it := range run.plan.Items {
		if it.operation == nil {
			continue
		}
		for _, i := range it.operation.deps {
			out[i] = append(out[i], j)
		}
	}
	return out
}
