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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// Request is one request as the API received it, so tests can assert what
// the gateway actually sent upstream (including requests that were faulted).
type Request struct {
	Method string
	// Path is the escaped path exactly as received (r.URL.EscapedPath()),
	// e.g. "/gadgets/a%20b", because escaping mistakes are what tests look for.
	Path     string
	RawQuery string
	Header   http.Header // a clone, safe to keep
	Body     []byte
	// At is when the request was received.
	At time.Time
}

// Fault replaces or disturbs the normal answer of matching requests, to
// simulate the failures a gateway meets in production.
type Fault struct {
	// Method restricts the fault to one method; "" matches any method.
	Method string
	// Path is the escaped request path the fault applies to (exact match).
	Path string
	// Status, when non-zero, is sent instead of the normal answer.
	Status int
	// ContentType of the injected answer; default "text/html; charset=utf-8",
	// because failing proxies and legacy stacks answer with error pages.
	ContentType string
	// Body of the injected answer.
	Body string
	// Header holds more headers of the injected answer (Retry-After,
	// say).
	Header http.Header
	// Delay waits this long before answering; the wait ends early if the
	// client goes away (nothing is sent then) or Close is called.
	Delay time.Duration
	// Until, when non-nil, holds the answer (after any Delay) until the
	// channel is closed, so a test decides exactly how long a request is
	// at the upstream; the hold ends early like Delay's.
	Until <-chan struct{}
	// Hang never answers: the handler blocks until the client gives up or
	// Close is called. On Close the connection is dropped, so the client
	// never sees an answer.
	Hang bool
	// Drop closes the TCP connection without any answer.
	Drop bool
	// AfterApply applies the request to the state first and only then
	// delays, hangs, drops or answers the fault: "it happened but you never
	// heard". Without it the state is left untouched.
	AfterApply bool
	// Times is how many matching requests the fault hits; 0 means every one.
	Times int
}

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

// Writes counts what the API did with write requests (POST, PUT, PATCH,
// DELETE) that reached it, so a test can tell a write applied once from one
// applied twice.
type Writes struct {
	// Applied counts writes the API carried out, answering 2xx; one whose
	// answer an AfterApply fault kept from the client counts too.
	Applied int
	// Replayed counts writes answered from a stored Idempotency-Key
	// answer (HonorKeys), with nothing applied.
	Replayed int
}

// keyRecord is one Idempotency-Key seen by the API.
type keyRecord struct {
	body [sha256.Size]byte // hash of the first request's body
	done bool              // false while the first request is being served
	res  response          // the first request's answer, once done
}

type armedFault struct {
	Fault
	left int // remaining hits; only meaningful when Times > 0
}

// response is a computed answer, kept apart from writing so that AfterApply
// faults can change the state and still decide not to send it.
type response struct {
	status int
	header http.Header
	body   []byte
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

func checkCollectionPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path must start with /")
	case strings.HasSuffix(p, "/"):
		return fmt.Errorf("path must not end with /")
	case strings.Contains(p, "//"):
		return fmt.Errorf("path must not contain empty segments")
	case strings.ContainsAny(p, "?#"):
		return fmt.Errorf("path must not contain a query or fragment")
	}
	if _, err := url.PathUnescape(p); err != nil {
		return err
	}
	return nil
}

// isPattern reports whether a collection path has a "*" segment.
func isPattern(p string) bool {
	return slices.Contains(strings.Split(p, "/"), "*")
}

// matches reports whether the concrete collection path p is one the pattern
// serves: as many segments, each "*" matching any non-empty one.
func matches(pattern, p string) bool {
	ps, cs := strings.Split(pattern, "/"), strings.Split(p, "/")
	if len(ps) != len(cs) {
		return false
	}
	for i, seg := range ps {
		if seg != cs[i] && (seg != "*" || cs[i] == "") {
			return false
		}
	}
	return true
}

// collectionAt returns the collection served at the escaped collection path
// p: the declared one, or the one a pattern serves there, made on first use;
// nil when none is. Callers hold mu.
func (a *API) collectionAt(p string) *collection {
	if c := a.cols[p]; c != nil {
		return c
	}
	for _, pat := range a.patterns {
		if !matches(pat.Path, p) {
			continue
		}
		if pat.FastAPI {
			p = canonicalParents(pat.Path, p)
		}
		c := pat.concrete[p]
		if c == nil {
			c = &collection{Collection: pat.Collection, tables: map[string]*table{}, pattern: pat}
			c.Path = p
			pat.concrete[p] = c
		}
		return c
	}
	return nil
}

