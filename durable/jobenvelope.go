package durable

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
		sc := bufio.NewScanner(bytes.NewReader(page.lines))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line ResultLine
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				return nil, fmt.Errorf("job %s's results from item %d: %w", d.hj.rec.ID, w, err)
			}
			if need[line.Index] {
				out[line.Index] = line.ItemResult
			}
		}
		if err := sc.Err(); err != nil {
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
	sc := bufio.NewScanner(bytes.NewReader(d.hj.page.lines))
	sc.Buffer(nil, 1<<20)
	for k := 0; k < len(items) && sc.Scan(); k++ {
		var line ResultLine
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("job %s's results from item %d: %w", d.hj.rec.ID, d.hj.page.head.First, err)
		}
		it := line.ItemResult
		items[k] = batch.ItemSnapshot{ID: it.ID, OperationID: it.OperationID, Method: it.Method, URL: it.URL,
			Phase: batch.PhaseSettled, Outcome: it.Outcome, Status: it.Status, Error: it.Error, Answer: it.Body}
	}
	return sc.Err()
}
