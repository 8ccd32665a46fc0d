package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// widgetEnvelope is an envelope of two operations: a PATCH of widget
// first with patch, then a PATCH of widget second with patch, or its
// DELETE when del. failing makes the first PATCH one the legacy API
// refuses (422).
func widgetEnvelope(first, second int, patch map[string]any, del, failing bool) string {
	ops := []map[string]any{
		{"id": "a", "method": "PATCH", "url": fmt.Sprintf("/api/widgets/%d", first), "body": patch},
		{"id": "b", "method": "PATCH", "url": fmt.Sprintf("/api/widgets/%d", second), "body": patch},
	}
	if del {
		ops[1] = map[string]any{"id": "b", "method": "DELETE", "url": fmt.Sprintf("/api/widgets/%d", second)}
	}
	if failing {
		refused := maps.Clone(patch)
		refused["name"] = "" // the legacy API's 422
		ops[0]["body"] = refused
	}
	raw, _ := json.Marshal(map[string]any{"operations": ops})
	return string(raw)
}

// sendKeyedBatch sends batch b of a randomized test, with the
// Idempotency-Key "b<b>" (so that its sub-requests carry "b<b>:<item>")
// and header, and returns its answer.
func sendKeyedBatch(t *testing.T, client *http.Client, base string, b int, method, path, body string, header http.Header) batchAnswer {
	h := http.Header{"Idempotency-Key": {fmt.Sprintf(`"b%d"`, b)}}
	maps.Copy(h, header)
	var a batchAnswer
	r, err := sendHeader(client, base, method, path, body, h)
	if err != nil {
		t.Errorf("batch %d: %v", b, err)
		return a
	}
	if err := json.Unmarshal(r.Body, &a); err != nil {
		t.Errorf("batch %d: %d, not a batch answer: %s", b, r.Status, r.Body)
	}
	return a
}

// batchKey is the Idempotency-Key a write to the legacy API carried,
// unquoted: "b3:1" for item 1 of the batch sendKeyedBatch sent as 3,
// "b3:1:undo" for its undo, "" for a write the gateway did not send.
func batchKey(r legacyapi.Request) string {
	return strings.Trim(r.Header.Get("Idempotency-Key"), `"`)
}

// undoLedger is what the writes a legacy API carried out say of the
// undos of batches sent by sendKeyedBatch.
type undoLedger struct {
	applied  []legacyapi.Request
	last     map[string]legacyapi.Request // item path -> the last write carried out on it
	outcomes map[string]int               // batches by outcome
	// Undos that landed on something other than their batch's write, of
	// the two kinds a caller may allow: a re-create after another
	// writer's delete (a missing item has no ETag to tell deletes apart),
	// and a retried undo on its own first copy.
	reborn, repeated int
}

// judgeUndos walks the writes api carried out, in order, for the batches
// whose answers are given. It fails the test where an undo landed on a
// write its batch did not make (beyond the two kinds undoLedger counts),
// and where an item reported rolled_back had its write carried out and
// no undo after it.
func judgeUndos(t *testing.T, api *legacyapi.API, answers []batchAnswer) undoLedger {
	t.Helper()
	l := undoLedger{applied: api.AppliedWrites(), last: map[string]legacyapi.Request{}, outcomes: map[string]int{}}
	wrote := map[string]bool{}  // keys of batch writes carried out
	undone := map[string]bool{} // keys of batch writes whose undo was carried out
	// A create is undone, with no undo of its own, when another writer
	// deleted what it made (docs/all-or-nothing.md).
	created := map[string]string{} // item path -> the key of the create that made it
	deletedBy := map[string]bool{} // keys of creates whose item another writer deleted
	for _, w := range l.applied {
		key := batchKey(w)
		if w.Method == http.MethodDelete && created[w.Path] != "" && key != created[w.Path]+":undo" {
			deletedBy[created[w.Path]] = true
		}
		if w.Method == http.MethodPost {
			// A create's effect is on the item it made: the id its batch
			// answered with.
			var b, i int
			if _, err := fmt.Sscanf(key, "b%d:%d", &b, &i); err != nil || b >= len(answers) || i >= len(answers[b].Items) {
				t.Fatalf("a create the test cannot place: %s (%q)", w.Body, key)
			}
			w.Path = "/api/widgets/" + answers[b].Items[i].ID
			created[w.Path] = key
		}
		if write, isUndo := strings.CutSuffix(key, ":undo"); isUndo {
			switch prev := l.last[w.Path]; {
			case batchKey(prev) == write:
			case batchKey(prev) == key:
				l.repeated++
			case w.Header.Get("If-None-Match") == "*" && prev.Method == http.MethodDelete:
				l.reborn++
			default:
				t.Errorf("the undo %s %s (%s) landed on a write it did not make: %s %s (%q)", w.Method, w.Path, key, prev.Method, prev.Body, batchKey(prev))
			}
			undone[write] = true
		} else {
			wrote[key] = true
		}
		l.last[w.Path] = w
	}
	for b, a := range answers {
		l.outcomes[a.Outcome]++
		for _, it := range a.Items {
			key := fmt.Sprintf("b%d:%d", b, it.Index)
			if it.Outcome == "rolled_back" && wrote[key] && !undone[key] && !deletedBy[key] {
				t.Errorf("batch %d item %d (id %s) is reported rolled_back, but its write was never undone", b, it.Index, it.ID)
			}
		}
	}
	return l
}
