package legacyapi

// Writes: creates, PUTs and PATCHes as legacy APIs apply them (assigned
// ids, normalised and stamped fields, keys honoured), and the records
// they keep.

import (
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// keyRecord is one Idempotency-Key seen by the API.
type keyRecord struct {
	body [sha256.Size]byte // hash of the first request's body
	done bool              // false while the first request is being served
	res  response          // the first request's answer, once done
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
