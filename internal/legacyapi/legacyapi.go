// Package legacyapi is an in-memory REST server that imitates a crude,
// real-world legacy API. It is the upstream that end-to-end tests of the
// batch gateway run against, and the demo API of the README quick start.
//
// It deliberately keeps the habits the gateway has to cope with in the wild:
// DELETE answers 200 with "{}" instead of 204, errors come as HTML pages or
// plain text rather than JSON, PUT may refuse to create, Location headers are
// absolute, and validation failures are 422 pages. Faults can be injected per
// request so tests can exercise the gateway's undo logic, including the case
// "the change happened but the answer never arrived".
//
// Other habits are opt-in per collection, off by default, and combine
// freely: ETags with conditional writes, Idempotency-Key replay, tenants
// chosen by a query parameter, an API key in the query string, creates
// answered 202/303/bare 201, ids always assigned by the server, slow
// writes, writes that normalise what they store and drop unknown or
// read-only members, a query parameter selecting the members answered,
// integer ids read leniently ("03", "3.json"), a Rails scaffold's
// habits (204 on DELETE, updated_at stamped, "3-foo" reaching row 3, a
// nested create that takes its parent from the path, a write that
// commits and answers late), ETags hashed from the
// answer body with no condition enforced, URLs that must end with a
// slash, the others redirected, a LIST filtered by id in the styles of
// json-server, django-filter and JSON:API, paged as Django REST
// framework pages it (a page size capped silently), and records the
// LIST hides and a GET refuses (403).
//
// A collection is declared by its concrete path, or by a pattern such as
// "/api/users/*/posts" that serves the posts of any user, one table per
// concrete path, answering 404 when that user does not exist.
//
// InFlight, PeakInFlight and CountConns let a test measure the load a
// client puts on the API.
package legacyapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Collection declares one collection the API serves, by its concrete path
// or by a pattern of paths. Nested resources are declared by their concrete
// parent path (for example "/api/users/1/posts") or by a pattern
// ("/api/users/*/posts"); either way each concrete path is simply its own
// table, because the legacy APIs being imitated have no notion of relations
// beyond the parent's existence.
type Collection struct {
	// Path is the escaped path of the collection, e.g. "/api/users" or
	// "/api/users/1/posts", without a trailing slash.
	//
	// A segment that is exactly "*" makes Path a pattern: it serves every
	// concrete path with the same segments where each "*" stands for any
	// one non-empty segment, e.g. "/api/users/*/posts" serves
	// "/api/users/1000/posts", a user created at run time. Each concrete
	// path is a collection of its own, with every setting of the pattern:
	// its own tables (one per tenant), made empty on first use, each with
	// its own auto-increment, and Location headers that name the concrete
	// path. A declared concrete path wins over a pattern that matches it,
	// and of two patterns that match a path the one declared first serves
	// it. A pattern has no seeds (New panics on them).
	//
	// The parent item of a concrete path is its prefix up to the segment
	// the last "*" matched ("/api/users/1000" for the path above). When
	// the collection holding it (here "/api/users") is served, declared or
	// by a pattern, the concrete path answers 404, as an unknown path, unless
	// the parent item exists in that collection, in the tenant the request
	// addresses there, as Django REST framework's nested routers and Rails'
	// nested resources do; a parent collection that is not served is not
	// checked. Deleting the parent deletes nothing else.
	Path string
	// PutCreates makes PUT on a missing id create it (201). When false, PUT
	// on a missing id answers 404, as many legacy APIs do, so the gateway
	// cannot assume PUT is a valid undo for DELETE.
	PutCreates bool
	// ETags imitates an API with a row-version column: every answer that
	// carries a record (GET, HEAD, PUT, PATCH, and a POST create answered
	// with the record, AnswerCreated; not 202, 303 or a bare 201) has a
	// strong ETag "v<n>", where n comes from one counter the whole API
	// shares and is new on every write of the record (even one that leaves
	// its content as it was). A tag is never reused, not even after a
	// delete and re-create of the same id, and two tenants' records never
	// share one.
	//
	// The API then honours, on PUT, PATCH and DELETE of an item, If-Match
	// ("*" matches any existing record; a tag is compared strongly, so a
	// W/ tag never matches) and, on PUT, If-None-Match ("*", or a tag
	// compared weakly, fails when the record exists or matches); on a POST
	// create, If-None-Match: * (or the record's tag) refers to the id in the
	// body and fails when that record exists. A failed condition answers
	// 412 with an HTML page and changes nothing; a missing record fails any
	// If-Match. Conditions are evaluated before the body is looked at (for
	// POST, when the id is known). Other conditional headers, and these on
	// other methods (GET answers no 304), are ignored.
	//
	// Without ETags no ETag is sent and every conditional header is
	// ignored, as most legacy APIs do.
	ETags bool
	// HonorKeys imitates an API that implements Idempotency-Key
	// (draft-ietf-httpapi-idempotency-key-header), as payment-style APIs
	// do. A write (POST, PUT, PATCH, DELETE) to the collection or its items
	// with a non-empty Idempotency-Key is remembered, for the API's
	// lifetime, under its method, escaped path, raw query and key, with
	// its answer (status, headers, body) and a hash of its body. The same
	// key again for the same method, path and query:
	//
	//   - with the same body bytes: the stored answer is replayed, with
	//     Idempotent-Replayed: true added, and nothing is applied;
	//   - with another body: 422, an HTML page, nothing applied;
	//   - while the first is still being served: 409, an HTML page with
	//     Retry-After: 1, nothing applied.
	//
	// Every answer the API computed is stored, errors included, and so is
	// one an AfterApply fault kept from the client ("applied, answer
	// lost"), which a resend then gets. A fault that replaced the answer
	// without AfterApply never reached the API, so it stores nothing.
	// API.Writes counts what was applied and what was replayed. Without
	// HonorKeys the header is ignored and every resend is applied again.
	HonorKeys bool
	// Tenants imitates a multi-tenant API that picks the tenant from a
	// query parameter: ?tenant=<name> selects a separate set of records;
	// no parameter, or an empty one, selects the default tenant, which
	// holds the seeds. A tenant not seen before is an empty set. Each
	// tenant is its own table with its own auto-increment, as with a
	// schema per tenant: POST without id assigns 1000, 1001… in every
	// tenant, so the same id names different records in different tenants
	// and a request that lost its ?tenant= hits the default tenant's record
	// of that id. Location headers name the item without the query, as
	// route-based URL builders do. Without Tenants the parameter is ignored
	// and everything is the default tenant. See API.TenantItem and
	// API.TenantItems.
	Tenants bool
	// APIKey, when set, imitates an API guarded by a key in the query
	// string: every request to the collection or its items without
	// api_key=<APIKey> answers 401 with an HTML page and
	// WWW-Authenticate: ApiKey realm="legacy", before anything else is
	// looked at (Idempotency-Key included), and nothing is applied.
	APIKey string
	// BearerTokens, when set, imitates an API guarded by bearer tokens
	// that expire: every request to the collection or its items whose
	// Authorization is not "Bearer <token>" of a token the API accepts
	// answers 401 with a JSON body and WWW-Authenticate: Bearer
	// realm="legacy", error="invalid_token", after the API key and
	// before anything else is looked at (Idempotency-Key included), and
	// nothing is applied. The API accepts these tokens from the start,
	// until API.RevokeToken; API.AcceptToken adds one (a token the client
	// refreshed). Default: none, Authorization is not looked at.
	BearerTokens []string
	// CreateAnswer is what a POST create answers; the record is created
	// whatever the answer. Default: AnswerCreated.
	CreateAnswer CreateAnswer
	// AssignIDs imitates a table with an auto-increment key: POST ignores
	// any id the client sent and always assigns the next number (1000,
	// 1001…). Without it the client's id is honoured (and a duplicate is
	// refused).
	AssignIDs bool
	// WriteDelay imitates a slow legacy API (a slow database, a lock wait):
	// every write (POST, PUT, PATCH, DELETE) to the collection or its items
	// that passed the API key check and is not an Idempotency-Key replay,
	// 409 or 422 waits this long before it is applied and answered. Reads
	// are not delayed, and other requests are served during the wait.
	//
	// If the client goes away during the wait, the write is still applied
	// when the wait ends, as by a real server that had already started the
	// transaction: a client that timed out cannot conclude that nothing
	// happened. Close cuts every wait short; the write is then applied and
	// answered at once. With HonorKeys the key is claimed before the wait,
	// so a resend during it is a 409. Default: 0, no delay.
	WriteDelay time.Duration
	// Normalize imitates a model that cleans up what it is sent, as a
	// serializer's trim_whitespace and an email field do: on every POST,
	// PUT and PATCH that stores a record, each top-level string member the
	// write sends ("id" included) is trimmed of surrounding white space,
	// and "email", if a string, is lower-cased; members the write does not
	// send are left as stored. The server also sets "updated_at" on every
	// stored write, whatever the client sent, to an RFC 3339 UTC timestamp
	// of fixed width with nanoseconds, from a clock the whole API shares
	// that starts at 2026-01-01T00:00:00Z and advances one nanosecond per
	// record stored (seeds included), so it is deterministic, new on every
	// write and ordered as text as in time. Validation judges the
	// normalised record (a name of "  " is a 422), and the answer carries
	// the record as stored, which is not what was sent. Seeds are stored as
	// given. Default false: members are stored as sent.
	Normalize bool
	// Fields, when not empty, imitates a serializer's declared fields: a
	// POST, PUT or PATCH silently drops every top-level member of its body
	// that is not listed, apart from "id" and "updated_at", and is
	// otherwise applied. Stored members (seeds') are not affected until a
	// PUT replaces the record. Default: every member is stored.
	Fields []string
	// ReadOnly names members a write cannot set, as a serializer's
	// read_only_fields: they are dropped from a POST, PUT or PATCH body, so
	// a create stores the record without them, a PUT keeps the replaced
	// record's values and a PATCH leaves them as they were (null does not
	// remove them). Only seeds give them values, except an "updated_at"
	// that Normalize sets. Naming "id" makes the server choose the id of
	// every POST, as AssignIDs does. Default: none.
	ReadOnly []string
	// SelectParam, when set, names a query parameter that selects the
	// members answered, as FeathersJS's "$select[]" or a "fields"
	// parameter of Django REST framework's dynamic fields: it may be
	// repeated and each value may be a comma-separated list of member
	// names. A request that selects at least one name has every record it
	// is answered with (an item's GET or HEAD, each element of a list, the
	// record a POST, PUT or PATCH answers) reduced to "id" and the selected
	// members it has; the write itself is applied whole. A parameter with
	// no name in it (?fields=) selects nothing, so records are answered
	// whole. Default "": no parameter selects.
	SelectParam string
	// LenientIDs imitates an ORM that casts an item's path segment to an
	// integer: the segment, once unescaped, loses an optional ".json"
	// suffix (in any case), then a leading "+", then leading zeros ("00" is
	// "0"), so "03", "+3", "3.json" and "3.JSON" all name the record "3",
	// for every method. A segment that is not then a decimal integer names
	// no item: it is answered 404 as an unknown path is, before the API
	// key or a TrailingSlash redirect. Records are stored under, and
	// Location headers name, their canonical id. Default false: the
	// segment is the id exactly.
	LenientIDs bool
	// ContentETags imitates Django's ConditionalGetMiddleware or Spring's
	// ShallowEtagHeaderFilter, which tag what the view rendered rather
	// than a row version: every 200 answer to a GET or HEAD of an item or
	// of the collection carries a strong ETag hashed from its body (the
	// hex of the first 8 bytes of its SHA-256, quoted), so equal bodies
	// have equal tags whatever wrote them, and the tag of an answer shaped
	// by SelectParam is that of the shaped body. Write answers carry none,
	// and no condition is ever enforced: If-Match and If-None-Match on
	// writes are ignored, never a 412, and GET answers no 304. It replaces
	// ETags' tags and enforcement, so New panics when both are set.
	// Default false: no such tags.
	ContentETags bool
	// TrailingSlash imitates Django REST framework's default router with
	// APPEND_SLASH: the collection is served at Path+"/" and its items at
	// Path+"/<id>/". A request for Path or Path+"/<id>" without the slash,
	// whatever its method, is answered 301 Moved Permanently with an HTML
	// page and an absolute Location of the same escaped path with "/"
	// appended, the query kept, before the API key or an Idempotency-Key
	// is looked at; nothing is applied, so a write is lost unless the
	// client sends it again to the new URL (Go's client follows a 301 of
	// any write with a bodiless GET). Location headers of items end with
	// "/".
	// Faults match the path as received. Default false: items are served
	// without the slash only, the collection with or without it.
	TrailingSlash bool
	// FilterParam names the query parameter that filters the LIST (a GET
	// of the collection) by id, as real APIs' list filters do: "id"
	// (json-server: ?id=1&id=2), "id__in" (django-filter, with
	// FilterComma: ?id__in=1,2), "filter[id]" (JSON:API and Laravel,
	// with FilterComma). Its name is compared unescaped (filter%5Bid%5D
	// is filter[id]); every occurrence adds ids. With FilterComma a value
	// is split on its literal commas before each part is unescaped (so
	// an id holding a comma is sent as %2C); without, a value is one id.
	// The LIST then holds only the records of those ids that exist.
	// Default "": the API knows no filter and ignores the parameter, as
	// any unknown one, answering everything (its first page, with
	// PageSize): what a gateway meets when it guesses the filter wrong.
	FilterParam string
	FilterComma bool
	// PageSize pages the LIST as Django REST framework's
	// PageNumberPagination does: the answer is {"count": <records that
	// match>, "next": <absolute URL of the next page, or null>,
	// "previous": <URL or null>, "results": [...]}, page ?page=<n> (from
	// 1; a page past the last answers 404 with an HTML page, as DRF's
	// "Invalid page"), PageSize records a page unless the client asks for
	// ?page_size=<n>, which MaxPageSize (0: none) caps silently: a client
	// that asks for 100 under a cap of 10 gets 10 and a next link, and
	// nothing says it was cut. offset and limit are ignored then. Default
	// 0: the LIST is a plain array of every record, offset and limit
	// honoured.
	PageSize    int
	MaxPageSize int
	// Hidden names the ids (their string form) of records the caller may
	// not see: the LIST leaves them out, filtered or not, and a GET or
	// HEAD of one answers 403 with an HTML page. Writes to them are not
	// affected. Default: none.
	Hidden []string
	// Rails imitates a Rails API-mode scaffold (rails.go): DELETE
	// answers 204 with no body (head :no_content); every save stamps
	// "updated_at" as Normalize does, seeds included, whatever the
	// client sent; an item's path segment is read as Rails reads :id,
	// the leading integer of what is left once a ".json" format is
	// dropped, so "3-foo", "3.json", "03" and "+3" all name the record
	// "3" (a segment with no leading digits names none: 404). With
	// ParentField and AnswerDelay it plays nested resources and a
	// controller that answers late. Default false.
	Rails bool
	// FastAPI imitates an API written as FastAPI's tutorials write it
	// (fastapi.go): the collection is routed at Path+"/" and its items
	// at Path+"/<id>", and Starlette's redirect_slashes answers the
	// other spelling of either (Path, Path+"/<id>/") 307 with the routed
	// spelling in Location, query kept, whatever the method, nothing
	// applied; a HEAD is answered 405 with an Allow that lacks HEAD (its
	// routes declare GET alone); a POST create answers 200 with the
	// record and no Location; the validation rule's failure is a 422
	// with {"detail": [...]} as Pydantic's; and ids are int path
	// parameters: an item's segment, and on a pattern every segment a
	// "*" matched, is read as an integer ("020" and "+20" are "20", so
	// /api/users/020/items is /api/users/20/items), and a segment that
	// is none names no item (404; FastAPI's own answer would be a 422).
	// Default false.
	FastAPI bool
	// ParentField, set on a pattern collection ("/api/users/*/posts"),
	// imitates a nested controller's create (@user.posts.build): a POST
	// stores the parent item's id from the path (the segment the last
	// "*" matched, canonical as its collection reads ids) in this member,
	// whatever the body sent there. Default "": the body is stored as
	// sent.
	ParentField string
	// AnswerDelay imitates a write that commits and answers late (a slow
	// after_commit callback, a slow render): every write to the
	// collection or its items is applied at once, and answered this long
	// after; a client that went away meanwhile gets nothing, and the
	// write stands. Close cuts the wait short. Default: 0, no delay.
	AnswerDelay time.Duration
	// Workers and ServiceTime imitate a server's thread pool
	// (capacity.go): at most Workers requests to the collection or its
	// items are served at once, each holding its worker for at least
	// ServiceTime; the others wait their turn in a queue. Default 0: no
	// bound, no service time.
	Workers     int
	ServiceTime time.Duration
	// RateLimit and Burst imitate a rate limiter in front of the API
	// (capacity.go): a token bucket of Burst tokens (default: a tenth of
	// a second's worth, at least 1) refilled at RateLimit a second; a
	// request to the collection or its items that finds no token is
	// answered 429 with Retry-After (whole seconds until a token, at
	// least 1) before the queue of Workers, and nothing is applied.
	// Default 0: no limit.
	RateLimit float64
	Burst     int
	// Seed holds the initial records. Each must have an "id" that is a number
	// (e.g. 1) or a non-empty string. A pattern Path has none.
	Seed []map[string]any
}

