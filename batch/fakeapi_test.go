package batch

// The one upstream of the engine's tests: a Sender with an in-memory
// legacy API behind it, whose answers a test can script request by
// request.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// answer is one scripted reply to a sub-request. The zero answer lets the
// in-memory store answer; the fields change that.
type answer struct {
	status int
	header http.Header
	body   string

	// err is returned with no response: ErrNotSent-wrapped means the
	// request never left, any other error means it was sent and no answer
	// came back.
	err error
	// effectThenErr lets the store apply the request, then loses the
	// answer: the write happened, the gateway cannot know.
	effectThenErr error
	// effectThenStatus lets the store apply the request, then answers
	// this status with an error page instead: a proxy in front of the
	// upstream whose answer did not reach it.
	effectThenStatus int
	// resent lets the store apply the request twice and answers the
	// second copy, marked Resent: an HTTP client that resent the request
	// after its first connection died.
	resent bool
	// readErr comes back with the scripted response: the status arrived,
	// the body could not be read whole.
	readErr error
	// hang blocks until the sub-request's context is done and returns its
	// error: an upstream that never answers.
	hang bool
	// lateAnswer waits until the sub-request's context is done, then
	// answers anyway: an upstream that answers just as time runs out.
	lateAnswer bool
	// hook runs before the answer; it may block on channels.
	hook func(ctx context.Context, req *SubRequest)
	// delay is slept before answering (ordering tests only).
	delay time.Duration
}

// reply is a shorthand for a canned answer.
func reply(status int, body string, header ...string) answer {
	a := answer{status: status, body: body, header: http.Header{}}
	for i := 0; i+1 < len(header); i += 2 {
		a.header.Add(header[i], header[i+1])
	}
	return a
}

// call is one sub-request as the fake received it.
type call struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   string
	// CtxErr is the sub-request context's error when Send returned.
	CtxErr error
	// CtxValue is the context's value under ctxKey{}.
	CtxValue any
}

// ctxKey is a context key a test can set on the client's context, to see
// that sub-requests keep the context's values.
type ctxKey struct{}

func (c call) String() string { return c.Method + " " + c.Path }

// fakeAPI is a legacy API of a few collections (/widgets unless told
// otherwise) behind a Sender. Its records are kept by item path: POST on
// a collection creates (with an absolute Location), GET on it lists its
// records (filtered by ?id=1&id=2, as json-server does), GET on an item
// reads it, PATCH merges (JSON merge patch), PUT replaces or creates,
// DELETE removes and answers 204. A script (on) answers in the store's
// place, or after it, request by request.
type fakeAPI struct {
	// Habits, set before the first request.

	// jitter, when set, delays every answer by a random duration below it,
	// so that items complete in random order.
	jitter time.Duration
	// noLocation makes a create answer without a Location header.
	noLocation bool
	// stamps makes the store set "updated_at" on every record it stores,
	// from a clock of its own, whatever the write sent: Rails'
	// timestamps, Django's auto_now.
	stamps bool
	// numericIDs makes the ids the API assigns JSON numbers, and keeps
	// the id a create names as it was sent; without it, every id is
	// stored as a string.
	numericIDs bool
	// putCannotCreate makes a PUT of an item that does not exist answer
	// 404: an API that creates only by POST.
	putCannotCreate bool

	mu          sync.Mutex
	collections map[string]bool
	scripts     map[string][]answer // "METHOD /escaped/path" → answers; the last one repeats
	calls       []call
	writeLog    []string // "METHOD /item/path" of every write the store carried out, in order
	inFlight    int
	maxInFlight int
	records     map[string]map[string]any // by item path, its last segment escaped
	nextID      int
	clock       int
}

// newFake is the widgets API: /widgets, with string ids, assigned from
// 1000.
func newFake() *fakeAPI {
	return &fakeAPI{
		collections: map[string]bool{"/widgets": true},
		scripts:     map[string][]answer{}, records: map[string]map[string]any{}, nextID: 1000,
	}
}

// newShopAPI is the API of the envelope tests, over the collections
// given (e.g. /users, /users/100/posts): ids are numbers, assigned from
// 100, and PUT cannot create.
func newShopAPI(collections ...string) *fakeAPI {
	f := newFake()
	f.collections = map[string]bool{}
	for _, c := range collections {
		f.collections[c] = true
	}
	f.nextID, f.numericIDs, f.putCannotCreate = 100, true, true
	return f
}

