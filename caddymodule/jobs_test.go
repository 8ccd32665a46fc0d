package caddymodule

import (
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/durable"
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

// A keyed start's record made by a build whose fingerprint left the
// atomicity out still replays its start (checked against the job's
// atomicity then); the fingerprint of this build tells the same
// elements all-or-nothing from them partial.
func TestStartReplaysAcrossTheFingerprintsAtomicity(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/api/users", nil)
	partial := &batch.JobPlan{Digest: []byte("elements"), Atomicity: policy.Partial}
	atomic := &batch.JobPlan{Digest: []byte("elements"), Atomicity: policy.AllOrNothing}
	before := &durable.Record{Fingerprint: durable.HashFields("job start", "POST", "/api/users", "", hex.EncodeToString([]byte("elements")))}
	now := &durable.Record{Fingerprint: startFingerprint(r, partial)}
	for _, c := range []struct {
		name               string
		rec                *durable.Record
		plan               *batch.JobPlan
		replays, unchecked bool
	}{
		{"this build's, the same start", now, partial, true, false},
		{"this build's, all-or-nothing now", now, atomic, false, false},
		{"the build before's", before, partial, true, true},
		{"the build before's, all-or-nothing now", before, atomic, true, true},
		{"another start", now, &batch.JobPlan{Digest: []byte("others"), Atomicity: policy.Partial}, false, false},
	} {
		replays, unchecked := startReplays(c.rec, r, c.plan)
		if replays != c.replays || unchecked != c.unchecked {
			t.Errorf("%s: replays %v, atomicity unchecked %v; want %v, %v", c.name, replays, unchecked, c.replays, c.unchecked)
		}
	}
}