// CreateAnswer is what a collection answers to a POST that created a
// record.
type CreateAnswer int

const (
	// AnswerCreated is 201 with the record as JSON and an absolute Location
	// of the new item.
	AnswerCreated CreateAnswer = iota
	// AnswerAccepted imitates an API that queues every create as a job:
	// 202 with Location <scheme>://<host>/jobs/<n> and the body
	// {"id": <n>, "status": "queued"}. Job numbers are counted across the
	// whole API from 1, so they collide with small record ids: a client
	// that takes the body's "id" for the record's id gets another record.
	// The record is created at once, under its own id; /jobs is not served.
	AnswerAccepted
	// AnswerSeeOther imitates a form-era framework's post/redirect/get:
	// 303 with an absolute Location of the new item and an empty body.
	AnswerSeeOther
	// AnswerBare imitates an API that only confirms: 201 with no Location
	// and no body, so the new id cannot be learned from the answer.
	AnswerBare
)

// API is the fake legacy server. It is an http.Handler; the zero value is not
// usable, call New.
type API struct {
	// cols (declared concrete paths) and patterns (pattern paths, in
	// declaration order) are built by New and only read afterwards.
	cols     map[string]*collection
	patterns []*collection

	// mu guards the fields from here to writes, the collections' tables
	// and the patterns' concrete collections; it is never held while a request sleeps, hangs or writes to
	// the network, so slow faults and slow writes cannot stall others.
	mu      sync.Mutex
	faults  []*armedFault
	log     []Request             // every request received, when recording
	applied []Request             // the writes carried out, in that order, when recording
	version uint64                // the last record version handed out
	lastJob int                   // the last job number handed out (AnswerAccepted)
	keys    map[string]*keyRecord // Idempotency-Key records, by scope and key
	writes  Writes
	// tokens are the bearer tokens the API accepts (BearerTokens).
	tokens map[string]bool

	// load guards the load counters, apart from mu so that counting never
	// waits for the state.
	load           sync.Mutex
	inFlight, peak int

	closed    chan struct{}
	closeOnce sync.Once

	// recording is whether log and applied are kept (NewRecording); set
	// before the API serves, only read afterwards.
	recording bool

	// capacity holds the declared collections' worker pools and token
	// buckets, by declared path; built by New, nil when none has one.
	capacity map[string]*capacity
}

