package policy

import (
	"fmt"
	"strings"
)

// IDFormat says what the upstream's ids are. An API that reads 3, 03 and
// +3 as one row would otherwise see two writes to one item in a batch
// that names both spellings, under two locks (docs/configuration.md,
// "id_format").
type IDFormat uint8

const (
	// IDAny takes an id as its text.
	IDAny IDFormat = iota
	// IDInteger takes ids as decimal integers.
	IDInteger
	// IDUUID takes ids as UUIDs.
	IDUUID
)

// String returns the configuration name.
func (f IDFormat) String() string {
	switch f {
	case IDInteger:
		return "integer"
	case IDUUID:
		return "uuid"
	}
	return "any"
}

// ParseIDFormat parses id_format: any, integer or uuid.
func ParseIDFormat(s string) (IDFormat, error) { return parseFormat("id_format", s) }

// parseFormat parses a format, of what (id_format, or a template's
// variable: {user:integer}).
func parseFormat(what, s string) (IDFormat, error) {
	switch s {
	case "any":
		return IDAny, nil
	case "integer":
		return IDInteger, nil
	case "uuid":
		return IDUUID, nil
	}
	return 0, unknown(what, s, []string{"any", "integer", "uuid"})
}

// Canonical returns the one text of id the gateway sends, locks, compares
// for duplicates and reports: under integer, without a plus sign or
// leading zeros (-0 is 0); under uuid, in lower case with hyphens; under
// any, id itself. An id that is not of the format is an error that says
// what to send instead.
func (f IDFormat) Canonical(id string) (string, error) {
	switch f {
	case IDInteger:
		if c, ok := canonicalInteger(id); ok {
			return c, nil
		}
		return "", fmt.Errorf("id %q is not an integer (id_format integer): send the id as a decimal integer, or set id_format any", id)
	case IDUUID:
		if c, ok := canonicalUUID(id); ok {
			return c, nil
		}
		return "", fmt.Errorf("id %q is not a UUID (id_format uuid): send it as 32 hexadecimal digits, with or without the hyphens of 8-4-4-4-12, or set id_format any", id)
	}
	return id, nil
}

// canonicalInteger reads an optional sign and ASCII digits, nothing
// else: not "3.0", "1e3", " 3" or other scripts' digits, which an
// upstream's parser may read as another number or as none.
func canonicalInteger(id string) (string, bool) {
	digits, negative := id, false
	if digits != "" && (digits[0] == '+' || digits[0] == '-') {
		negative = digits[0] == '-'
		digits = digits[1:]
	}
	if digits == "" {
		return "", false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return "", false
		}
	}
	digits = strings.TrimLeft(digits, "0")
	switch {
	case digits == "":
		return "0", true
	case negative:
		return "-" + digits, true
	}
	return digits, true
}

// canonicalUUID reads the 8-4-4-4-12 form or the 32 digits alone, in
// either case.
func canonicalUUID(id string) (string, bool) {
	hex := id
	if len(id) == 36 {
		if id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
			return "", false
		}
		hex = id[:8] + id[9:13] + id[14:18] + id[19:23] + id[24:]
	}
	if len(hex) != 32 {
		return "", false
	}
	var b [36]byte
	j := 0
	for i := 0; i < 32; i++ {
		if i == 8 || i == 12 || i == 16 || i == 20 {
			b[j] = '-'
			j++
		}
		c := hex[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		default:
			return "", false
		}
		b[j] = c
		j++
	}
	return string(b[:]), true
}
