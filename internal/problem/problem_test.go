package problem

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	if err := New(http.StatusMethodNotAllowed, "method-not-allowed", "DELETE is not allowed on /a/1").Write(rec); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 405 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type":   "https://github.com/caddy-batch/caddy-batch#problem-method-not-allowed",
		"title":  "Method Not Allowed",
		"status": float64(405),
		"detail": "DELETE is not allowed on /a/1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestTitleOfAClosedRequest(t *testing.T) {
	t.Parallel()
	if got := New(499, "client-closed", "").Title; got != "Client Closed Request" {
		t.Errorf("title %q", got)
	}
}
