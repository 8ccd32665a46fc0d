package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// The faults a cluster sees, played on a bulk job (docs/durability.md,
// "A job at each fault"): the saga's fault tests (fence_test.go)
// over HeldJob.Run, two instances on one in-memory storage in a synctest
// bubble, the second taking the job over by its scan.

// jobFaultLease is the lease of the job fault tests: renewed every 10 s,
// a write held back 5 s short of its end.
const jobFaultLease = 30 * time.Second

// jobFaultItems is the size of the fault tests' jobs: three windows, the
// last one short.
const jobFaultItems = 600

// storageCall is a storage call an instance made, when it began.
type storageCall struct {
	op, key string
	at      time.Time
}

// jobInstance is one instance of a cluster: its storage calls go through
// a fault of its own, and are logged; its creates go to the one API, each
// logged with when it left.
type jobInstance struct {
	name string
	s    *faulty
	js   *Jobs

	mu    sync.Mutex
	calls []storageCall
	fault func(ctx context.Context, op, key string) error
	sent  []sentCreate
	// before, if set, runs as the instance's nth create (from 1) leaves.
	before func(n int)
	// held, while set, keeps the answers the API gave the instance
	// until it is closed: the instance's process is paused.
	held chan struct{}
}

type sentCreate struct {
	name string
	at   time.Time
}

func newJobInstance(name string, mem *memStorage) *jobInstance {
	in := &jobInstance{name: name, s: &faulty{memStorage: mem}}
	in.s.setHook(func(ctx context.Context, op, key string) error {
		in.mu.Lock()
		in.calls = append(in.calls, storageCall{op, key, now()})
		fault := in.fault
		in.mu.Unlock()
		if fault != nil {
			return fault(ctx, op, key)
		}
		return nil
	})
	in.js = NewJobs(in.s, NewLeases(jobFaultLease), zap.NewNop())
	return in
}

func (in *jobInstance) setFault(f func(ctx context.Context, op, key string) error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.fault = f
}

// refuseRenewals is a fault that refuses every store of a job's lease
// (a storage read-only for that key), and lets every other call pass.
func refuseRenewals(_ context.Context, op, key string) error {
	if op == "store" && strings.HasPrefix(path.Base(key), leaseName) {
		return errors.New("READONLY")
	}
	return nil
}

// pause pauses the instance's process as it sends its nth create (or
// forward write): the API's answers and its storage calls are held
// until wake closes. paused closes once it is.
func (in *jobInstance) pause(n int) (wake, paused chan struct{}) {
	wake, paused = make(chan struct{}), make(chan struct{})
	in.before = func(c int) {
		if c == n {
			in.mu.Lock()
			in.held = wake
			in.mu.Unlock()
			in.setFault(func(context.Context, string, string) error { <-wake; return nil })
			close(paused)
		}
	}
	return wake, paused
}

// writesFrom are the stores and deletes the instance began at or after
// at.
func (in *jobInstance) writesFrom(at time.Time) []storageCall {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []storageCall
	for _, c := range in.calls {
		if (c.op == "store" || c.op == "delete") && !c.at.Before(at) {
			out = append(out, c)
		}
	}
	return out
}

// sentFrom are the creates the instance sent at or after at.
func (in *jobInstance) sentFrom(at time.Time) []sentCreate {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []sentCreate
	for _, c := range in.sent {
		if !c.at.Before(at) {
			out = append(out, c)
		}
	}
	return out
}

// through is the instance's way to up: each create logged, and taking a
// second of the bubble's time, so that renewals come between them.
func (in *jobInstance) through(t *testing.T, up *widgetsUpstream) Through {
	send := senderFunc(func(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
		if req.Method == http.MethodPost {
			var w struct{ Name string }
			_ = json.Unmarshal(req.Body, &w)
			in.mu.Lock()
			in.sent = append(in.sent, sentCreate{w.Name, now()})
			n, before := len(in.sent), in.before
			in.mu.Unlock()
			if before != nil {
				before(n)
			}
			time.Sleep(time.Second)
		}
		resp, err := up.Send(ctx, req)
		in.mu.Lock()
		held := in.held
		in.mu.Unlock()
		if held != nil {
			<-held
		}
		return resp, err
	})
	return throughTo(widgetsPolicy(t, nil), send)
}

