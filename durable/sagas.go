package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A saga that ends with items left behind is kept (docs/durability.md,
// "Kept sagas"), apart from the running journals so that the recovery
// scan never reads it, until an operator retries it to the end or
// resolves it:
//
//	batch/v1/sagas/<saga>/summary   what a listing shows of it
//	batch/v1/sagas/<saga>/saga      the whole saga
//
// and a journal that recovery cannot finish says why beside its
// segments:
//
//	batch/v1/journal/<saga>/stuck
const (
	sagasPrefix = "batch/v1/sagas"
	keptVersion = 1
	summaryName = "summary"
	sagaName    = "saga"
	stuckName   = "stuck"
)

func keptDir(saga string) string     { return path.Join(sagasPrefix, saga) }
func summaryKey(saga string) string  { return path.Join(sagasPrefix, saga, summaryName) }
func keptSagaKey(saga string) string { return path.Join(sagasPrefix, saga, sagaName) }
func stuckKey(saga string) string    { return path.Join(journalPrefix, saga, stuckName) }

// The states of a saga, as an operator sees them.
const (
	// StateRunning: a process holds the saga's lease and is running it.
	StateRunning = "running"
	// StateOrphaned: its owner's lease lapsed, and no process has taken
	// it over yet.
	StateOrphaned = "orphaned"
	// StateStuck: recovery took it over and could not finish it.
	StateStuck = "stuck"
	// StateLeftBehind: it ended with items it could not undo, and is kept.
	StateLeftBehind = "left_behind"
	// StateResolved: a retry undid what was left, or an operator closed it.
	StateResolved = "resolved"
)

// Summary is a saga as a listing shows it.
type Summary struct {
	ID    string `json:"id"`
	State string `json:"state"`
	OriginView
	Op         string     `json:"op"`
	Resource   string     `json:"resource"`
	Items      int        `json:"items"`
	LeftBehind int        `json:"left_behind"`
	Started    time.Time  `json:"started"`
	Ended      *time.Time `json:"ended"`
	// Reason says why the saga was left behind or is stuck; empty
	// otherwise.
	Reason string `json:"reason"`
}

// Kept is a saga kept with items left behind, as stored. Its snapshot's
// headers hold no value but the harmless ones (harmlessHeaders).
type Kept struct {
	Version int    `json:"v"`
	Saga    string `json:"saga"`
	Origin
	Started  time.Time       `json:"started"`
	Ended    time.Time       `json:"ended"`
	Detail   string          `json:"detail"`
	Snapshot *batch.Snapshot `json:"snapshot"`
	// Items are the items as the saga answered them: their answers, and
	// the compensations tried.
	Items      []batch.ItemResult `json:"items"`
	LeftBehind []string           `json:"left_behind"`
	// LostFrom names the saga whose lease the instance that kept this
	// one lost: this is what that instance could not undo of its own
	// (docs/durability.md, "A saga never writes after it lost its
	// lease"); the other saga was finished by whoever took it over.
	LostFrom string `json:"lost_from,omitempty"`
}

// stuck is why recovery could not finish a journal, and the lease it
// was given up under: while that lease is the saga's, nobody runs it.
type stuck struct {
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Lease  Lease     `json:"lease"`
}

// keepOrForget keeps a saga that left items behind before its journal is
// removed; a retry's journal that ended with nothing left removes the
// kept copy instead, before the journal, so that what a crash leaves is
// a journal to finish again, never a kept copy of what was undone.
func (j *Journal) keepOrForget(ctx context.Context, res *batch.Result) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StorageTimeout)
	defer cancel()
	if res.Outcome != batch.RollbackFailed {
		if !j.revived {
			return nil
		}
		return j.js.removeKept(ctx, j.saga)
	}
	st, err := j.js.load(ctx, j.saga)
	if errors.Is(err, errNoIntent) {
		return nil // nothing was stored, so nothing was sent
	}
	if err != nil {
		return err
	}
	j.mu.Lock()
	for _, it := range j.items {
		if it.Index >= 0 && it.Index < len(st.snap.Items) {
			st.snap.Items[it.Index] = it.Item
		}
	}
	j.mu.Unlock()
	return j.js.storeKept(ctx, keptOf(st, res))
}

// keptOf is what is kept of a journal's saga that ended with res.
func keptOf(st *storedSaga, res *batch.Result) *Kept {
	snap := *st.snap
	snap.Header = harmless(snap.Header)
	snap.Items = slices.Clone(snap.Items)
	for i, it := range snap.Items {
		if it.Sent != nil {
			sent := *it.Sent
			sent.Header = harmless(sent.Header)
			snap.Items[i].Sent = &sent
		}
	}
	return &Kept{
		Version: keptVersion, Saga: st.intent.Saga, Origin: st.intent.Origin,
		Started: st.intent.Started, Ended: now(), Detail: res.Detail,
		Snapshot: &snap, Items: res.Items, LeftBehind: res.LeftBehind,
	}
}

