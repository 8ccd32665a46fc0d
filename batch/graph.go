package batch

// dependencies tells whether everything operation i depends on has
// succeeded (ready), or which of them ended without succeeding (failed,
// when blocked: an index of the plan, or outside it for an operation
// before a job's window).
func (p *Plan) dependencies(i int, ended, succeeded []bool) (ready bool, failed int, blocked bool) {
	ready = true
	for _, j := range p.Items[i].operation.deps {
		switch {
		case j < 0:
			// Before the window, so ended.
			if p.window.before[-1-j].Outcome != Succeeded {
				return false, j, true
			}
		case !ended[j]:
			ready = false
		case !succeeded[j]:
			return false, j, true
		}
	}
	return ready, 0, false
}

// dependents lists, for each item, the items that depend on it: an
// envelope's undo of an item waits for theirs.
func (p *Plan) dependents() [][]int {
	out := make([][]int, len(p.Items))
	for j, it := range p.Items {
		if it.operation == nil {
			continue
		}
		for _, i := range it.operation.deps {
			if i >= 0 { // one before the window is undone after it
				out[i] = append(out[i], j)
			}
		}
	}
	return out
}
