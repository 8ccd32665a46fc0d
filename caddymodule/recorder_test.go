package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/recorder"
)

// A sub-request's answer is held until the batch answers, so its buffer
// should be the body's size: sized from Content-Length when there is
// one, else trimmed once the body is whole.
func TestRecorderBodyBuffer(t *testing.T) {
	const limit = 2 << 20
	body := bytes.Repeat([]byte("x"), 1<<20)
	tests := []struct {
		name          string
		contentLength string
		body          []byte
		tooLarge      bool
		maxCap        int // the most the kept body's buffer may hold
	}{
		{name: "Content-Length", contentLength: strconv.Itoa(len(body)), body: body, maxCap: len(body)},
		{name: "no Content-Length (chunked)", body: body, maxCap: len(body) + len(body)/4},
		{name: "Content-Length too small", contentLength: "1000", body: body, maxCap: len(body) + len(body)/4},
		{name: "Content-Length too large: trusted only up to the limit", contentLength: "100000000000", body: body, maxCap: len(body) + len(body)/4},
		{name: "Content-Length not a number", contentLength: "lots", body: body, maxCap: len(body) + len(body)/4},
		{name: "small, chunked", body: []byte(`{"id":1}`), maxCap: 64},
		{name: "empty", contentLength: "0", maxCap: 0},
		{name: "past the limit", contentLength: strconv.Itoa(limit + 1), body: bytes.Repeat([]byte("x"), limit+1), tooLarge: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := recorder.New(limit)
			if tt.contentLength != "" {
				rec.Header().Set("Content-Length", tt.contentLength)
			}
			rec.WriteHeader(200)
			// reverse_proxy copies a body in pieces of 32 KiB.
			for rest := tt.body; len(rest) > 0; {
				n := min(len(rest), 32<<10)
				if w, err := rec.Write(rest[:n]); w != n || err != nil {
					t.Fatalf("Write = %d, %v", w, err)
				}
				rest = rest[n:]
			}
			resp, err := answer(context.Background(), rec, nil)
			if tt.tooLarge {
				if !errors.Is(err, batch.ErrBodyTooLarge) || resp == nil || resp.Body != nil {
					t.Fatalf("answer = %+v, %v; want the status without the body, and ErrBodyTooLarge", resp, err)
				}
				return
			}
			if err != nil || resp.Status != 200 || !bytes.Equal(resp.Body, tt.body) {
				t.Fatalf("answer = %d, %d bytes, %v; want 200 and the %d bytes written", resp.Status, len(resp.Body), err, len(tt.body))
			}
			if cap(resp.Body) > tt.maxCap {
				t.Errorf("the body of %d bytes is held in a buffer of %d, want at most %d", len(resp.Body), cap(resp.Body), tt.maxCap)
			}
		})
	}
}

// With a Content-Length, the body is received into one buffer, allocated
// once: not grown by doubling, not copied again when whole.
func TestRecorderSizedOnce(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 1<<20)
	receive := func() {
		rec := recorder.New(2 << 20)
		rec.Header().Set("Content-Length", strconv.Itoa(len(body)))
		for rest := body; len(rest) > 0; rest = rest[32<<10:] {
			_, _ = rec.Write(rest[:32<<10])
		}
		if _, err := answer(context.Background(), rec, nil); err != nil {
			t.Fatal(err)
		}
	}
	// AllocsPerRun counts the whole process's allocations, and goroutines
	// that earlier tests leave behind for a while (certmagic's lock-file
	// keepers wake every 5 s) allocate too: the least of several runs is
	// the recorder's own count.
	allocs := math.Inf(1)
	for range 5 {
		allocs = min(allocs, testing.AllocsPerRun(5, receive))
	}
	// The recorder, its header, the buffer, the answer: 6 in all. Grown
	// from nothing, the buffer alone would take 5 more.
	if allocs > 8 {
		t.Errorf("receiving a 1 MiB body took %.0f allocations, want one for its buffer and a few small ones", allocs)
	}
}
