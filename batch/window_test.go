package batch

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// jobWindow is a window of a job on /widgets: op's items from elements
// (a create's or update's) or ids (a delete's), the first at job index
// base, under the job's key "job".
func jobWindow(op policy.Op, base int, items ...ItemSnapshot) *Snapshot {
	return &Snapshot{Version: SnapshotVersion, Op: op.String(), Path: "/widgets", Key: "job", Base: base, Items: items}
}

// element is an item of a job's window: a delete's has no body.
func element(id, body string) ItemSnapshot {
	it := ItemSnapshot{ID: id, Outcome: NotAttempted}
	if body != "" {
		it.Element = []byte(body)
	}
	return it
}

func runWindow(t *testing.T, w *Snapshot, f *fakeAPI, j Journal, o WindowOpts, mods ...specMod) *WindowResult {
	t.Helper()
	res, err := ExecuteWindow(context.Background(), w, Site{Runtime: Runtime{Send: f, Journal: j}, Lookup: widgets(t, mods...).Lookup}, o)
	if err != nil {
		t.Fatalf("ExecuteWindow: %v", err)
	}
	return res
}

func TestWindowKeysAndIndexesComeFromTheJob(t *testing.T) {
	f := newFake()
	w := jobWindow(policy.OpCreate, 500, element("", `{"name":"a"}`), element("", `{"name":"b"}`), element("", `{"name":"c"}`))
	res := runWindow(t, w, f, nil, WindowOpts{}, concurrency(1))
	for i, it := range res.Items {
		if it.Index != 500+i || it.Outcome != Succeeded {
			t.Errorf("item %d: index %d, outcome %s; want %d, succeeded", i, it.Index, it.Outcome, 500+i)
		}
	}
	posts := f.sentWith(http.MethodPost)
	if len(posts) != 3 {
		t.Fatalf("sent %v, want 3 creates", f.sent())
	}
	for i, c := range posts {
		if got, want := c.Header.Get("Idempotency-Key"), fmt.Sprintf("job:%d", 500+i); got != want {
			t.Errorf("create %d carried Idempotency-Key %q, want %q", i, got, want)
		}
	}
}

func TestWindowKeepBodyCutsLongAnswers(t *testing.T) {
	long := `{"id":"1","note":"` + strings.Repeat("é", 5000) + `"}`
	f := newFake().seed("1", "2").on(http.MethodPatch, widget("1"), reply(http.StatusOK, long, "Content-Type", "application/json"))
	w := jobWindow(policy.OpUpdate, 0, element("1", `{"id":"1","name":"x"}`), element("2", `{"id":"2","name":"y"}`))
	res := runWindow(t, w, f, nil, WindowOpts{KeepBody: 4096})
	cut := res.Items[0]
	if !cut.BodyCut() || cut.Body != nil || len(cut.BodyText) > 4096 || len(cut.BodyText) < 4090 || cut.Outcome != Succeeded {
		t.Errorf("long answer kept as body %d bytes, body_text %d bytes, cut %v, %s; want body_text of at most 4096 bytes, cut",
			len(cut.Body), len(cut.BodyText), cut.BodyCut(), cut.Outcome)
	}
	if kept := res.Items[1]; kept.BodyCut() || kept.Body == nil {
		t.Errorf("short answer: cut %v, body %s; want it whole", kept.BodyCut(), kept.Body)
	}
}

// orderJournal notes, with the fake's requests, when each write was
// recorded as being sent and when the lease was fenced.
type orderJournal struct {
	NoJournal
	mu     sync.Mutex
	events []string
}

func (j *orderJournal) note(e string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, e)
}

func (j *orderJournal) Record(_ context.Context, t Transition) error {
	if t.Phase == PhaseSending {
		j.note(fmt.Sprintf("record %d", t.Index))
	}
	return nil
}

func (j *orderJournal) Fence(context.Context) error {
	j.note("fence")
	return nil
}

