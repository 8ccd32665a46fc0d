package batch

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"net/http"

	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// JobLimits bound what a bulk job may be given; each is at least 1.
type JobLimits struct {
	// MaxItems is the most items a job may have (max_job_items).
	MaxItems int
	// MaxAtomic is the most items an all-or-nothing job may have
	// (max_atomic_job_items): it holds every item's lock and pre-image
	// for its whole run.
	MaxAtomic int
	// MaxBody is the most bytes a job's body may have
	// (max_job_body_size).
	MaxBody int64
	// MaxElement is the most bytes one element may have: the resource's
	// max_body_size, since an element is a sub-request's body.
	MaxElement int64
}

// A job's items are handed over in chunks of at most chunkItems items,
// and of at most chunkBytes of elements unless one element is larger:
// what a caller stores in one write, and holds at once.
const (
	chunkItems = 1000
	chunkBytes = 1 << 20
)

// JobPlan is a bulk job that passed every input rule: what it is, without
// its items, which AdmitJob handed to its chunk function as they came.
type JobPlan struct {
	// Spec is the job as its items' Snapshot would say it (operation,
	// path, query, forwarded header, Idempotency-Key), with no Items.
	Spec              Snapshot
	Atomicity         policy.Atomicity
	PreferenceApplied string
	// Items is how many items the job has.
	Items int
	// Digest is the SHA-256 of the job's elements as JSON Lines: each
	// element as the client sent it, without the white space around it,
	// followed by "\n". An array and JSON Lines of the same elements
	// have the same digest, whatever their white space and blank lines;
	// a GET or DELETE job's is that of nothing, as its ids are in its
	// query. It is what an Idempotency-Key's fingerprint needs of the
	// body.
	Digest []byte
}

// AdmitJob applies to a bulk job on the collection m matched, of the
// operation op, every input rule a synchronous batch meets
// (docs/wire-format.md, "Bad input"), with lim in place of max_items and
// max_body_size, and reads its body as a stream, never whole: a JSON
// array, or JSON Lines (Content-Type application/x-ndjson or
// application/jsonl: an element a line; a blank line is skipped but
// counted, a line may end in CRLF, and the last needs no line end). A
// GET or DELETE job takes its ids from the query, as a synchronous one
// does.
//
// The items go to chunk as they are admitted, in request order, first
// being the index of the chunk's first item in the job: each chunk holds
// at most 1,000 items and about 1 MiB of elements, and chunk may keep
// it. The items are what a Snapshot of the same batch holds. A body
// refused part way has had its first chunks handed over: the caller
// drops them.
//
// A refusal is a problem to answer with: 400 names the element, by
// "line N" in JSON Lines (from 1, blank lines counted) and "item N" in
// an array (its index from 0, as a synchronous batch names it); 413 is
// past a limit of lim, and names an element larger than MaxElement in
// the same way (a JSON Lines line is measured without its line end, and
// neither is read further than MaxElement and a little); 415 is a body
// that is neither JSON nor JSON Lines, or is encoded. When chunk fails, the
// admission stops: the problem is a 503 (storage-unavailable, nothing
// was started) and the error is chunk's, for the caller's log.
func AdmitJob(r *http.Request, m policy.Match, op policy.Op, lim JobLimits, chunk func(first int, items []ItemSnapshot) error) (*JobPlan, *problem.Details, error) {
	if prob := disabled(op, m); prob != nil {
		return nil, prob, nil
	}
	s := m.Resource.Settings
	header := forwardHeader(r.Header) // without respond-async: the job's, not its requests'
	plan := &JobPlan{Spec: Snapshot{Version: SnapshotVersion, Op: op.String(), Path: m.Path(), Header: header}}
	plan.Atomicity, plan.PreferenceApplied = atomicityOf(r.Header, op, s)
	if op.Writes() {
		key := newIdempotencyKey(r.Header.Get("Idempotency-Key"))
		plan.Spec.Key, plan.Spec.KeyQuoted = key.base, key.quoted
	}
	a := newAdmission(lim, plan.Atomicity, s.AllowOverride, chunk)
	query, prob := a.admit(r, op, s)
	return a.done(plan, query, prob)
}

func newAdmission(lim JobLimits, atomicity policy.Atomicity, allowOverride bool, chunk func(first int, items []ItemSnapshot) error) *admission {
	return &admission{lim: lim, atomic: atomicity == policy.AllOrNothing, allowOverride: allowOverride,
		digest: sha256.New(), chunks: chunker{send: chunk}}
}

