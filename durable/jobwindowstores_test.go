package durable

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/slots"
)

// serialLogStorage is a storage whose every store of a window's log
// takes delay, one at a time, as the file system's synced files do; it
// counts those stores and the records of writes about to be sent they
// hold.
type serialLogStorage struct {
	*memStorage
	delay time.Duration

	mu              chanMutex
	logStores, sent int
}

func (s *serialLogStorage) SerialStores() {}

func (s *serialLogStorage) Store(ctx context.Context, key string, value []byte) error {
	if !strings.Contains(key, "/"+logName+"/") {
		return s.memStorage.Store(ctx, key, value)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	time.Sleep(s.delay)
	var seg logSegment
	if err := json.Unmarshal(value, &seg); err != nil {
		return err
	}
	s.logStores++
	for _, r := range seg.Records {
		if r.Item.Phase == batch.PhaseSending {
			s.sent++
		}
	}
	return s.memStorage.Store(ctx, key, value)
}

// A job holds few slots (at most half of max_in_flight), and on the file
// system each store of its log is a synced file, one at a time: the
// records of the writes waiting their turn go to storage together. A
// write that held its slot through its record's store left each store a
// record or two, and the job ran at the pace of the disk's syncs.
func TestJobWindowRecordsGoToStorageTogether(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := &serialLogStorage{memStorage: newMemStorage(), delay: 5 * time.Millisecond}
		js := NewJobs(s, NewLeases(time.Minute), zap.NewNop())
		const n = 512
		hj, token := startWidgets(t, js, n, false)
		up := newWidgetsUpstream(false)
		up.onCreate = func(int) { time.Sleep(time.Millisecond) }
		pol := widgetsPolicy(t, nil)
		fifo := slots.NewFIFO(4) // of which a job holds 2
		var inFlight, most int
		var mu sync.Mutex
		counted := senderFunc(func(ctx context.Context, req *batch.SubRequest) (*batch.SubResponse, error) {
			mu.Lock()
			inFlight++
			most = max(most, inFlight)
			mu.Unlock()
			defer func() {
				mu.Lock()
				inFlight--
				mu.Unlock()
			}()
			return up.Send(ctx, req)
		})
		through := func(_ context.Context, _ *JobRecord, _ http.Header, work func(batch.Site) error) error {
			return work(batch.Site{Runtime: batch.Runtime{Send: counted, Slots: fifo, Background: true}, Lookup: pol.Lookup})
		}
		began := time.Now()
		if err := hj.Run(context.Background(), through, nil); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		st := mustStatus(t, js, hj.Record().ID, token)
		if st.State != JobSucceeded || st.Succeeded != n {
			t.Fatalf("status %s, %d succeeded; want succeeded, %d", st.State, st.Succeeded, n)
		}
		up.checkMadeOnce(t, n)
		if most > 2 {
			t.Errorf("%d requests in flight at once, want at most the job's 2 slots", most)
		}
		if s.sent != n || s.logStores == 0 || s.sent/s.logStores < 8 {
			t.Errorf("%d records of writes about to be sent in %d stores of the log, want all %d, at least 8 a store", s.sent, s.logStores, n)
		}
		// Two slots, a millisecond a create: the job goes at the
		// upstream's pace, not at the storage's (5ms a store).
		if limit := n * time.Millisecond; took > limit {
			t.Errorf("the job took %v, want at most %v: its writes waited for the storage", took, limit)
		}
	})
}
