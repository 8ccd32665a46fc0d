package durable

import (
	"context"
	"encoding/json"
	"net/http"
	"path"
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
		// Each store waits what a store takes (here 2 ms, maxGather) for
		// the records of more writers: 13 or so a store, where one that
		// went at once took 10, and one that held a slot 1 or 2.
		if s.sent != n || s.logStores == 0 || s.sent/s.logStores < 12 {
			t.Errorf("%d records of writes about to be sent in %d stores of the log, want all %d, at least 12 a store", s.sent, s.logStores, n)
		}
		// Two slots, a millisecond a create: the job goes at the
		// upstream's pace, not at the storage's (5ms a store).
		if limit := n * time.Millisecond; took > limit {
			t.Errorf("the job took %v, want at most %v: its writes waited for the storage", took, limit)
		}
	})
}

// slowLogDeletes is a storage whose deletes of a window's log take
// delay each, and which notes when the first of them ended.
type slowLogDeletes struct {
	*memStorage
	delay time.Duration

	mu          sync.Mutex
	firstDelete time.Time
}

func (s *slowLogDeletes) Delete(ctx context.Context, key string) error {
	if strings.Contains(key, "/"+logName+"/") {
		time.Sleep(s.delay)
		s.mu.Lock()
		if s.firstDelete.IsZero() {
			s.firstDelete = time.Now()
		}
		s.mu.Unlock()
	}
	return s.memStorage.Delete(ctx, key)
}

// A finished window's log is deleted key by key, which on the file
// system took a tenth of a job's time while the next window waited for
// it: the next window runs meanwhile, and the job's end waits for the
// deletion, so that nothing is left.
func TestJobNextWindowDoesNotWaitForTheLogsDeletion(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		defer endHeld(t)
		s := &slowLogDeletes{memStorage: newMemStorage(), delay: time.Minute}
		js := NewJobs(s, NewLeases(10*time.Minute), zap.NewNop())
		const n = jobWindowItems + 10
		hj, token := startWidgets(t, js, n, false)
		up := newWidgetsUpstream(false)
		var secondWindow time.Time
		up.onCreate = func(c int) {
			if c == jobWindowItems+1 {
				secondWindow = time.Now()
			}
		}
		through := func(_ context.Context, _ *JobRecord, _ http.Header, work func(batch.Site) error) error {
			return work(batch.Site{Runtime: batch.Runtime{Send: up, Background: true}, Lookup: widgetsPolicy(t, nil).Lookup})
		}
		if err := hj.Run(context.Background(), through, nil); err != nil {
			t.Fatal(err)
		}
		if st := mustStatus(t, js, hj.Record().ID, token); st.State != JobSucceeded || st.Succeeded != n {
			t.Fatalf("status %s, %d succeeded; want succeeded, %d", st.State, st.Succeeded, n)
		}
		up.checkMadeOnce(t, n)
		if secondWindow.IsZero() || !secondWindow.Before(s.firstDelete) {
			t.Errorf("the second window's first create at %v, the first log key deleted at %v: the window waited for the deletion", secondWindow, s.firstDelete)
		}
		if keys := s.keysUnder(path.Join(jobDir(hj.Record().ID), logName)); len(keys) > 0 {
			t.Errorf("the job ended with %d log keys left: %v", len(keys), keys)
		}
	})
}
