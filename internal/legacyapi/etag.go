package legacyapi

// Entity tags and the conditional requests some legacy APIs honour
// (Collection.ETags).

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
)

// etag is the record's strong entity tag.
func (rec *record) etag() string {
	return `"v` + strconv.FormatUint(rec.version, 10) + `"`
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