// parentExists reports whether a concrete collection of a pattern may be
// served: see Collection.Path. Callers hold mu.
func (a *API) parentExists(c *collection, r *http.Request) bool {
	if c.pattern == nil {
		return true
	}
	parentPath, seg := c.parentItem()
	parent := a.collectionAt(parentPath)
	if parent == nil {
		return true
	}
	id, ok := parent.itemID(seg)
	if !ok {
		return false
	}
	_, ok = parent.table(parent.tenant(r)).records[id]
	return ok
}

// parentItem is where a pattern's concrete collection's parent item is:
// the path of its collection, and the escaped segment the last "*"
// matched.
func (c *collection) parentItem() (collectionPath, seg string) {
	pat, segs := strings.Split(c.pattern.Path, "/"), strings.Split(c.Path, "/")
	last := len(pat) - 1
	for pat[last] != "*" {
		last--
	}
	return strings.Join(segs[:last], "/"), segs[last]
}

// normalize turns a Go value into what a JSON body would have decoded to
// (json.Number for numbers), which also makes it a private deep copy.
func normalize(v map[string]any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return decodeObject(b)
}

// Close releases every hanging request and cuts running delays short; it is
// needed before httptest.Server.Close, which otherwise waits for hanging
// handlers forever. It is idempotent.
func (a *API) Close() {
	a.closeOnce.Do(func() { close(a.closed) })
}

// Inject adds a fault. Faults are matched in injection order and the first
// one that matches and has hits left is used. It panics on a fault that could
// never work, since that is a mistake in the test.
func (a *API) Inject(f Fault) {
	if f.Path == "" || f.Times < 0 || (f.Status != 0 && (f.Status < 200 || f.Status > 999)) {
		panic(fmt.Sprintf("legacyapi: bad fault %+v", f))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults = append(a.faults, &armedFault{Fault: f, left: f.Times})
}

// ClearFaults removes every injected fault, so one API can serve several
// test phases.
func (a *API) ClearFaults() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults = nil
}

// Item returns a deep copy of one record, looked up by collection path (a
// concrete one, also of a pattern) and by the id's string form (the
// unescaped path segment, e.g. "7" or "a b"), in the default tenant.
func (a *API) Item(collection, id string) (map[string]any, bool) {
	return a.TenantItem(collection, "", id)
}

// TenantItem is Item in the given tenant ("" is the default tenant; see
// Collection.Tenants).
func (a *API) TenantItem(collection, tenant, id string) (map[string]any, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.collectionAt(collection)
	if c == nil {
		return nil, false
	}
	t := c.tables[tenant]
	if t == nil {
		return nil, false
	}
	rec, ok := t.records[id]
	if !ok {
		return nil, false
	}
	return deepCopy(rec.fields).(map[string]any), true
}

// Items returns a deep copy of every record of a collection, in the default
// tenant, keyed by the id's string form, or nil for a path no collection
// serves (a pattern's concrete path never used has no records).
func (a *API) Items(collection string) map[string]map[string]any {
	return a.TenantItems(collection, "")
}

// TenantItems is Items in the given tenant ("" is the default tenant; see
// Collection.Tenants); a tenant never used has no records.
func (a *API) TenantItems(collection, tenant string) map[string]map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.collectionAt(collection)
	if c == nil {
		return nil
	}
	out := map[string]map[string]any{}
	t := c.tables[tenant]
	if t == nil {
		return out
	}
	for k, rec := range t.records {
		out[k] = deepCopy(rec.fields).(map[string]any)
	}
	return out
}

// Writes returns the write counters since creation.
func (a *API) Writes() Writes {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.writes
}

// Requests returns a copy of every request received since creation or the
// last ResetLog, in arrival order. It panics unless the API was built with
// NewRecording.
func (a *API) Requests() []Request {
	a.mustRecord("Requests")
	a.mu.Lock()
	defer a.mu.Unlock()
	return copyRequests(a.log)
}

// AppliedWrites returns a copy of every write the API carried out
// (answered 2xx) since creation or the last ResetLog, in the order it
// carried them out. Requests' arrival order is not that order for writes
// that reach the API at once: a test that judges what overwrote what
// reads this one. It panics unless the API was built with NewRecording.
func (a *API) AppliedWrites() []Request {
	a.mustRecord("AppliedWrites")
	a.mu.Lock()
	defer a.mu.Unlock()
	return copyRequests(a.applied)
}

// copyRequests is a deep copy of rs, for a caller to keep.
func copyRequests(rs []Request) []Request {
	out := make([]Request, len(rs))
	for i, r := range rs {
		out[i] = Request{Method: r.Method, Path: r.Path, RawQuery: r.RawQuery, Header: r.Header.Clone(), Body: bytes.Clone(r.Body), At: r.At}
	}
	return out
}

