package batch

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/slots"
	"github.com/caddy-batch/caddy-batch/policy"
)

// The proofs (docs/all-or-nothing.md): an undo never destroys what the batch did not
// write. Each test plays the other writer (a hook that changes the store
// between the batch's write and its undo) and reads the store at the end.

// otherWriter changes record id as another client would, directly at the
// upstream, and then answers the batch's failing request with 500.
func otherWriter(f *fakeAPI, id string, rec map[string]any) answer {
	return answer{status: 500, body: `{}`, hook: func(context.Context, *SubRequest) {
		if rec == nil {
			f.mu.Lock()
			delete(f.records, widget(id))
			f.mu.Unlock()
			return
		}
		f.put(widget(id), rec)
	}}
}

func TestProofUpdateLeavesAnotherWritersChange(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	theirs := map[string]any{"id": "1", "name": "theirs", "color": "red"}
	f.on("PATCH", "/widgets/2", otherWriter(f, "1", theirs))
	w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"ours"},{"id":"2","name":"x"}]`, f, concurrency(1)))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
	equal(t, "status", w.Code, 500)
	equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
	c := w.Items[0].Compensation
	if c == nil || !strings.Contains(c.Error, "another writer") || !strings.Contains(string(c.Found), "theirs") {
		t.Errorf("compensation %+v: want the reason and what was found", c)
	}
	jsonEqual(t, "widget 1", f.state()["/widgets/1"], `{"id":"1","name":"theirs","color":"red"}`)
}

func TestProofDeleteDoesNotRecreateOverANewItem(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	newer := map[string]any{"id": "1", "name": "newer"}
	f.on("DELETE", "/widgets/2", otherWriter(f, "1", newer))
	w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
	equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
	jsonEqual(t, "widget 1", f.state()["/widgets/1"], `{"id":"1","name":"newer"}`)
	if c := w.Items[0].Compensation; c == nil || !strings.Contains(c.Error, "exists again") {
		t.Errorf("compensation %+v, want the reason", c)
	}
}

func TestProofCreateLeavesAChangedItem(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.on("POST", "/widgets", answer{}, otherWriter(f, "1000", map[string]any{"id": "1000", "name": "renamed"}))
	w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
	equal(t, "DELETEs sent", len(f.sentWith("DELETE")), 0)
	equal(t, "widget 1000 kept", f.state()["/widgets/1000"] != "", true)
}

func TestProofCreateAlreadyDeletedIsUndone(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.on("POST", "/widgets", answer{}, otherWriter(f, "1000", nil))
	w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
	equal(t, "DELETEs sent", len(f.sentWith("DELETE")), 0)
}

// With strong ETags and conditional_writes the upstream proves it: the
// forward write carries the preflight's ETag, the undo the write's, and no
// proof read is needed.
func TestProofByETag(t *testing.T) {
	t.Parallel()
	t.Run("update", func(t *testing.T) {
		f := newFake().
			on("GET", "/widgets/1", reply(200, `{"id":"1","v":0}`, "ETag", `"a1"`)).
			on("GET", "/widgets/2", reply(200, `{"id":"2","v":0}`, "ETag", `W/"weak"`)).
			on("PATCH", "/widgets/1", reply(200, `{"id":"1","v":1}`, "ETag", `"a2"`)).
			on("PATCH", "/widgets/2", reply(500, ``)).
			on("PUT", "/widgets/1", reply(200, `{"id":"1","v":0}`))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1), conditional))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "PUT /widgets/1"})
		log := f.log()
		equal(t, "write 1 If-Match", log[2].Header.Get("If-Match"), `"a1"`)
		equal(t, "write 2 If-Match (weak ETag: none)", log[3].Header.Get("If-Match"), "")
		equal(t, "undo If-Match", log[4].Header.Get("If-Match"), `"a2"`)
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
	})
	t.Run("a write refused 412 is the item's failure", func(t *testing.T) {
		f := newFake().
			on("GET", "/widgets/1", reply(200, `{"id":"1"}`, "ETag", `"a1"`)).
			on("PATCH", "/widgets/1", reply(412, ``))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1}]`, f, conditional))
		equal(t, "status", w.Code, 412)
		if !strings.Contains(w.Items[0].Error, "changed after the batch read it") {
			t.Errorf("error %q", w.Items[0].Error)
		}
	})
	t.Run("an undo refused 412 leaves the item", func(t *testing.T) {
		f := newFake().seed("2").
			on("GET", "/widgets/1", reply(200, `{"id":"1"}`, "ETag", `"a1"`)).
			on("PATCH", "/widgets/1", reply(200, `{"id":"1","v":1}`, "ETag", `"a2"`)).
			on("PATCH", "/widgets/2", reply(500, ``)).
			on("PUT", "/widgets/1", reply(412, ``))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1), conditional))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		equal(t, "PUT attempts (412 is not retried)", len(f.sentWith("PUT")), 1)
	})
	t.Run("delete: the re-create is conditional, with no read", func(t *testing.T) {
		f := newFake().
			on("GET", "/widgets/1", reply(200, `{"id":"1"}`, "ETag", `"a1"`)).
			on("GET", "/widgets/2", reply(200, `{"id":"2"}`, "ETag", `"b1"`)).
			on("DELETE", "/widgets/1", reply(204, ``)).
			on("DELETE", "/widgets/2", reply(500, ``)).
			on("PUT", "/widgets/1", reply(201, `{"id":"1"}`))
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), conditional))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "DELETE /widgets/2", "PUT /widgets/1"})
		log := f.log()
		equal(t, "delete If-Match", log[2].Header.Get("If-Match"), `"a1"`)
		equal(t, "re-create If-None-Match", log[4].Header.Get("If-None-Match"), "*")
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
	})
}

