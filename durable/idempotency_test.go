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
	scope := []string{`"k1"`, Credentials(http.Header{"Authorization": {"Bearer a"}}, nil), "/api/users", "/api/users", "update"}
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
	if Credentials(http.Header{"Cookie": {"a"}}, nil) == Credentials(http.Header{"Authorization": {"a"}}, nil) {
		t.Error("a cookie and an Authorization of the same value share credentials")
	}
}

// A header named in scope_headers says who the client is, however the
// configuration spells or orders the names; without scope_headers the
// credentials are what older builds hashed (their records are still
// found: the golden claims), and other headers say nothing.
func TestCredentialsScopeHeaders(t *testing.T) {
	t.Parallel()
	alice := http.Header{"X-Api-Key": {"alice"}, "X-Tenant": {"t1"}}
	bob := http.Header{"X-Api-Key": {"bob"}, "X-Tenant": {"t1"}}
	if Credentials(alice, nil) != Credentials(bob, nil) {
		t.Error("a header not named in scope_headers told two clients apart")
	}
	if Credentials(alice, nil) != HashFields("authorization", "", "cookie", "") {
		t.Error("without scope_headers the credentials are not what older builds hashed")
	}
	scoped := []string{"X-API-Key", "x-tenant"}
	if Credentials(alice, scoped) == Credentials(bob, scoped) {
		t.Error("two X-API-Keys named in scope_headers are one client")
	}
	if Credentials(alice, scoped) != Credentials(alice, []string{"X-Tenant", "x-api-key"}) {
		t.Error("the same scope_headers, spelled and ordered otherwise, name another client")
	}
	if Credentials(alice, scoped) == Credentials(http.Header{"X-Tenant": {"t1"}}, scoped) {
		t.Error("a client without the header is the one with it")
	}
}