// ResetLog forgets the requests received and the writes applied so far, so
// a test can look only at what one step sent. It panics unless the API was
// built with NewRecording.
func (a *API) ResetLog() {
	a.mustRecord("ResetLog")
	a.mu.Lock()
	defer a.mu.Unlock()
	a.log, a.applied = nil, nil
}

// InFlight returns how many requests are being served now: from the
// moment ServeHTTP is entered until it returns, whatever faults, delays or
// hangs keep them.
func (a *API) InFlight() int {
	a.load.Lock()
	defer a.load.Unlock()
	return a.inFlight
}

// PeakInFlight returns the most requests served at once since New or the
// last ResetPeak, so a test can prove a bound on concurrency.
func (a *API) PeakInFlight() int {
	a.load.Lock()
	defer a.load.Unlock()
	return a.peak
}

// ResetPeak starts a new PeakInFlight measure, from the requests in flight
// now.
func (a *API) ResetPeak() {
	a.load.Lock()
	defer a.load.Unlock()
	a.peak = a.inFlight
}

func (a *API) enter() {
	a.load.Lock()
	defer a.load.Unlock()
	a.inFlight++
	a.peak = max(a.peak, a.inFlight)
}

func (a *API) leave() {
	a.load.Lock()
	defer a.load.Unlock()
	a.inFlight--
}

// CountConns wraps a listener so that every connection it accepts is
// counted, for a test to prove that a client reused its connections (or
// dialed no new ones while it should not):
//
//	srv := httptest.NewUnstartedServer(api)
//	ln, conns := legacyapi.CountConns(srv.Listener)
//	srv.Listener = ln
//	srv.Start()
//	…
//	conns.Load() // connections accepted so far
func CountConns(l net.Listener) (net.Listener, *atomic.Int64) {
	n := new(atomic.Int64)
	return &countingListener{Listener: l, n: n}, n
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
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

// receive logs a request, takes a token of its collection's rate limit
// (the Retry-After to answer when there is none) and, when it got one,
// the fault that hits it.
func (a *API) receive(r *http.Request, path string, body []byte) (f *Fault, cp *capacity, retryAfter string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.recording {
		a.log = append(a.log, Request{Method: r.Method, Path: path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: bytes.Clone(body), At: time.Now()})
	}
	cp = a.capacityFor(path)
	if retryAfter = cp.limit(time.Now()); retryAfter == "" {
		f = a.takeFault(r.Method, path)
	}
	return f, cp, retryAfter
}

// header is the headers of the fault's answer.
func (f *Fault) header(contentType string) http.Header {
	h := f.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", contentType)
	return h
}

// takeFault consumes the first matching fault with hits left. Callers hold mu.
func (a *API) takeFault(method, path string) *Fault {
	for i, af := range a.faults {
		if (af.Method != "" && af.Method != method) || af.Path != path {
			continue
		}
		f := af.Fault
		if af.Times > 0 {
			af.left--
			if af.left == 0 {
				a.faults = slices.Delete(a.faults, i, i+1)
			}
		}
		return &f
	}
	return nil
}

// wait sleeps for d and reports whether the request should still be
// answered: false if the client went away, true if d elapsed or Close cut
// the wait short.
func (a *API) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	return holdUntil(ctx, a.closed, t.C)
}

// holdUntil blocks until released fires or closed is closed (true), or the
// client goes away first (false).
func holdUntil[T any](ctx context.Context, closed <-chan struct{}, released <-chan T) bool {
	select {
	case <-ctx.Done():
		return false
	case <-closed:
	case <-released:
	}
	return true
}

// drop closes the connection without an answer. Hijacking is not possible on
// HTTP/2, where aborting the handler resets the stream instead.
func drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}