// collection is a declared collection and its records. The declaration is
// read-only after New, so it can be read without mu; tables is guarded by mu.
type collection struct {
	Collection                   // the declaration, Seed dropped
	tables     map[string]*table // by tenant; "" is the default tenant
	// concrete holds a pattern's collections, by concrete path, made on
	// first use; guarded by mu. nil for a concrete collection.
	concrete map[string]*collection
	// pattern is the pattern a collection in concrete was made from.
	pattern *collection
}

// table is one set of records: a collection's only one, or one tenant's.
type table struct {
	records map[string]*record // keyed by the id's string form
	nextID  int                // auto-increment for POST without id
}

// record is a stored record. A record is replaced, never changed in place,
// so an answer may keep a reference to its fields.
type record struct {
	fields  map[string]any
	version uint64 // from API.version, new on every write
}

// firstAutoID is where POST without an id starts numbering, high enough to
// never collide with small hand-written seed ids.
const firstAutoID = 1000

// New builds an API serving the given collections. It panics on a malformed
// declaration because it is test and demo setup, where failing loudly beats
// returning an error nobody checks.
func New(cols ...Collection) *API {
	a := &API{cols: map[string]*collection{}, keys: map[string]*keyRecord{}, closed: make(chan struct{})}
	for _, c := range cols {
		if err := checkCollectionPath(c.Path); err != nil {
			panic(fmt.Sprintf("legacyapi: collection %q: %v", c.Path, err))
		}
		if c.WriteDelay < 0 || c.AnswerDelay < 0 {
			panic(fmt.Sprintf("legacyapi: collection %q: negative WriteDelay or AnswerDelay", c.Path))
		}
		if c.CreateAnswer < AnswerCreated || c.CreateAnswer > AnswerBare {
			panic(fmt.Sprintf("legacyapi: collection %q: unknown CreateAnswer %d", c.Path, c.CreateAnswer))
		}
		if c.ETags && c.ContentETags {
			panic(fmt.Sprintf("legacyapi: collection %q: ETags and ContentETags exclude each other", c.Path))
		}
		if _, dup := a.cols[c.Path]; dup || slices.ContainsFunc(a.patterns, func(p *collection) bool { return p.Path == c.Path }) {
			panic(fmt.Sprintf("legacyapi: collection %q declared twice", c.Path))
		}
		if cp := newCapacity(c); cp != nil {
			if a.capacity == nil {
				a.capacity = map[string]*capacity{}
			}
			a.capacity[c.Path] = cp
		}
		col := &collection{Collection: c, tables: map[string]*table{}}
		col.Seed = nil
		if isPattern(c.Path) {
			if len(c.Seed) > 0 {
				panic(fmt.Sprintf("legacyapi: collection %q: a pattern path has no seeds; seed a concrete path it matches instead, which wins over the pattern", c.Path))
			}
			col.concrete = map[string]*collection{}
			a.patterns = append(a.patterns, col)
			continue
		}
		t := col.table("")
		for i, seed := range c.Seed {
			rec, err := normalize(seed)
			if err != nil {
				panic(fmt.Sprintf("legacyapi: collection %q seed %d: %v", c.Path, i, err))
			}
			key, ok := idKey(rec["id"])
			if !ok {
				panic(fmt.Sprintf("legacyapi: collection %q seed %d: \"id\" must be a number or a non-empty string", c.Path, i))
			}
			if _, dup := t.records[key]; dup {
				panic(fmt.Sprintf("legacyapi: collection %q seed %d: duplicate id %q", c.Path, i, key))
			}
			a.store(t, key, rec, c.Rails)
		}
		a.cols[c.Path] = col
	}
	return a
}

