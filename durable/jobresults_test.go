package durable

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// readResults streams a job's results, and answers the indexes of their
// lines and how many pages they came in.
func readResults(t *testing.T, js *Jobs, id, token string) (indexes []int, pages int, lines []ResultLine) {
	t.Helper()
	_, err := js.Results(context.Background(), id, token, func(page []byte) error {
		pages++
		sc := bufio.NewScanner(bytes.NewReader(page))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line ResultLine
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("a results line %s: %v", sc.Bytes(), err)
			}
			indexes = append(indexes, line.Index)
			lines = append(lines, line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return indexes, pages, lines
}

func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// The results stream the longest finished prefix: windows of 4 whose
// pages follow each other, up to the first window not finished, a page
// at a time. A page goes on where it stopped, on another instance too,
// and refuses a result that would leave a gap.
func TestJobResultsLongestFinishedPrefix(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	hj, token := mustStart(t, js, 12)
	id := hj.Record().ID
	if got, pages, _ := readResults(t, js, id, token); len(got) != 0 || pages != 0 {
		t.Errorf("before any result: %v in %d pages", got, pages)
	}
	for _, step := range []struct {
		window, first, n int
		want             int
	}{
		{0, 0, 2, 2},  // window 0 half done
		{0, 2, 2, 4},  // window 0 finished
		{4, 4, 1, 5},  // window 4 begun
		{8, 8, 4, 5},  // window 8 finished, after a window that is not
		{4, 5, 3, 12}, // window 4 finished: all of them
	} {
		if err := hj.AppendResults(ctx, step.window, createdRange(step.first, step.n)); err != nil {
			t.Fatal(err)
		}
		got, pages, _ := readResults(t, js, id, token)
		if !slices.Equal(got, upTo(step.want)) {
			t.Errorf("after items %d to %d: results %v, want the first %d", step.first, step.first+step.n-1, got, step.want)
		}
		if want := (step.want + 3) / 4; pages != want {
			t.Errorf("after items %d to %d: %d pages, want %d", step.first, step.first+step.n-1, pages, want)
		}
	}
	if err := hj.AppendResults(ctx, 0, createdRange(5, 1)); err == nil {
		t.Error("a result past a full window's end was stored")
	}
	// Another instance carries window 8 on from what is stored.
	if err := hj.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := js.ClaimReleased(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer next.lease.end("the test ended")
	if err := next.AppendResults(ctx, 8, createdRange(10, 1)); err == nil {
		t.Error("a result that leaves a gap was stored")
	}
	if err := next.AppendResults(ctx, 8, createdRange(12, 1)); err != nil {
		t.Errorf("carrying a window on: %v", err)
	}
	if got, _, _ := readResults(t, js, id, token); len(got) != 13 {
		t.Errorf("results %v after a carry-on", got)
	}
}

// A body over 4 KiB is kept as body_text, cut at a UTF-8 boundary, with
// body_truncated; a shorter one stays as it was, JSON.
func TestJobResultBodiesCutAt4KiB(t *testing.T) {
	t.Parallel()
	defer endHeld(t)
	js := NewJobs(newMemStorage(), NewLeases(time.Minute), zap.NewNop())
	hj, token := mustStart(t, js, 3)
	// "é" is two bytes: the 4 KiB boundary falls inside one.
	long := `{"name":"` + "x" + strings.Repeat("é", 3000) + `"}`
	text := strings.Repeat("€", 2000) // three bytes each
	items := []batch.ItemResult{
		created(0),
		{Index: 1, Status: 201, Outcome: batch.Succeeded, Body: json.RawMessage(long)},
		{Index: 2, Status: 502, Outcome: batch.Failed, BodyText: text},
	}
	if err := hj.AppendResults(context.Background(), 0, items); err != nil {
		t.Fatal(err)
	}
	_, _, lines := readResults(t, js, hj.Record().ID, token)
	if len(lines) != 3 {
		t.Fatalf("%d lines", len(lines))
	}
	if l := lines[0]; string(l.Body) != `{"id":1}` || l.BodyTruncated || l.BodyText != "" {
		t.Errorf("a short body: %+v", l)
	}
	for _, l := range lines[1:] {
		if l.Body != nil || !l.BodyTruncated || !utf8.ValidString(l.BodyText) || len(l.BodyText) > ResultBodyLimit || len(l.BodyText) < ResultBodyLimit-3 {
			t.Errorf("item %d: body %q, %d bytes of body_text (valid UTF-8: %v), truncated %v", l.Index, l.Body, len(l.BodyText), utf8.ValidString(l.BodyText), l.BodyTruncated)
		}
	}
	if !strings.HasPrefix(long, lines[1].BodyText) || !strings.HasPrefix(text, lines[2].BodyText) {
		t.Error("a cut body is not a prefix of the body")
	}
}