func write(w http.ResponseWriter, r *http.Request, res response) {
	h := w.Header()
	for k, v := range res.header {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(res.body)))
	w.WriteHeader(res.status)
	if r.Method != http.MethodHead {
		w.Write(res.body)
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

// claimKey looks up an Idempotency-Key by its scope (method, path, query
// and key). For a new key it records the key as being served and returns
// its record, for the caller to fill in with the answer; otherwise it
// returns nil and the answer to send instead (a replay, 422 or 409).
// Callers hold mu.
func (a *API) claimKey(scope string, body []byte) (*keyRecord, response) {
	sum := sha256.Sum256(body)
	k := a.keys[scope]
	switch {
	case k == nil:
		k = &keyRecord{body: sum}
		a.keys[scope] = k
		return k, response{}
	case k.body != sum:
		return nil, htmlPage(http.StatusUnprocessableEntity, "This Idempotency-Key was already used with another request body.")
	case !k.done:
		res := htmlPage(http.StatusConflict, "A request with this Idempotency-Key is still being processed.")
		res.header.Set("Retry-After", "1")
		return nil, res
	}
	a.writes.Replayed++
	res := k.res.clone()
	res.header.Set("Idempotent-Replayed", "true")
	return nil, res
}

// route finds the collection a path names, and the item id when it names
// an item ("" for the collection itself): the unescaped segment, or with
// LenientIDs its canonical form. slash reports a trailing slash, which
// only a TrailingSlash collection's items may have. Callers hold mu.
func (a *API) route(path string) (c *collection, id string, slash bool) {
	trimmed, slash := strings.CutSuffix(path, "/")
	if c := a.collectionAt(trimmed); c != nil {
		return c, "", slash
	}
	i := strings.LastIndexByte(trimmed, '/')
	c = a.collectionAt(trimmed[:max(i, 0)])
	if c == nil || (slash && !c.TrailingSlash && !c.FastAPI) {
		return nil, "", false
	}
	id, ok := c.itemID(trimmed[i+1:])
	if !ok {
		return nil, "", false
	}
	return c, id, slash
}

// itemID is the id an item's escaped path segment names: the unescaped
// segment, or with LenientIDs its canonical form; false when it names none.
func (c *collection) itemID(seg string) (string, bool) {
	id, err := url.PathUnescape(seg)
	ok := err == nil && id != ""
	switch {
	case ok && c.Rails:
		id, ok = railsID(id)
	case ok && c.LenientIDs:
		id, ok = lenientID(id)
	case ok && c.FastAPI:
		id, ok = intParam(id)
	}
	return id, ok
}

// lenientID reads an item's path segment as an ORM that casts it to an
// integer does, and returns the canonical form, or false when it is no
// integer. See Collection.LenientIDs.
func lenientID(seg string) (string, bool) {
	if n := len(seg) - len(".json"); n >= 0 && strings.EqualFold(seg[n:], ".json") {
		seg = seg[:n]
	}
	return intParam(seg)
}

// misrouted is what a framework's router answers before any route runs
// (TrailingSlash's APPEND_SLASH, FastAPI's redirect_slashes and its
// missing HEAD); false when the route runs.
func (c *collection) misrouted(r *http.Request, path string, item, slash bool) (response, bool) {
	switch {
	case c.TrailingSlash && !slash:
		return appendSlash(r, path), true
	case c.FastAPI && r.Method == http.MethodHead:
		if res, moved := fastAPIRedirect(r, path, item, slash); moved {
			return res, true
		}
		return fastAPINoHead(item), true
	case c.FastAPI:
		return fastAPIRedirect(r, path, item, slash)
	}
	return response{}, false
}

// appendSlash redirects a request to its path with a slash appended, as
// Django's APPEND_SLASH does.
func appendSlash(r *http.Request, path string) response {
	loc := sameQuery(r, origin(r)+path+"/")
	res := htmlPage(http.StatusMovedPermanently, "The resource has moved to "+loc+".")
	res.header.Set("Location", loc)
	return res
}

// sameQuery is loc with the query of r, as a redirect keeps it.
func sameQuery(r *http.Request, loc string) string {
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	return loc
}

// tenant is the tenant a request addresses.
func (c *collection) tenant(r *http.Request) string {
	if !c.Tenants {
		return ""
	}
	return r.URL.Query().Get("tenant")
}

// table returns the records of one tenant, making an empty set for a tenant
// not seen before. Callers hold mu.
func (c *collection) table(tenant string) *table {
	t := c.tables[tenant]
	if t == nil {
		t = &table{records: map[string]*record{}, nextID: firstAutoID}
		c.tables[tenant] = t
	}
	return t
}

// store puts a record under key with a new version; with stamp, its
// updated_at is set from that version (see Collection.Normalize). Callers
// hold mu.
func (a *API) store(t *table, key string, fields map[string]any, stamp bool) *record {
	a.version++
	if stamp {
		fields["updated_at"] = updatedAt(a.version)
	}
	rec := &record{fields: fields, version: a.version}
	t.records[key] = rec
	return rec
}

// Callers of the handlers below hold mu.

func (a *API) handleCollection(c *collection, t *table, r *http.Request, body []byte) response {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return c.list(t, r)
	case http.MethodPost:
		return a.create(c, t, r, body)
	default:
		return methodNotAllowed(r.Method, "GET, HEAD, POST")
	}
}

