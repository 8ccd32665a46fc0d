package batch

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// aheadJournal records what a saga records, and which records went ahead
// of their writes.
type aheadJournal struct {
	NoJournal
	mu      sync.Mutex
	ahead   map[int]*SubRequest // the request each record ahead names
	sending map[int]*SubRequest // the request each write's own record names
	early   []int               // items whose own record came before the one ahead
	calls   [][]int             // the items of each RecordAhead
}

func newAheadJournal() *aheadJournal {
	return &aheadJournal{ahead: map[int]*SubRequest{}, sending: map[int]*SubRequest{}}
}

func (j *aheadJournal) RecordAhead(_ context.Context, ts ...Transition) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var call []int
	for _, t := range ts {
		call = append(call, t.Index)
		if _, sent := j.sending[t.Index]; sent {
			j.early = append(j.early, t.Index)
		}
		j.ahead[t.Index] = t.Item.Sent
	}
	if len(call) > 0 {
		j.calls = append(j.calls, call)
	}
}

func (j *aheadJournal) Record(_ context.Context, t Transition) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if t.Phase == PhaseSending {
		j.sending[t.Index] = t.Item.Sent
	}
	return nil
}

// Records go ahead of their writes only where a recovery reads an
// unanswered write's outcome back without sending anything: an update,
// not under idempotent_upstream, of an all-or-nothing batch
// (docs/durability.md, "Records stored ahead"). Each names the very
// request its write then sends, and none comes after the write's own.
func TestRecordsAheadOnlyWhereAReadDecides(t *testing.T) {
	var updates []string
	for i := range 30 {
		updates = append(updates, fmt.Sprintf(`{"id":"%d","name":"n%d"}`, i, i))
	}
	update := "[" + strings.Join(updates, ",") + "]"
	idempotent := settings(func(s *policy.Settings) { s.IdempotentUpstream = true })
	for _, tc := range []struct {
		name, method, target, body string
		mods                       []specMod
		ahead                      bool
	}{
		{"update", "PATCH", "/widgets", update, nil, true},
		{"update, idempotent_upstream", "PATCH", "/widgets", update, []specMod{idempotent}, false},
		{"update, partial", "PATCH", "/widgets", update, []specMod{partial}, false},
		{"create", "POST", "/widgets", elements(30), nil, false},
		{"delete", "DELETE", "/widgets?ids=" + ids(30, 0), "", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			for i := range 30 {
				f.seed(fmt.Sprint(i))
			}
			j := newAheadJournal()
			p := mustPlan(t, newRequest(tc.method, tc.target, tc.body), append(tc.mods, concurrency(4))...)
			res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
			if res.Outcome != Succeeded {
				t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
			}
			if !tc.ahead {
				if len(j.ahead) > 0 {
					t.Errorf("%d records went ahead of their writes", len(j.ahead))
				}
				return
			}
			// A worker may take an item before the worker four waves
			// back recorded it ahead (a goroutine not scheduled): that
			// write stores its own record, as it would have.
			if len(j.ahead) < 15 || len(j.early) > 0 {
				t.Errorf("%d of 30 records went ahead; %v came after their write's own", len(j.ahead), j.early)
			}
			for i, req := range j.ahead {
				if j.sending[i] != req {
					t.Errorf("item %d: the record ahead names another request than the one sent", i)
				}
			}
		})
	}
}

// TestRecordsAheadGoAWaveAtATime: records go ahead a wave (concurrency
// writes) at a time, a store each, not one write at a time: the first
// four waves each once the preflight read all of its pre-images, and
// each later wave as the first write four waves before it starts.
func TestRecordsAheadGoAWaveAtATime(t *testing.T) {
	f := newFake()
	var updates []string
	for i := range 100 {
		f.seed(fmt.Sprint(i))
		updates = append(updates, fmt.Sprintf(`{"id":"%d","name":"n%d"}`, i, i))
	}
	j := newAheadJournal()
	p := mustPlan(t, newRequest("PATCH", "/widgets", "["+strings.Join(updates, ",")+"]"), concurrency(8))
	res := newBatchRun(p, Runtime{Send: f, Journal: j}, noBackoff).do(context.Background())
	if res.Outcome != Succeeded {
		t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
	}
	// A write whose worker took it before the worker four waves back
	// recorded its wave ahead (a goroutine not scheduled) stores its own
	// record, as it would have: its wave goes ahead without it.
	waves := map[int]bool{}
	for _, call := range j.calls {
		w := call[0] / 8
		slices.Sort(call)
		if call[len(call)-1]/8 != w || waves[w] {
			t.Errorf("a record ahead of %v: want one wave's writes, once", call)
		}
		waves[w] = true
	}
	if len(waves) < 10 || len(j.early) > 0 {
		t.Errorf("%d of 13 waves went ahead; %v came after their write's own", len(waves), j.early)
	}
}
