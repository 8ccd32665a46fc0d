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

// IsMethodParam reports whether a query parameter named key is the
// method override parameter, as the frameworks that read one see its
// name: PHP (under Laravel and Symfony) drops a name's leading spaces
// and reads its spaces and dots as underscores, so " _method", ".method"
// and "%2Emethod" are "_method" there.
func IsMethodParam(key string) bool {
	name := strings.Map(func(r rune) rune {
		if r == ' ' || r == '.' {
			return '_'
		}
		return r
	}, strings.TrimLeft(key, " "))
	return name == MethodParam
}

// WithoutMethodParam is rawQuery without any parameter IsMethodParam
// names.
func WithoutMethodParam(rawQuery string) string {
	var rest []string
	found := false
	_ = EachParam(rawQuery, func(pair, key, _ string) error {
		if IsMethodParam(key) {
			found = true
		} else {
			rest = append(rest, pair)
		}
		return nil
	})
	if !found {
		return rawQuery
	}
	return strings.Join(rest, "&")
}