// list answers a LIST: every item the query selects, a page of them
// (PageSize), or the slice offset and limit ask for.
func (c *collection) list(t *table, r *http.Request) response {
	keys := c.listed(t, r)
	if c.PageSize > 0 {
		return c.page(t, r, keys)
	}
	q := r.URL.Query()
	offset, ok1 := queryInt(q, "offset", 0)
	limit, ok2 := queryInt(q, "limit", -1)
	if !ok1 || !ok2 {
		return plain(http.StatusBadRequest, "offset and limit must be non-negative integers")
	}
	keys = keys[min(offset, len(keys)):]
	if limit >= 0 {
		keys = keys[:min(limit, len(keys))]
	}
	return jsonAnswer(http.StatusOK, c.elements(t, r, keys))
}

// create answers a POST: the item stored under the id the body names,
// or one the API assigns.
func (a *API) create(c *collection, t *table, r *http.Request, body []byte) response {
	rec, err := decodeObject(body)
	if err != nil {
		return plain(http.StatusBadRequest, "body must be a JSON object")
	}
	c.accept(rec, nil)
	if c.ParentField != "" {
		rec[c.ParentField] = a.parentID(c)
	}
	if res, bad := c.checkName(rec); bad {
		return res
	}
	// A null id is what ORMs send for "not saved yet", so it means
	// "assign one" rather than an error.
	if v, has := rec["id"]; has && (v == nil || c.AssignIDs) {
		delete(rec, "id")
	}
	var key string
	if v, has := rec["id"]; has {
		k, ok := idKey(v)
		if !ok {
			return plain(http.StatusBadRequest, "id must be a number or a non-empty string")
		}
		if cur := t.records[k]; cur != nil {
			if res, failed := c.createPrecondition(r, cur); failed {
				return res
			}
			return plain(http.StatusConflict, "duplicate id")
		}
		key = k
	} else {
		key = t.nextKey()
		rec["id"] = json.Number(key)
	}
	return a.created(c, r, key, a.store(t, key, rec, c.stamps()))
}

// nextKey takes the table's next auto-increment id that no record holds.
func (t *table) nextKey() string {
	for {
		key := strconv.Itoa(t.nextID)
		t.nextID++
		if _, taken := t.records[key]; !taken {
			return key
		}
	}
}

// listed is the ids of the records a LIST answers, in order: filtered by
// FilterParam, without the Hidden ones. Callers hold mu.
func (c *collection) listed(t *table, r *http.Request) []string {
	var keys []string
	if ids, filtered := c.filterIDs(r); filtered {
		for _, id := range ids {
			if _, ok := t.records[id]; ok && !slices.Contains(keys, id) {
				keys = append(keys, id)
			}
		}
	} else {
		keys = make([]string, 0, len(t.records))
		for k := range t.records {
			keys = append(keys, k)
		}
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return slices.Contains(c.Hidden, k) })
	slices.SortFunc(keys, compareIDs)
	return keys
}

// filterIDs reads the ids the LIST's filter asks for, and whether it
// asks: see Collection.FilterParam.
func (c *collection) filterIDs(r *http.Request) ([]string, bool) {
	if c.FilterParam == "" {
		return nil, false
	}
	var ids []string
	filtered := false
	for _, pair := range strings.Split(r.URL.RawQuery, "&") {
		rawKey, value, _ := strings.Cut(pair, "=")
		if key, err := url.QueryUnescape(rawKey); err != nil || key != c.FilterParam {
			continue
		}
		filtered = true
		parts := []string{value}
		if c.FilterComma {
			parts = strings.Split(value, ",")
		}
		for _, part := range parts {
			if id, err := url.QueryUnescape(part); err == nil && id != "" {
				ids = append(ids, id)
			}
		}
	}
	return ids, filtered
}

// elements are the LIST's records of keys, shaped by SelectParam.
// Callers hold mu.
func (c *collection) elements(t *table, r *http.Request, keys []string) []any {
	sel := c.selected(r)
	list := make([]any, len(keys))
	for i, k := range keys {
		list[i] = only(t.records[k].fields, sel)
	}
	return list
}

// page answers one page of the LIST: see Collection.PageSize. Callers
// hold mu.
func (c *collection) page(t *table, r *http.Request, keys []string) response {
	q := r.URL.Query()
	number, ok1 := queryInt(q, "page", 1)
	size, ok2 := queryInt(q, "page_size", c.PageSize)
	if !ok1 || !ok2 || number < 1 || size < 1 {
		return plain(http.StatusBadRequest, "page and page_size must be positive integers")
	}
	if c.MaxPageSize > 0 {
		size = min(size, c.MaxPageSize)
	}
	start := (number - 1) * size
	if start >= len(keys) && number > 1 {
		return htmlPage(http.StatusNotFound, "Invalid page.")
	}
	end := min(start+size, len(keys))
	link := func(n int) any {
		q.Set("page", strconv.Itoa(n))
		return origin(r) + r.URL.EscapedPath() + "?" + q.Encode()
	}
	var next, previous any
	if end < len(keys) {
		next = link(number + 1)
	}
	if number > 1 {
		previous = link(number - 1)
	}
	return jsonAnswer(http.StatusOK, map[string]any{
		"count": len(keys), "next": next, "previous": previous, "results": c.elements(t, r, keys[start:end]),
	})
}

