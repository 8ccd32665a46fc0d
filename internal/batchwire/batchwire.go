// Package batchwire is a batch response as a client decodes it, for the
// tests. It is written from the contract's wire format, not from the
// engine's own types, so that a member the engine renames or drops fails
// the tests instead of changing with them.
package batchwire

import "encoding/json"

// Response is a batch answer: the envelope, with the problem details
// members when the batch failed all-or-nothing.
type Response struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`

	Atomicity string `json:"atomicity"`
	Outcome   string `json:"outcome"`
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"`
	// Saga names the saga whose lease the gateway lost.
	Saga  string `json:"saga"`
	Items []Item `json:"items"`
}

// Item is one item of a batch answer.
type Item struct {
	Index int `json:"index"`
	// Op, Method and URL name an envelope's operation.
	Op           string            `json:"op"`
	Method       string            `json:"method"`
	URL          string            `json:"url"`
	ID           string            `json:"id"`
	Status       int               `json:"status"`
	Outcome      string            `json:"outcome"`
	Body         json.RawMessage   `json:"body"`
	BodyText     string            `json:"body_text"`
	Headers      map[string]string `json:"headers"`
	Error        string            `json:"error"`
	Compensation *Compensation     `json:"compensation"`
}

// Compensation is the request that undid an item, or tried to.
type Compensation struct {
	Method   string `json:"method"`
	Path     string `json:"path"`
	Status   int    `json:"status"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error"`
	// Found is what the proof read showed, when the undo was not sent,
	// or what the read that resolved an unknown write found.
	Found json.RawMessage `json:"found"`
}

// Outcomes lists the items' outcomes, in answer order.
func (r Response) Outcomes() []string {
	return each(r.Items, func(it Item) string { return it.Outcome })
}

// Statuses lists the items' statuses, in answer order.
func (r Response) Statuses() []int { return each(r.Items, func(it Item) int { return it.Status }) }

// IDs lists the items' ids, in answer order.
func (r Response) IDs() []string { return each(r.Items, func(it Item) string { return it.ID }) }

func each[T any](items []Item, f func(Item) T) []T {
	out := make([]T, len(items))
	for i, it := range items {
		out[i] = f(it)
	}
	return out
}
