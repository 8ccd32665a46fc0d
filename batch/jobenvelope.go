package batch

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// An envelope job (docs/jobs.md, "Envelope jobs") is an envelope's
// operations run as a job: its body the envelope's JSON object, or JSON
// Lines of operations, read as a stream. Each operation is kept in the
// job's input as the client wrote it (its Element), with its id, method,
// url and the job indexes of the operations it depends on (Deps), so
// that a window parses it again knowing only those: an operation may
// reference one any number of windows before it, whose result the
// window is given (WindowOpts.Done).

// AdmitEnvelopeJob applies to an envelope sent as a job every input rule
// a synchronous envelope meets, with lim in place of max_items and
// max_body_size, reading its body as a stream, as AdmitJob does. In the
// JSON object, "atomicity" must come before "operations" when it is
// given: each operation is checked, as it comes, for the atomicity the
// envelope runs with.
func AdmitEnvelopeJob(r *http.Request, e *Envelope, lim JobLimits, chunk func(first int, items []ItemSnapshot) error) (*JobPlan, *problem.Details, error) {
	plan := &JobPlan{Spec: Snapshot{Version: SnapshotVersion, Op: policy.OpEnvelope.String(), Path: e.Path, Header: forwardHeader(r.Header)}}
	p := &Plan{Atomicity: e.Atomicity}
	if prob := p.chooseAtomicity(nil, r.Header, e); prob != nil {
		return nil, prob, nil
	}
	plan.Atomicity, plan.PreferenceApplied = p.Atomicity, p.PreferenceApplied
	key := newIdempotencyKey(r.Header.Get("Idempotency-Key"))
	plan.Spec.Key, plan.Spec.KeyQuoted = key.base, key.quoted
	a := newAdmission(lim, plan.Atomicity, e.Settings.AllowOverride, chunk)
	query := policy.WithoutMethodParam(r.URL.RawQuery)
	if a.atomic {
		if prob := unscopedParam(query, e.Settings); prob != nil {
			return nil, prob, nil
		}
	}
	rules := &operationRules{e: e, query: query, atomicity: plan.Atomicity, names: map[string]int{}, writers: map[string]int{}}
	return a.done(plan, query, a.envelope(r, rules, plan))
}

// envelope admits an envelope job's body: JSON Lines of operations, or
// the envelope's JSON object.
func (a *admission) envelope(r *http.Request, rules *operationRules, plan *JobPlan) *problem.Details {
	body, prob := a.open(r)
	if prob != nil {
		return prob
	}
	if isJSONLines(r.Header.Get("Content-Type")) {
		rules.noun = "line"
		prob = a.lines(body, rules)
	} else {
		prob = a.object(body, rules, plan)
	}
	switch {
	case prob != nil:
		return prob
	case a.items == 0:
		return invalid("the envelope has no operations: send one or more")
	}
	return nil
}

// object admits the envelope's JSON object: its "atomicity", then its
// "operations", an element at a time.
func (a *admission) object(body io.Reader, rules *operationRules, plan *JobPlan) *problem.Details {
	dec, bound, prob := a.decode(body, '{', "an envelope job's body is the envelope's JSON object, or JSON Lines of operations (Content-Type: application/x-ndjson)")
	if prob != nil {
		return prob
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return a.notJSON(err, dec)
		}
		name, _ := tok.(string)
		if seen[name] {
			return invalid("the envelope has %q twice", name)
		}
		seen[name] = true
		switch name {
		case "atomicity":
			if seen["operations"] {
				return invalid("the envelope's atomicity comes after its operations: in a job, put \"atomicity\" before \"operations\", which are checked for it as they come")
			}
			var member string
			if err := dec.Decode(&member); err != nil {
				return invalid("the envelope's atomicity: %v", err)
			}
			p := &Plan{Atomicity: rules.e.Atomicity}
			if prob := p.chooseAtomicity(&member, nil, rules.e); prob != nil {
				return prob
			}
			plan.Atomicity, plan.PreferenceApplied = p.Atomicity, p.PreferenceApplied
			rules.atomicity, a.atomic = p.Atomicity, p.Atomicity == policy.AllOrNothing
		case "operations":
			open, err := dec.Token()
			if err != nil {
				return a.notJSON(err, dec)
			}
			if open != json.Delim('[') {
				return invalid("the envelope's operations are a JSON %s: send an array of operations", tokenKind(open))
			}
			if prob := a.elements(dec, bound, rules); prob != nil {
				return prob
			}
		default:
			return invalid("the envelope has a member %q: it takes \"atomicity\" and \"operations\"", name)
		}
	}
	if _, err := dec.Token(); err != nil { // the object's closing brace
		return a.notJSON(err, dec)
	}
	return a.ended(dec, "object", "an envelope job's body is one JSON object")
}

