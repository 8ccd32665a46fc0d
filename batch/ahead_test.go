package batch

import (
	"context"
	"fmt"
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
}

func newAheadJournal() *aheadJournal {
	return &aheadJournal{ahead: map[int]*SubRequest{}, sending: map[int]*SubRequest{}}
}

func (j *aheadJournal) RecordAhead(_ context.Context, ts ...Transition) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, t := range ts {
		if _, sent := j.sending[t.Index]; sent {
			j.early = append(j.early, t.Index)
		}
		j.ahead[t.Index] = t.Item.Sent
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