// Without conditional_writes a strong ETag is no proof: many frameworks
// send one on every GET and ignore If-Match on writes. The conditions are
// still sent, and every undo is proved by a read first, where the write's
// ETag on the read counts.
func TestProofByReadWithoutConditionalWrites(t *testing.T) {
	t.Parallel()
	t.Run("update: the read carries the write's ETag", func(t *testing.T) {
		f := newFake().
			on("GET", "/widgets/1", reply(200, `{"id":"1","v":0}`, "ETag", `"a1"`), reply(200, `{"id":"1","v":1,"at":"t2"}`, "ETag", `"a2"`)).
			on("PATCH", "/widgets/1", reply(200, `{"id":"1","v":1}`, "ETag", `"a2"`)).
			on("PATCH", "/widgets/2", reply(500, ``)).
			on("PUT", "/widgets/1", reply(200, `{"id":"1","v":0}`))
		f.seed("2")
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "PATCH /widgets/1", "PATCH /widgets/2", "GET /widgets/1", "PUT /widgets/1"})
		equal(t, "undo If-Match (still sent)", f.log()[5].Header.Get("If-Match"), `"a2"`)
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
	})
	t.Run("update: an unenforced ETag does not hide another writer", func(t *testing.T) {
		// The API answers the proof read with the batch's own ETag but a
		// body another writer left: ETags are not compared by an API that
		// does not enforce them, and a body that is not the write's
		// answer is another writer's.
		f := newFake().
			on("GET", "/widgets/1", reply(200, `{"id":"1","v":0}`, "ETag", `"a1"`), reply(200, `{"id":"1","v":9}`, "ETag", `"x9"`)).
			on("PATCH", "/widgets/1", reply(200, `{"id":"1","v":1}`, "ETag", `"a2"`)).
			on("PATCH", "/widgets/2", reply(500, ``))
		f.seed("2")
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		equal(t, "PUTs sent", len(f.sentWith("PUT")), 0)
	})
	t.Run("delete: the re-create is read first, and still conditional", func(t *testing.T) {
		f := newFake().
			on("GET", "/widgets/1", reply(200, `{"id":"1"}`, "ETag", `"a1"`), reply(200, `{"id":"1","name":"someone else's"}`, "ETag", `"z1"`)).
			on("GET", "/widgets/2", reply(200, `{"id":"2"}`, "ETag", `"b1"`)).
			on("DELETE", "/widgets/1", reply(204, ``)).
			on("DELETE", "/widgets/2", reply(500, ``))
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1)))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/1", "GET /widgets/2", "DELETE /widgets/1", "DELETE /widgets/2", "GET /widgets/1"})
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
	})
}

