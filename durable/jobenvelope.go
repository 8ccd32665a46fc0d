package durable

import (
	"context"
	"fmt"

	"github.com/caddy-batch/caddy-batch/batch"
)

// An envelope job's operations may reference, or wait for, operations
// any number of windows before theirs (docs/jobs.md, "Envelope jobs").
// Before a window runs, its owner reads from the results pages the
// results of those it names (each operation's Deps, as admitted), and
// only those: what a window holds of the job stays bounded by its own
// operations' dependencies.

// resultsBefore reads the results of the operations before the window at
// first that items (its input) depend on, by job index.
func (d *driver) resultsBefore(ctx context.Context, first int, items []batch.ItemSnapshot) (map[int]batch.ItemResult, error) {
	need := map[int]bool{}
	pages := map[int]bool{}
	for _, it := range items {
		for _, j := range it.Deps {
			if j < first {
				need[j] = true
				if w, _, ok := d.windowAt(j); ok {
					pages[w] = true
				}
			}
		}
	}
	if len(need) == 0 {
		return nil, nil
	}
	out := make(map[int]batch.ItemResult, len(need))
	for w := range pages {
		page, err := loadPage(ctx, d.hj.jobs.storage, d.hj.rec.ID, w)
		if err != nil {
			return nil, err
		}
		err = page.eachLine(d.hj.rec.ID, func(line ResultLine, _ int) bool {
			if need[line.Index] {
				out[line.Index] = line.ItemResult
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	for j := range need {
		if _, ok := out[j]; !ok {
			return nil, fmt.Errorf("job %s: the result of operation %d, which an operation from item %d depends on, is not among its results", d.hj.rec.ID, j, first)
		}
	}
	return out, nil
}

// finishedBefore lays over items, the first of an envelope job's window
// that runs whole, what its results page says they did (hj.page, which
// carriedOn read): they are not run again, and the window's later
// operations read their ids and answers. The page, not the log, is what
// stands for them: a window's log goes once its results are stored.
func (d *driver) finishedBefore(items []batch.ItemSnapshot) error {
	if len(items) == 0 {
		return nil
	}
	k := 0
	return d.hj.page.eachLine(d.hj.rec.ID, func(line ResultLine, _ int) bool {
		it := line.ItemResult
		items[k] = batch.ItemSnapshot{ID: it.ID, OperationID: it.OperationID, Method: it.Method, URL: it.URL,
			Phase: batch.PhaseSettled, Outcome: it.Outcome, Status: it.Status, Error: it.Error, Answer: it.Body}
		k++
		return k < len(items)
	})
}