// NewRecording builds an API as New does that also keeps every request it
// receives and every write it carries out, for a test to read (Requests,
// AppliedWrites). New keeps neither: the demo serves the same API for as
// long as it runs, and must not grow with every request it has served.
func NewRecording(cols ...Collection) *API {
	a := New(cols...)
	a.recording = true
	return a
}

// mustRecord panics when the API keeps no log, so that a test reading one
// cannot pass on an empty log that only means nobody kept it.
func (a *API) mustRecord(method string) {
	if !a.recording {
		panic("legacyapi: " + method + " on an API that keeps no log: build it with NewRecording")
	}
}

// Close releases every hanging request and cuts running delays short; it is
// needed before httptest.Server.Close, which otherwise waits for hanging
// handlers forever. It is idempotent.
func (a *API) Close() {
	a.closeOnce.Do(func() { close(a.closed) })
}

// ServeHTTP serves the API. A recording API logs every request before
// anything else, so tests see even the ones that were faulted.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.enter()
	defer a.leave()
	body, readErr := io.ReadAll(r.Body)
	path := r.URL.EscapedPath()
	normal := func() response {
		if readErr != nil {
			return plain(http.StatusBadRequest, "cannot read request body")
		}
		return a.process(r, path, body)
	}

	f, cp, retryAfter := a.receive(r, path, body)
	release, ok := cp.admit(w, r, retryAfter, a.closed)
	if !ok {
		return
	}
	defer release()

	var res response
	applied := f == nil || f.AfterApply
	if applied {
		res = normal()
	}
	if f == nil {
		write(w, r, res)
		return
	}
	if f.Delay > 0 && !a.wait(r.Context(), f.Delay) {
		return // the client is gone; there is nobody to answer
	}
	if f.Until != nil && !holdUntil(r.Context(), a.closed, f.Until) {
		return
	}
	switch {
	case f.Hang:
		select {
		case <-r.Context().Done():
		case <-a.closed:
			drop(w)
		}
	case f.Drop:
		drop(w)
	case f.Status != 0:
		ct := f.ContentType
		if ct == "" {
			ct = "text/html; charset=utf-8"
		}
		write(w, r, response{status: f.Status, header: f.header(ct), body: []byte(f.Body)})
	default:
		if !applied {
			res = normal()
		}
		write(w, r, res)
	}
}

