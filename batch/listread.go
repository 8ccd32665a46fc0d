package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
)

// maxListTarget bounds a LIST's request target (path and query): servers
// commonly refuse 8 KiB, and some less.
const maxListTarget = 4 << 10

// ListFailure is a LIST that answered nothing the batch could use: all
// its ids were read one by one instead, and the client never sees it.
type ListFailure struct {
	// Reason is the metric's label: "no_answer", "status" or "body".
	Reason string
	// Detail says what went wrong, for the WARN line.
	Detail string
	// IDs is how many ids the LIST asked for.
	IDs int
}

// listReads read a batch's items through its resource's list filter,
// and count what those reads did, for the batch's log line and metrics.
type listReads struct {
	sender      *sender
	concurrency int
	header      http.Header // the client's, forwarded (Plan.header)
	trace       *runTrace   // nil when nothing is traced

	mu        sync.Mutex
	requests  int // LISTs sent
	fallbacks int // ids read one by one after the LISTs
	failures  []ListFailure
}

// listed is what a batch does with the items its LISTs settle.
type listed struct {
	// found gets every item a LIST answer holds, with its element.
	found func(ctx context.Context, i int, elem json.RawMessage)
	// throttled gets every item of a LIST that the upstream throttled
	// for longer than the batch could wait, with that answer and a
	// *listThrottled: the item fails with it, as its own GET would have.
	throttled func(ctx context.Context, i int, resp *SubResponse, err error)
}

// read reads the items at indices, whose ids are ids, through the resource's list
// filter (docs/list-filter.md): one LIST per group
// of ids, at most concurrency at once, each a sub-request like any other
// (a slot of max_in_flight, item_timeout), and none started once stop is
// closed. to gets the items the LISTs settle.
// read returns the indices no LIST answer held: a LIST answers only
// what the caller may see, a page may be cut short, and a LIST may fail,
// so only each item's own GET can tell what became of those.
func (l *listReads) read(ctx context.Context, t *target, indices []int, ids []string, stop <-chan struct{}, to listed) []int {
	if len(indices) == 0 {
		return nil
	}
	// The items of a batch read through a list share one target, t.
	f := t.match.Resource.List
	index := make(map[string]int, len(indices))
	for k, i := range indices {
		index[ids[k]] = i
	}
	query := t.query
	if query != "" {
		query += "&"
	}
	groups := f.Split(ids, maxListTarget-len(t.collectionPath)-len("?")-len(query))
	claims := &listClaims{held: make(map[int]bool, len(indices))}
	sent := fanOut(ctx, l.concurrency, upTo(len(groups)), stop, func(ctx context.Context, g int) {
		req := newSubRequest(l.header, t, http.MethodGet, t.collectionPath, nil, "")
		req.RawQuery = query + f.Query(groups[g])
		l.readGroup(ctx, t, req, groups[g], index, claims, to)
	})
	var rest []int
	for _, i := range indices {
		if !claims.held[i] {
			rest = append(rest, i)
		}
	}
	l.mu.Lock()
	l.requests += len(sent)
	l.fallbacks += len(rest)
	l.mu.Unlock()
	return rest
}

// listClaims give each item of a batch read through a LIST to the first
// answer that holds it: the answers of two LISTs may overlap.
type listClaims struct {
	mu   sync.Mutex
	held map[int]bool
}

func (c *listClaims) take(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[i] {
		return false
	}
	c.held[i] = true
	return true
}

