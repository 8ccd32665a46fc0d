package durable

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// One name for a record, whoever looks for it: a batch's claim and the
// recovery that settles it; every field of the scope tells records apart,
// and no field can run into the next.
func TestIdempotencyRecord(t *testing.T) {
	t.Parallel()
	scope := []string{`"k1"`, Credentials(http.Header{"Authorization": {"Bearer a"}}), "/api/users", "/api/users", "update"}
	key, lock := IdempotencyRecord(scope[0], scope[1], scope[2], scope[3], scope[4])
	if !regexp.MustCompile(`^batch/v1/idem/[0-9a-f]{64}$`).MatchString(key) || lock != "batch_idem_"+strings.TrimPrefix(key, "batch/v1/idem/") {
		t.Fatalf("record %q, lock %q", key, lock)
	}
	if IdempotencyLock(key) != lock {
		t.Errorf("the sweep's lock of %q is %q, the claim's %q", key, IdempotencyLock(key), lock)
	}
	for i := range scope {
		other := append([]string(nil), scope...)
		other[i] += "x"
		if k, _ := IdempotencyRecord(other[0], other[1], other[2], other[3], other[4]); k == key {
			t.Errorf("field %d changed, the record did not", i)
		}
	}
	if HashFields("ab", "c") == HashFields("a", "bc") {
		t.Error("fields ran into each other")
	}
	if Credentials(http.Header{"Cookie": {"a"}}) == Credentials(http.Header{"Authorization": {"a"}}) {
		t.Error("a cookie and an Authorization of the same value share credentials")
	}
}
