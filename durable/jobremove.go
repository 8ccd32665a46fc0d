package durable

import (
	"context"
	"errors"
	"fmt"
)

// ErrJobNotEnded refuses to remove a job still running: cancel it first,
// and remove it once it ended.
var ErrJobNotEnded = errors.New("the job has not ended: cancel it, and remove it once it ended")

// Remove deletes the ended job id, for the holder of its token: its
// results, marks, index entries and record (the record last, so that a
// removal cut short is finished by the sweep), then its expiry entry.
func (js *Jobs) Remove(ctx context.Context, id, token string) error {
	v, err := js.open(ctx, id, token)
	if err != nil {
		return err
	}
	if !v.ended() {
		return ErrJobNotEnded
	}
	if err := deleteJob(ctx, js.storage, v.rec, v.progress.State); err != nil {
		return err
	}
	expiry := jobExpiryKey(id, v.progress.Ended.Add(v.rec.TTL), v.rec.TTL)
	if err := deleteKey(ctx, js.storage, expiry); err != nil {
		return fmt.Errorf("deleting the expiry entry of job %s: %w", id, err)
	}
	return nil
}

// Abandon deletes a job just registered whose start was refused after
// all (its first request answered 401, 403 or 407): nothing of it stays,
// the record last, then its expiry entry. Its lease ends first, so that
// no renewal writes it again.
func (hj *HeldJob) Abandon(ctx context.Context) error {
	hj.lease.end("the job's start was refused")
	s, rec := hj.jobs.storage, hj.rec
	if err := deleteJob(ctx, s, rec, jobIndexActive); err != nil {
		return err
	}
	if err := deleteKey(ctx, s, jobExpiryKey(rec.ID, rec.lapses(), rec.TTL)); err != nil {
		return fmt.Errorf("deleting the expiry entry of job %s: %w", rec.ID, err)
	}
	return nil
}
