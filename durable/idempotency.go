package durable

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"path"
	"slices"
	"strings"
)

// IdempotencyPrefix is the storage folder of the Idempotency-Key records,
// one file (or Redis key) per record, named by the hash of its scope.
const IdempotencyPrefix = "batch/v1/idem"

// IdempotencyRecord names the record of an Idempotency-Key, and the
// storage lock around its check and claim, from what scopes it: the
// client's key as sent, the hash of its credentials (Credentials), the
// resource's template, the collection's path and the operation. A batch's
// claim and a recovery that settles the batch's record both find it here.
func IdempotencyRecord(key, credentials, resource, collection, op string) (storageKey, lockName string) {
	name := HashFields("batch idempotency v1", key, credentials, resource, collection, op)
	storageKey = path.Join(IdempotencyPrefix, name)
	return storageKey, IdempotencyLock(storageKey)
}

// IdempotencyLock is the storage lock of the record stored at storageKey:
// lock names are stripped to a few characters, and a record's name is hex.
func IdempotencyLock(storageKey string) string {
	return "batch_idem_" + strings.TrimPrefix(storageKey, IdempotencyPrefix+"/")
}

// Credentials hashes what says who the client is: its Authorization and
// Cookie, and the headers named in scopeHeaders (scope_headers: an API
// keyed by X-API-Key). Two clients with other credentials never share a
// record or a throttle hold, so neither can read the other's answer by
// guessing its key; the record holds no credential itself. Without
// scopeHeaders the hash is what older builds made, so the records they
// kept are still found.
func Credentials(h http.Header, scopeHeaders []string) string {
	fields := []string{
		"authorization", strings.Join(h.Values("Authorization"), "\n"),
		"cookie", strings.Join(h.Values("Cookie"), "\n"),
	}
	// Canonical and sorted, so that two instances whose configurations
	// spell or order them otherwise agree on who a client is.
	names := make([]string, len(scopeHeaders))
	for i, name := range scopeHeaders {
		names[i] = http.CanonicalHeaderKey(name)
	}
	slices.Sort(names)
	for _, name := range names {
		fields = append(fields, "header "+name, strings.Join(h.Values(name), "\n"))
	}
	return HashFields(fields...)
}

// HashFields hashes fields so that no two lists of fields share a hash:
// each is length-prefixed.
func HashFields(fields ...string) string {
	h := sha256.New()
	for _, f := range fields {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}