// docs/all-or-nothing.md: a Location counts only when it names an item of the same
// resource; a 202's body is not the item.
func TestCreatedIDRules(t *testing.T) {
	t.Parallel()
	t.Run("202 with a Location elsewhere names no id", func(t *testing.T) {
		f := newFake().seed("2").on("POST", "/widgets",
			reply(202, `{"id":2,"status":"queued"}`, "Location", "http://h/jobs/2"), reply(409, `{}`))
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		equal(t, "DELETEs sent", len(f.sentWith("DELETE")), 0)
		equal(t, "widget 2 kept", f.state()["/widgets/2"] != "", true)
	})
	t.Run("a Location of another collection is not an id", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", reply(201, `{"name":"w0"}`, "Location", "/gadgets/9"), reply(409, `{}`))
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equal(t, "id", w.Items[0].ID, "")
		equal(t, "DELETEs sent", len(f.sentWith("DELETE")), 0)
	})
	t.Run("the element's id was not where the upstream put the item", func(t *testing.T) {
		// An API that numbers items itself and answers 201 with nothing:
		// the element's id 3 names nothing, and 3 must not be deleted when
		// someone creates it later.
		f := newFake().on("POST", "/widgets", reply(201, ``), reply(409, `{}`))
		w := write(t, run1(t, "POST", "/widgets", `[{"id":3,"name":"a"},{"name":"b"}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		equal(t, "DELETEs sent", len(f.sentWith("DELETE")), 0)
	})
	t.Run("an existing id fails the item before its create", func(t *testing.T) {
		f := newFake().seed("3")
		before := f.state()
		w := write(t, run1(t, "POST", "/widgets", `[{"id":3,"name":"a"}]`, f))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/3"})
		equal(t, "status", w.Code, 409)
		f.checkUnchanged(t, before)
	})
	t.Run("303: unknown, and what the Location names is never deleted", func(t *testing.T) {
		// A 303 may point a create at an existing equivalent item (RFC
		// 9110 §9.3.3): reading what it sent there proves nothing.
		f := newFake().on("POST", "/widgets", reply(303, ``, "Location", "http://h/widgets/7"), reply(409, `{}`)).
			on("GET", "/widgets/7", reply(200, `{"id":7,"name":"w0"}`)).
			on("DELETE", "/widgets/7", reply(204, ``))
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "not_attempted"})
		equalSlices(t, "deletes", pathsOf(f.sentWith("DELETE")), nil)
		equal(t, "status", w.Code, 500)
	})
	t.Run("restore_deleted post under another id is rollback_failed, naming it", func(t *testing.T) {
		f := newFake().seed("1", "2").
			on("DELETE", "/widgets/2", reply(500, ``)).
			on("POST", "/widgets", reply(201, `{"id":"1000"}`, "Location", "/widgets/1000"))
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, concurrency(1), restoreByPost))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		if c := w.Items[0].Compensation; c == nil || !strings.Contains(c.Error, `"1000"`) {
			t.Errorf("compensation %+v does not name the new id", c)
		}
	})
}

// With idempotent_upstream, an unknown write is sent again with the same
// key, and the answer tells what it did.
func TestIdempotentUpstreamResend(t *testing.T) {
	t.Parallel()
	idem := settings(func(s *policy.Settings) { s.IdempotentUpstream = true })
	f := newFake().seed("1", "2").
		on("PATCH", "/widgets/1", answer{effectThenErr: errLost}, answer{}).
		on("PATCH", "/widgets/2", reply(500, ``))
	before := f.state()
	w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`, f, concurrency(1), idem))
	patches := f.sentWith("PATCH")
	if len(patches) != 2 || patches[0].Path != "/widgets/1" || patches[1].Path != "/widgets/1" {
		t.Fatalf("PATCHes %v, want item 1's sent again", patches)
	}
	equal(t, "same key", patches[1].Header.Get("Idempotency-Key"), patches[0].Header.Get("Idempotency-Key"))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "not_attempted"})
	f.checkUnchanged(t, before)
}

// Undos run in parallel: five hanging undos take one compensation's
// budget, not five.
func TestUndosRunInParallel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := newFake().seed("1", "2", "3", "4", "5", "6").
			on("PATCH", "/widgets/6", reply(500, ``)).
			on("PUT", "/widgets/1", answer{hang: true}).on("PUT", "/widgets/2", answer{hang: true}).
			on("PUT", "/widgets/3", answer{hang: true}).on("PUT", "/widgets/4", answer{hang: true}).
			on("PUT", "/widgets/5", answer{hang: true})
		slow := settings(func(s *policy.Settings) {
			s.CompensationTimeout = 100 * time.Millisecond
			s.CompensationRetries = 1
		})
		start := time.Now()
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1},{"id":"4","v":1},{"id":"5","v":1},{"id":"6","v":1}]`,
			f, concurrency(6), slow))
		took := time.Since(start)
		equal(t, "outcome", w.Outcome, "rollback_failed")
		// One budget is 2 × 100ms plus a backoff (none in tests); five in a
		// row would be a second.
		if took > 600*time.Millisecond {
			t.Errorf("five hanging undos took %s: they did not run in parallel", took)
		}
		if f.maxConcurrent() < 5 {
			t.Errorf("at most %d requests in flight, want the five undos together", f.maxConcurrent())
		}
	})
}

// The preflight and every undo keep the client's query.
func TestQueryOnEverySubRequest(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2").on("DELETE", "/widgets/2", reply(500, ``))
	run1(t, "DELETE", "/widgets?ids=1,2&tenant=t2", "", f, concurrency(1), scopeQuery("tenant"))
	for _, c := range f.log() {
		if c.RawQuery != "tenant=t2" {
			t.Errorf("%s went without the query: %q", c, c.RawQuery)
		}
	}
}

// recordingJournal keeps what the saga tells it, and checks the
// write-ahead rule against the sender's log.
type recordingJournal struct {
	mu     sync.Mutex
	f      *fakeAPI
	events []string
	failAt Phase
	ended  *Result
}

func (j *recordingJournal) Fence(context.Context) error { return nil }

func (j *recordingJournal) Begin(context.Context, *Plan) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, "begin")
	return nil
}

func (j *recordingJournal) Record(_ context.Context, t Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	e := t.Phase.String()
	if t.Request != nil {
		e += " " + t.Request.Method + " " + t.Request.Path
		if t.Phase == PhaseSending {
			for _, c := range j.f.log() {
				if c.Method == t.Request.Method && c.Path == t.Request.Path {
					return errorString("the write was sent before its record: " + e)
				}
			}
		}
	}
	if t.Phase == PhaseAnswered && t.Item.Undo != nil {
		e += " undo " + t.Item.Undo.Method
	}
	j.events = append(j.events, e)
	if t.Phase == j.failAt {
		return errorString("storage down")
	}
	return nil
}

func (j *recordingJournal) End(_ context.Context, r *Result) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, "end")
	j.ended = r
}

type errorString string

func (e errorString) Error() string { return string(e) }

func TestJournalSeesEveryTransition(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(500, ``))
	j := &recordingJournal{f: f}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1))
	res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	equalSlices(t, "journal", j.events, []string{
		"begin", "read", "read",
		"sending PATCH /widgets/1", "answered undo PUT",
		"sending PATCH /widgets/2", "answered",
		"undoing PUT /widgets/1", "settled",
		"end",
	})
	if j.ended != res {
		t.Error("End was not given the result")
	}
}

func TestJournalFailureStopsTheWrite(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	before := f.state()
	j := &recordingJournal{f: f, failAt: PhaseSending}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1}]`))
	w := write(t, newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background()))
	equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 0)
	equalSlices(t, "statuses", w.Statuses(), []int{503})
	// The gateway's own storage failed, not the legacy API: 503, and
	// when to try again (docs/wire-format.md, "Batch requests and responses").
	equal(t, "status", w.Code, 503)
	equal(t, "Retry-After", w.Header.Get("Retry-After"), gatewayRetryAfter)
	f.checkUnchanged(t, before)
}

