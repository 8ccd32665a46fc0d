package durable

import (
	"strconv"
	"strings"
	"time"

	"github.com/caddy-batch/caddy-batch/batch"
)

// JobProgress is where a job stands, stored by the owner of one lease
// epoch as batch/v1/jobs/<id>/progress.<epoch>; readers take the highest
// epoch's. An owner never writes another epoch's key, so one that lost
// the job cannot write over its successor's progress.
type JobProgress struct {
	Version int `json:"v"`
	// State is one of the Job* states; Outcome is the batch outcome once
	// ended (empty for a cancelled partial job, whose state says it).
	State   string `json:"state"`
	Outcome string `json:"outcome,omitempty"`
	// Cursor is the index of the first item not finished: the results
	// pages hold the items before it.
	Cursor int `json:"cursor"`
	// Done counts the items that reached an outcome other than
	// not_attempted; Succeeded and Failed, those of Tally.
	Done      int `json:"done"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	// Started is when an instance first ran the job, Ended when it
	// ended: zero before.
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	// Reason says why the job is paused, or why it failed.
	Reason string `json:"reason,omitempty"`
	// Takeovers counts the times an instance took the job over from
	// another (a lapsed or released lease), not first runs.
	Takeovers int `json:"takeovers,omitempty"`
	// ResultsBytes is the size of the results pages stored so far, for a
	// monitor that must refuse an answer larger than max_response_size
	// before it reads any.
	ResultsBytes int64 `json:"results_bytes,omitempty"`
	// Undoing says an all-or-nothing job is being undone (jobundo.go),
	// UndoNext is the first item of the window it undoes next (going
	// back: -1 once its first is undone), and LeftBehind counts its
	// items whose undo failed so far.
	Undoing    bool `json:"undoing,omitempty"`
	UndoNext   int  `json:"undo_next,omitempty"`
	LeftBehind int  `json:"left_behind,omitempty"`
}

// Tally counts finished items into p: each whose outcome is other than
// not_attempted is done; succeeded ones succeeded; failed ones, and
// writes that went unanswered (unknown), failed, as a batch's Failed
// counts them.
func (p *JobProgress) Tally(items []batch.ItemResult) {
	for i := range items {
		switch items[i].Outcome {
		case "", batch.NotAttempted:
			continue
		case batch.Succeeded:
			p.Succeeded++
		case batch.Failed, batch.Unknown:
			p.Failed++
		}
		p.Done++
	}
}

// progressEpoch parses a progress key's base name, progress.<epoch>.
func progressEpoch(base string) (int, bool) {
	digits, ok := strings.CutPrefix(base, progressName+".")
	if !ok {
		return 0, false
	}
	e, err := strconv.Atoi(digits)
	return e, err == nil && e >= 0
}

// jobEnded reports whether state is one a job ends in.
func jobEnded(state string) bool {
	switch state {
	case JobQueued, JobRunning, JobPaused, JobCancelling:
		return false
	}
	return true
}
