package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"
)

// Quota is what a client may have of the jobs (docs/durability.md,
// "Bulk jobs in storage").
type Quota struct {
	// PerClient is max_jobs_per_client: the jobs one identity has queued,
	// running, paused or cancelling across the cluster.
	PerClient int
	// Queued is max_queued_jobs: the jobs waiting in the queue, which is
	// the cluster's, as this instance allows it.
	Queued int
	// Waits says the job would wait in the queue (this instance has no
	// free max_jobs slot for it): only then does Queued apply.
	Waits bool
}

// Retry-After of a refused start: a client's own jobs take minutes to
// end; the queue moves as any job of the cluster ends.
const (
	clientQuotaRetry = time.Minute
	queueQuotaRetry  = 30 * time.Second
)

// QuotaError refuses a start over a quota (429): Retry-After says when to
// try again.
type QuotaError struct {
	RetryAfter time.Duration
	Reason     string
}

func (e *QuotaError) Error() string { return e.Reason }

// CheckQuota refuses, with a *QuotaError, a start the client's quota or
// the queue has no room for; Register checks again, under a lock.
func (js *Jobs) CheckQuota(ctx context.Context, client string, q Quota) error {
	ids, err := listNames(ctx, js.storage, path.Join(jobClientsPrefix, client))
	if err != nil {
		return fmt.Errorf("counting the client's jobs: %w", err)
	}
	ids, err = js.withRecords(ctx, client, ids)
	if err != nil {
		return fmt.Errorf("counting the client's jobs: %w", err)
	}
	if len(ids) >= q.PerClient {
		return &QuotaError{RetryAfter: clientQuotaRetry, Reason: fmt.Sprintf(
			"this client has %d jobs not ended, and may have %d (max_jobs_per_client): wait for one to end, or cancel one", len(ids), q.PerClient)}
	}
	if !q.Waits {
		return nil
	}
	queued, err := js.queued(ctx)
	if err != nil {
		return err
	}
	if queued >= q.Queued {
		return &QuotaError{RetryAfter: queueQuotaRetry, Reason: fmt.Sprintf(
			"%d jobs wait to run, and %d may (max_queued_jobs): try again once the queue moved", queued, q.Queued)}
	}
	return nil
}

// withRecords keeps of ids, the jobs client's entries name, those whose
// record is in storage, and deletes the entries of the others: jobs the
// storage lost (a record goes in before its entries, and out after them
// when the job ends), which would hold the client's quota for good. One
// read per job counted, at most max_jobs_per_client of them.
func (js *Jobs) withRecords(ctx context.Context, client string, ids []string) ([]string, error) {
	kept := ids[:0]
	for _, id := range ids {
		missing, err := gone(ctx, js.storage, jobKey(id, jobName))
		switch {
		case missing:
			if err := deleteKey(ctx, js.storage, path.Join(jobClientsPrefix, client, id)); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, err
		default:
			kept = append(kept, id)
		}
	}
	return kept, nil
}

// queued counts the jobs of the cluster that wait to run: of the active
// ones (job-active), those whose progress says queued.
func (js *Jobs) queued(ctx context.Context) (int, error) {
	names, err := listNames(ctx, js.storage, jobActivePrefix)
	if err != nil {
		return 0, fmt.Errorf("listing the active jobs: %w", err)
	}
	n := 0
	for _, name := range names {
		id := name[strings.LastIndexByte(name, '.')+1:] // <created>.<id>
		rec, err := readJob(ctx, js.storage, id)
		if err != nil {
			continue // gone since, or another build's: not this queue's
		}
		v, err := viewJob(ctx, js.storage, rec)
		if err != nil {
			return 0, err
		}
		if v.progress.State == JobQueued {
			n++
		}
	}
	return n, nil
}

