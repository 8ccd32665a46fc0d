package legacyapi

import (
	"net/url"
	"strings"
)

// What a Rails API-mode scaffold does that other legacy APIs do not
// (Collection.Rails, ParentField).

// stamps reports whether the collection sets updated_at on every save.
func (c *collection) stamps() bool { return c.Normalize || c.Rails }

// railsID reads an item's path segment as Rails reads :id: the format
// suffix ".json" is routed away, and the rest is cast as Ruby's to_i
// does, keeping the leading integer ("3-foo" is 3), so that a slug
// after the id (to_param) reaches the row. A segment with no leading
// digits, or a negative one, names no record.
func railsID(seg string) (string, bool) {
	if n := len(seg) - len(".json"); n >= 0 && strings.EqualFold(seg[n:], ".json") {
		seg = seg[:n]
	}
	seg = strings.TrimPrefix(seg, "+")
	end := 0
	for end < len(seg) && seg[end] >= '0' && seg[end] <= '9' {
		end++
	}
	if end == 0 {
		return "", false
	}
	if seg = strings.TrimLeft(seg[:end], "0"); seg == "" {
		return "0", true
	}
	return seg, true
}

// parentID is the id of the parent item of a pattern's concrete
// collection, as a JSON value: the segment the last "*" matched, read as
// the parent's collection reads ids where it is served. Callers hold mu.
func (a *API) parentID(c *collection) any {
	if c.pattern == nil {
		return nil
	}
	parentPath, seg := c.parentItem()
	id, err := url.PathUnescape(seg)
	ok := err == nil
	if parent := a.collectionAt(parentPath); parent != nil {
		id, ok = parent.itemID(seg)
	}
	if !ok {
		return nil
	}
	return pathIDValue(id)
}