// created answers a POST that created rec under key, as the collection's
// CreateAnswer says.
func (a *API) created(c *collection, r *http.Request, key string, rec *record) response {
	switch c.CreateAnswer {
	case AnswerAccepted:
		a.lastJob++
		res := jsonAnswer(http.StatusAccepted, map[string]any{"id": a.lastJob, "status": "queued"})
		res.header.Set("Location", origin(r)+"/jobs/"+strconv.Itoa(a.lastJob))
		return res
	case AnswerSeeOther:
		return response{status: http.StatusSeeOther, header: http.Header{"Location": {location(r, c, key)}}}
	case AnswerBare:
		return response{status: http.StatusCreated, header: http.Header{}}
	}
	if c.FastAPI {
		return c.recordAnswer(r, http.StatusOK, rec)
	}
	res := c.recordAnswer(r, http.StatusCreated, rec)
	res.header.Set("Location", location(r, c, key))
	return res
}

func (a *API) handleItem(c *collection, t *table, id string, r *http.Request, body []byte) response {
	old := t.records[id] // nil when missing
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if old == nil {
			return notFound(r.URL.EscapedPath())
		}
		if slices.Contains(c.Hidden, id) {
			return htmlPage(http.StatusForbidden, "You do not have permission to perform this action.")
		}
		return c.recordAnswer(r, http.StatusOK, old)

	case http.MethodPut:
		return a.put(c, t, id, old, r, body)

	case http.MethodPatch:
		return a.patch(c, t, id, old, r, body)

	case http.MethodDelete:
		if res, failed := c.preconditions(r, old, false); failed {
			return res
		}
		if old == nil {
			return notFound(r.URL.EscapedPath())
		}
		delete(t.records, id)
		if c.Rails {
			return response{status: http.StatusNoContent, header: http.Header{}}
		}
		return response{status: http.StatusOK, header: jsonHeader(), body: []byte("{}")}

	default:
		return methodNotAllowed(r.Method, "GET, HEAD, PUT, PATCH, DELETE")
	}
}

// put replaces the record at id (old, nil when missing), or creates it
// where PUT may create.
func (a *API) put(c *collection, t *table, id string, old *record, r *http.Request, body []byte) response {
	if res, failed := c.preconditions(r, old, true); failed {
		return res
	}
	rec, err := decodeObject(body)
	if err != nil {
		return plain(http.StatusBadRequest, "body must be a JSON object")
	}
	c.accept(rec, old)
	if res, bad := c.checkName(rec); bad {
		return res
	}
	if old != nil {
		rec["id"] = old.fields["id"]
		return c.recordAnswer(r, http.StatusOK, a.store(t, id, rec, c.stamps()))
	}
	if !c.PutCreates {
		return notFound(r.URL.EscapedPath())
	}
	// The body's id only decides the type ("7" vs 7) when it names the
	// same record; the path is what identifies the record.
	if k, ok := idKey(rec["id"]); !ok || k != id {
		rec["id"] = pathIDValue(id)
	}
	res := c.recordAnswer(r, http.StatusCreated, a.store(t, id, rec, c.stamps()))
	res.header.Set("Location", location(r, c, id))
	return res
}

// patch merges the body into the record at id (old, nil when missing).
func (a *API) patch(c *collection, t *table, id string, old *record, r *http.Request, body []byte) response {
	if res, failed := c.preconditions(r, old, false); failed {
		return res
	}
	if old == nil {
		return notFound(r.URL.EscapedPath())
	}
	patch, err := decodeObject(body)
	if err != nil {
		return plain(http.StatusBadRequest, "body must be a JSON object")
	}
	// The stored record already holds its read-only members, so none
	// needs copying into the patch.
	c.accept(patch, nil)
	merged := make(map[string]any, len(old.fields)+len(patch))
	for k, v := range old.fields {
		merged[k] = v
	}
	for k, v := range patch {
		switch {
		case k == "id":
		case v == nil:
			delete(merged, k)
		default:
			merged[k] = v
		}
	}
	if res, bad := c.checkName(merged); bad {
		return res
	}
	return c.recordAnswer(r, http.StatusOK, a.store(t, id, merged, c.stamps()))
}

