package durable

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Bulk jobs (docs/durability.md, "Bulk jobs in storage"): a batch that
// outlives its request, kept in storage so that any instance can carry it
// on and answer its monitors. Every value stored is JSON, or JSON Lines
// under a first line, carrying "v":1 (but the lease, a journal's Lease):
//
//	batch/v1/jobs/<id>/job                   JobRecord, written once
//	batch/v1/jobs/<id>/credentials           the forwarded headers; deleted at the end
//	batch/v1/jobs/<id>/cancel                the cancel mark
//	batch/v1/jobs/<id>/lease[.<epoch>.<tag>] the fenced lease (joblease.go)
//	batch/v1/jobs/<id>/progress.<epoch>      JobProgress, by that epoch's owner only
//	batch/v1/jobs/<id>/input/<first %08d>    a chunk of the items as sent
//	batch/v1/jobs/<id>/results/<first %08d>  a window's result lines, in request order
//	batch/v1/job-active/<created>.<id>       jobs not ended yet
//	batch/v1/job-index/<created>.<id>.<state>  every job kept; "active" until it ends
//	batch/v1/job-clients/<identity>/<id>     the jobs an identity has not ended
//	batch/v1/job-expiry/<bucket end>/<id>    the expiry index (jobexpiry.go)
//
// Each owner-written key names its epoch, so a stale owner never
// overwrites its successor's; the sibling indexes keep each reader's work
// proportional to what it reads: the active jobs, the expired ones, one
// identity's.
const (
	jobsPrefix       = "batch/v1/jobs"
	jobActivePrefix  = "batch/v1/job-active"
	jobIndexPrefix   = "batch/v1/job-index"
	jobClientsPrefix = "batch/v1/job-clients"

	jobName         = "job"
	credentialsName = "credentials"
	cancelName      = "cancel"
	progressName    = "progress"
	inputName       = "input"
	resultsName     = "results"

	// jobIndexActive is the state a job-index entry names until the job
	// ends: it is renamed once, to the end state, so that a listing by
	// state never reads a job.
	jobIndexActive = "active"
	// createdLayout names the index entries by creation, sortable.
	createdLayout = "20060102T150405.000000000Z"
)

// ErrUnknownJob is the answer for a job that is not there, whose token is
// not the one given, or that is past its time to live: the three alike,
// so that nobody learns a job exists without its token (404).
var ErrUnknownJob = errors.New("no such job")

// The states of a job: the first four before it ends, the rest after.
const (
	JobQueued         = "queued"
	JobRunning        = "running"
	JobPaused         = "paused"
	JobCancelling     = "cancelling"
	JobSucceeded      = "succeeded"
	JobPartial        = "partial"
	JobFailed         = "failed"
	JobRolledBack     = "rolled_back"
	JobRollbackFailed = "rollback_failed"
	JobCancelled      = "cancelled"
)

// JobRecord is a job as it was started, stored once as
// batch/v1/jobs/<id>/job. It holds no credential and not the token: only
// the token's hash, and the hash of the client's identity.
type JobRecord struct {
	Version int    `json:"v"`
	ID      string `json:"id"`
	// Op, Resource, Path and Query are the batch's, as a synchronous
	// batch's Snapshot has them; Atomicity is the one that applies.
	Op        string `json:"op"`
	Resource  string `json:"resource"`
	Path      string `json:"path"`
	Query     string `json:"query,omitempty"`
	Atomicity string `json:"atomicity"`
	// Items is how many items the input chunks hold.
	Items int `json:"items"`
	// TokenSHA256 is the hex SHA-256 of the job's token.
	TokenSHA256 string `json:"token_sha256"`
	// Key and KeyQuoted are the base of every item's Idempotency-Key, as
	// a synchronous batch's.
	Key       string `json:"key,omitempty"`
	KeyQuoted bool   `json:"key_quoted,omitempty"`
	// Created is when the job was registered; Deadline when it must have
	// ended (job_timeout after Created); TTL how long it is kept after
	// its end (job_ttl).
	Created  time.Time     `json:"created"`
	Deadline time.Time     `json:"deadline"`
	TTL      time.Duration `json:"ttl"`
	// Origin is the start request, for the instance that runs the job to
	// route its windows as that request went.
	Origin Origin `json:"origin,omitzero"`
	// Client is the hash of the client's identity, which its quota is
	// counted under.
	Client string `json:"client"`
	// JobsPath is the handler's jobs path, for the monitors' URLs.
	JobsPath string `json:"jobs_path"`
	// StartTrace is the span context of the start request's span, as a
	// W3C traceparent, which each run's span links to; empty when the
	// start was not traced (and in a record stored before it was kept).
	StartTrace string `json:"start_trace,omitempty"`
}

// cancelMark is batch/v1/jobs/<id>/cancel: who asked, and when.
type cancelMark struct {
	Version int       `json:"v"`
	At      time.Time `json:"at"`
	By      string    `json:"by"`
}

// Jobs keeps the bulk jobs of one storage, those this process owns under
// its leases.
type Jobs struct {
	storage Storage
	leases  *Leases
	logger  *zap.Logger
	// watch is what the scans saw of other owners' job leases
	// (jobscan.go).
	watch *watched
	hooks JobHooks
}

// NewJobs keeps jobs in s, owned under leases; logger hears of leases lost
// and locks it could not release.
func NewJobs(s Storage, leases *Leases, logger *zap.Logger) *Jobs {
	return &Jobs{storage: s, leases: leases, logger: logger, watch: newWatched()}
}

