package legacyapi

import (
	"net/http"
	"testing"
)

// A token is accepted until it is revoked, and one accepted later from
// then on; a refused request applies nothing.
func TestBearerTokensExpire(t *testing.T) {
	t.Parallel()
	api, srv := startWith(t, Collection{Path: "/api/widgets", BearerTokens: []string{"first"}}, Collection{Path: "/open"})
	post := func(auth string) answer {
		return doH(t, "POST", srv.URL+"/api/widgets", `{"id":"`+auth+`"}`, http.Header{"Authorization": {auth}})
	}
	if a := post("Bearer first"); a.status != http.StatusCreated {
		t.Fatalf("with the first token: %d %s", a.status, a.body)
	}
	api.RevokeToken("first")
	for _, auth := range []string{"Bearer first", "Bearer second", "", "Basic first"} {
		a := post(auth)
		if a.status != http.StatusUnauthorized || a.header.Get("WWW-Authenticate") != `Bearer realm="legacy", error="invalid_token"` {
			t.Errorf("with %q: %d %v, want 401 with WWW-Authenticate: Bearer", auth, a.status, a.header)
		}
	}
	if got := api.Writes(); got.Applied != 1 {
		t.Errorf("%d writes applied, want only the first: a refused one applies nothing", got.Applied)
	}
	api.AcceptToken("second")
	if a := post("Bearer second"); a.status != http.StatusCreated {
		t.Errorf("with the accepted second token: %d %s", a.status, a.body)
	}
	if a := do(t, "GET", srv.URL+"/open", ""); a.status != http.StatusOK {
		t.Errorf("a collection without BearerTokens: %d, want 200 without a token", a.status)
	}
}
