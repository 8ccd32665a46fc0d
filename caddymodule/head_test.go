package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A HEAD sent as GET drops the GET's body as it streams, through Write
// and ReadFrom alike (reverse_proxy uses either), and holds none of it:
// 64 MiB pass with a few KiB allocated. Not parallel: it counts the
// process's allocations, which parallel tests would add to.
func TestHeadAsGetStreamsTheBodyAway(t *testing.T) {
	const size = 64 << 20
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if r.Method != http.MethodGet {
			t.Errorf("sent %s, want GET", r.Method)
		}
		w.Header().Set("Content-Length", "134217728")
		w.WriteHeader(http.StatusOK)
		chunk := make([]byte, 32<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		_, err := io.Copy(w, io.LimitReader(zeros{}, size))
		return err
	})
	rec := httptest.NewRecorder()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := serveHeadAsGet(rec, httptest.NewRequest(http.MethodHead, "/api/users/20", nil), next); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Length") != "134217728" || rec.Body.Len() != 0 {
		t.Errorf("answered %d, Content-Length %q, %d bytes of body; want the GET's status and headers, no body",
			rec.Code, rec.Header().Get("Content-Length"), rec.Body.Len())
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 4<<20 {
		t.Errorf("allocated %d bytes to pass %d bytes on: the body was held", grown, 2*size)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestAllows(t *testing.T) {
	t.Parallel()
	for allow, want := range map[string]bool{"GET, HEAD": true, "get,head": true, "GET, POST": false, "": false, "HEADER": false} {
		if got := allows(allow, http.MethodHead); got != want {
			t.Errorf("allows(%q, HEAD) = %v", allow, got)
		}
	}
}