// etag is the record's strong entity tag.
func (rec *record) etag() string {
	return `"v` + strconv.FormatUint(rec.version, 10) + `"`
}

// accept turns a write's body into what the collection stores, as a
// serializer does: members Fields does not list or ReadOnly names are
// dropped, and with Normalize strings are cleaned up. old is the record a
// PUT replaces (nil when none), whose read-only members survive it.
func (c *collection) accept(body map[string]any, old *record) {
	for k, v := range body {
		switch {
		case slices.Contains(c.ReadOnly, k),
			len(c.Fields) > 0 && k != "id" && k != "updated_at" && !slices.Contains(c.Fields, k):
			delete(body, k)
		case c.Normalize:
			if s, ok := v.(string); ok {
				s = strings.TrimSpace(s)
				if k == "email" {
					s = strings.ToLower(s)
				}
				body[k] = s
			}
		}
	}
	if old == nil {
		return
	}
	for _, k := range c.ReadOnly {
		if v, has := old.fields[k]; has {
			body[k] = v
		}
	}
}

// updatedAtEpoch is where Normalize's clock starts; a fixed instant keeps
// answers reproducible from run to run.
var updatedAtEpoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// updatedAt is the updated_at of a record version: nine fractional digits
// always, so that the text sorts as the time does.
func updatedAt(version uint64) string {
	return updatedAtEpoch.Add(time.Duration(version)).Format("2006-01-02T15:04:05.000000000Z07:00")
}

// selected is the member names a request selects with the collection's
// SelectParam; none means the whole record.
func (c *collection) selected(r *http.Request) []string {
	if c.SelectParam == "" {
		return nil
	}
	var names []string
	for _, v := range r.URL.Query()[c.SelectParam] {
		for _, name := range strings.Split(v, ",") {
			if name != "" {
				names = append(names, name)
			}
		}
	}
	return names
}

// only is a record's fields reduced to "id" and the named members it has,
// or the fields themselves when no member is named.
func only(fields map[string]any, names []string) map[string]any {
	if len(names) == 0 {
		return fields
	}
	out := map[string]any{"id": fields["id"]}
	for _, name := range names {
		if v, has := fields[name]; has {
			out[name] = v
		}
	}
	return out
}

// contentTag is a strong entity tag hashed from an answer's body, as
// ContentETags computes it.
func contentTag(body []byte) string {
	sum := sha256.Sum256(body)
	return `"` + hex.EncodeToString(sum[:8]) + `"`
}

// recordAnswer answers r with a record as JSON, reduced to the members r
// selects, with the record's ETag when the collection has ETags.
func (c *collection) recordAnswer(r *http.Request, status int, rec *record) response {
	res := jsonAnswer(status, only(rec.fields, c.selected(r)))
	if c.ETags && res.status == status {
		res.header.Set("ETag", rec.etag())
	}
	return res
}

// preconditions evaluates If-Match, and with noneMatch If-None-Match,
// against cur, the record about to be written (nil when missing). It
// reports true, with the 412 to send, when one fails. Without ETags
// nothing fails.
func (c *collection) preconditions(r *http.Request, cur *record, noneMatch bool) (response, bool) {
	if !c.ETags {
		return response{}, false
	}
	if tags, has := condition(r, "If-Match"); has && (cur == nil || !matchTags(tags, cur.etag(), false)) {
		return preconditionFailed("If-Match"), true
	}
	if noneMatch {
		return c.createPrecondition(r, cur)
	}
	return response{}, false
}

// createPrecondition evaluates If-None-Match against cur, the record a
// create would replace or collide with (nil when missing).
func (c *collection) createPrecondition(r *http.Request, cur *record) (response, bool) {
	if !c.ETags || cur == nil {
		return response{}, false
	}
	if tags, has := condition(r, "If-None-Match"); has && matchTags(tags, cur.etag(), true) {
		return preconditionFailed("If-None-Match"), true
	}
	return response{}, false
}

// condition returns a conditional header's entity-tag list, all its lines
// joined; a header that is absent or blank is no condition.
func condition(r *http.Request, name string) (string, bool) {
	v := strings.Join(r.Header.Values(name), ",")
	return v, strings.TrimSpace(v) != ""
}

// matchTags reports whether a list of entity tags (or "*") matches etag, a
// strong tag, with the strong or weak comparison of RFC 9110 section 8.8.3.2.
func matchTags(list, etag string, weak bool) bool {
	for _, tag := range strings.Split(list, ",") {
		tag = strings.TrimSpace(tag)
		if weak {
			tag = strings.TrimPrefix(tag, "W/")
		}
		if tag == "*" || tag == etag {
			return true
		}
	}
	return false
}