// done hands the last chunk over, and completes plan with what was
// admitted; or answers prob, the admission's refusal.
func (a *admission) done(plan *JobPlan, query string, prob *problem.Details) (*JobPlan, *problem.Details, error) {
	if prob == nil {
		prob = a.chunks.flush()
	}
	if prob != nil {
		return nil, prob, a.chunks.err
	}
	plan.Spec.Query, plan.Items, plan.Digest = query, a.items, a.digest.Sum(nil)
	return plan, nil, nil
}

// JobOp tells whether r, a request to a collection that asked for
// Prefer: respond-async, starts a bulk job, and of which operation: a
// POST (create) or PATCH (update) whose body is JSON Lines, or any
// request a synchronous batch would be (detectOp: a POST or PATCH of a
// JSON array, a DELETE, a GET with the ids parameter). Anything else, a
// single create or a LIST, is no job and passes on as it came: a body
// read to decide is put back.
func JobOp(r *http.Request, res *policy.Resource) (policy.Op, bool, error) {
	if isJSONLines(r.Header.Get("Content-Type")) {
		switch r.Method {
		case http.MethodPost:
			return policy.OpCreate, true, nil
		case http.MethodPatch:
			return policy.OpUpdate, true, nil
		}
	}
	return detectOp(r, res)
}

// admission is one job's items as they stream past: how many came, the
// digest of their elements, and the chunk being filled.
type admission struct {
	lim           JobLimits
	atomic        bool // all-or-nothing: MaxAtomic applies
	allowOverride bool // the client may ask for partial
	items         int
	digest        hash.Hash
	chunks        chunker
}

// admit reads the job's ids or body, and returns the query its
// sub-requests carry.
func (a *admission) admit(r *http.Request, op policy.Op, s policy.Settings) (string, *problem.Details) {
	if op == policy.OpGet || op == policy.OpDelete {
		return a.ids(r.URL.RawQuery, op, s)
	}
	query := policy.WithoutMethodParam(r.URL.RawQuery)
	if a.atomic {
		if prob := unscopedParam(query, s); prob != nil {
			return "", prob
		}
	}
	return query, a.body(r, op, s)
}

// ids admits a GET or DELETE job's ids, from its query, and returns the
// rest of the query.
func (a *admission) ids(rawQuery string, op policy.Op, s policy.Settings) (string, *problem.Details) {
	ids, query, prob := idsFromQuery(rawQuery, s, countLimit{a.lim.MaxItems, "max_job_items"})
	if prob != nil {
		return "", prob
	}
	items, prob := itemsFromIDs(ids, op, s.IDFormat)
	if prob != nil {
		return "", prob
	}
	if a.atomic && op.Writes() {
		if prob := unscopedParam(query, s); prob != nil {
			return "", prob
		}
	}
	for _, it := range items {
		if prob := a.room(); prob != nil {
			return "", prob
		}
		a.items++
		if prob := a.chunks.add(it.plannedSnapshot()); prob != nil {
			return "", prob
		}
	}
	return query, nil
}

// open is the job's body, bounded by max_job_body_size, once its size
// and type are a job's.
func (a *admission) open(r *http.Request) (io.Reader, *problem.Details) {
	limit := a.bodyLimit()
	if prob := refusedBody(r, limit, isJobBody, "JSON (application/json) or JSON Lines (application/x-ndjson, application/jsonl)"); prob != nil {
		return nil, prob
	}
	if r.Body == nil {
		return http.NoBody, nil
	}
	return http.MaxBytesReader(nil, r.Body, limit.most), nil
}

// body admits a CREATE or UPDATE job's elements, from its body.
func (a *admission) body(r *http.Request, op policy.Op, s policy.Settings) *problem.Details {
	body, prob := a.open(r)
	if prob != nil {
		return prob
	}
	if isJSONLines(r.Header.Get("Content-Type")) {
		prob = a.lines(body, newElementRules(op, s, "line"))
	} else {
		prob = a.array(body, newElementRules(op, s, "item"))
	}
	switch {
	case prob != nil:
		return prob
	case a.items == 0:
		return invalid("the job is empty: send one or more items")
	}
	return nil
}

func (a *admission) bodyLimit() sizeLimit { return sizeLimit{a.lim.MaxBody, "max_job_body_size"} }

// readFailure is the problem of a body that could not be read: past
// limit, or cut off.
func readFailure(err error, limit sizeLimit) *problem.Details {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return limit.tooLarge()
	}
	return invalid("reading the body: %v", err)
}

