package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// JobStatus is a job as its monitor shows it: exactly the members of a
// job's status, with null where a time is not known yet (expires until
// the job ended).
type JobStatus struct {
	ID        string     `json:"id"`
	State     string     `json:"state"`
	Op        string     `json:"op"`
	Resource  string     `json:"resource"`
	Atomicity string     `json:"atomicity"`
	Items     int        `json:"items"`
	Done      int        `json:"done"`
	Succeeded int        `json:"succeeded"`
	Failed    int        `json:"failed"`
	Created   time.Time  `json:"created"`
	Started   *time.Time `json:"started"`
	Ended     *time.Time `json:"ended"`
	Expires   *time.Time `json:"expires"`
	Outcome   string     `json:"outcome"`
	Reason    string     `json:"reason"`
	Takeovers int        `json:"takeovers"`
	Results   string     `json:"results"`
}

// status is what v shows: cancelling while a cancel mark waits for the
// owner to end the job.
func (v *jobView) status() *JobStatus {
	p, rec := &v.progress, v.rec
	st := &JobStatus{
		ID: rec.ID, State: p.State, Op: rec.Op, Resource: rec.Resource, Atomicity: rec.Atomicity,
		Items: rec.Items, Done: p.Done, Succeeded: p.Succeeded, Failed: p.Failed,
		Created: rec.Created, Outcome: p.Outcome, Reason: p.Reason, Takeovers: p.Takeovers,
		Results: path.Join(rec.JobsPath, rec.ID, "results"),
	}
	if !p.Started.IsZero() {
		st.Started = &p.Started
	}
	if v.ended() {
		expires := p.Ended.Add(rec.TTL)
		st.Ended, st.Expires = &p.Ended, &expires
	} else if v.cancelled {
		st.State = JobCancelling
	}
	return st
}

// Status is the job id's status, for the holder of its token.
func (js *Jobs) Status(ctx context.Context, id, token string) (*JobStatus, error) {
	v, err := js.open(ctx, id, token)
	if err != nil {
		return nil, err
	}
	return v.status(), nil
}

// Cancel marks the job id cancelled, by "client" or "admin", and answers
// its status. The owner of a running job sees the mark at its next
// renewal (HeldJob.CancelAsked) and ends it; a queued job nothing was written for, and a
// paused one, end cancelled at once, since nobody would otherwise. An ended job is left
// as it is (its monitor removes it instead), and a second cancel changes
// nothing.
func (js *Jobs) Cancel(ctx context.Context, id, token, by string) (*JobStatus, error) {
	v, err := js.open(ctx, id, token)
	if err != nil || v.ended() {
		return statusOf(v, err)
	}
	return js.cancel(ctx, v, by)
}

// cancel is Cancel of the job v, which has not ended.
func (js *Jobs) cancel(ctx context.Context, v *jobView, by string) (*JobStatus, error) {
	id := v.rec.ID
	if !v.cancelled {
		mark, _ := json.Marshal(cancelMark{Version: 1, At: now().UTC(), By: by})
		if err := js.storage.Store(ctx, jobKey(id, cancelName), mark); err != nil {
			return nil, fmt.Errorf("storing the cancel of job %s: %w", id, err)
		}
		v.cancelled = true
	}
	if endsOnCancel(v.rec, v.progress) {
		return js.cancelQueued(ctx, v)
	}
	return v.status(), nil
}

// endsOnCancel reports whether a cancel ends a job of progress p at
// once: nobody runs it, and nothing of it is in flight. A queued job
// that ran before (handed over) has items in its windows' logs, which
// only a run carries on into its results; an all-or-nothing one, queued
// or paused, may have writes to undo, which only a run sends (the next
// scan claims it, and its undo ends it rolled_back): even with nothing
// done, its start's first write may have landed with its results never
// stored.
func endsOnCancel(rec *JobRecord, p JobProgress) bool {
	if p.Undoing || rec.atomic() {
		return false
	}
	return p.State == JobQueued && p.Done == 0 || p.State == JobPaused
}

// cancelQueued ends a queued job that nothing was written for, or a
// paused one (endsOnCancel): it claims
// the job's released lease, as an instance that would run it does, and
// ends it under the next epoch. A job whose lease is not released (being
// started, or run) is left to its owner, who sees the mark.
func (js *Jobs) cancelQueued(ctx context.Context, v *jobView) (*JobStatus, error) {
	name := jobLock(v.rec.ID)
	lctx, cancel := context.WithTimeout(ctx, sweepLockWait)
	unlock, err := Lock(lctx, js.storage, name, LockPoll, js.unlockFailed(name))
	cancel()
	if errors.Is(err, itemlock.ErrLocked) {
		return v.status(), nil // being claimed: the owner sees the mark
	}
	if err != nil {
		return nil, fmt.Errorf("locking job %s to cancel it: %w", v.rec.ID, err)
	}
	defer unlock()
	v, err = viewJob(ctx, js.storage, v.rec)
	if err != nil || !endsOnCancel(v.rec, v.progress) {
		return statusOf(v, err)
	}
	held, err := js.claimLocked(ctx, v.rec, nil)
	if errors.Is(err, ErrJobHeld) {
		return v.status(), nil
	}
	if err != nil {
		return nil, err
	}
	if v.progress.State == JobPaused {
		err = held.endPaused(ctx, haltCancel)
	} else {
		end := v.progress
		end.State, end.Outcome, end.Ended = JobCancelled, "", now().UTC()
		err = held.End(ctx, end)
	}
	if err != nil {
		return nil, err
	}
	return statusOf(viewJob(ctx, js.storage, v.rec))
}

func statusOf(v *jobView, err error) (*JobStatus, error) {
	if err != nil {
		return nil, err
	}
	return v.status(), nil
}
