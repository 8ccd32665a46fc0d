package durable

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// The files under testdata/stored-v1/jobs are the jobs' stored formats
// (every value "v":1), each under its storage key, as goldenJobs wrote
// them in a synctest bubble (whose clock starts at 2000-01-01T00:00:00Z),
// its random ids and token hashes replaced by goldenRunningJob's and
// goldenEndedJob's. Like the rest of testdata/stored-v1 they are never
// regenerated: a later build must write these formats, or a new version
// of them beside these, and still read these.
//
//   - job goldenRunningJob: a partial create of 3 widgets (chunks at 0
//     and 2), running, item 0 and 1 done and their results stored
//     (window 0), cancelled by its client and not ended yet, its lease
//     (epoch 0) released by an instance that stopped;
//   - job goldenEndedJob: a partial create of one widget, whose answer's
//     body was over 4 KiB, ended succeeded.
const (
	goldenJobsDir    = "testdata/stored-v1/jobs"
	goldenRunningJob = "0b1e5f3c9a7d4e2f8c6b0a1d2e3f4a5b"
	goldenEndedJob   = "7c2d9e4f1a3b5c6d8e0f2a4b6c8d0e1f"
)

// goldenJobTokens are the tokens of the golden jobs.
var goldenJobTokens = map[string]string{
	goldenRunningJob: "golden-running-job-token",
	goldenEndedJob:   "golden-ended-job-token",
}

// goldenJobs stores the golden jobs in s, and answers what to replace in
// what it stored to make the golden files: each job's id and token hash
// by the golden ones, and this process's owner name by goldenOwner.
func goldenJobs(t *testing.T, s Storage) (replace []string) {
	t.Helper()
	js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
	ctx := context.Background()
	quota := Quota{PerClient: 2, Queued: 16}

	running, token, err := startJob(t, js, 3, goldenClient, quota)
	if err != nil {
		t.Fatal(err)
	}
	replace = append(replace, running.Record().ID, goldenRunningJob, tokenSum(token), tokenSum(goldenJobTokens[goldenRunningJob]))
	time.Sleep(time.Second)
	p := JobProgress{State: JobRunning, Started: now().UTC()}
	if err := running.WriteProgress(ctx, p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	done := []batch.ItemResult{created(0), {Index: 1, Status: 409, Outcome: batch.Failed, Body: json.RawMessage(`{"error":"taken"}`)}}
	if err := running.AppendResults(ctx, 0, done); err != nil {
		t.Fatal(err)
	}
	p.Tally(done)
	p.Cursor = 2
	if err := running.WriteProgress(ctx, p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if _, err := js.Cancel(ctx, running.Record().ID, token, "client"); err != nil {
		t.Fatal(err)
	}

	time.Sleep(time.Minute)
	ended, token, err := startJob(t, js, 1, goldenClient, quota)
	if err != nil {
		t.Fatal(err)
	}
	replace = append(replace, ended.Record().ID, goldenEndedJob, tokenSum(token), tokenSum(goldenJobTokens[goldenEndedJob]))
	time.Sleep(time.Second)
	p = JobProgress{State: JobRunning, Started: now().UTC()}
	if err := ended.WriteProgress(ctx, p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	long := []batch.ItemResult{{Index: 0, ID: "9", Status: 201, Outcome: batch.Succeeded,
		Body: json.RawMessage(`{"id":9,"notes":"` + strings.Repeat("é", 2100) + `"}`)}}
	if err := ended.AppendResults(ctx, 0, long); err != nil {
		t.Fatal(err)
	}
	p.Tally(long)
	p.State, p.Outcome, p.Cursor, p.Ended, p.ResultsBytes = JobSucceeded, "succeeded", 1, now().UTC(), 4242
	if err := ended.End(ctx, p); err != nil {
		t.Fatal(err)
	}
	// The running job's instance stops: its lease released.
	time.Sleep(time.Second)
	if err := running.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return append(replace, Owner(), goldenOwner)
}

// goldenStored is every key of s and its value, the golden replacements
// made in both.
func goldenStored(s *memStorage, replace []string) map[string]string {
	r := strings.NewReplacer(replace...)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.keys {
		out[r.Replace(k)] = r.Replace(string(v))
	}
	return out
}

// goldenFiles is every file under dir, by its key.
func goldenFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// This build writes the jobs' stored formats and layout byte for byte as
// the golden files hold them.
func TestJobsWriteStoredV1(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := newMemStorage()
		got := goldenStored(s, goldenJobs(t, s))
		want := goldenFiles(t, goldenJobsDir)
		if g, w := slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)); !slices.Equal(g, w) {
			t.Fatalf("stored keys\n%s\nwant\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("%s holds\n%s\nwant\n%s", k, got[k], w)
			}
		}
	})
}