func preconditionFailed(header string) response {
	return htmlPage(http.StatusPreconditionFailed, "Precondition failed: "+header+" does not hold for this record.")
}

// location builds an absolute URL from the request's Host, as legacy
// frameworks do, so the gateway has to cope with absolute Location headers.
func location(r *http.Request, c *collection, id string) string {
	loc := origin(r) + c.Path + "/" + url.PathEscape(id)
	if c.TrailingSlash {
		loc += "/"
	}
	return loc
}

// origin is "<scheme>://<host>" of the request, as the client addressed it.
func origin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func queryInt(q url.Values, name string, def int) (int, bool) {
	if !q.Has(name) {
		return def, true
	}
	n, err := strconv.Atoi(q.Get(name))
	return n, err == nil && n >= 0
}

// decodeObject decodes exactly one JSON object, keeping numbers as
// json.Number so ids and values round-trip without becoming floats.
func decodeObject(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.Decode(new(any)) != io.EOF {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a JSON object")
	}
	return m, nil
}

// checkName is the API's only validation rule, enough to provoke a 422.
func (c *collection) checkName(rec map[string]any) (response, bool) {
	v, has := rec["name"]
	if !has {
		return response{}, false
	}
	if s, ok := v.(string); ok && s != "" {
		return response{}, false
	}
	if c.FastAPI {
		return fastAPIInvalid(), true
	}
	return htmlPage(http.StatusUnprocessableEntity, "Validation failed: name must be a non-empty string."), true
}

// idKey is the string form an id is stored under.
func idKey(v any) (string, bool) {
	switch id := v.(type) {
	case json.Number:
		return id.String(), true
	case string:
		return id, id != ""
	}
	return "", false
}

// pathIDValue is the id value of a record created from its path: a JSON
// number when the segment is a canonical non-negative integer (so "007"
// stays a string and round-trips unchanged), else the string itself.
func pathIDValue(id string) any {
	if isDigits(id) && (id == "0" || id[0] != '0') {
		return json.Number(id)
	}
	return id
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// compareIDs orders numerically when both ids are numbers and lexically
// otherwise, so "10" sorts after "9" as a legacy "ORDER BY id" would.
func compareIDs(x, y string) int {
	if isDigits(x) && isDigits(y) {
		tx, ty := strings.TrimLeft(x, "0"), strings.TrimLeft(y, "0")
		if c := len(tx) - len(ty); c != 0 {
			return c
		}
		if c := strings.Compare(tx, ty); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	}
	fx, errx := parseNumber(x)
	fy, erry := parseNumber(y)
	if errx == nil && erry == nil && fx != fy {
		if fx < fy {
			return -1
		}
		return 1
	}
	return strings.Compare(x, y)
}

// parseNumber accepts only JSON number syntax, so ids like "inf" or "0x10"
// count as strings.
func parseNumber(s string) (float64, error) {
	if s == "" || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) || !json.Valid([]byte(s)) {
		return 0, fmt.Errorf("not a number")
	}
	return strconv.ParseFloat(s, 64)
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, e := range v {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

func (res response) clone() response {
	h := res.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	return response{status: res.status, header: h, body: bytes.Clone(res.body)}
}

func jsonHeader() http.Header {
	return http.Header{"Content-Type": {"application/json; charset=utf-8"}}
}

func jsonAnswer(status int, v any) response {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return plain(http.StatusInternalServerError, "cannot encode record")
	}
	return response{status: status, header: jsonHeader(), body: bytes.TrimSuffix(buf.Bytes(), []byte("\n"))}
}

func plain(status int, msg string) response {
	return response{status: status, header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, body: []byte(msg)}
}

// htmlPage renders the kind of error page a legacy web stack emits, which a
// gateway must not try to parse as JSON.
func htmlPage(status int, msg string) response {
	text := http.StatusText(status)
	page := fmt.Sprintf("<!DOCTYPE html><html><head><title>%d %s</title></head><body><h1>%s</h1><p>%s</p></body></html>",
		status, text, text, html.EscapeString(msg))
	return response{status: status, header: http.Header{"Content-Type": {"text/html; charset=utf-8"}}, body: []byte(page)}
}

func notFound(path string) response {
	return htmlPage(http.StatusNotFound, "The requested URL "+path+" was not found on this server.")
}

func methodNotAllowed(method, allow string) response {
	res := htmlPage(http.StatusMethodNotAllowed, "The method "+method+" is not allowed for the requested URL.")
	res.header.Set("Allow", allow)
	return res
}
