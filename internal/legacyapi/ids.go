package legacyapi

// Ids as legacy APIs read them: numeric where the path segment is
// digits, compared as numbers, and the lenient spellings some accept.

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

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
