package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Envelope is a handler's batch across resources (docs/envelope.md): a
// POST on its path carries single-item operations on the handler's
// resources, with references between them, run as one batch.
type Envelope struct {
	// Path is the envelope's own path, which matches no resource.
	Path string
	// Settings are the handler's own, which bound the envelope as a
	// resource's bound its batches: max_items, max_body_size,
	// concurrency, batch_timeout, max_response_size, allow_override,
	// scope_query. Each operation's own requests follow its resource's.
	Settings policy.Settings
	// Atomicity is the handler's top-level atomicity: resources' own
	// settings govern their batches, not envelopes.
	Atomicity policy.Atomicity
	// Lookup finds the resource of an operation's path.
	Lookup func(escapedPath string) (policy.Match, bool)
}

// envelopeOperation is one element of an envelope's "operations", as
// the client sent it, with what its references need to fill it in. (A
// policy.Op is what it does: its kind.)
type envelopeOperation struct {
	id     string // the client's id of it
	method string
	url    string // as the client sent it
	// segs are the url's path segments, escaped; a segment that is a
	// reference is in refs instead, by position.
	segs  []string
	refs  map[int]reference
	query string // the envelope's query and the url's own
	// body is the body decoded, when it holds references (or escaped
	// dollars) to fill in; nil when it is sent as the client wrote it.
	body any
	// deps are the operations it waits for, by index, ascending: those it
	// references and those it names in depends_on.
	deps     []int
	resource *policy.Resource
	kind     policy.Op
}

// envelopeBody is an envelope's JSON body.
type envelopeBody struct {
	Atomicity  *string           `json:"atomicity"`
	Operations []json.RawMessage `json:"operations"`
}

// operationBody is one operation's JSON.
type operationBody struct {
	ID        string          `json:"id"`
	Method    string          `json:"method"`
	URL       string          `json:"url"`
	Body      json.RawMessage `json:"body"`
	DependsOn []string        `json:"depends_on"`
}

// AdmitEnvelope applies the envelope's input rules (docs/envelope.md,
// "Bad input") to a POST on its path, reading the body once: it returns
// the plan, or the problem to answer with before anything is sent.
func AdmitEnvelope(r *http.Request, e *Envelope) (*Plan, *problem.Details) {
	s := e.Settings
	body, prob := readBody(r, s)
	if prob != nil {
		return nil, prob
	}
	var env envelopeBody
	if err := decodeStrict(body, &env); err != nil {
		return nil, invalid("the envelope is not valid: %v; send a JSON object with an \"operations\" array", err)
	}
	switch {
	case len(env.Operations) == 0:
		return nil, invalid("the envelope has no operations: send one or more in \"operations\"")
	case len(env.Operations) > s.MaxItems:
		d := problem.New(http.StatusRequestEntityTooLarge, "too-many-items",
			fmt.Sprintf("the envelope has %d operations; max_items allows at most %d", len(env.Operations), s.MaxItems))
		return nil, &d
	}
	p := &Plan{
		Op:        policy.OpEnvelope,
		Atomicity: e.Atomicity,
		Envelope:  e.Path,
		lookup:    e.Lookup,
		settings:  s,
		header:    forwardHeader(r.Header),
		key:       newIdempotencyKey(r.Header.Get("Idempotency-Key")),
		Items:     make([]Item, len(env.Operations)),
	}
	digest := sha256.Sum256(body)
	p.bodyDigest = digest[:]
	if prob := p.chooseAtomicity(env.Atomicity, r.Header, e); prob != nil {
		return nil, prob
	}
	query := policy.WithoutMethodParam(r.URL.RawQuery)
	if p.Atomicity == policy.AllOrNothing {
		if prob := unscopedParam(query, s); prob != nil {
			return nil, prob
		}
	}
	names := make(map[string]int, len(env.Operations))
	for i, raw := range env.Operations {
		it, prob := parseOperation(i, raw, names, e, query, p.Atomicity)
		if prob != nil {
			return nil, prob
		}
		p.Items[i] = it
	}
	if prob := p.orderWrites(); prob != nil {
		return nil, prob
	}
	return p, nil
}

