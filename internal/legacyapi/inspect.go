package legacyapi

// What a test reads of the API: its items, the requests it received, the
// writes it applied, and how many requests were in flight at once.

import (
	"bytes"
	"net"
	"net/http"
	"sync/atomic"
	"time"
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
