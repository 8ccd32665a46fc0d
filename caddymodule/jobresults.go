package caddymodule

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddy-batch/caddy-batch/internal/problem"
)

// The media types a job's results are read as: JSON Lines, a line an
// item, as far as the job has got (the default), or the synchronous
// batch's whole answer once the job ended.
const (
	resultsLines = "application/x-ndjson"
	resultsWhole = "application/json"
)

// wantsWholeResults reports whether the client's Accept prefers the whole
// answer, application/json, to JSON Lines (RFC 9110, section 12.5.1): an
// exact type wins over a range, a higher q over a lower one, and a tie,
// or no Accept at all, is JSON Lines, what every results reader took
// before the whole answer could be asked for.
func wantsWholeResults(accept []string) bool {
	whole, lines := acceptQuality(accept, resultsWhole), acceptQuality(accept, resultsLines)
	for _, alias := range []string{"application/jsonl", "application/x-jsonlines"} {
		lines = max(lines, acceptQuality(accept, alias))
	}
	return whole > lines
}

// acceptQuality is the q the Accept header values give mediaType: the
// most specific range that matches it decides; 0 when none does.
func acceptQuality(accept []string, mediaType string) float64 {
	kind, _, _ := strings.Cut(mediaType, "/")
	q, specificity := 0.0, -1
	for _, value := range accept {
		for _, member := range strings.Split(value, ",") {
			t, params, err := mime.ParseMediaType(strings.TrimSpace(member))
			if err != nil {
				continue
			}
			s := -1
			switch {
			case t == mediaType:
				s = 2
			case t == kind+"/*":
				s = 1
			case t == "*/*":
				s = 0
			}
			if s <= specificity {
				continue
			}
			specificity, q = s, 1
			if v, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f <= 1 {
					q = f
				}
			}
		}
	}
	return q
}

// resultsHead is the whole answer's members before its items: those of a
// synchronous batch's answer.
type resultsHead struct {
	Atomicity string `json:"atomicity"`
	Outcome   string `json:"outcome"`
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"`
}

// serveWholeResults answers an ended job's results as a synchronous
// batch of its items would have been answered: {atomicity, outcome,
// succeeded, failed, items}, the items in request order, streamed from
// storage a page at a time. Before the job ended, 409; an answer past
// max_response_size, 413 pointing at JSON Lines; both decided before any
// page is read.
func (h *Handler) serveWholeResults(w http.ResponseWriter, r *http.Request, id, token string) error {
	var bw *bufio.Writer
	var refused error // what writing a refusal answered
	first, lines, items := true, 0, 0
	read := func(v durable.ResultsView) bool {
		st := v.Status
		if st.Ended == nil {
			w.Header().Set("Retry-After", jobRetryAfter)
			refused = problem.New(http.StatusConflict, "job-not-ended", fmt.Sprintf(
				"job %s is %s, %d of %d items done: its whole answer is there once it ended; poll its status, or read the results so far as JSON Lines (Accept: %s)",
				st.ID, st.State, st.Done, st.Items, resultsLines)).Write(w)
			return false
		}
		head, _ := json.Marshal(resultsHead{Atomicity: st.Atomicity, Outcome: wholeOutcome(st), Succeeded: st.Succeeded, Failed: st.Failed})
		head = append(head[:len(head)-1], `,"items":[`...)
		// Each stored line ends in a newline, which becomes the comma
		// between items: the items take at most the pages' size, and
		// those never started at most notStarted's each (a line counts
		// an item done unless it is one of them).
		notStarted := int64(len(notStartedItem(st.Items))+1) * int64(st.Items-st.Done)
		size, limit := int64(len(head))+v.Bytes+notStarted+int64(len("]}\n")), h.resultsLimit(v.Path)
		if size > limit {
			refused = problem.New(http.StatusRequestEntityTooLarge, "results-too-large", fmt.Sprintf(
				"job %s's whole answer would be about %d bytes, more than max_response_size (%d bytes): read its results as JSON Lines (Accept: %s), a line an item, which no size bounds",
				st.ID, size, limit, resultsLines)).Write(w)
			return false
		}
		w.Header().Set("Content-Type", resultsWhole)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		items = st.Items
		bw = bufio.NewWriterSize(w, 32<<10)
		_, _ = bw.Write(head)
		return true
	}
	_, err := h.jobs.store.ResultsIf(r.Context(), id, token, read, func(page []byte) error {
		for line := range bytes.SplitSeq(page, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			if !first {
				_ = bw.WriteByte(',')
			}
			first = false
			lines++
			if _, err := bw.Write(line); err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case bw == nil && err != nil:
		return h.refuseJob(w, err)
	case bw == nil:
		return refused // answered by read
	case err != nil:
		// Cut short after the status went out: the client sees JSON that
		// ends early, and reads again.
		_ = bw.Flush()
		return err
	}
	// A cancelled job, or one past its deadline, stored no result for
	// the items it never started: a synchronous batch answers them too.
	for i := lines; i < items; i++ {
		if !first {
			_ = bw.WriteByte(',')
		}
		first = false
		_, _ = bw.WriteString(notStartedItem(i))
	}
	_, _ = bw.WriteString("]}\n")
	return bw.Flush()
}

// notStartedItem is the answer's item of a job's item that never started.
func notStartedItem(index int) string {
	return `{"index":` + strconv.Itoa(index) + `,"outcome":"not_attempted"}`
}

// wholeOutcome is the outcome of an ended job's whole answer: its
// batch's outcome, or its state where that says more (a cancelled
// partial job, which has none).
func wholeOutcome(st *durable.JobStatus) string {
	if st.Outcome != "" {
		return st.Outcome
	}
	return st.State
}

// resultsLimit is the max_response_size of the resource a job's batch
// was sent to, or the handler's when the configuration no longer has it.
func (h *Handler) resultsLimit(path string) int64 {
	if m, ok := h.policy.Lookup(path); ok && !m.Item {
		return m.Resource.Settings.MaxResponseSize
	}
	return h.handler.MaxResponseSize
}
