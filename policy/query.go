package policy

import (
	"errors"
	"net/url"
	"strings"
)

// EachParam calls f with every key=value pair of a raw query, the key
// unescaped and the value as sent. A key that is not valid
// percent-encoding is passed as sent: it is some other parameter, which
// must neither hide the ids parameter nor fail the batch.
func EachParam(rawQuery string, f func(pair, key, value string) error) error {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		if pair == "" {
			continue
		}
		key, value, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(key, "%+") {
			if k, err := url.QueryUnescape(key); err == nil {
				key = k
			}
		}
		if err := f(pair, key, value); err != nil {
			return err
		}
	}
	return nil
}

// HasParam reports whether the raw query names the parameter.
func HasParam(rawQuery, name string) bool {
	found := errors.New("found")
	return EachParam(rawQuery, func(_, key, _ string) error {
		if key == name {
			return found
		}
		return nil
	}) == found
}

// WithoutParam returns the raw query without the parameter name, the
// other pairs as they were sent.
func WithoutParam(rawQuery, name string) string {
	if !HasParam(rawQuery, name) {
		return rawQuery
	}
	var rest []string
	_ = EachParam(rawQuery, func(pair, key, _ string) error {
		if key != name {
			rest = append(rest, pair)
		}
		return nil
	})
	return strings.Join(rest, "&")
}