func TestWindowRecordsEveryWriteBeforeSendingIt(t *testing.T) {
	j := &orderJournal{}
	f := newFake()
	sent := answer{hook: func(_ context.Context, req *SubRequest) { j.note("send " + req.Header.Get("Idempotency-Key")) }}
	f.on(http.MethodPost, "/widgets", sent)
	w := jobWindow(policy.OpCreate, 10, element("", `{"name":"a"}`), element("", `{"name":"b"}`))
	runWindow(t, w, f, j, WindowOpts{}, concurrency(1))
	// The records of writes waiting their turn may go ahead of an
	// earlier write (recordsAhead).
	sends := 0
	for k := range 2 {
		record, send := slices.Index(j.events, fmt.Sprintf("record %d", k)), slices.Index(j.events, fmt.Sprintf("send job:%d", 10+k))
		if record < 0 || send < record || !slices.Contains(j.events[record:send], "fence") {
			t.Errorf("events %q: want write %d recorded, then fenced, then sent", j.events, k)
		}
		if send > sends {
			sends = send
		} else {
			t.Errorf("events %q: want the writes sent in the order of the window", j.events)
		}
	}
}

func TestWindowRefusedRecordSendsNothing(t *testing.T) {
	f := newFake()
	w := jobWindow(policy.OpCreate, 0, element("", `{"name":"a"}`))
	res := runWindow(t, w, f, &killingJournal{killAt: 1}, WindowOpts{})
	if len(f.sent()) != 0 || res.Items[0].Outcome != Failed || res.Items[0].Status != http.StatusServiceUnavailable {
		t.Errorf("sent %v, item %+v; want nothing sent and a 503 failure", f.sent(), res.Items[0])
	}
}

func TestWindowStopsStartingItemsOnStop(t *testing.T) {
	stop := make(chan struct{})
	f := newFake()
	first := answer{hook: func(context.Context, *SubRequest) { close(stop) }}
	f.on(http.MethodPost, "/widgets", first, answer{})
	w := jobWindow(policy.OpCreate, 0, element("", `{"name":"a"}`), element("", `{"name":"b"}`), element("", `{"name":"c"}`))
	res := runWindow(t, w, f, nil, WindowOpts{Stop: stop}, concurrency(1))
	if !res.Stopped || res.Items[0].Outcome != Succeeded || res.Items[1].Outcome != NotAttempted || res.Items[2].Outcome != NotAttempted {
		t.Errorf("stopped %v, outcomes %s %s %s; want the write in flight to finish and nothing after it to start",
			res.Stopped, res.Items[0].Outcome, res.Items[1].Outcome, res.Items[2].Outcome)
	}
	if n := len(f.sentWith(http.MethodPost)); n != 1 {
		t.Errorf("sent %d creates, want 1", n)
	}
}

func TestWindowKeepsWhatItsJournalAnswered(t *testing.T) {
	f := newFake()
	done := element("", `{"name":"a"}`)
	done.Phase, done.Outcome, done.Status = PhaseAnswered, Succeeded, http.StatusCreated
	w := jobWindow(policy.OpCreate, 7, done, element("", `{"name":"b"}`))
	res := runWindow(t, w, f, nil, WindowOpts{})
	if res.Items[0].Outcome != Succeeded || res.Items[0].Index != 7 || res.Items[1].Index != 8 {
		t.Errorf("items %+v; want the answered one kept at index 7", res.Items)
	}
	if posts := f.sentWith(http.MethodPost); len(posts) != 1 || posts[0].Header.Get("Idempotency-Key") != "job:8" {
		t.Errorf("sent %v, want only item 8's create", f.sent())
	}
}

// countingJournal counts the transitions it is given.
type countingJournal struct {
	NoJournal
	mu sync.Mutex
	n  int
}

func (j *countingJournal) Record(context.Context, Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.n++
	return nil
}

func TestReadWindowRecordsNothing(t *testing.T) {
	j := &countingJournal{}
	res := runWindow(t, jobWindow(policy.OpGet, 3, element("1", ""), element("2", "")), newFake().seed("1", "2"), j, WindowOpts{})
	if res.Items[0].Outcome != Succeeded || res.Items[1].Index != 4 || j.n != 0 {
		t.Errorf("items %+v, %d records; want both read, nothing recorded: a read needs no write-ahead", res.Items, j.n)
	}
}