// readGroup sends req, the LIST of ids (the items at index[id]), and
// hands to the items its answer settles.
func (l *listReads) readGroup(ctx context.Context, t *target, req *SubRequest, ids []string, index map[string]int, claims *listClaims, to listed) {
	sp := l.trace.listSpan(len(ids))
	resp, err := l.sender.read(ctx, t, req, sp)
	if _, ok := throttled(resp, time.Now()); ok {
		// The API asked for fewer requests: one GET per id would be many
		// more. The sender waited out every pause it could, so this one
		// fails the items at once.
		sp.endList(&ListFailure{Reason: "throttled"})
		var held *HeldBack
		errors.As(err, &held)
		cause := &listThrottled{status: resp.Status, held: held}
		for _, id := range ids {
			if i := index[id]; claims.take(i) {
				to.throttled(ctx, i, resp, cause)
			}
		}
		return
	}
	elems, failure := listElements(t, resp, err)
	sp.endList(failure)
	if failure != nil {
		failure.IDs = len(ids)
		l.mu.Lock()
		l.failures = append(l.failures, *failure)
		l.mu.Unlock()
		return
	}
	for _, elem := range elems {
		// An element that names no id of the batch is ignored: an API
		// that does not know the filter answers everything.
		if i, ok := index[t.idOf(elem)]; ok && claims.take(i) {
			to.found(ctx, i, elem)
		}
	}
}

// listThrottled is the error of an item whose LIST the upstream
// throttled for longer than max_throttle_wait or the batch's deadline
// allows; held is set when the LIST was not sent at all.
type listThrottled struct {
	status int
	held   *HeldBack
}

func (e *listThrottled) Error() string {
	if e.held != nil {
		return "the LIST that reads it (list_filter) was " + e.held.Error()
	}
	return fmt.Sprintf("the upstream throttled the LIST that reads it (list_filter), answering %d, for longer than max_throttle_wait or the batch's deadline allows: send the batch again later, after the answer's Retry-After when it has one",
		e.status)
}

func (e *listThrottled) Unwrap() error {
	if e.held == nil {
		return nil
	}
	return e.held
}

// listElements returns the elements of a LIST answer's array, or why
// there are none to use.
func listElements(t *target, resp *SubResponse, err error) ([]json.RawMessage, *ListFailure) {
	switch {
	case resp == nil:
		return nil, &ListFailure{Reason: "no_answer", Detail: asNoAnswer(err).reason}
	case err != nil:
		return nil, &ListFailure{Reason: "body", Detail: "the answer's body could not be read whole: " + err.Error()}
	case !is2xx(resp.Status):
		return nil, &ListFailure{Reason: "status", Detail: fmt.Sprintf("answered %d", resp.Status)}
	}
	elems, why := arrayAt(resp.Body, t.match.Resource.List.ItemsPointer())
	if why != "" {
		return nil, &ListFailure{Reason: "body", Detail: why}
	}
	return elems, nil
}

// arrayAt finds the array a JSON pointer (its reference tokens) names in
// a JSON text, and returns its elements as they are written.
func arrayAt(body []byte, pointer []string) ([]json.RawMessage, string) {
	raw, err := jsonvalue.At(body, pointer, "items")
	if err != nil {
		return nil, "the answer " + err.Error()
	}
	if kind := jsonvalue.Kind(raw); kind != "array" {
		return nil, fmt.Sprintf("the answer holds a JSON %s where items points, not an array", kind)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, "the answer is not JSON: " + err.Error()
	}
	return elems, ""
}

// idOf is the canonical id a JSON object names (a LIST's element, a
// write's answer), or "" when it names none: it is not an object, or has
// no id that is a string or an integer of the batch's id_format.
func (t *target) idOf(elem []byte) string {
	if jsonvalue.Kind(elem) != "object" {
		return ""
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(elem, &members) != nil {
		return ""
	}
	s := t.settings
	id, ok := jsonvalue.ID(members[s.IDField])
	if !ok {
		return ""
	}
	if canonical, err := s.IDFormat.Canonical(id); err == nil {
		return canonical
	}
	return ""
}

// idsOf are the ids of the items at indices.
func idsOf(items []ItemResult, indices []int) []string {
	ids := make([]string, len(indices))
	for k, i := range indices {
		ids[k] = items[i].ID
	}
	return ids
}

// upTo is 0, 1, …, n-1.
func upTo(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