type senderFunc func(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error)

func (f senderFunc) Send(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
	return f(ctx, req)
}

// lapseOf is when the job's lease lapsed, or lapses, by its owner's wall
// clock: its last proof plus a lease.
func lapseOf(hj *HeldJob) time.Time {
	h := hj.lease.holder
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wall
}

// takeOver has the instance scan, let a lease and a second pass, and
// scan again, the job it claims run to its end through through; it
// answers once that run ended, with its error.
func (in *jobInstance) takeOver(t *testing.T, through Through) <-chan error {
	ran := make(chan error, 1)
	room := func(*JobRecord) (func(*HeldJob), func(), bool) {
		run := func(hj *HeldJob) {
			keepHeld(t, hj)
			ran <- hj.Run(context.Background(), through, nil)
		}
		return run, func() {}, true
	}
	scan := func() {
		if err := in.js.Scan(context.Background(), room, func(id, doing string, err error) {
			t.Errorf("%s's scan: job %s, %s: %v", in.name, id, doing, err)
		}); err != nil {
			t.Error(err)
		}
	}
	go func() {
		scan()
		time.Sleep(jobFaultLease + time.Second)
		scan()
	}()
	return ran
}

// ranToItsEnd waits for the run takeOver answers: an hour of the
// bubble's time, far past its job's run.
func ranToItsEnd(t *testing.T, ran <-chan error) {
	t.Helper()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("the instance that took the job over: %v", err)
		}
	case <-time.After(time.Hour):
		t.Fatal("no scan of the other instance took the job over")
	}
}

// checkCarriedOn checks the job the fault left to another owner: ended
// succeeded with one takeover, its results every item in order, and
// each element sent once across the owners, and made once.
func checkCarriedOn(t *testing.T, js *Jobs, id, token string, up *widgetsUpstream, owners ...*jobInstance) {
	t.Helper()
	st := mustStatus(t, js, id, token)
	if st.State != JobSucceeded || st.Done != jobFaultItems || st.Succeeded != jobFaultItems || st.Takeovers != 1 {
		t.Errorf("status %s, done %d, succeeded %d, takeovers %d; want succeeded, %d, %d, 1",
			st.State, st.Done, st.Succeeded, st.Takeovers, jobFaultItems, jobFaultItems)
	}
	if indexes, _, _ := readResults(t, js, id, token); !slices.Equal(indexes, upTo(jobFaultItems)) {
		t.Errorf("results of %d items, want 0 to %d in order", len(indexes), jobFaultItems-1)
	}
	sends := map[string]int{}
	for _, in := range owners {
		for _, c := range in.sentFrom(time.Time{}) {
			sends[c.name]++
		}
	}
	for i := range jobFaultItems {
		if n := sends[fmt.Sprintf("w%d", i)]; n != 1 {
			t.Errorf("element %d sent %d times across the owners, want once", i, n)
		}
	}
	up.checkMadeOnce(t, jobFaultItems)
}

// checkStoppedBy checks what the owner that lost the job did: Run ended
// with the lost lease, no create sent once its lease was within a sixth
// of its lapse by its own clock, and no store or delete begun after the
// lapse.
func checkStoppedBy(t *testing.T, a *jobInstance, hj *HeldJob, err error) {
	t.Helper()
	var lost *batch.LeaseLost
	if !errors.As(err, &lost) {
		t.Errorf("the owner that lost the job: Run = %v, want its lease lost", err)
	}
	lapse := lapseOf(hj)
	if late := a.sentFrom(lapse.Add(-jobFaultLease / 6)); len(late) > 0 {
		t.Errorf("the owner sent %d creates within a sixth of its lease's lapse at %s or after, the first %+v", len(late), lapse, late[0])
	}
	if late := a.writesFrom(lapse); len(late) > 0 {
		t.Errorf("the owner wrote %d times after its lease lapsed at %s, the first %+v", len(late), lapse, late[0])
	}
}

