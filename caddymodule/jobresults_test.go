package caddymodule

import "testing"

// TestWantsWholeResults: the whole answer only for a client that
// prefers application/json to JSON Lines; a tie, a range or no Accept is
// JSON Lines, as results were read before.
func TestWantsWholeResults(t *testing.T) {
	for _, c := range []struct {
		accept []string
		whole  bool
	}{
		{nil, false},
		{[]string{"*/*"}, false},
		{[]string{"application/json"}, true},
		{[]string{"application/x-ndjson"}, false},
		{[]string{"application/json, application/x-ndjson"}, false},
		{[]string{"application/json", "application/x-ndjson;q=0.5"}, true},
		{[]string{"application/json;q=0.5, application/x-ndjson"}, false},
		{[]string{"application/json, application/*;q=0.1"}, true},
		{[]string{"application/json;q=0", "*/*"}, false},
		{[]string{"application/json, application/jsonl"}, false},
		{[]string{"text/html"}, false},
	} {
		if got := wantsWholeResults(c.accept); got != c.whole {
			t.Errorf("Accept %q: whole %v, want %v", c.accept, got, c.whole)
		}
	}
}
