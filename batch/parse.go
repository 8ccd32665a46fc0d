package batch

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Plan is a batch that passed every input rule, ready to run: nothing in
// it can make a sub-request go anywhere but an item of its collection (or,
// for an envelope, of the handler's resources). It stays as it was
// admitted: a run keeps what it learns (filled references, targets,
// created ids, bodies as sent) in its own state and its Result, so a
// plan may be read or snapshotted while it runs, and run again.
type Plan struct {
	// Op is the batch's operation; for an envelope, policy.OpEnvelope,
	// the name it is journaled, counted and logged under (what it does is
	// its operations' kinds: Writes).
	Op policy.Op
	// Match is the batch's collection; an envelope's is its own path,
	// which matches no resource.
	Match     policy.Match
	Atomicity policy.Atomicity
	// PreferenceApplied is the Preference-Applied answer when the client
	// chose the atomicity; empty otherwise.
	PreferenceApplied string
	Items             []Item

	// Envelope is the envelope's path; "" for a batch.
	Envelope string

	// settings are the batch's own: its resource's, or for an envelope
	// the handler's.
	settings policy.Settings
	// lookup finds the resource of an envelope's filled url.
	lookup     func(escapedPath string) (policy.Match, bool)
	header     http.Header
	key        idempotencyKey
	bodyDigest []byte // SHA-256 of the body as the client sent it

	// window is set for a window of a bulk job (window.go): where its
	// items sit in the job, and how their answers are kept.
	window *windowing
}

// BodyDigest is the SHA-256 of the batch's body as the client sent it (of
// nothing for a batch GET or DELETE, whose body the gateway never reads):
// what an Idempotency-Key's fingerprint needs of the body.
func (p *Plan) BodyDigest() []byte {
	if p.bodyDigest == nil {
		sum := sha256.Sum256(nil)
		return sum[:]
	}
	return p.bodyDigest
}

// Item is one element of a batch.
type Item struct {
	// ID is the item's id; for a create, the element's own id field if it
	// has one, else empty (the run's Result names the created item). An
	// envelope's operation whose url or body holds references has the id
	// they give only in the run's Result.
	ID string
	// Body is a create's element as the client sent it, or an update's
	// element without its id field; an envelope's operation's body, or nil
	// when it holds references (the run sends them filled in).
	Body []byte
	// fields are an update's member names, whose old values a PATCH
	// restore puts back.
	fields []string
	// firstWithID is the index of the first item with the same id (its
	// own when none is before it): a batch GET fetches a repeated id once.
	firstWithID int
	// tgt is where the item's requests go; nil for an envelope's
	// operation whose url holds references (the run finds its target).
	tgt *target
	// operation is the envelope's operation the item is; nil in a batch.
	operation *envelopeOperation
	// rewrite marks an envelope's operation that writes an item an
	// earlier one wrote: its pre-image is read just before its write.
	rewrite bool
}

// parsePlan applies the input rules (docs/wire-format.md, "Bad input") to a batch
// request on the collection m matched, reading the body once; it returns
// the plan, or the problem to answer with before any sub-request is sent.
func parsePlan(r *http.Request, m policy.Match, op policy.Op) (*Plan, *problem.Details) {
	s := m.Resource.Settings
	p := &Plan{
		Op:        op,
		Match:     m,
		Atomicity: s.Atomicity[op],
		settings:  s,
		header:    forwardHeader(r.Header),
	}
	p.Atomicity, p.PreferenceApplied = atomicityOf(r.Header, op, s)
	if op.Writes() {
		p.key = newIdempotencyKey(r.Header.Get("Idempotency-Key"))
	}
	var prob *problem.Details
	var query string // the client's query without the ids and _method parameters
	switch op {
	case policy.OpGet, policy.OpDelete:
		var ids []string
		ids, query, prob = idsFromQuery(r.URL.RawQuery, s, countLimit{s.MaxItems, "max_items"})
		if prob == nil {
			p.Items, prob = itemsFromIDs(ids, op, s.IDFormat)
		}
	default:
		query = policy.WithoutMethodParam(r.URL.RawQuery)
		var elems []json.RawMessage
		elems, p.bodyDigest, prob = readElements(r, s)
		if prob == nil {
			p.Items, prob = itemsFromElements(elems, op, s)
		}
	}
	if prob == nil && p.Saga() {
		prob = unscopedParam(query, s)
	}
	if prob != nil {
		return nil, prob
	}
	t := newTarget(op, batchMethods[op], m, query)
	for i := range p.Items {
		p.Items[i].tgt = t
	}
	return p, nil
}