// orderWrites refuses two operations that write one item whose urls name
// it, unless the later depends on the earlier: they would race, and their
// undos could not tell whose write they prove. The later's pre-image is
// read just before it is written, after the earlier's write.
func (p *Plan) orderWrites() *problem.Details {
	writer := map[string]int{}
	for i := range p.Items {
		it := &p.Items[i]
		key := writeKey(it.tgt, it.ID)
		if key == "" {
			continue
		}
		if w, ok := writer[key]; ok {
			if !p.dependsOn(i, w) {
				return sameItem(it.operation.id, p.Items[w].operation.id, key)
			}
			it.rewrite = true
		}
		writer[key] = i
	}
	return nil
}

// writeKey names item id that a request to t writes, as its lock names
// it (policy.ItemPaths.Key); "" when t does not write, or is not known
// yet, or the item's id is not.
func writeKey(t *target, id string) string {
	if t == nil || !t.kind.Writes() || id == "" {
		return ""
	}
	return t.paths.Key(id)
}

// dependsOn reports whether operation i waits, directly or not, for
// operation j. Each operation is looked at once: the graph's paths can be
// exponentially many, its operations are at most max_items.
func (p *Plan) dependsOn(i, j int) bool {
	return waitsFor(func(k int) []int { return p.Items[k].operation.deps }, i, j)
}

// waitsFor reports whether operation i waits, directly or not, for
// operation j, deps(k) being those operation k waits for (before it);
// one before a job's window (a negative index) waits for nothing in it.
func waitsFor(deps func(k int) []int, i, j int) bool {
	seen := make([]bool, i+1)
	var reaches func(k int) bool
	reaches = func(k int) bool {
		for _, d := range deps(k) {
			if d < 0 {
				continue
			}
			if d == j || d > j && !seen[d] && reaches(d) {
				return true
			}
			seen[d] = true
		}
		return false
	}
	return reaches(i)
}

func sameItem(later, earlier, key string) *problem.Details {
	return invalid("operations %q and %q both write %s, and %q does not depend on %q: make it wait for it (depends_on), or write the item once",
		later, earlier, key, later, earlier)
}

// chooseAtomicity applies the envelope's atomicity member, or the
// client's Prefer header, where allow_override lets the client choose.
func (p *Plan) chooseAtomicity(member *string, h http.Header, e *Envelope) *problem.Details {
	if member == nil {
		if a, ok := preferredAtomicity(h); ok && e.Settings.AllowOverride {
			p.Atomicity, p.PreferenceApplied = a, preferenceApplied(a)
		}
		return nil
	}
	a, err := policy.ParseAtomicity(*member)
	switch {
	case err != nil:
		return invalid("the envelope's atomicity: %v", err)
	case a != e.Atomicity && !e.Settings.AllowOverride:
		return invalid("the envelope asks for atomicity %s, but envelopes here run %s and allow_override is off: leave atomicity out, or send %s",
			a, e.Atomicity, e.Atomicity)
	}
	p.Atomicity = a
	return nil
}

// operationKinds are the operations an envelope may hold, by method: the
// batch operation each is of one item.
var operationKinds = map[string]policy.Op{
	http.MethodGet:    policy.OpGet,
	http.MethodPost:   policy.OpCreate,
	http.MethodPatch:  policy.OpUpdate,
	http.MethodPut:    policy.OpUpdate,
	http.MethodDelete: policy.OpDelete,
}