// Register makes a job of what st staged, under the identity's lock so
// that two starts of one client do not both pass its quota: rec is the
// job (Register fills its id, version and token hash, and Created if
// zero; Deadline must be set), cred the headers its requests forward. It
// answers the job, held at epoch 0 and queued, and its token, which is
// nowhere else: the client has it, the storage only its hash. The job's
// lease is this process's and renewed until the job ends or is released
// (queued, it is released for whichever instance has room). Over a
// quota it answers a *QuotaError and keeps the staging, for the caller
// to discard.
func (js *Jobs) Register(ctx context.Context, st *Staging, rec *JobRecord, cred http.Header, q Quota) (*HeldJob, string, error) {
	if rec.Created.IsZero() {
		rec.Created = now().UTC()
	}
	if !rec.Deadline.After(rec.Created) || rec.Client == "" {
		return nil, "", errors.New("a job needs a deadline after its creation, and a client identity")
	}
	name := jobClientLock(rec.Client)
	lctx, cancel := context.WithTimeout(ctx, sweepLockWait)
	unlock, err := Lock(lctx, js.storage, name, LockPoll, js.unlockFailed(name))
	cancel()
	if err != nil {
		return nil, "", fmt.Errorf("locking the client's jobs to count them: %w", err)
	}
	defer unlock()
	if err := js.CheckQuota(ctx, rec.Client, q); err != nil {
		return nil, "", err
	}
	token, sum := newToken()
	rec.Version, rec.ID, rec.TokenSHA256 = 1, st.id, sum
	start := now()
	lease := leaseRecord(0, start.Add(js.leases.Length), 0)
	if err := js.storeNew(ctx, st, rec, cred, lease); err != nil {
		return nil, "", err
	}
	hj := &HeldJob{jobs: js, rec: rec, lease: holdLease(js.storage, js.leases, js.logger, jobLeases(rec.ID), 0, lease, start, nil)}
	return hj, token, nil
}

// storeNew writes a registered job's keys, its first progress (queued)
// and lease (epoch 0, lease) before its record, and the record before
// the indexes that name it: a crash in between leaves a job the sweep
// finds by its staging's expiry entry and deletes with everything that
// names it. The job is then filed for its deadline + ttl (by then it has
// ended, or its owners are long gone) instead of its staging's time.
func (js *Jobs) storeNew(ctx context.Context, st *Staging, rec *JobRecord, cred http.Header, lease []byte) error {
	s := js.storage
	if err := storeCredentials(ctx, s, rec.ID, cred); err != nil {
		return err
	}
	pb, _ := json.Marshal(JobProgress{Version: 1, State: JobQueued})
	if err := s.Store(ctx, progressKey(rec.ID, 0), pb); err != nil {
		return fmt.Errorf("storing the job's progress: %w", err)
	}
	if err := s.Store(ctx, jobLeases(rec.ID).key(0, Owner()), lease); err != nil {
		return fmt.Errorf("storing the job's lease: %w", err)
	}
	jb, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.Store(ctx, jobKey(rec.ID, jobName), jb); err != nil {
		return fmt.Errorf("storing the job: %w", err)
	}
	for _, key := range []string{rec.indexKey(jobIndexActive), rec.activeKey(), rec.clientKey()} {
		if err := s.Store(ctx, key, rec.entry()); err != nil {
			return fmt.Errorf("indexing the job: %w", err)
		}
	}
	if err := fileJobExpiry(ctx, s, rec.ID, rec.lapses(), rec.TTL); err != nil {
		return err
	}
	return deleteKey(ctx, s, jobExpiryKey(rec.ID, st.expires, st.ttl))
}

// storedCredentials is batch/v1/jobs/<id>/credentials: the headers the
// job's requests forward (Authorization, Cookie, the scope headers), kept
// apart from the record so that the end erases them without rewriting it.
type storedCredentials struct {
	Version int         `json:"v"`
	Header  http.Header `json:"header"`
}

// storeCredentials stores cred as the headers job id's requests forward.
func storeCredentials(ctx context.Context, s Storage, id string, cred http.Header) error {
	cb, err := json.Marshal(storedCredentials{Version: 1, Header: cred})
	if err != nil {
		return err
	}
	if err := s.Store(ctx, jobKey(id, credentialsName), cb); err != nil {
		return fmt.Errorf("storing the credentials of job %s: %w", id, err)
	}
	return nil
}

// Credentials reads the headers the job's requests forward.
func (hj *HeldJob) Credentials(ctx context.Context) (http.Header, error) {
	return hj.jobs.Credentials(ctx, hj.rec)
}

// Credentials reads the headers the requests of the job rec forward: a
// scan routes its request for room with them, as the job's windows go.
func (js *Jobs) Credentials(ctx context.Context, rec *JobRecord) (http.Header, error) {
	var c storedCredentials
	found, err := loadJSON(ctx, js.storage, jobKey(rec.ID, credentialsName), &c)
	if err == nil && !found {
		err = fmt.Errorf("job %s has no credentials stored", rec.ID)
	}
	return c.Header, err
}