func TestWindowStartsNothingAfterACredentialRefusal(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			f := newFake()
			f.on(http.MethodPost, "/widgets", answer{}, reply(status, `{"error":"token expired"}`), answer{})
			w := jobWindow(policy.OpCreate, 20, element("", `{"name":"a"}`), element("", `{"name":"b"}`), element("", `{"name":"c"}`))
			res := runWindow(t, w, f, nil, WindowOpts{}, concurrency(1))
			if !res.Stopped || fmt.Sprint(res.Refused) != "[21]" {
				t.Errorf("stopped %v, refused %v; want stopped, item 21 refused", res.Stopped, res.Refused)
			}
			if res.Items[0].Outcome != Succeeded || res.Items[2].Outcome != NotAttempted {
				t.Errorf("outcomes %s, %s: want the item before the refusal done, the one after it not started", res.Items[0].Outcome, res.Items[2].Outcome)
			}
			if n := len(f.sentWith(http.MethodPost)); n != 2 {
				t.Errorf("sent %d creates, want 2", n)
			}
		})
	}
}

func TestWindowRefusalOtherThanCredentialsGoesOn(t *testing.T) {
	f := newFake()
	f.on(http.MethodPost, "/widgets", reply(http.StatusUnprocessableEntity, `{}`), answer{})
	w := jobWindow(policy.OpCreate, 0, element("", `{"name":"a"}`), element("", `{"name":"b"}`))
	res := runWindow(t, w, f, nil, WindowOpts{}, concurrency(1))
	if res.Stopped || len(res.Refused) != 0 || res.Items[1].Outcome != Succeeded {
		t.Errorf("stopped %v, refused %v, second %s; want a 422 failed alone and the window run whole", res.Stopped, res.Refused, res.Items[1].Outcome)
	}
}

func TestJobHeaderDropsWhatNoSubRequestCarries(t *testing.T) {
	kept, dropped := JobHeader(http.Header{
		"Authorization": {"Bearer fresh"}, "X-Api-Key": {"k1", "k2"}, "Connection": {"close"},
		"Content-Type": {"text/plain"}, "Idempotency-Key": {"k"}, "X-Http-Method-Override": {"DELETE"},
	})
	if got := fmt.Sprint(dropped); got != "[Connection Content-Type Idempotency-Key X-Http-Method-Override]" {
		t.Errorf("dropped %s; want the hop-by-hop, Content-*, batch-only and method override headers", got)
	}
	if len(kept) != 2 || kept.Get("Authorization") != "Bearer fresh" || len(kept.Values("X-Api-Key")) != 2 {
		t.Errorf("kept %v; want Authorization and both X-Api-Key values", kept)
	}
}

// A window's workers are recordsAhead times its concurrency, so that
// the records of the writes waiting their turn go to storage together;
// the writes themselves still go at most concurrency at once, and, one
// at a time, in the order of the job's input.
func TestWindowSendsAtMostItsConcurrencyInOrder(t *testing.T) {
	items := make([]ItemSnapshot, 64)
	for i := range items {
		items[i] = element("", fmt.Sprintf(`{"name":"w%d"}`, i))
	}
	for _, c := range []int{1, 3} {
		f := newFake()
		f.jitter = 2 * time.Millisecond
		res := runWindow(t, jobWindow(policy.OpCreate, 0, items...), f, nil, WindowOpts{}, concurrency(c))
		for _, it := range res.Items {
			if it.Outcome != Succeeded {
				t.Fatalf("concurrency %d: item %d %s, want every item created", c, it.Index, it.Outcome)
			}
		}
		if most := f.maxConcurrent(); most > c || c > 1 && most < 2 {
			t.Errorf("concurrency %d: %d creates in flight at once, want at most %d (and more than one)", c, most, c)
		}
		if c > 1 {
			continue
		}
		for i, sent := range f.sentWith(http.MethodPost) {
			if got, want := sent.Header.Get("Idempotency-Key"), fmt.Sprintf("job:%d", i); got != want {
				t.Fatalf("concurrency 1: create %d sent carried %q, want %q: the items left out of order", i, got, want)
			}
		}
	}
}