// operationRules are the envelope's input rules, applied to a job's
// operations as they stream past: what they need of the operations
// before (their ids, what each depends on, the items they write) is all
// they keep.
type operationRules struct {
	e         *Envelope
	query     string
	atomicity policy.Atomicity
	// noun is "line" for JSON Lines, whose problems name the line.
	noun    string
	names   map[string]int
	deps    [][]int
	writers map[string]int
}

func (r *operationRules) snapshot(n, i int, elem json.RawMessage) (ItemSnapshot, *problem.Details) {
	it, prob := parseOperation(i, elem, r.names, r.e, r.query, r.atomicity)
	if prob != nil {
		if r.noun != "" {
			d := *prob
			d.Detail = fmt.Sprintf("%v: %s", position{r.noun, n}, d.Detail)
			return ItemSnapshot{}, &d
		}
		return ItemSnapshot{}, prob
	}
	eo := it.operation
	r.deps = append(r.deps, eo.deps)
	if key := writeKey(it.tgt, it.ID); key != "" {
		if w, ok := r.writers[key]; ok && !r.dependsOn(i, w) {
			d := *sameItem(eo.id, r.idOf(w), key)
			return ItemSnapshot{}, &d
		}
		r.writers[key] = i
	}
	return ItemSnapshot{OperationID: eo.id, Method: eo.method, URL: eo.url, Deps: eo.deps, Element: elem, Outcome: NotAttempted}, nil
}

// dependsOn is Plan.dependsOn over the operations admitted so far.
func (r *operationRules) dependsOn(i, j int) bool {
	return waitsFor(func(k int) []int { return r.deps[k] }, i, j)
}

// idOf is the id of operation j.
func (r *operationRules) idOf(j int) string {
	for name, k := range r.names {
		if k == j {
			return name
		}
	}
	return fmt.Sprint(j)
}

// envelopeWindowPlan is the plan of an envelope job's window, which
// begins at the window's first item (w.Base) whether or not it is
// carried on, so that the indexes its operations' dependencies are
// recorded with stay the same. An operation its log recorded is made
// again from the record, as a saga resumed is (resumeOperation); one
// that has not started is parsed again from its input, its references
// to operations before the window named outside, and given their
// results (o.Done); unless parse is false (the window is only undone),
// when it stays a name that never runs.
func envelopeWindowPlan(w *Snapshot, env *Envelope, o WindowOpts, allOrNothing, parse bool) (*Plan, error) {
	if env == nil || env.Path != w.Path {
		return nil, fmt.Errorf("%w: no envelope is configured at %s", ErrNotResumable, w.Path)
	}
	p := &Plan{
		Op: policy.OpEnvelope, Envelope: env.Path, lookup: env.Lookup, settings: env.Settings, Atomicity: policy.Partial,
		Items:  make([]Item, len(w.Items)),
		header: w.Header,
		key:    idempotencyKey{base: w.Key, quoted: w.KeyQuoted},
		window: &windowing{base: w.Base, keepBody: o.KeepBody, before: o.Done},
	}
	if allOrNothing {
		p.Atomicity = policy.AllOrNothing
	}
	if p.header == nil {
		p.header = http.Header{}
	}
	index := func(j int) int {
		if j >= w.Base {
			return j - w.Base
		}
		return outside(j)
	}
	nameOf := func(j int) (string, error) {
		if j >= w.Base && j-w.Base < len(w.Items) {
			return w.Items[j-w.Base].OperationID, nil
		}
		if r, ok := o.Done[j]; ok && j < w.Base {
			return r.OperationID, nil
		}
		return "", fmt.Errorf("%w: operation %d, which an operation of the window depends on, has no result given", ErrNotResumable, j)
	}
	for i, s := range w.Items {
		it := Item{ID: s.ID, firstWithID: i}
		switch {
		case s.Phase > 0:
			it.Body = s.Element
			if err := it.resumeOperation(s, env.Lookup); err != nil {
				return nil, err
			}
		case !parse:
			it.operation = &envelopeOperation{id: s.OperationID, method: s.Method, url: s.URL}
		default:
			names := make(map[string]int, len(s.Deps))
			deps := make([]int, 0, len(s.Deps))
			for _, j := range s.Deps {
				name, err := nameOf(j)
				if err != nil {
					return nil, err
				}
				names[name] = index(j)
				deps = append(deps, index(j))
			}
			parsed, prob := parseOperation(i, s.Element, names, env, w.Query, p.Atomicity)
			if prob != nil {
				return nil, fmt.Errorf("%w: operation %q: %s", ErrNotResumable, s.OperationID, prob.Detail)
			}
			it = parsed
			// depends_on named operations the names above hold only
			// by index: the stored dependencies are all of them.
			it.operation.deps = sortedUnique(append(it.operation.deps, deps...))
		}
		p.Items[i] = it
	}
	if prob := p.orderWrites(); prob != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotResumable, prob.Detail)
	}
	return p, nil
}
