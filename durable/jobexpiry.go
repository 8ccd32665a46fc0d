package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// The jobs' expiry index, batch/v1/job-expiry/<bucket end>/<id>, swept by
// the Idempotency-Key records' sweeper (expiry.go), with its lock and
// pace: first a staging's entry, filed before its first chunk; the job
// registered, one for Deadline + ttl instead; the job ended, one for
// Ended + ttl instead. A sibling of the
// records' index, so that a build that knows no jobs never sweeps their
// entries.
const jobExpiryPrefix = "batch/v1/job-expiry"

// jobExpiryEntry is an entry of the index: which job, and the expiry it
// was filed for (for an operator reading the storage).
type jobExpiryEntry struct {
	Version int       `json:"v"`
	Job     string    `json:"job"`
	Expires time.Time `json:"expires"`
}

// lapses is when a job that never ended may go: its deadline + ttl, by
// when it has ended, or its owners are long gone.
func (rec *JobRecord) lapses() time.Time { return rec.Deadline.Add(rec.TTL) }

// jobExpiryKey is the entry of job id expiring at expires, in the buckets
// of a ttl.
func jobExpiryKey(id string, expires time.Time, ttl time.Duration) string {
	width := bucketWidth(ttl)
	end := expires.UTC().Truncate(width).Add(width)
	return path.Join(jobExpiryPrefix, end.Format(bucketLayout), id)
}

// fileJobExpiry files job id under its expiry.
func fileJobExpiry(ctx context.Context, s Storage, id string, expires time.Time, ttl time.Duration) error {
	b, _ := json.Marshal(jobExpiryEntry{Version: 1, Job: id, Expires: expires.UTC()})
	if err := s.Store(ctx, jobExpiryKey(id, expires, ttl), b); err != nil {
		return fmt.Errorf("indexing job %s under its expiry: %w", id, err)
	}
	return nil
}

// NewJobSweeper sweeps the jobs of storage that expired; logger hears of
// locks it could not release.
func NewJobSweeper(s Storage, logger *zap.Logger) *Sweeper {
	return &Sweeper{storage: s, logger: logger, index: expiryIndex{prefix: jobExpiryPrefix, sweep: (*Sweeper).sweepJobEntry}}
}

// sweepJobEntry looks at the job an entry names, under the job's lock: a
// staging never registered (no job) is deleted; a job past its time
// (Ended + ttl, or Deadline + ttl for one that never ended: its owner
// is long gone) is deleted key by key, job last; a job this build cannot
// read is left, with its entry; any other is filed again for its time.
func (sw *Sweeper) sweepJobEntry(ctx context.Context, entry string, at time.Time, out *Swept) error {
	s, id := sw.storage, path.Base(entry)
	if !validJobID(id) {
		return deleteKey(ctx, s, entry) // names no job
	}
	lctx, cancel := context.WithTimeout(ctx, sweepLockWait)
	unlock, err := Lock(lctx, s, jobLock(id), LockPoll, sw.unlockFailed(jobLock(id)))
	cancel()
	if errors.Is(err, itemlock.ErrLocked) {
		out.Kept++
		return nil // being decided: the next sweep looks again
	}
	if err != nil {
		return fmt.Errorf("locking job %s: %w", id, err)
	}
	defer unlock()
	rec, err := readJob(ctx, s, id)
	switch {
	case errors.Is(err, errUnreadable):
		out.Kept++
		return nil
	case errors.Is(err, fs.ErrNotExist):
		// A staging never registered, or a job deleted already (it was
		// filed twice: when staged, and at its end).
		n, err := deleteJobKeys(ctx, s, id)
		if err != nil {
			return err
		}
		if n > 0 {
			out.Deleted++
		}
	case err != nil:
		return fmt.Errorf("reading job %s: %w", id, err)
	default:
		v, err := viewJob(ctx, s, rec)
		if err != nil && !errors.Is(err, errUnreadable) {
			return err
		}
		expires, state := rec.lapses(), jobIndexActive
		if err == nil && v.ended() {
			expires, state = v.progress.Ended.Add(rec.TTL), v.progress.State
		}
		if at.Before(expires) {
			out.Kept++
			if err := fileJobExpiry(ctx, s, id, expires, rec.TTL); err != nil {
				return err
			}
			break
		}
		if err := deleteJob(ctx, s, rec, state); err != nil {
			return err
		}
		out.Deleted++
	}
	return deleteKey(ctx, s, entry)
}

// deleteJob deletes the job rec, whose index entry names state: every key
// under its folder and in the indexes, the record last, so that a removal
// cut short is found again (by its expiry entry) and finished.
func deleteJob(ctx context.Context, s Storage, rec *JobRecord, state string) error {
	var errs []error
	for _, key := range []string{rec.indexKey(jobIndexActive), rec.indexKey(state), rec.activeKey(), rec.clientKey()} {
		errs = append(errs, deleteKey(ctx, s, key))
	}
	errs = append(errs, removeEmptyFolder(ctx, s, path.Join(jobClientsPrefix, rec.Client)))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deleting the index entries of job %s: %w", rec.ID, err)
	}
	_, err := deleteJobKeys(ctx, s, rec.ID)
	return err
}

// jobFolders are the folders under a job's, whose keys are deleted one by
// one (a storage like Redis's deletes no folder whole).
var jobFolders = map[string]bool{inputName: true, resultsName: true}

// deleteJobKeys deletes every key under the job's folder, job last, and
// then the folder; it answers how many names the folder listed.
func deleteJobKeys(ctx context.Context, s Storage, id string) (int, error) {
	names, err := listNames(ctx, s, jobDir(id))
	if err != nil {
		return 0, fmt.Errorf("listing job %s: %w", id, err)
	}
	for _, name := range names {
		key := jobKey(id, name)
		switch {
		case name == jobName:
			continue
		case jobFolders[name]:
			err = deleteFolder(ctx, s, key)
		case name == logName:
			err = deleteLogs(ctx, s, id)
		default:
			err = deleteKey(ctx, s, key)
		}
		if err != nil {
			return 0, fmt.Errorf("deleting %s: %w", key, err)
		}
	}
	if err := deleteKey(ctx, s, jobKey(id, jobName)); err != nil {
		return 0, fmt.Errorf("deleting job %s: %w", id, err)
	}
	return len(names), removeEmptyFolder(ctx, s, jobDir(id))
}