// storeKept stores the saga, then its summary: a listing names only a
// saga that is there whole.
func (js *Journals) storeKept(ctx context.Context, k *Kept) error {
	b, err := json.Marshal(k)
	if err != nil {
		return fmt.Errorf("encoding the kept saga: %w", err)
	}
	if err := js.storage.Store(ctx, keptSagaKey(k.Saga), b); err != nil {
		return fmt.Errorf("storing the kept saga: %w", err)
	}
	b, _ = json.Marshal(k.summary())
	if err := js.storage.Store(ctx, summaryKey(k.Saga), b); err != nil {
		return fmt.Errorf("storing the kept saga's summary: %w", err)
	}
	return nil
}

func (k *Kept) summary() Summary {
	ended := k.Ended
	return Summary{
		ID: k.Saga, State: StateLeftBehind, OriginView: k.Origin.view(), Op: k.Snapshot.Op, Resource: k.Resource,
		Items: len(k.Snapshot.Items), LeftBehind: len(k.LeftBehind),
		Started: k.Started, Ended: &ended, Reason: k.Detail,
	}
}

// removeKept removes a kept saga key by key, its summary first so that
// no listing names what is half removed.
func (js *Journals) removeKept(ctx context.Context, saga string) error {
	for _, key := range []string{summaryKey(saga), keptSagaKey(saga)} {
		if err := deleteKey(ctx, js.storage, key); err != nil {
			return fmt.Errorf("removing the kept saga %s: %w", saga, err)
		}
	}
	if err := removeEmptyFolder(ctx, js.storage, keptDir(saga)); err != nil {
		return fmt.Errorf("removing the folder of the kept saga %s: %w", saga, err)
	}
	return nil
}

// loadKept reads a kept saga; ErrUnknownSaga if there is none.
func (js *Journals) loadKept(ctx context.Context, saga string) (*Kept, error) {
	var k Kept
	found, err := loadJSON(ctx, js.storage, keptSagaKey(saga), &k)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, ErrUnknownSaga
	}
	if k.Version != keptVersion || k.Snapshot == nil {
		return nil, fmt.Errorf("%s is in kept-saga format %d, this gateway knows %d", keptSagaKey(saga), k.Version, keptVersion)
	}
	return &k, nil
}

// MarkStuck records why recovery could not finish saga, in its journal's
// folder, for a listing to show: only while the saga's lease is still
// the one this process gave it up under.
func (js *Journals) MarkStuck(ctx context.Context, saga, reason string) {
	ctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	l, err := js.leaseOf(ctx, saga)
	if err != nil || l.Owner != Owner() || owned.has(saga) {
		return
	}
	b, _ := json.Marshal(stuck{Reason: reason, At: now(), Lease: l})
	if err := js.storage.Store(ctx, stuckKey(saga), b); err != nil {
		js.logger.Warn("recording why a saga is stuck", zap.String("saga", saga), zap.Error(err))
	}
}

// stuckOf is why saga is stuck, if it is: a mark whose lease is still
// the saga's.
func (js *Journals) stuckOf(ctx context.Context, saga string, l Lease) (*stuck, error) {
	var s stuck
	if found, err := loadJSON(ctx, js.storage, stuckKey(saga), &s); err != nil || !found {
		return nil, err
	}
	if s.Lease.Owner != l.Owner || !s.Lease.Expires.Equal(l.Expires) {
		if now().Before(l.Expires) {
			return nil, nil // taken over since, and running
		}
	}
	return &s, nil
}

// harmlessHeaders are the only headers whose values a kept saga keeps
// and a view shows: none of them is a credential.
var harmlessHeaders = []string{"Accept", "Accept-Language", "Content-Type", "User-Agent", "Traceparent", "Tracestate", "X-Request-Id"}

func isHarmless(name string) bool {
	name = http.CanonicalHeaderKey(name)
	for _, h := range harmlessHeaders {
		if h == name {
			return true
		}
	}
	return false
}

// harmless is h with every value but the harmless headers' erased; the
// names stay, so that a view says what the batch carried.
func harmless(h http.Header) http.Header {
	out := make(http.Header, len(h))
	for name, vs := range h {
		if isHarmless(name) {
			out[name] = vs
		} else {
			out[name] = []string{}
		}
	}
	return out
}
