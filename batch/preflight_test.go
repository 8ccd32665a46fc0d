package batch

// Preflight: what an all-or-nothing write reads before it writes
// (docs/all-or-nothing.md).

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPreflight(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method, target, body string
		mods                       []specMod
		fake                       func() *fakeAPI
		status                     int
		items                      []string
		detail                     []string
	}{
		{name: "update, a target missing", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1}]`,
			fake:   func() *fakeAPI { return newFake().seed("1", "3") },
			status: 404, items: []string{"not_attempted", "failed", "not_attempted"}, detail: []string{"item 1", `"2"`, "404"}},
		{name: "delete, a target missing", method: "DELETE", target: "/widgets?ids=1,2,3",
			fake:   func() *fakeAPI { return newFake().seed("1", "3") },
			status: 404, items: []string{"not_attempted", "failed", "not_attempted"}, detail: []string{"item 1", `"2"`}},
		{name: "delete, the first by index of two missing", method: "DELETE", target: "/widgets?ids=1,2,3", mods: []specMod{concurrency(3)},
			fake: func() *fakeAPI {
				second := make(chan struct{})
				return newFake().seed("1").
					on("GET", "/widgets/2", answer{status: 410, body: `{}`, hook: func(context.Context, *SubRequest) { <-second }}).
					on("GET", "/widgets/3", answer{status: 404, body: `{}`, hook: func(context.Context, *SubRequest) { close(second) }})
			},
			status: 410, items: []string{"not_attempted", "failed", "failed"}, detail: []string{"item 1"}},
		{name: "update, a pre-image that is a JSON array", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", reply(200, `[1,2]`)) },
			status: 502, items: []string{"not_attempted", "failed"}, detail: []string{"item 1", "JSON object"}},
		{name: "update, a pre-image that is a JSON object but not UTF-8", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			fake: func() *fakeAPI {
				return newFake().seed("1").on("GET", "/widgets/2", reply(200, "{\"name\":\"\xff\"}"))
			},
			status: 502, items: []string{"not_attempted", "failed"}, detail: []string{"item 1", "JSON object"}},
		{name: "delete, a pre-image that is HTML", method: "DELETE", target: "/widgets?ids=1,2",
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", reply(200, `<html>ok</html>`)) },
			status: 502, items: []string{"not_attempted", "failed"}, detail: []string{"item 1"}},
		{name: "update, a pre-image read fails with 500", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", reply(500, `boom`)) },
			status: 502, items: []string{"not_attempted", "failed"}},
		{name: "update, a pre-image read times out", method: "PATCH", target: "/widgets", body: `[{"id":"1","v":1},{"id":"2","v":1}]`,
			mods:   []specMod{itemTimeout(50 * time.Millisecond)},
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", answer{hang: true}) },
			status: 504, items: []string{"not_attempted", "failed"}},
		{name: "delete, a pre-image read unanswered", method: "DELETE", target: "/widgets?ids=1,2",
			fake:   func() *fakeAPI { return newFake().seed("1").on("GET", "/widgets/2", answer{err: errLost}) },
			status: 502, items: []string{"not_attempted", "failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.fake()
			before := f.state()
			w := write(t, run1(t, tt.method, tt.target, tt.body, f, tt.mods...))
			for _, c := range f.log() {
				if c.Method != "GET" {
					t.Errorf("%s was sent, but a failed preflight must stop the batch before any write", c)
				}
				if c.Header.Get("Idempotency-Key") != "" {
					t.Errorf("preflight %s carries an Idempotency-Key", c)
				}
			}
			equal(t, "status", w.Code, tt.status)
			equal(t, "outcome", w.Outcome, "failed")
			equal(t, "Content-Type", w.ContentType, "application/problem+json")
			equalSlices(t, "outcomes", w.Outcomes(), tt.items)
			for _, s := range tt.detail {
				if !strings.Contains(w.Detail, s) {
					t.Errorf("detail %q does not contain %q", w.Detail, s)
				}
			}
			f.checkUnchanged(t, before)
		})
	}
}

// Every target is read before the first write; partial mode reads none.
func TestPreflightOrder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, method, target, body string
		write                      string
	}{
		{"update", "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1},{"id":"4","v":1}]`, "PATCH"},
		{"delete", "DELETE", "/widgets?ids=1,2,3,4", "", "DELETE"},
	} {
		t.Run(tt.name+", all_or_nothing", func(t *testing.T) {
			f := newFake().seed("1", "2", "3", "4")
			f.jitter = time.Millisecond
			w := write(t, run1(t, tt.method, tt.target, tt.body, f))
			equal(t, "outcome", w.Outcome, "succeeded")
			log := f.log()
			firstWrite := slices.IndexFunc(log, func(c call) bool { return c.Method != "GET" })
			gets := pathsOf(log[:firstWrite])
			slices.Sort(gets)
			equalSlices(t, "reads before the first write", gets, []string{"/widgets/1", "/widgets/2", "/widgets/3", "/widgets/4"})
			for _, c := range log[firstWrite:] {
				if c.Method != tt.write {
					t.Errorf("%s after the first write", c)
				}
			}
		})
		t.Run(tt.name+", partial", func(t *testing.T) {
			f := newFake().seed("1", "2", "3", "4")
			w := write(t, run1(t, tt.method, tt.target, tt.body, f, partial))
			equal(t, "outcome", w.Outcome, "succeeded")
			for _, c := range f.log() {
				if c.Method != tt.write {
					t.Errorf("partial mode sent %s", c)
				}
			}
			equal(t, "sub-requests", len(f.log()), 4)
		})
	}
}