// process is what the API itself does with a request that reached it:
// route it, check its API key, honour an Idempotency-Key, and apply it to
// the state. It is called without mu and takes it for as long as it reads
// or changes the state.
func (a *API) process(r *http.Request, path string, body []byte) response {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, id, slash := a.route(path)
	if c == nil || !a.parentExists(c, r) {
		return notFound(path)
	}
	if res, refused := c.misrouted(r, path, id != "", slash); refused {
		return res
	}
	if c.APIKey != "" && r.URL.Query().Get("api_key") != c.APIKey {
		res := htmlPage(http.StatusUnauthorized, "A valid api_key query parameter is required.")
		res.header.Set("WWW-Authenticate", `ApiKey realm="legacy"`)
		return res
	}
	if res, refused := a.checkBearer(c, r); refused {
		return res
	}
	write := isWrite(r.Method)
	var key *keyRecord
	if write && c.HonorKeys {
		if k := r.Header.Get("Idempotency-Key"); k != "" {
			var res response
			if key, res = a.claimKey(r.Method+" "+path+"?"+r.URL.RawQuery+" "+k, body); key == nil {
				return res
			}
		}
	}
	if write && c.WriteDelay > 0 {
		a.mu.Unlock()
		// The client's context is not the wait's: see Collection.WriteDelay.
		a.wait(context.Background(), c.WriteDelay)
		a.mu.Lock()
	}
	t := c.table(c.tenant(r))
	var res response
	if id == "" {
		res = a.handleCollection(c, t, r, body)
	} else {
		res = a.handleItem(c, t, id, r, body)
	}
	if write && res.status >= 200 && res.status < 300 {
		a.writes.Applied++
		if a.recording {
			a.applied = append(a.applied, Request{Method: r.Method, Path: path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: bytes.Clone(body)})
		}
	}
	if c.ContentETags && (r.Method == http.MethodGet || r.Method == http.MethodHead) && res.status == http.StatusOK {
		res.header.Set("ETag", contentTag(res.body))
	}
	if key != nil {
		key.res, key.done = res.clone(), true
	}
	if write && c.AnswerDelay > 0 {
		a.mu.Unlock()
		// Committed already: see Collection.AnswerDelay.
		a.wait(r.Context(), c.AnswerDelay)
		a.mu.Lock()
	}
	return res
}

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// Callers of the handlers below hold mu.
