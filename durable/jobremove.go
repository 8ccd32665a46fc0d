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
