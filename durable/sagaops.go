package durable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// ErrSagaRunning is the answer to a retry or resolve of a saga that a
// process runs: a batch, a recovery, or another retry.
var ErrSagaRunning = errors.New("the saga is running (a batch, a recovery or another retry holds it): wait for it to end, then list the sagas again")

// Revival is a saga an operator retries, claimed by this process under
// a lease of its own: a kept saga turned back into a journal, or a
// journal that recovery left stuck or that nobody took over yet.
type Revival struct {
	*Recovered
	// Prev are the items as the kept saga answered them, to undo again
	// what was left (batch.Retry); nil for a journal, which is finished
	// as recovery finishes one (batch.Resume).
	Prev []batch.ItemResult
}

// Revive claims saga for a retry now, adding header to what its requests
// carry (the operator's credentials: a kept saga keeps none). A kept
// saga becomes a journal again, under the same id, so that a process
// that dies in the middle of the retry leaves a journal for recovery,
// and a second retry, on any instance, finds it running. ErrUnknownSaga
// if there is no such saga, ErrSagaRunning if a process runs it.
func (js *Journals) Revive(ctx context.Context, saga string, header http.Header) (*Revival, error) {
	unlock, err := js.hold(ctx, saga)
	if unlock == nil {
		return nil, err
	}
	defer unlock()
	if err == nil {
		return js.reviveJournal(ctx, saga, header)
	}
	k, err := js.loadKept(ctx, saga)
	if err != nil {
		return nil, err
	}
	return js.revive(ctx, k, header)
}

// reviveJournal claims a journal that no process runs (stuck or
// orphaned) for a retry now.
func (js *Journals) reviveJournal(ctx context.Context, saga string, header http.Header) (*Revival, error) {
	v, err := js.readLease(ctx, saga)
	if err != nil {
		return nil, err
	}
	r, _, err := js.claim(ctx, saga, v)
	if errors.Is(err, errOwned) || errors.Is(err, errSteppedBack) {
		return nil, ErrSagaRunning
	}
	if err != nil {
		return nil, err
	}
	r.Snapshot.Header = withHeaders(r.Snapshot.Header, header)
	return &Revival{Recovered: r}, nil
}

// revive stores a kept saga's journal again, as a batch's first segment
// is stored, and holds its lease.
func (js *Journals) revive(ctx context.Context, k *Kept, header http.Header) (*Revival, error) {
	snap := *k.Snapshot
	snap.Header = withHeaders(k.Snapshot.Header, header)
	snap.Items = slices.Clone(snap.Items)
	for i, it := range snap.Items {
		if it.Sent != nil {
			sent := *it.Sent
			sent.Header = withHeaders(sent.Header, header)
			snap.Items[i].Sent = &sent
		}
	}
	start := now()
	in := &intent{Saga: k.Saga, Owner: Owner(), Expires: start.Add(js.leases.Length), Started: k.Started, Origin: k.Origin, Snapshot: &snap, Revived: true}
	b, err := json.Marshal(segment{Version: journalVersion, Intent: in})
	if err != nil {
		return nil, fmt.Errorf("encoding the retry's journal: %w", err)
	}
	if !owned.add(k.Saga) {
		return nil, ErrSagaRunning
	}
	sctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	if err := js.storage.Store(sctx, segmentKey(k.Saga, 0), b); err != nil {
		owned.done()
		owned.forget(k.Saga)
		return nil, fmt.Errorf("storing the retry's journal: %w", err)
	}
	j := newJournalOf(&Journal{js: js, saga: k.Saga, seq: 1, stored: true, landed: true, revived: true, origin: k.Origin, began: k.Started})
	j.lease.prove(start)
	j.startRenewal()
	r := &Recovered{Saga: k.Saga, Origin: k.Origin, Started: k.Started, Snapshot: &snap, Journal: j}
	return &Revival{Recovered: r, Prev: k.Items}, nil
}

