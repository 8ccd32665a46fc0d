package batch

// dependencies tells whether everything operation i depends on has
// succeeded (ready), or which of them ended without succeeding (-1 for
// none).
func (p *Plan) dependencies(i int, ended, succeeded []bool) (ready bool, failed int) {
	ready = true
	for _, j := range p.Items[i].operation.deps {
		switch {
		case !ended[j]:
			ready = false
		case !succeeded[j]:
			return false, j
		}
	}
	return ready, -1
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
			out[i] = append(out[i], j)
		}
	}
	return out
}