func jobDir(id string) string       { return path.Join(jobsPrefix, id) }
func jobKey(id, name string) string { return path.Join(jobsPrefix, id, name) }
func progressKey(id string, epoch int) string {
	return jobKey(id, fmt.Sprintf("%s.%08d", progressName, epoch))
}
func chunkKey(id, folder string, first int) string {
	return path.Join(jobsPrefix, id, folder, fmt.Sprintf("%08d", first))
}

// jobLock is the storage lock of what is decided about a job nobody owns
// (a cancel of a queued job, a sweep).
func jobLock(id string) string { return "batch_job_" + id }

// jobClientLock serialises the quota check and registration of one
// identity across the cluster; lock names are kept short.
func jobClientLock(client string) string { return "batch_jobclient_" + client[:min(32, len(client))] }

func (rec *JobRecord) createdName() string {
	return rec.Created.UTC().Format(createdLayout) + "." + rec.ID
}
func (rec *JobRecord) activeKey() string { return path.Join(jobActivePrefix, rec.createdName()) }
func (rec *JobRecord) indexKey(state string) string {
	return path.Join(jobIndexPrefix, rec.createdName()+"."+state)
}
func (rec *JobRecord) clientKey() string { return path.Join(jobClientsPrefix, rec.Client, rec.ID) }

// entry is the value of the job's index entries, whose names say all:
// the job's id, for an operator reading the storage.
func (rec *JobRecord) entry() []byte {
	b, _ := json.Marshal(struct {
		Version int    `json:"v"`
		Job     string `json:"job"`
	}{1, rec.ID})
	return b
}

// validJobID reports whether id is one NewID makes: anything else, a path
// in particular, names no job.
func validJobID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

// newToken is a job's token, 256 random bits as base64url (43
// characters), and the hash that is all the storage keeps of it.
func newToken() (token, sum string) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	token = base64.RawURLEncoding.EncodeToString(b[:])
	return token, tokenSum(token)
}

func tokenSum(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// tokenMatches compares in constant time, so that the time of a wrong
// guess says nothing of the right one.
func (rec *JobRecord) tokenMatches(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(tokenSum(token)), []byte(rec.TokenSHA256)) == 1
}

// readJob reads a job's record; fs.ErrNotExist when there is none,
// errUnreadable when this build cannot read it.
func readJob(ctx context.Context, s Storage, id string) (*JobRecord, error) {
	b, err := s.Load(ctx, jobKey(id, jobName))
	if err != nil {
		return nil, err
	}
	var rec JobRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Version != 1 {
		return nil, fmt.Errorf("job %s: %w", id, errUnreadable)
	}
	return &rec, nil
}

// jobView is what a monitor reads of a job: its record, its latest
// progress, and whether a cancel mark is there.
type jobView struct {
	rec       *JobRecord
	progress  JobProgress
	epoch     int
	cancelled bool
}

// open reads the job id for the holder of token: ErrUnknownJob when it
// is not there, the token is not its, or it is past its time to live.
func (js *Jobs) open(ctx context.Context, id, token string) (*jobView, error) {
	return js.openIf(ctx, id, func(rec *JobRecord) bool { return rec.tokenMatches(token) })
}

// openIf is open for whoever allowed lets see rec: the holder of its
// token, or the operator (joblist.go), who needs none.
func (js *Jobs) openIf(ctx context.Context, id string, allowed func(*JobRecord) bool) (*jobView, error) {
	if !validJobID(id) {
		return nil, ErrUnknownJob
	}
	rec, err := readJob(ctx, js.storage, id)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, ErrUnknownJob
	case err != nil:
		return nil, err
	case !allowed(rec):
		return nil, ErrUnknownJob
	}
	v, err := viewJob(ctx, js.storage, rec)
	if err != nil {
		return nil, err
	}
	if v.ended() && !now().Before(v.progress.Ended.Add(rec.TTL)) {
		return nil, ErrUnknownJob
	}
	return v, nil
}

// viewJob reads a job's latest progress: one listing of its folder, which
// also shows the cancel mark, and one load.
func viewJob(ctx context.Context, s Storage, rec *JobRecord) (*jobView, error) {
	names, err := listNames(ctx, s, jobDir(rec.ID))
	if err != nil {
		return nil, fmt.Errorf("listing job %s: %w", rec.ID, err)
	}
	v := &jobView{rec: rec, epoch: -1}
	for _, name := range names {
		if name == cancelName {
			v.cancelled = true
		}
		if e, ok := progressEpoch(name); ok && e > v.epoch {
			v.epoch = e
		}
	}
	if v.epoch < 0 {
		return nil, fmt.Errorf("job %s has no progress: %w", rec.ID, errUnreadable)
	}
	found, err := loadJSON(ctx, s, progressKey(rec.ID, v.epoch), &v.progress)
	if err == nil && !found {
		err = fmt.Errorf("job %s lost progress.%d", rec.ID, v.epoch)
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

func (v *jobView) ended() bool { return !v.progress.Ended.IsZero() }

// unlockFailed logs a storage lock that could not be released (it lapses
// on its own).
func (js *Jobs) unlockFailed(name string) func(error) {
	return func(err error) {
		js.logger.Warn("releasing a storage lock of a job", zap.String("lock", name), zap.Error(err))
	}
}