// on scripts the answers to one method and escaped path, in turn; the last
// answer repeats. A zero answer lets the store answer.
func (f *fakeAPI) on(method, path string, answers ...answer) *fakeAPI {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripts[method+" "+path] = answers
	return f
}

// widget is the item path of a widget.
func widget(id string) string { return "/widgets/" + url.PathEscape(id) }

// seed stores widgets, each with its "id" member set.
func (f *fakeAPI) seed(ids ...string) *fakeAPI {
	for _, id := range ids {
		f.put(widget(id), map[string]any{"id": id, "name": "widget " + id, "color": "red"})
	}
	return f
}

// put stores rec at an item path, as it is.
func (f *fakeAPI) put(itemPath string, rec map[string]any) *fakeAPI {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[itemPath] = rec
	return f
}

// state returns a copy of the store: each record as JSON, by item path.
func (f *fakeAPI) state() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.records))
	for key, rec := range f.records {
		b, _ := json.Marshal(rec)
		out[key] = string(b)
	}
	return out
}

// checkUnchanged fails the test unless the store holds what it held
// before: a rollback left nothing behind and lost nothing.
func (f *fakeAPI) checkUnchanged(t testing.TB, before map[string]string) {
	t.Helper()
	if now := f.state(); !maps.Equal(now, before) {
		t.Errorf("store %v, want it back as it was: %v", now, before)
	}
}

// log returns the sub-requests received so far, in arrival order.
func (f *fakeAPI) log() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// sent returns "METHOD /path" of every sub-request, in arrival order.
func (f *fakeAPI) sent() []string {
	var out []string
	for _, c := range f.log() {
		out = append(out, c.String())
	}
	return out
}

// sentWith returns the calls with the given method.
func (f *fakeAPI) sentWith(method string) []call {
	var out []call
	for _, c := range f.log() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// writes returns "METHOD /item/path" of every write the store carried
// out, in order: a create under the path it gave the item.
func (f *fakeAPI) writes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writeLog)
}

func (f *fakeAPI) maxConcurrent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxInFlight
}

func (f *fakeAPI) Send(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, call{
		Method: req.Method, Path: req.Path, RawQuery: req.RawQuery,
		Header: req.Header.Clone(), Body: string(req.Body), CtxValue: ctx.Value(ctxKey{}),
	})
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	var a answer
	key := req.Method + " " + req.Path
	if script := f.scripts[key]; len(script) > 0 {
		a = script[0]
		if len(script) > 1 {
			f.scripts[key] = script[1:]
		}
	}
	delay := a.delay
	if f.jitter > 0 {
		delay += rand.N(f.jitter)
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.calls[n].CtxErr = ctx.Err()
		f.mu.Unlock()
	}()

	if a.hook != nil {
		a.hook(ctx, req)
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	switch {
	case a.hang:
		<-ctx.Done()
		return nil, ctx.Err()
	case a.lateAnswer:
		<-ctx.Done()
	}
	if a.err != nil {
		return nil, a.err
	}
	if a.status != 0 {
		h := a.header.Clone()
		if h == nil {
			h = http.Header{}
		}
		return &SubResponse{Status: a.status, Header: h, Body: []byte(a.body)}, a.readErr
	}
	resp := f.store(req)
	if a.resent {
		resp = f.store(req)
		resp.Resent = true
	}
	if a.effectThenErr != nil {
		return nil, a.effectThenErr
	}
	if a.effectThenStatus != 0 {
		return &SubResponse{Status: a.effectThenStatus, Header: http.Header{"Content-Type": {"text/html"}}, Body: []byte("<h1>Bad Gateway</h1>")}, nil
	}
	return resp, nil
}

// answerJSON is the store's answer with a JSON body.
func answerJSON(status int, v any) *SubResponse {
	b, _ := json.Marshal(v)
	return &SubResponse{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: b}
}

