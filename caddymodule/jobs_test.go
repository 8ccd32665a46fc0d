package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestReadResumeHeaders: a resume gives headers as strings or arrays,
// [] to remove one, and is refused a header no sub-request carries.
func TestReadResumeHeaders(t *testing.T) {
	read := func(body string) (http.Header, int) {
		h, prob := readResumeHeaders(httptest.NewRequest("POST", "/jobs/x/resume", strings.NewReader(body)))
		if prob != nil {
			return nil, prob.Status
		}
		return h, 0
	}
	h, status := read(`{"headers": {"authorization": "Bearer fresh", "X-API-Key": ["k1", "k2"], "Cookie": []}}`)
	if status != 0 || h.Get("Authorization") != "Bearer fresh" || len(h.Values("X-Api-Key")) != 2 || h["Cookie"] == nil || len(h["Cookie"]) != 0 {
		t.Errorf("read %v (%d); want Authorization, both X-API-Key values, Cookie to remove", h, status)
	}
	if h, status := read(""); status != 0 || len(h) != 0 {
		t.Errorf("no body: %v (%d); want no headers, resumed as it was", h, status)
	}
	for _, body := range []string{
		`{"headers": {"Connection": "close"}}`,
		`{"headers": {"Content-Type": "text/plain"}}`,
		`{"headers": {"Idempotency-Key": "k"}}`,
		`{"headers": {"X-HTTP-Method-Override": "DELETE"}}`,
		`{"headers": {"Bad Name": "x"}}`,
		`{"headers": {"X-Key": "a\nb"}}`,
		`{"headers": {"X-Key": 7}}`,
		`{"headers": {"X-Key": null}}`,
		`{"header": {}}`,
		`[]`,
		`{"headers": {}} {}`,
	} {
		if _, status := read(body); status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", body, status)
		}
	}
}