// atomicityOf is the atomicity a batch runs under: its operation's,
// unless the client chose one (Prefer: atomicity=…) and the resource
// allows it (allow_override); then also the Preference-Applied answer.
func atomicityOf(h http.Header, op policy.Op, s policy.Settings) (policy.Atomicity, string) {
	if a, ok := preferredAtomicity(h); ok && s.AllowOverride {
		return a, preferenceApplied(a)
	}
	return s.Atomicity[op], ""
}

// unscopedParam refuses a parameter of an all-or-nothing write batch's
// query that scope_query does not name (docs/configuration.md,
// "scope_query"). The
// saga reads and puts back whole items with the query on every request:
// a parameter that scopes them must be there, and one that shapes them
// ($select, fields) must not, or an undo would put back a partial item
// and erase what it did not read. Only the operator knows which is which.
func unscopedParam(query string, s policy.Settings) *problem.Details {
	var param string
	unscoped := errors.New("unscoped")
	if policy.EachParam(query, func(_, key, _ string) error {
		if slices.Contains(s.ScopeQuery, key) {
			return nil
		}
		param = key
		return unscoped
	}) == nil {
		return nil
	}
	alternative := "send the batch without it"
	if s.AllowOverride {
		alternative += ", or as partial (Prefer: atomicity=partial)"
	}
	return invalid("the query parameter %q is not kept on an all-or-nothing batch write: the saga reads and puts back whole items, "+
		"and a parameter that shapes them would make an undo erase what it did not read. "+
		"If it scopes the request (a tenant, an API key), name it in scope_query; otherwise %s", param, alternative)
}

func invalid(format string, args ...any) *problem.Details {
	d := problem.New(http.StatusBadRequest, "invalid-batch", fmt.Sprintf(format, args...))
	return &d
}

// countLimit is a limit on a batch's items, and the option that sets it.
type countLimit struct {
	most   int
	option string
}

func (l countLimit) tooMany(n int) *problem.Details {
	d := problem.New(http.StatusRequestEntityTooLarge, "too-many-items",
		fmt.Sprintf("the batch has %d items; %s allows at most %d", n, l.option, l.most))
	return &d
}

// sizeLimit is a limit on a body's bytes, and the option that sets it.
type sizeLimit struct {
	most   int64
	option string
}

func (l sizeLimit) tooLarge() *problem.Details {
	d := problem.New(http.StatusRequestEntityTooLarge, "body-too-large",
		fmt.Sprintf("the body is larger than %s (%d bytes)", l.option, l.most))
	return &d
}

