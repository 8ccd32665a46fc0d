package durable

import (
	"context"
	"errors"
	"path"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// lossyRenewals is a removerMem whose nth store of a lease key lands in
// storage and still answers an error, as a call whose reply was lost (a
// timeout, a connection reset after the command ran) does.
type lossyRenewals struct {
	*removerMem
	mu    sync.Mutex
	n     int
	lossy int
}

func (s *lossyRenewals) Store(ctx context.Context, key string, value []byte) error {
	err := s.removerMem.Store(ctx, key, value)
	if path.Base(key) == leaseName {
		s.mu.Lock()
		s.n++
		lost := s.n == s.lossy
		s.mu.Unlock()
		if lost && err == nil {
			return errors.New("i/o timeout (the reply was lost; the store ran)")
		}
	}
	return err
}

// One renewal whose reply is lost (it landed, and answered an error) is
// a storage blip, which leaves the lease unproven, never lost. With no
// other instance anywhere, the saga ends succeeded and its journal is
// removed: its removal's guard takes the bytes of that renewal for this
// process's own. It took them for another instance's, left the journal
// unrenewed, and a recovery would have undone a saga its client was
// told succeeded.
func TestRenewalWhoseReplyIsLost(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		s := &lossyRenewals{removerMem: &removerMem{memStorage: newMemStorage()}, lossy: 2}
		js := NewJournals(s, NewLeases(time.Minute), zap.NewNop())
		j := js.New(Origin{})
		var once sync.Once
		up := &upstream{check: func(*batch.SubRequest) {
			// The first write takes 45 s: the lease is renewed at 20 s
			// (stored, answered) and at 40 s (stored, reply lost).
			once.Do(func() { time.Sleep(45 * time.Second) })
		}}
		res := batch.Run(context.Background(), updatePlan(t, widgets(t), 3), batch.Runtime{Send: up, Journal: j})
		if res.Outcome != batch.Succeeded {
			t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
		}
		time.Sleep(2 * time.Minute)
		left := s.memStorage.keysUnder(journalDir(j.Saga()))
		if len(left) != 0 || j.takenOver.Load() {
			t.Errorf("client told %s; journal left %v (lease lost %v, taken over %v) with no other instance: a recovery will undo it", res.Outcome, left, j.lostErr(), j.takenOver.Load())
		}
	})
}