// countingSlots stands for max_in_flight: it counts who asked, and how.
type countingSlots struct{ normal, urgent, background atomic.Int32 }

func (s *countingSlots) Acquire(_ context.Context, p slots.Priority) (func(), error) {
	if p.Urgent {
		s.urgent.Add(1)
	} else {
		s.normal.Add(1)
	}
	if p.Background {
		s.background.Add(1)
	}
	return func() {}, nil
}

func TestEverySubRequestTakesASlot(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(500, ``))
	slots := &countingSlots{}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1))
	newBatchRun(p, Runtime{Send: f, Slots: slots}, noBackoff).do(context.Background())
	// 2 preflight reads and 2 writes; then the proof read and the undo.
	equal(t, "normal slots", slots.normal.Load(), 4)
	equal(t, "urgent slots", slots.urgent.Load(), 2)
	equal(t, "background slots", slots.background.Load(), 0)
	equal(t, "sent", len(f.sent()), 6)
}

// TestBackgroundRunTakesBackgroundSlots: a run set Background (a bulk
// job's) asks every slot in a background lane, its undos in the urgent
// one.
func TestBackgroundRunTakesBackgroundSlots(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(500, ``))
	counted := &countingSlots{}
	p := mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1}]`), concurrency(1))
	newBatchRun(p, Runtime{Send: f, Slots: counted, Background: true}, noBackoff).do(context.Background())
	equal(t, "normal slots", counted.normal.Load(), 4)
	equal(t, "urgent slots", counted.urgent.Load(), 2)
	equal(t, "background slots", counted.background.Load(), 6)
}

// A write is recorded before it waits for a slot: one whose slot never
// came within the batch's time was not sent, and its record says so
// (settled), so that a recovery does not take it for a write whose
// answer was lost.
func TestWriteThatGotNoSlotIsRecordedNotSent(t *testing.T) {
	t.Parallel()
	f := newFake()
	j := &recordingJournal{f: f}
	fifo := slots.NewFIFO(1)
	release, err := fifo.Acquire(context.Background(), slots.Priority{})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	p := mustPlan(t, newRequest("POST", "/widgets", `[{"name":"a"}]`), batchTimeout(50*time.Millisecond))
	res := newBatchRun(p, Runtime{Send: f, Journal: j, Slots: fifo}, noBackoff).do(context.Background())
	if len(f.sent()) != 0 || res.Items[0].Outcome != NotAttempted {
		t.Fatalf("sent %v, item %s; want nothing sent, the item not attempted", f.sent(), res.Items[0].Outcome)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	sending := slices.Index(j.events, "sending POST /widgets")
	if sending < 0 || !slices.Contains(j.events[sending:], "settled") {
		t.Errorf("journal %q: want the write recorded as about to be sent, then settled, nothing sent", j.events)
	}
}