// idsFromQuery takes the ids out of the query, and returns the rest of it
// for the sub-requests. Ids are split on literal commas before they are
// unescaped, so an id may hold a comma as %2C; repeated ids parameters
// add up. More than most ids are refused. They are read as form
// encoders write them (a '+' is a space, a plus is %2B), but under
// id_format integer a leading '+', which no integer's form encoding
// holds, is the sign written by hand: +3 is the id 3.
func idsFromQuery(rawQuery string, s policy.Settings, most countLimit) ([]string, string, *problem.Details) {
	var ids, rest []string
	err := policy.EachParam(rawQuery, func(pair, key, value string) error {
		if policy.IsMethodParam(key) {
			return nil // the sub-requests' methods are the gateway's
		}
		if key != s.IDsParam {
			rest = append(rest, pair)
			return nil
		}
		for _, raw := range strings.Split(value, ",") {
			sign, rest := "", raw
			if s.IDFormat == policy.IDInteger {
				rest = strings.TrimPrefix(raw, "+")
				sign = raw[:len(raw)-len(rest)]
			}
			id, err := url.QueryUnescape(rest)
			if err != nil {
				return fmt.Errorf("id %q: %w", raw, err)
			}
			ids = append(ids, sign+id)
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, "", invalid("the %s parameter is not valid percent-encoding: %v", s.IDsParam, err)
	case ids == nil:
		// Only a DELETE comes here without the parameter: a GET without
		// it is a list, and passes through.
		return nil, "", invalid("a DELETE on the collection needs the %s parameter (?%s=1,2): many legacy APIs read a DELETE of the whole collection as \"delete everything\", so the gateway does not pass it on",
			s.IDsParam, s.IDsParam)
	case len(ids) == 1 && ids[0] == "":
		return nil, "", invalid("the %s parameter is empty: give one or more ids, separated by commas", s.IDsParam)
	case len(ids) > most.most:
		return nil, "", most.tooMany(len(ids))
	}
	return ids, strings.Join(rest, "&"), nil
}

func itemsFromIDs(ids []string, op policy.Op, format policy.IDFormat) ([]Item, *problem.Details) {
	items := make([]Item, len(ids))
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		id, prob := checkID(itemAt(i), id, format)
		if prob != nil {
			return nil, prob
		}
		items[i] = Item{ID: id, firstWithID: i}
		if j, dup := seen[id]; dup {
			if op != policy.OpGet {
				return nil, invalid("items %d and %d both have id %q: each id may appear once in a batch %s", j, i, id, op)
			}
			items[i].firstWithID = j
			continue
		}
		seen[id] = i
	}
	return items, nil
}

// checkID returns the canonical text of the id of the item at pos under
// the format, which is what the batch sends, locks, compares for
// duplicates and reports (docs/configuration.md, "id_format"), or the
// problem with it.
func checkID(pos position, id string, format policy.IDFormat) (string, *problem.Details) {
	// A hostile id is refused for what it is, whatever the format.
	if reason := badID(id); reason != "" {
		return "", invalid("%v: id %q %s", pos, id, reason)
	}
	canonical, err := format.Canonical(id)
	if err != nil {
		return "", invalid("%v: %v", pos, err)
	}
	return canonical, nil
}

// badID says why an id could reach a path other than its item's, or
// cannot be reported back faithfully; empty means the id is fine. Ids are
// escaped into the path, so this is a second lock, not the only one; it
// also holds for an upstream (or a proxy before it) that decodes a path
// more than once, since an id is refused when any of its percent-decodings
// breaks a rule: "%2e%2e" in a JSON element is as refused as ".." is.
func badID(id string) string {
	for {
		if reason := badDecodedID(id); reason != "" {
			return reason
		}
		decoded, err := url.PathUnescape(id)
		if err != nil || decoded == id {
			return ""
		}
		id = decoded
	}
}

func badDecodedID(id string) string {
	switch {
	case id == "":
		return "is empty"
	case id == "." || id == "..":
		return "is a dot segment"
	case strings.ContainsRune(id, '/'):
		return "contains '/'"
	case strings.ContainsRune(id, '\\'):
		return `contains '\'`
	case !utf8.ValidString(id):
		return "is not valid UTF-8"
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return "contains a control character"
	}
	return ""
}

// readElements reads the batch body once and returns its elements and its
// SHA-256.
func readElements(r *http.Request, s policy.Settings) ([]json.RawMessage, []byte, *problem.Details) {
	body, prob := readBody(r, s)
	if prob != nil {
		return nil, nil, prob
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '[' {
		if !json.Valid(body) {
			return nil, nil, invalid("the body is not valid JSON; a batch body is a JSON array of objects")
		}
		return nil, nil, invalid("the body is a JSON %s; a batch body is a JSON array of objects", jsonvalue.Kind(trimmed))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(body, &elems); err != nil {
		return nil, nil, invalid("the body is not valid JSON: %v", err)
	}
	switch {
	case len(elems) == 0:
		return nil, nil, invalid("the batch is empty: send one or more items")
	case len(elems) > s.MaxItems:
		return nil, nil, countLimit{s.MaxItems, "max_items"}.tooMany(len(elems))
	}
	digest := sha256.Sum256(body)
	return elems, digest[:], nil
}

// readBody reads a batch's JSON body once, within max_body_size.
func readBody(r *http.Request, s policy.Settings) ([]byte, *problem.Details) {
	limit := sizeLimit{s.MaxBodySize, "max_body_size"}
	if prob := refusedBody(r, limit, isJSON, "JSON (application/json)"); prob != nil {
		return nil, prob
	}
	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, s.MaxBodySize+1))
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return nil, limit.tooLarge()
		case err != nil:
			return nil, invalid("reading the body: %v", err)
		}
	}
	if int64(len(body)) > s.MaxBodySize {
		return nil, limit.tooLarge()
	}
	return body, nil
}

// refusedBody applies the rules a batch's body meets before a byte of it
// is read: a Content-Length within limit, a media type that accepted
// takes (what names them for the client), no Content-Encoding.
func refusedBody(r *http.Request, limit sizeLimit, accepted func(contentType string) bool, what string) *problem.Details {
	if r.ContentLength > limit.most {
		return limit.tooLarge()
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !accepted(ct) {
		d := problem.New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			fmt.Sprintf("a batch body must be %s, not %q", what, ct))
		return &d
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		d := problem.New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			fmt.Sprintf("a batch body must not be encoded (Content-Encoding %q)", ce))
		return &d
	}
	return nil
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

// itemsFromElements applies the element rules to a synchronous batch's
// elements, each named by its index.
func itemsFromElements(elems []json.RawMessage, op policy.Op, s policy.Settings) ([]Item, *problem.Details) {
	rules := newElementRules(op, s, "item")
	items := make([]Item, len(elems))
	for i, elem := range elems {
		it, prob := rules.item(i, elem)
		if prob != nil {
			return nil, prob
		}
		it.firstWithID = i
		items[i] = it
	}
	return items, nil
}
