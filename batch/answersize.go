package batch

import (
	"fmt"
	"strconv"
	"sync/atomic"
)

// answerBudget holds the item bodies a batch's answer will carry to
// max_response_size.
type answerBudget struct {
	max  int64
	held atomic.Int64
}

// keep counts an item's body, as just answered, toward the batch's
// answer, and leaves it out if the answer would then pass
// max_response_size (docs/security.md, "Sizing the limits"). It reports false when that made
// the item a failure. The bodies are what a batch holds
// until it answers, and what its answer is made of, so counting them as
// they come bounds both before the memory runs out; the answer's own
// members are small beside them, and bounded by max_items.
//
// An item left out fails, so that an all-or-nothing batch fails and a
// write batch is undone; except a partial batch's write that took
// effect: calling it failed would tell the client that a write which
// happened did not, and invite it to send it again.
func (b *answerBudget) keep(it *ItemResult, st *itemState, copies int, allOrNothing bool) bool {
	size := int64(len(it.Body) + len(it.BodyText))
	if size == 0 {
		return true
	}
	// A repeated id's body is held once, but written once for each time
	// the batch names it (copies).
	if b.reserve(size * int64(copies)) {
		return true
	}
	it.Body, it.BodyText = nil, ""
	what := strconv.FormatInt(size, 10) + " bytes"
	if copies > 1 {
		what += fmt.Sprintf(", once for each of the %d times the batch names the id", copies)
	}
	it.Error = joinReasons(it.Error, fmt.Sprintf(
		"the batch's answer would pass max_response_size (%d bytes) with this item's body (%s), so the body is left out",
		b.max, what))
	if it.Outcome == Succeeded && st.tgt.kind.Writes() && !allOrNothing {
		return true
	}
	if it.Outcome == Succeeded {
		it.Outcome = Failed
	}
	st.failure = true
	return false
}

// copies counts the items of the batch that share item i's answer: i
// itself and the later items of a batch GET that name its id again.
func (p *Plan) copies(i int) int {
	n := 1
	for j := i + 1; j < len(p.Items); j++ {
		if p.Items[j].firstWithID == i {
			n++
		}
	}
	return n
}

// reserve adds n bytes to the batch's answer, unless they would take it
// past max_response_size.
func (b *answerBudget) reserve(n int64) bool {
	for {
		held := b.held.Load()
		if held+n > b.max {
			return false
		}
		if b.held.CompareAndSwap(held, held+n) {
			return true
		}
	}
}