// GiveUp lets go of a revival that could not run (no handler serves the
// saga under the current config): a kept saga's journal is removed again,
// so that it is as it was; a journal is given back to recovery, and told
// stuck with why.
func (rv *Revival) GiveUp(ctx context.Context, why string) {
	if rv.Prev == nil {
		rv.abandon()
		rv.Journal.js.MarkStuck(ctx, rv.Saga, why)
		return
	}
	rv.Journal.stopRenewal()
	defer owned.done()
	defer owned.forget(rv.Saga)
	if err := rv.Journal.js.dropJournal(ctx, rv.Saga); err != nil {
		rv.Journal.js.logger.Warn("removing the journal of a retry that could not run; recovery will finish it",
			zap.String("saga", rv.Saga), zap.Error(err))
	}
}

// Resolve removes a saga that an operator repaired by hand, and returns
// it as it was, for the audit line: a kept saga, or a journal that is
// stuck or orphaned. ErrUnknownSaga if there is no such saga,
// ErrSagaRunning if a process runs it.
func (js *Journals) Resolve(ctx context.Context, saga string) (*SagaView, error) {
	unlock, err := js.hold(ctx, saga)
	if unlock == nil {
		return nil, err
	}
	defer unlock()
	if err == nil {
		v, err := js.Saga(ctx, saga)
		if err != nil {
			return nil, err
		}
		return v, js.dropJournal(ctx, saga)
	}
	k, err := js.loadKept(ctx, saga)
	if errors.Is(err, ErrUnknownSaga) {
		// A journal whose beginning the storage lost, marked stuck.
		if v, verr := js.Saga(ctx, saga); verr == nil && v.State == StateStuck {
			return v, js.dropJournal(ctx, saga)
		}
	}
	if err != nil {
		return nil, err
	}
	return k.view(), js.removeKept(ctx, saga)
}

// hold takes the storage lock under which saga is claimed, for an
// operator's action on it, and tells whether it is a journal that no
// process runs (nil), no journal (errNoIntent), or something the action
// must not touch: then unlock is nil, and the error ErrSagaRunning
// where a process runs it.
func (js *Journals) hold(ctx context.Context, saga string) (unlock func(), err error) {
	unlock, ok := js.lock(ctx, saga, nil)
	if !ok {
		return nil, ErrSagaRunning
	}
	_, state, _, err := js.journalState(ctx, saga)
	switch {
	case err == nil && state == StateRunning, errors.Is(err, errEnded):
		// A journal under its end marker ended: it is being removed,
		// its removal was cut short, or a taken-over saga's marker waits
		// for its old owner, until a scan clears it. A retry would write
		// the saga's journal again under it.
		err = ErrSagaRunning
	case err == nil || errors.Is(err, errNoIntent):
		return unlock, err
	}
	unlock()
	return nil, err
}

// dropJournal removes a journal that no process runs, key by key
// (removeKeys).
func (js *Journals) dropJournal(ctx context.Context, saga string) error {
	ctx, cancel := context.WithTimeout(ctx, StorageTimeout)
	defer cancel()
	if err := js.markEnd(ctx, saga); err != nil {
		return fmt.Errorf("removing the journal of saga %s: %w", saga, err)
	}
	if err := js.removeKeys(ctx, saga, true, mayBeUnlisted(saga)); err != nil {
		return fmt.Errorf("removing the journal of saga %s: %w", saga, err)
	}
	return js.deleteEnd(ctx, saga)
}

// withHeaders is h without the values a kept saga erased, with extra's
// set over it.
func withHeaders(h, extra http.Header) http.Header {
	out := make(http.Header, len(h)+len(extra))
	for name, vs := range h {
		if len(vs) > 0 {
			out[name] = vs
		}
	}
	for name, vs := range extra {
		out[http.CanonicalHeaderKey(name)] = vs
	}
	return out
}
