package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The operator's view of the jobs (docs/jobs.md, "Operations"): every job
// kept, without its token, through Caddy's admin endpoint. A listing
// reads the job index's names, which say each job's creation, id and,
// once it ended, its end state; it reads a job only for the page it
// answers, and the jobs not ended, whose state the index does not say.

// ErrJobEnded refuses an operator's cancel of a job that has ended:
// there is nothing left to cancel.
var ErrJobEnded = errors.New("the job has ended: there is nothing to cancel")

// ErrJobCursor refuses a listing whose after names no job kept: the job
// was removed or swept since the page before was read.
var ErrJobCursor = errors.New("after names no job kept (removed or swept since): list again without after")

// JobQuery selects jobs for an operator's listing: by State (any when
// empty; one of the Job* states), at most Limit (all when 0), those
// after the job named After in the listing's order (newest first).
type JobQuery struct {
	State string
	Limit int
	After string
}

// JobStates are the states a job can be in, in the order of its life.
var JobStates = []string{JobQueued, JobRunning, JobPaused, JobCancelling, JobSucceeded, JobPartial, JobFailed, JobRolledBack, JobRollbackFailed, JobCancelled}

// indexed is a job as its index entry names it: state is its end state,
// or jobIndexActive before it ended.
type indexed struct {
	created, id, state string
}

// parseIndexName reads <created>.<id>.<state>; created holds a dot of
// its own, so the name is read from its end.
func parseIndexName(name string) (indexed, bool) {
	rest, state, ok := cutLast(name)
	if !ok {
		return indexed{}, false
	}
	created, id, ok := cutLast(rest)
	if !ok || !validJobID(id) || state == "" {
		return indexed{}, false
	}
	return indexed{created: created, id: id, state: state}, true
}

func cutLast(s string) (string, string, bool) {
	i := strings.LastIndexByte(s, '.')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// jobIndex lists the jobs kept, newest first (then by id, so that a page
// boundary is stable), each once: a job whose end renamed its entry
// halfway (the end state's entry written, the active one not deleted
// yet) is taken in its end state.
func (js *Jobs) jobIndex(ctx context.Context) ([]indexed, error) {
	names, err := listNames(ctx, js.storage, jobIndexPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing the job index: %w", err)
	}
	at := make(map[string]int, len(names))
	out := make([]indexed, 0, len(names))
	for _, name := range names {
		e, ok := parseIndexName(name)
		if !ok {
			continue // not a name this build writes
		}
		if i, seen := at[e.id]; seen {
			if e.state != jobIndexActive {
				out[i] = e
			}
			continue
		}
		at[e.id] = len(out)
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b indexed) int {
		if c := cmp.Compare(b.created, a.created); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return out, nil
}

// ListJobs lists the jobs kept for an operator, newest first, as their
// statuses (no token): q.After a job id the listing goes on after
// (ErrJobCursor if no job kept has it), q.State one of JobStates. An
// ended job is read only if its state is the one asked for and it falls
// on the page; a job past its job_ttl, swept or not, is not listed.
func (js *Jobs) ListJobs(ctx context.Context, q JobQuery) ([]*JobStatus, error) {
	index, err := js.jobIndex(ctx)
	if err != nil {
		return nil, err
	}
	if q.After != "" {
		i := slices.IndexFunc(index, func(e indexed) bool { return e.id == q.After })
		if i < 0 {
			return nil, ErrJobCursor
		}
		index = index[i+1:]
	}
	out := []*JobStatus{}
	for _, e := range index {
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
		if q.State != "" && e.state != jobIndexActive && e.state != q.State {
			continue // ended in another state: no read needed
		}
		st, err := js.OperatorStatus(ctx, e.id)
		switch {
		case errors.Is(err, ErrUnknownJob), errors.Is(err, errUnreadable):
			continue // removed meanwhile, past its ttl, or another build's
		case err != nil:
			return nil, err
		}
		if q.State == "" || st.State == q.State {
			out = append(out, st)
		}
	}
	return out, nil
}

// OperatorStatus is the status of the job id for an operator, who needs
// no token: ErrUnknownJob when it is not there or past its job_ttl.
func (js *Jobs) OperatorStatus(ctx context.Context, id string) (*JobStatus, error) {
	v, err := js.openIf(ctx, id, anyone)
	if err != nil {
		return nil, err
	}
	return v.status(), nil
}

// OperatorCancel cancels the job id for an operator, as its token's
// holder's Cancel does (a mark its owner sees; a queued job ends
// cancelled at once), the mark saying "admin". A job that has ended is
// left as it is, its status answered with ErrJobEnded.
func (js *Jobs) OperatorCancel(ctx context.Context, id string) (*JobStatus, error) {
	v, err := js.openIf(ctx, id, anyone)
	if err != nil {
		return nil, err
	}
	if v.ended() {
		return v.status(), ErrJobEnded
	}
	return js.cancel(ctx, v, "admin")
}

func anyone(*JobRecord) bool { return true }

// CountJobs counts the jobs kept by state, for the metrics: an ended
// job counted from its index entry's name, unread (until the sweep
// removes it, past its job_ttl); a job not ended read for its state.
// Every state is in the answer, 0 where no job is in it.
func (js *Jobs) CountJobs(ctx context.Context) (map[string]int, error) {
	counts := make(map[string]int, len(JobStates))
	for _, s := range JobStates {
		counts[s] = 0
	}
	index, err := js.jobIndex(ctx)
	if err != nil {
		return nil, err
	}
	for _, e := range index {
		if e.state != jobIndexActive {
			if _, known := counts[e.state]; known {
				counts[e.state]++
			}
			continue
		}
		v, err := js.openIf(ctx, e.id, anyone)
		switch {
		case errors.Is(err, ErrUnknownJob), errors.Is(err, errUnreadable):
			continue
		case err != nil:
			return nil, err
		}
		counts[v.status().State]++
	}
	return counts, nil
}