// parseOperation applies the input rules to operation i: its id, method,
// url (its resource, its kind, the method map) and body, and the
// references and dependencies that name earlier operations.
func parseOperation(i int, raw json.RawMessage, names map[string]int, e *Envelope, envQuery string, a policy.Atomicity) (Item, *problem.Details) {
	var ob operationBody
	if err := decodeStrict(raw, &ob); err != nil {
		return Item{}, invalid("operation %d is not valid: %v", i, err)
	}
	if !validOperationID(ob.ID) {
		return Item{}, invalid("operation %d: its id %q must be one or more of A-Z, a-z, 0-9, _ and -", i, ob.ID)
	}
	if j, dup := names[ob.ID]; dup {
		return Item{}, invalid("operations %d and %d both have id %q: each operation's id must be unique", j, i, ob.ID)
	}
	eo := &envelopeOperation{id: ob.ID, method: ob.Method, url: ob.URL}
	bad := func(format string, args ...any) (Item, *problem.Details) {
		return Item{}, invalid("operation %q: %s", ob.ID, fmt.Sprintf(format, args...))
	}
	kind, ok := operationKinds[ob.Method]
	if !ok {
		return bad("the method %q is not an operation's: use GET, PUT, PATCH or DELETE on an item, POST on a collection", ob.Method)
	}
	eo.kind = kind
	if prob := eo.parseURL(names); prob != nil {
		return bad("%s", prob)
	}
	if prob := eo.dropMethodOverride(); prob != nil {
		return Item{}, prob
	}
	m, ok := e.Lookup(eo.path())
	eo.query = joinNonEmpty("&", envQuery, eo.query)
	if prob := eo.fits(m, ok, a); prob != nil {
		return Item{}, prob
	}
	eo.resource = m.Resource
	for _, name := range ob.DependsOn {
		j, ok := names[name]
		if !ok {
			return bad("depends_on names %q, which is no earlier operation: an operation may wait only for those before it", name)
		}
		eo.deps = append(eo.deps, j)
	}
	it := Item{firstWithID: i, operation: eo}
	if prob := eo.parseBody(&it, ob.Body, names); prob != nil {
		return bad("%s", prob)
	}
	eo.deps = sortedUnique(eo.deps)
	names[ob.ID] = i
	if len(eo.refs) == 0 {
		// The url names its item already: it is checked, locked and
		// preflighted as a batch's would be.
		t, id, err := eo.target(m)
		if err == nil {
			id, err = elementID(t, it.Body, id)
		}
		if err != nil {
			return bad("%s", err)
		}
		it.tgt, it.ID = t, id
	}
	return it, nil
}

// fits checks that the operation may go where its url points (m, when
// ok): the kind of path its method goes to, a method the map allows,
// and, in an all-or-nothing envelope, a query it may carry and an undo
// the map allows.
func (eo *envelopeOperation) fits(m policy.Match, ok bool, a policy.Atomicity) *problem.Details {
	bad := func(format string, args ...any) *problem.Details {
		return invalid("operation %q: %s", eo.id, fmt.Sprintf(format, args...))
	}
	switch {
	case !ok:
		return bad("the url %s matches no resource of this gateway", eo.url)
	case eo.kind == policy.OpCreate && m.Item:
		return bad("POST goes to a collection, and %s is an item of %s", eo.url, m.Resource.Collection)
	case eo.kind != policy.OpCreate && !m.Item:
		return bad("%s goes to an item, and %s is the collection %s", eo.method, eo.url, m.Resource.Collection)
	}
	if method, _ := policy.ParseMethod(eo.method); !m.Methods().Has(method) {
		d := problem.New(http.StatusMethodNotAllowed, "method-not-allowed",
			fmt.Sprintf("operation %q: %s is not allowed on %s; allowed: %s", eo.id, eo.method, eo.url, m.Allow()))
		return &d
	}
	if a == policy.AllOrNothing && eo.kind.Writes() {
		if prob := unscopedParam(eo.query, m.Resource.Settings); prob != nil {
			return bad("%s", prob.Detail)
		}
		if missing, how := m.Resource.UndoMissing(eo.kind); missing != "" {
			return bad("an all-or-nothing envelope undoes it if the envelope fails (%s), and the map of %s does not allow %s: allow it, or send the envelope as partial",
				how, m.Resource.Collection, missing)
		}
	}
	return nil
}

