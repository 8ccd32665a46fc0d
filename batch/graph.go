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
func (sg *saga) executeGraph(clientCtx, batchCtx context.Context) {
	writeCtx := context.WithoutCancel(clientCtx)
	n := len(sg.items)
	started, ended, succeeded := make([]bool, n), make([]bool, n), make([]bool, n)
	finished := make(chan int)
	results := make([]bool, n)
	running, halted := 0, false
	for {
		halted = halted || clientCtx.Err() != nil || batchCtx.Err() != nil
		for i := 0; i < n && !halted && running < sg.batchSettings.Concurrency; i++ {
			if started[i] {
				continue
			}
			ready, failedDep := sg.dependencies(i, ended, succeeded)
			switch {
			case failedDep >= 0:
				started[i], ended[i] = true, true
				sg.notAttempted(writeCtx, i, failedDep)
			case ready:
				started[i] = true
				running++
				sg.started = append(sg.started, i)
				go func() {
					results[i] = sg.executeOperation(clientCtx, batchCtx, i)
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
		if !results[i] && sg.allOrNothing() {
			halted = true
		}
	}
}

// dependencies tells whether everything operation i depends on has
// succeeded (ready), or which of them ended without succeeding (-1 for
// none).
func (sg *saga) dependencies(i int, ended, succeeded []bool) (ready bool, failed int) {
	ready = true
	for _, j := range sg.plan.Items[i].operation.deps {
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
func (sg *saga) notAttempted(ctx context.Context, i, dep int) {
	_ = sg.transition(ctx, i, PhaseSettled, nil, func(it *ItemResult, st *itemState) {
		it.clearResponse()
		it.Status, it.Outcome, st.settled = http.StatusFailedDependency, NotAttempted, true
		it.Error = fmt.Sprintf("operation %q, which it depends on, did not succeed", sg.plan.Items[dep].operation.id)
	})
}

// executeOperation runs one operation of an envelope: it fills in its
// references, and, where its url named its item only once filled, locks
// and preflights that item as the saga's first steps do for the others;
// then it sends it as a batch's item. It reports whether it succeeded.
func (sg *saga) executeOperation(clientCtx, batchCtx context.Context, i int) bool {
	planned, ctx := &sg.plan.Items[i], context.WithoutCancel(clientCtx)
	late := planned.tgt == nil || planned.tgt.kind == policy.OpCreate && planned.ID == "" || planned.rewrite
	if planned.tgt == nil || planned.operation.body != nil {
		if !sg.fill(ctx, i) {
			return false
		}
	}
	if late && !planned.rewrite && !sg.claimWrite(ctx, i) {
		return false
	}
	if late && sg.isSaga() && sg.tgt(i).kind.Writes() && sg.items[i].ID != "" {
		if !sg.lockLate(clientCtx, batchCtx, i) {
			return false
		}
		read := sg.preflightRead(i)
		if read != nil && !read(batchCtx, i) {
			return false
		}
	}
	return sg.executeItem(clientCtx, batchCtx, i)
}

// claimWrite checks an operation whose item became known as the envelope
// ran against the other operations that write the same item: one of each
// two must wait for the other, as orderWrites asks of those known up
// front. It settles the operation as failed (400, nothing sent) when it
// would race one of them.
func (sg *saga) claimWrite(ctx context.Context, i int) bool {
	key := writeKey(sg.tgt(i), sg.items[i].ID)
	if key == "" {
		return true
	}
	sg.mu.Lock()
	race := -1
	for _, w := range sg.writers[key] {
		if w != i && !sg.plan.dependsOn(i, w) && !sg.plan.dependsOn(w, i) {
			race = w
		}
	}
	if race < 0 {
		sg.writers[key] = append(sg.writers[key], i)
	}
	sg.mu.Unlock()
	if race >= 0 {
		d := sameItem(sg.plan.Items[i].operation.id, sg.plan.Items[race].operation.id, key)
		sg.fail(ctx, i, http.StatusBadRequest, d.Detail, nil)
	}
	return race < 0
}

// lockLate locks an item whose id an envelope learned only as it ran, out
// of the order of keys: the wait is bounded by item_timeout, and an item
// it cannot lock fails the operation as RefuseLock says, nothing sent.
func (sg *saga) lockLate(clientCtx, batchCtx context.Context, i int) bool {
	key := sg.lockKey(i, sg.items[i].ID)
	if sg.rt.Locks == nil || sg.locks.has(key) {
		return true
	}
	unlock, ok := sg.lockOne(clientCtx, batchCtx, i, sg.items[i].ID)
	if ok {
		sg.locks.add(key, unlock)
	}
	return ok
}

// dependents lists, for each item, the items that depend on it: an
// envelope's undo of an item waits for theirs.
func (sg *saga) dependents() [][]int {
	out := make([][]int, len(sg.plan.Items))
	for j, it := range sg.plan.Items {
		if it.operation == nil {
			continue
		}
		for _, i := range it.operation.deps {
			out[i] = append(out[i], j)
		}
	}
	return out
}