// The golden jobs are read as they were stored: statuses, results, input
// and credentials; the ended one is removed whole; the running one, past
// its deadline + ttl, is swept whole; nothing is left.
func TestStoredV1JobsStillRead(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := storedFrom(t, goldenJobsDir)
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		ctx := context.Background()
		runningToken, endedToken := goldenJobTokens[goldenRunningJob], goldenJobTokens[goldenEndedJob]

		st, err := js.Status(ctx, goldenRunningJob, runningToken)
		if err != nil || st.State != JobCancelling || st.Done != 2 || st.Succeeded != 1 || st.Failed != 1 || st.Items != 3 || st.Ended != nil {
			t.Errorf("the running job: %+v, %v", st, err)
		}
		if got, _, _ := readResults(t, js, goldenRunningJob, runningToken); !slices.Equal(got, []int{0, 1}) {
			t.Errorf("the running job's results %v", got)
		}
		rec, err := readJob(ctx, s, goldenRunningJob)
		if err != nil || rec.Key != "golden-job" || rec.Client != goldenClient || rec.Origin.Host != "example.com" || rec.JobsPath != "/api/jobs" {
			t.Fatalf("the running job's record %+v, %v", rec, err)
		}
		// Released: another instance takes it at once.
		hj, err := js.ClaimReleased(ctx, goldenRunningJob)
		if err != nil || hj.Epoch() != 1 {
			t.Fatalf("claiming the released job: %v", err)
		}
		chunk, err := hj.ReadChunk(ctx, 2)
		if err != nil || len(chunk) != 1 || string(chunk[0].Element) != `{"name":"w2"}` {
			t.Errorf("the running job's chunk at 2: %+v, %v", chunk, err)
		}
		if cred, err := hj.Credentials(ctx); err != nil || cred.Get("Authorization") != "Bearer golden" {
			t.Errorf("the running job's credentials %v, %v", cred, err)
		}
		if err := hj.Release(ctx); err != nil {
			t.Fatal(err)
		}

		st, err = js.Status(ctx, goldenEndedJob, endedToken)
		if err != nil || st.State != JobSucceeded || st.Outcome != "succeeded" || st.Ended == nil || !st.Expires.Equal(st.Ended.Add(24*time.Hour)) {
			t.Errorf("the ended job: %+v, %v", st, err)
		}
		if _, _, lines := readResults(t, js, goldenEndedJob, endedToken); len(lines) != 1 || !lines[0].BodyTruncated {
			t.Errorf("the ended job's results %+v", lines)
		}
		if _, err := js.Status(ctx, goldenEndedJob, runningToken); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("the ended job with the other's token: %v", err)
		}
		if err := js.Remove(ctx, goldenEndedJob, endedToken); err != nil {
			t.Fatal(err)
		}
		swept, err := NewJobSweeper(s, zap.NewNop()).Sweep(ctx, now().Add(31*time.Hour))
		if err != nil || swept.Deleted != 1 {
			t.Errorf("sweeping the running job past its deadline + ttl: %+v, %v", swept, err)
		}
		if left := s.keysUnder("batch"); len(left) != 0 {
			t.Errorf("left %v", left)
		}
	})
}