// parseURL takes the url apart: its path's segments, the references
// among them, and its query.
func (eo *envelopeOperation) parseURL(names map[string]int) error {
	if !strings.HasPrefix(eo.url, "/") || strings.HasPrefix(eo.url, "//") {
		return fmt.Errorf("the url %q must be a path on this gateway, like /api/users/7", eo.url)
	}
	u, err := url.Parse(eo.url)
	switch {
	case err != nil:
		return fmt.Errorf("the url %q is not a path and query: %v", eo.url, err)
	case strings.Contains(eo.url, "#"):
		return fmt.Errorf("the url %q has a #: a member of an answer stands in a url segment percent-encoded, as $op%%23%%2Fname for $op#/name", eo.url)
	}
	eo.query = u.RawQuery
	eo.segs = strings.Split(u.EscapedPath()[1:], "/")
	for k, seg := range eo.segs {
		text, err := url.PathUnescape(seg)
		if err != nil {
			return fmt.Errorf("the url %q is not valid percent-encoding", eo.url)
		}
		ref, isRef, err := parseReference(text, names)
		switch {
		case err != nil:
			return fmt.Errorf("the url's segment %q %w", text, err)
		case !isRef && text != "" && badID(text) != "":
			return fmt.Errorf("the url's segment %q %s", text, badID(text))
		case isRef:
			if eo.refs == nil {
				eo.refs = map[int]reference{}
			}
			eo.refs[k] = ref
			eo.deps = append(eo.deps, ref.operation)
		case strings.HasPrefix(text, "$$"):
			eo.segs[k] = url.PathEscape(text[1:])
		}
	}
	return nil
}

// dropMethodOverride takes the _method parameter out of the operation's
// query: an upstream that reads it (Rails, Laravel, Symfony) would turn
// the request into another, and an operation's method is its "method"
// member, the gateway's to send. One that names that same method is
// dropped, as a single request's is; one that names another is refused,
// since the client asked for something the gateway will not send.
func (eo *envelopeOperation) dropMethodOverride() *problem.Details {
	o, ok, err := policy.FindQueryMethodOverride(eo.query)
	switch {
	case err != nil:
		return methodOverrideRefused(fmt.Sprintf("operation %q: its url's %s parameters name different methods; an operation is sent as its \"method\" alone: drop %s from its url",
			eo.id, policy.MethodParam, policy.MethodParam))
	case ok && o.Method != eo.method:
		return methodOverrideRefused(fmt.Sprintf("operation %q: its url's %s parameter names %s, but its method is %s; an operation is sent as its \"method\" alone: put %s in \"method\", or drop %s from its url",
			eo.id, policy.MethodParam, o.Method, eo.method, o.Method, policy.MethodParam))
	}
	eo.query = policy.WithoutMethodParam(eo.query)
	return nil
}

func methodOverrideRefused(detail string) *problem.Details {
	d := problem.New(http.StatusBadRequest, "invalid-method-override", detail)
	return &d
}

// path is the operation's path, with each reference left as the client
// wrote it: it matches the resource the filled path will, since a
// reference stands for a whole segment.
func (eo *envelopeOperation) path() string {
	path, _ := eo.pathWith(func(ref reference) (string, error) { return ref.text, nil })
	return path
}

// pathWith is the operation's path, each reference segment the escaped
// text fill gives it.
func (eo *envelopeOperation) pathWith(fill func(reference) (string, error)) (string, error) {
	segs := slices.Clone(eo.segs)
	for k, ref := range eo.refs {
		text, err := fill(ref)
		if err != nil {
			return "", err
		}
		segs[k] = url.PathEscape(text)
	}
	return "/" + strings.Join(segs, "/"), nil
}

