package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

func TestBearer(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer abc":  "abc",
		"bearer abc":  "abc",
		"BEARER  abc": "abc",
		"Basic abc":   "",
		"Bearer":      "",
		"":            "",
	} {
		if got := bearer(header); got != want {
			t.Errorf("bearer(%q) = %q, want %q", header, got, want)
		}
	}
}

// TestJobClient: a job's identity is any non-empty credential a request
// carries, and two requests with different credentials are two clients.
func TestJobClient(t *testing.T) {
	sc := scope{gateway: policy.GatewaySettings{ScopeHeaders: []string{"X-API-Key"}}, settings: policy.Settings{ScopeQuery: []string{"tenant"}}}
	request := func(target string, header ...string) *http.Request {
		r := httptest.NewRequest("POST", target, nil)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	seen := map[string]string{}
	for name, r := range map[string]*http.Request{
		"authorization": request("/w", "Authorization", "Bearer a"),
		"other bearer":  request("/w", "Authorization", "Bearer b"),
		"cookie":        request("/w", "Cookie", "s=1"),
		"scope header":  request("/w", "X-API-Key", "k"),
		"scope query":   request("/w?tenant=acme"),
		"other tenant":  request("/w?tenant=other"),
	} {
		client, ok := jobClient(r, sc)
		if !ok {
			t.Errorf("%s: no identity found", name)
		}
		if other, dup := seen[client]; dup {
			t.Errorf("%s and %s are one client", name, other)
		}
		seen[client] = name
	}
	for name, r := range map[string]*http.Request{
		"nothing":            request("/w"),
		"empty tenant":       request("/w?tenant="),
		"unscoped parameter": request("/w?page=2"),
		"unscoped header":    request("/w", "X-Other", "x"),
	} {
		if _, ok := jobClient(r, sc); ok {
			t.Errorf("%s: an identity found", name)
		}
	}
}