// A storage that hangs for one and a half leases and then answers, as a
// partition that heals: the owner's lease lapses by its own clock while
// its calls hang, and what lands late proves nothing; another instance
// takes the job over meanwhile and carries it on. The owner sends
// nothing after the lapse and never renews again; each element is sent
// once across the two.
func TestJobStorageHangingPastTheLapse(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		mem := newMemStorage()
		a, b := newJobInstance("A", mem), newJobInstance("B", mem)
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		heal := make(chan struct{})
		var takenOver <-chan error
		a.before = func(n int) {
			if n == 300 {
				a.setFault(func(context.Context, string, string) error { <-heal; return nil })
				go func() { time.Sleep(jobFaultLease * 3 / 2); close(heal) }()
				takenOver = b.takeOver(t, b.through(t, up))
			}
		}
		err := hj.Run(context.Background(), a.through(t, up), nil)
		checkStoppedBy(t, a, hj, err)
		ranToItsEnd(t, takenOver)
		checkCarriedOn(t, b.js, id, token, up, a, b)
	})
}

// Renewals refused (a storage gone read-only for one key) while every
// other call passes: the lease is never proven again, and the owner
// stops sending a sixth of a lease before it lapses by its own clock,
// writing nothing after; another instance carries the job on.
func TestJobRenewalsRefused(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		mem := newMemStorage()
		a, b := newJobInstance("A", mem), newJobInstance("B", mem)
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		a.before = func(n int) {
			if n == 100 {
				a.setFault(refuseRenewals)
			}
		}
		err := hj.Run(context.Background(), a.through(t, up), nil)
		checkStoppedBy(t, a, hj, err)
		ranToItsEnd(t, b.takeOver(t, b.through(t, up)))
		checkCarriedOn(t, b.js, id, token, up, a, b)
	})
}

// A storage blip shorter than the lease (every call of the owner fails
// for a third of it) loses nothing: a renewal it fails leaves the lease
// unproven, the writes wait, and go on once the next renewal proves it;
// the job ends succeeded, each element sent once, never taken over.
func TestJobStorageBlipLosesNothing(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		a := newJobInstance("A", newMemStorage())
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		a.before = func(n int) {
			if n == 100 {
				a.setFault(func(context.Context, string, string) error { return errors.New("connection refused") })
				go func() { time.Sleep(jobFaultLease / 3); a.setFault(nil) }()
			}
		}
		if err := hj.Run(context.Background(), a.through(t, up), nil); err != nil {
			t.Fatalf("Run across a blip: %v", err)
		}
		st := mustStatus(t, a.js, id, token)
		if st.State != JobSucceeded || st.Done != jobFaultItems || st.Succeeded != jobFaultItems || st.Takeovers != 0 {
			t.Errorf("status %s, done %d, succeeded %d, takeovers %d; want succeeded, %d, %d, 0",
				st.State, st.Done, st.Succeeded, st.Takeovers, jobFaultItems, jobFaultItems)
		}
		if indexes, _, _ := readResults(t, a.js, id, token); !slices.Equal(indexes, upTo(jobFaultItems)) {
			t.Errorf("results of %d items, want 0 to %d in order", len(indexes), jobFaultItems-1)
		}
		if sent := a.sentFrom(time.Time{}); len(sent) != jobFaultItems {
			t.Errorf("%d creates sent, want %d: nothing sent twice", len(sent), jobFaultItems)
		}
		up.checkMadeOnce(t, jobFaultItems)
	})
}