// store is the in-memory API: it carries the request out, and answers.
func (f *fakeAPI) store(req *SubRequest) *SubResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	var body map[string]any
	if req.Body != nil {
		if err := json.Unmarshal(req.Body, &body); err != nil {
			return answerJSON(http.StatusBadRequest, map[string]string{"error": err.Error()})
		}
	}
	if f.collections[req.Path] {
		switch req.Method {
		case http.MethodGet:
			return f.list(req)
		case http.MethodPost:
			return f.create(req.Path, body)
		}
		return answerJSON(http.StatusMethodNotAllowed, nil)
	}
	parent, last := path.Split(req.Path)
	id, err := url.PathUnescape(last)
	if err != nil {
		return answerJSON(http.StatusNotFound, map[string]string{"error": "not found"})
	}
	return f.item(req.Method, strings.TrimSuffix(parent, "/"), id, body)
}

// list is a GET on a collection: its records, in the order of their
// paths, or those the query's ids name, in their order.
func (f *fakeAPI) list(req *SubRequest) *SubResponse {
	q, _ := url.ParseQuery(req.RawQuery)
	var paths []string
	for _, id := range q["id"] {
		paths = append(paths, req.Path+"/"+url.PathEscape(id))
	}
	if len(q["id"]) == 0 {
		for _, p := range slices.Sorted(maps.Keys(f.records)) {
			if parent, _ := path.Split(p); parent == req.Path+"/" {
				paths = append(paths, p)
			}
		}
	}
	list := []map[string]any{}
	for _, p := range paths {
		if rec, ok := f.records[p]; ok {
			list = append(list, rec)
		}
	}
	return answerJSON(http.StatusOK, list)
}

// create is a POST on a collection: the item gets the id its body names,
// or the next one.
func (f *fakeAPI) create(collection string, body map[string]any) *SubResponse {
	var id string
	switch v := body["id"].(type) {
	case string:
		id = v
	case float64:
		id = strconv.FormatFloat(v, 'f', -1, 64)
	default:
		id = strconv.Itoa(f.nextID)
		body["id"] = f.nextID
		f.nextID++
	}
	if !f.numericIDs {
		body["id"] = id
	}
	itemPath := collection + "/" + url.PathEscape(id)
	if _, exists := f.records[itemPath]; exists {
		return answerJSON(http.StatusConflict, map[string]string{"error": "exists"})
	}
	f.stamp(body)
	f.records[itemPath] = body
	f.writeLog = append(f.writeLog, "POST "+itemPath)
	resp := answerJSON(http.StatusCreated, body)
	if !f.noLocation {
		resp.Header.Set("Location", "http://upstream.test"+itemPath)
	}
	return resp
}

// item carries out a request on an item of the collection at parent.
func (f *fakeAPI) item(method, parent, id string, body map[string]any) *SubResponse {
	itemPath := parent + "/" + url.PathEscape(id)
	rec, exists := f.records[itemPath]
	creates := method == http.MethodPut && !f.putCannotCreate && f.collections[parent]
	switch {
	case !slices.Contains([]string{http.MethodGet, http.MethodPatch, http.MethodPut, http.MethodDelete}, method):
		return answerJSON(http.StatusMethodNotAllowed, nil)
	case !exists && !creates:
		return answerJSON(http.StatusNotFound, map[string]string{"error": "not found"})
	case method == http.MethodGet:
		return answerJSON(http.StatusOK, rec)
	}
	status := http.StatusOK
	switch method {
	case http.MethodPatch:
		merged := maps.Clone(rec)
		for k, v := range body {
			if v == nil {
				delete(merged, k)
			} else {
				merged[k] = v
			}
		}
		f.stamp(merged)
		f.records[itemPath] = merged
		body = merged
	case http.MethodPut:
		f.stamp(body)
		f.records[itemPath] = body
		if !exists {
			status = http.StatusCreated
		}
	case http.MethodDelete:
		delete(f.records, itemPath)
		status, body = http.StatusNoContent, nil
	}
	f.writeLog = append(f.writeLog, method+" "+itemPath)
	if body == nil {
		return &SubResponse{Status: status, Header: http.Header{}}
	}
	return answerJSON(status, body)
}

// stamp sets a record's updated_at, when the store stamps. Callers hold
// mu.
func (f *fakeAPI) stamp(rec map[string]any) {
	if f.stamps {
		f.clock++
		rec["updated_at"] = fmt.Sprintf("t%d", f.clock)
	}
}