// parseBody checks the operation's body, and finds the references in it.
func (eo *envelopeOperation) parseBody(it *Item, raw json.RawMessage, names map[string]int) error {
	raw = bytes.TrimSpace(raw)
	hasBody := len(raw) > 0 && string(raw) != "null"
	switch {
	case !eo.kind.Writes() || eo.kind == policy.OpDelete:
		if hasBody {
			return fmt.Errorf("a %s operation has no body", eo.method)
		}
		return nil
	case !hasBody:
		return fmt.Errorf("a %s operation needs a body: a JSON object", eo.method)
	case jsonvalue.Kind(raw) != "object":
		return fmt.Errorf("its body must be a JSON object, not a JSON %s", jsonvalue.Kind(raw))
	}
	v, ok := jsonvalue.Decode(raw)
	if !ok {
		return fmt.Errorf("its body is not valid JSON")
	}
	marked, deps, err := markReferences(v, names)
	if err != nil {
		return err
	}
	eo.deps = append(eo.deps, deps...)
	filled := len(deps) > 0 || bytes.Contains(raw, []byte(`"$$`))
	for name := range v.(map[string]any) {
		it.fields = append(it.fields, name)
	}
	if filled {
		eo.body = marked
	} else {
		it.Body = raw
	}
	return nil
}

// target settles where the operation's requests go once its url (matched
// by m) names its item: the item's collection and, for an item, its id
// (canonical under the resource's id_format; "" for a create). It returns
// why it cannot.
func (eo *envelopeOperation) target(m policy.Match) (*target, string, error) {
	coll, id := m.CollectionAndID()
	t := newTarget(eo.kind, eo.method, coll, eo.query)
	if !m.Item {
		return t, "", nil
	}
	if reason := badID(id); reason != "" {
		return nil, "", fmt.Errorf("its item's id %q %s", id, reason)
	}
	canonical, err := m.Resource.Settings.IDFormat.Canonical(id)
	if err != nil {
		return nil, "", err
	}
	return t, canonical, nil
}

// elementID is the id of the item a request to t with body writes: for a
// create whose body names an id (like a batch create's element's, proved
// free before anything is written), that id, canonical; else id.
func elementID(t *target, body []byte, id string) (string, error) {
	if t.kind != policy.OpCreate || body == nil {
		return id, nil
	}
	s := t.settings
	var members map[string]json.RawMessage
	_ = json.Unmarshal(body, &members) // parseBody checked it is an object
	raw, ok := members[s.IDField]
	switch {
	case !ok:
		return id, nil
	case string(raw) == "null":
		// As a batch element's: the client may have meant an id it
		// failed to fill in.
		return "", fmt.Errorf("its body's %q is null; leave it out for the API to assign one, or give a string or an integer", s.IDField)
	}
	named, ok := jsonvalue.ID(raw)
	if !ok {
		return "", fmt.Errorf("its body's %q must be a string or an integer, not a JSON %s", s.IDField, jsonvalue.Kind(raw))
	}
	if reason := badID(named); reason != "" {
		return "", fmt.Errorf("its body's %q, %q, %s", s.IDField, named, reason)
	}
	canonical, err := s.IDFormat.Canonical(named)
	if err != nil {
		return "", fmt.Errorf("its body's %q: %w", s.IDField, err)
	}
	return canonical, nil
}

// validOperationID reports whether name is an operation id: one or more of
// A-Z, a-z, 0-9, _ and -, so that it can stand in a url segment and a
// JSON string as a reference without escaping.
func validOperationID(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// decodeStrict decodes JSON into v, refusing members v does not have: a
// misspelt depends_on must not silently run operations out of order.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

// sortedUnique sorts indices and drops repeats.
func sortedUnique(xs []int) []int {
	slices.Sort(xs)
	return slices.Compact(xs)
}