// An owner paused (its process stopped: its storage calls and the
// answers it waits for held, its clock running) across a takeover:
// another instance sees its lease unchanged for a lease, takes the job
// over and ends it. The owner, awake, sends nothing more and writes
// nothing more: no results page or progress over the new owner's, its
// run ending with the lost lease; the job stands as the new owner ended
// it, each element sent once.
func TestJobOwnerPausedAcrossATakeover(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		mem := newMemStorage()
		a, b := newJobInstance("A", mem), newJobInstance("B", mem)
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		wake, paused := a.pause(300)
		ran := make(chan error, 1)
		go func() { ran <- hj.Run(context.Background(), a.through(t, up), nil) }()
		<-paused
		ranToItsEnd(t, b.takeOver(t, b.through(t, up)))
		ended := mem.valuesUnder(jobDir(id))
		woke := now()
		close(wake)
		var lost *batch.LeaseLost
		if err := <-ran; !errors.As(err, &lost) {
			t.Errorf("the owner that woke: Run = %v, want its lease lost", err)
		}
		if late := a.sentFrom(woke); len(late) > 0 {
			t.Errorf("the owner sent %d creates after it woke, the first %+v", len(late), late[0])
		}
		if late := a.writesFrom(woke); len(late) > 0 {
			t.Errorf("the owner wrote %d times after it woke, the first %+v", len(late), late[0])
		}
		// A store the owner made before its pause lands as it wakes: only
		// a log segment of its own epoch, which no later owner takes for
		// its own.
		for key, v := range mem.valuesUnder(jobDir(id)) {
			if string(ended[key]) != string(v) && !strings.Contains(key, "/"+logName+"/") {
				t.Errorf("%s changed after the owner woke", key)
			}
			if _, was := ended[key]; !was && strings.Contains(key, "/"+logName+"/") && !strings.Contains(key, "/seg.00000000.") {
				t.Errorf("%s stored after the owner woke, not under its epoch", key)
			}
		}
		checkCarriedOn(t, b.js, id, token, up, a, b)
	})
}

// A storage that fails one kind of call for good while the lease is
// renewed is no blip: the owner tries for a lease, then ends its run
// with the error and releases the job, which another instance may claim
// at once; no write went whose record its log could not store.
func TestJobStorageFailingForALease(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, calls, want string }{
		{"window logs", "/" + logName + "/", "did not record the writes"},
		{"results pages", "/" + resultsName + "/", "storing the results"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			bubble(t, func(t *testing.T) {
				defer endHeld(t)
				a := newJobInstance("A", newMemStorage())
				hj, _ := startWidgets(t, a.js, jobFaultItems, true)
				up := newWidgetsUpstream(false)
				var broke time.Time
				a.before = func(n int) {
					if n == 100 {
						broke = now()
						a.setFault(func(_ context.Context, op, key string) error {
							if op == "store" && strings.Contains(key, c.calls) {
								return errors.New("OOM command not allowed")
							}
							return nil
						})
					}
				}
				err := hj.Run(context.Background(), a.through(t, up), nil)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("Run = %v, want it ended by the failing stores (%q)", err, c.want)
				}
				if took := now().Sub(broke); took < jobFaultLease || took > 3*jobFaultLease {
					t.Errorf("the run ended %s after the stores began failing, want after about a lease of tries", took)
				}
				if c.calls == "/"+logName+"/" {
					// The writes recorded before the stores failed, waiting
					// their turn (four times job_concurrency), may still go:
					// their records are in the log. No other may.
					recorded := sendingRecordsUnder(t, a.s.memStorage, hj.Record().ID)
					for _, late := range a.sentFrom(broke.Add(time.Millisecond)) {
						if !recorded[late.name] {
							t.Errorf("create %+v sent after the log's stores began failing, with no record of it stored: a write goes only once its record is stored", late)
						}
					}
				}
				next, err := a.js.ClaimReleased(context.Background(), hj.Record().ID)
				if err != nil {
					t.Fatalf("claiming the job its owner gave up: %v, want its lease released", err)
				}
				keepHeld(t, next)
			})
		})
	}
}

// sendingRecordsUnder names the elements (w<job index>) whose write a
// segment of job id's log in s records as about to be sent.
func sendingRecordsUnder(t *testing.T, s *memStorage, id string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for key, v := range s.valuesUnder(path.Join(jobDir(id), logName)) {
		var seg logSegment
		if err := json.Unmarshal(v, &seg); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		for _, r := range seg.Records {
			if r.Item.Phase == batch.PhaseSending {
				out[fmt.Sprintf("w%d", r.Index)] = true
			}
		}
	}
	return out
}