// lines admits a JSON Lines body, a line at a time.
func (a *admission) lines(body io.Reader, rules itemRules) *problem.Details {
	in := bufio.NewReaderSize(body, 64<<10)
	var line []byte // reused: an element is copied out of it
	for n := 1; ; n++ {
		var err error
		line, err = readLine(in, line[:0], a.lim.MaxElement)
		switch {
		case errors.Is(err, errLineTooLong):
			return a.elementTooLarge(position{"line", n})
		case err != nil && err != io.EOF:
			return readFailure(err, a.bodyLimit())
		}
		if elem := bytes.Trim(line, jsonSpace); len(elem) > 0 {
			if prob := a.element(rules, n, bytes.Clone(elem)); prob != nil {
				return prob
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// jsonSpace is JSON's white space (RFC 8259, section 2); bytes.TrimSpace
// would also take Unicode's, which no JSON value may start with.
const jsonSpace = " \t\r\n"

// errLineTooLong is readLine's error for a line longer than its most.
var errLineTooLong = errors.New("line too long")

// readLine appends to buf the next line of in without its line end
// ("\n" or "\r\n"), and returns it, with io.EOF for the last line (which
// may be empty). A line longer than most bytes is not read further:
// errLineTooLong.
func readLine(in *bufio.Reader, buf []byte, most int64) ([]byte, error) {
	for {
		frag, err := in.ReadSlice('\n')
		buf = append(buf, frag...)
		if err == bufio.ErrBufferFull {
			if int64(len(buf)) > most+int64(len("\r\n")) { // the line end may still come
				return buf, errLineTooLong
			}
			continue
		}
		buf = bytes.TrimSuffix(bytes.TrimSuffix(buf, []byte("\n")), []byte("\r"))
		if int64(len(buf)) > most {
			return buf, errLineTooLong
		}
		return buf, err
	}
}

// array admits a JSON array body, an element at a time.
func (a *admission) array(body io.Reader, rules itemRules) *problem.Details {
	dec, bound, prob := a.decode(body, '[', "a job's body is a JSON array of objects, or JSON Lines of objects (Content-Type: application/x-ndjson)")
	if prob != nil {
		return prob
	}
	if prob := a.elements(dec, bound, rules); prob != nil {
		return prob
	}
	return a.ended(dec, "array", "a job's body is one JSON array")
}

// decode opens body, a JSON value that opens with open (what says what
// the body must be), to be read an element at a time.
func (a *admission) decode(body io.Reader, open json.Delim, what string) (*json.Decoder, *elementBound, *problem.Details) {
	bound := &elementBound{r: body, most: a.lim.MaxElement + elementSlack}
	dec := json.NewDecoder(bound)
	tok, err := dec.Token()
	switch {
	case err == io.EOF:
		return nil, nil, invalid("the body is empty; %s", what)
	case err != nil:
		return nil, nil, a.notJSON(err, dec)
	case tok != open:
		return nil, nil, invalid("the body is a JSON %s; %s", tokenKind(tok), what)
	}
	return dec, bound, nil
}

// ended refuses a body that goes on after its value, a JSON kind (what
// says what the body must be).
func (a *admission) ended(dec *json.Decoder, kind, what string) *problem.Details {
	if _, err := dec.Token(); err != io.EOF {
		if err != nil {
			return a.notJSON(err, dec)
		}
		return invalid("the body goes on after its %s (at byte %d): %s", kind, dec.InputOffset(), what)
	}
	return nil
}

// elements admits the elements of the array dec has just opened, and
// its closing bracket.
func (a *admission) elements(dec *json.Decoder, bound *elementBound, rules itemRules) *problem.Details {
	for i := 0; ; i++ {
		bound.start = dec.InputOffset()
		if !dec.More() {
			break
		}
		var elem json.RawMessage // its own: the item keeps it
		err := dec.Decode(&elem)
		switch {
		case errors.Is(err, errElementTooLarge) || int64(len(elem)) > a.lim.MaxElement:
			return a.elementTooLarge(itemAt(i))
		case err != nil:
			return a.notJSON(err, dec)
		}
		if prob := a.element(rules, i, elem); prob != nil {
			return prob
		}
	}
	if _, err := dec.Token(); err != nil { // the array's closing bracket
		return a.notJSON(err, dec)
	}
	return nil
}

// elementSlack is what an array's decoder may read past an element's
// most bytes before elementBound stops it: the white space and comma
// before the element, and the decoder's look-ahead.
const elementSlack = 64 << 10

// errElementTooLarge is elementBound's error.
var errElementTooLarge = errors.New("element too large")

// elementBound stops an array's decoder once it has read most bytes past
// start, where the decoder stood before the value it is decoding (the
// comma and white space before the value count), so that an element too
// large is refused before it is read whole, not once it is: a decoder
// holds a whole value before it returns it.
type elementBound struct {
	r                 io.Reader
	read, start, most int64
}

func (b *elementBound) Read(p []byte) (int, error) {
	left := b.start + b.most - b.read
	if left <= 0 {
		return 0, errElementTooLarge
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}

// notJSON is the problem of an array body the decoder stopped on.
func (a *admission) notJSON(err error, dec *json.Decoder) *problem.Details {
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &syntax):
		return invalid("the body is not valid JSON at byte %d: %v", syntax.Offset, err)
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("the body is not valid JSON: it ends at byte %d, inside its array", dec.InputOffset())
	}
	return readFailure(err, a.bodyLimit())
}

// tokenKind names the JSON kind a value's first token opens.
func tokenKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "object" // '[' is an array, the one token AdmitJob takes
	case string:
		return "string"
	case bool:
		return "boolean"
	case nil:
		return "null"
	}
	return "number"
}

func (a *admission) elementTooLarge(pos position) *problem.Details {
	d := problem.New(http.StatusRequestEntityTooLarge, "body-too-large",
		fmt.Sprintf("%v is larger than max_body_size (%d bytes), the most one item's request may send", pos, a.lim.MaxElement))
	return &d
}

// itemRules are the input rules of a job's elements: a batch's
// (elementRules), or an envelope's operations (operationRules).
type itemRules interface {
	// snapshot applies the rules to the element at n (a line's number,
	// or an index), the job's item i, and returns the item as the job
	// keeps it.
	snapshot(n, i int, elem json.RawMessage) (ItemSnapshot, *problem.Details)
}

func (r *elementRules) snapshot(n, _ int, elem json.RawMessage) (ItemSnapshot, *problem.Details) {
	it, prob := r.item(n, elem)
	return it.plannedSnapshot(), prob
}

// element admits the element at n, once the job has room for it. elem,
// without the white space around it, is the item's to keep.
func (a *admission) element(rules itemRules, n int, elem json.RawMessage) *problem.Details {
	if prob := a.room(); prob != nil {
		return prob
	}
	snap, prob := rules.snapshot(n, a.items, elem)
	if prob != nil {
		return prob
	}
	a.items++
	a.digest.Write(elem)
	a.digest.Write([]byte{'\n'})
	return a.chunks.add(snap)
}

// room refuses one more item past the job's limits.
func (a *admission) room() *problem.Details {
	switch {
	case a.atomic && a.items == a.lim.MaxAtomic:
		how := "split it into jobs of at most that many"
		if a.allowOverride {
			how = "send it as partial (Prefer: atomicity=partial), or split it"
		}
		d := problem.New(http.StatusRequestEntityTooLarge, "too-many-items",
			fmt.Sprintf("the job has more than %d items; an all-or-nothing job may have at most %d (max_atomic_job_items), since it holds every item's lock and pre-image for its whole run: %s",
				a.lim.MaxAtomic, a.lim.MaxAtomic, how))
		return &d
	case a.items == a.lim.MaxItems:
		d := problem.New(http.StatusRequestEntityTooLarge, "too-many-items",
			fmt.Sprintf("the job has more than %d items; max_job_items allows at most %d: split it into jobs", a.lim.MaxItems, a.lim.MaxItems))
		return &d
	}
	return nil
}

// isJobBody says whether a job's body may be of contentType: JSON, or
// JSON Lines.
func isJobBody(contentType string) bool {
	return isJSON(contentType) || isJSONLines(contentType)
}

// isJSONLines says whether contentType is JSON Lines, under either of
// its names.
func isJSONLines(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/x-ndjson" || mt == "application/jsonl")
}

// chunker fills the chunks a job's items are handed over in.
type chunker struct {
	send  func(first int, items []ItemSnapshot) error
	first int // the job index of items[0]
	items []ItemSnapshot
	bytes int // of the items' elements
	err   error
}

// add appends an item to the chunk, handing the chunk over first if the
// item would take it past chunkBytes, and after if it is full.
func (c *chunker) add(snap ItemSnapshot) *problem.Details {
	if len(c.items) > 0 && c.bytes+len(snap.Element) > chunkBytes {
		if prob := c.flush(); prob != nil {
			return prob
		}
	}
	c.items = append(c.items, snap)
	c.bytes += len(snap.Element)
	if len(c.items) == chunkItems {
		return c.flush()
	}
	return nil
}

// flush hands the chunk over, if it holds anything.
func (c *chunker) flush() *problem.Details {
	if len(c.items) == 0 {
		return nil
	}
	if err := c.send(c.first, c.items); err != nil {
		c.err = fmt.Errorf("storing the job's items %d to %d: %w", c.first, c.first+len(c.items)-1, err)
		d := problem.New(http.StatusServiceUnavailable, "storage-unavailable",
			"the job's items could not be stored, so no job was started: send it again later")
		return &d
	}
	c.first += len(c.items)
	c.items, c.bytes = nil, 0
	return nil
}
