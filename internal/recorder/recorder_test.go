package recorder

import (
	"bytes"
	"math"
	"strconv"
	"testing"
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
			rec := New(limit)
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
			if rec.Overflowed() != tt.tooLarge {
				t.Fatalf("Overflowed = %t, want %t", rec.Overflowed(), tt.tooLarge)
			}
			if tt.tooLarge {
				return
			}
			body := rec.Bytes()
			if rec.Status() != 200 || !bytes.Equal(body, tt.body) {
				t.Fatalf("kept %d, %d bytes; want 200 and the %d bytes written", rec.Status(), len(body), len(tt.body))
			}
			if cap(body) > tt.maxCap {
				t.Errorf("the body of %d bytes is held in a buffer of %d, want at most %d", len(body), cap(body), tt.maxCap)
			}
		})
	}
}

// With a Content-Length, the body is received into one buffer, allocated
// once: not grown by doubling, not copied again when whole.
func TestRecorderSizedOnce(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 1<<20)
	receive := func() {
		rec := New(2 << 20)
		rec.Header().Set("Content-Length", strconv.Itoa(len(body)))
		for rest := body; len(rest) > 0; rest = rest[32<<10:] {
			_, _ = rec.Write(rest[:32<<10])
		}
		if len(rec.Bytes()) != len(body) {
			t.Fatal("the body was not kept whole")
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
	// The recorder, its header, the buffer: 3 in all. Grown from
	// nothing, the buffer alone would take 5 more.
	if allocs > 6 {
		t.Errorf("receiving a 1 MiB body took %.0f allocations, want one for its buffer and a few small ones", allocs)
	}
}
