package durable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// ErrUnknownSaga is the answer for an id no saga in storage has.
var ErrUnknownSaga = errors.New("no saga with that id is in storage: list them with caddy batch sagas")

// SagaQuery selects sagas for a listing: by State (any when empty), at
// most Limit (all when 0), those after the one named After in the
// listing's order (newest first).
type SagaQuery struct {
	State string
	Limit int
	After string
}

// ListSagas lists the sagas in storage, newest first: the running
// journals (each read for its intent, lease and stuck mark) and the kept
// sagas (each read for its summary only, never whole). A kept saga that
// a retry is running shows once, as its journal.
func (js *Journals) ListSagas(ctx context.Context, q SagaQuery) ([]Summary, error) {
	journals, err := js.sagas(ctx)
	if err != nil {
		return nil, err
	}
	out := []Summary{}
	live := map[string]bool{} // the journals that are sagas
	for _, saga := range journals {
		s, err := js.folderSummary(ctx, saga)
		if errors.Is(err, ErrUnknownSaga) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		live[saga] = true
	}
	kept, err := js.keptSagas(ctx)
	if err != nil {
		return nil, err
	}
	for _, saga := range kept {
		if live[saga] {
			continue
		}
		s, err := js.keptSummary(ctx, saga)
		if errors.Is(err, ErrUnknownSaga) {
			continue // being removed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return selectSagas(out, q), nil
}

// selectSagas orders the sagas newest first (then by id, so that a page
// boundary is stable) and picks those q asks for.
func selectSagas(all []Summary, q SagaQuery) []Summary {
	slices.SortFunc(all, func(a, b Summary) int {
		if c := b.Started.Compare(a.Started); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	if q.After != "" {
		if i := slices.IndexFunc(all, func(s Summary) bool { return s.ID == q.After }); i >= 0 {
			all = all[i+1:]
		}
	}
	out := []Summary{}
	for _, s := range all {
		if q.State != "" && s.State != q.State {
			continue
		}
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
		out = append(out, s)
	}
	return out
}

// CountSagas counts the sagas in storage by state, for the metrics: the
// journals are read as a listing reads them, the kept sagas only
// listed, none read.
func (js *Journals) CountSagas(ctx context.Context) (map[string]int, error) {
	counts := map[string]int{StateRunning: 0, StateOrphaned: 0, StateStuck: 0, StateLeftBehind: 0}
	journals, err := js.sagas(ctx)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, saga := range journals {
		if s, err := js.folderSummary(ctx, saga); err == nil {
			counts[s.State]++
			live[saga] = true
		}
	}
	kept, err := js.keptSagas(ctx)
	if err != nil {
		return nil, err
	}
	for _, saga := range kept {
		if !live[saga] {
			counts[StateLeftBehind]++
		}
	}
	return counts, nil
}

// keptSagas names the kept sagas.
func (js *Journals) keptSagas(ctx context.Context) ([]string, error) {
	return listNames(ctx, js.storage, sagasPrefix)
}

func (js *Journals) keptSummary(ctx context.Context, saga string) (Summary, error) {
	var s Summary
	found, err := loadJSON(ctx, js.storage, summaryKey(saga), &s)
	if err == nil && !found {
		err = ErrUnknownSaga
	}
	return s, err
}

// errEnded is a journal folder under an end marker: a saga that ended,
// its journal being removed (or its removal cut short, or a taken-over
// saga's marker left for its old owner, until a scan clears it): no
// saga to list, as a journal without its intent is none.
var errEnded = fmt.Errorf("the saga ended, and its journal is being removed: %w", errNoIntent)

// journalState reads what a listing says of a journal: its intent, and
// its state from its lease and stuck mark. The marker is looked for
// first, whatever else is left: an operator's action refuses a folder
// that holds one (hold), so that no journal is ever written under it,
// where every scan would take it for what is left of a removal.
func (js *Journals) journalState(ctx context.Context, saga string) (*intent, string, *stuck, error) {
	v, err := js.readLease(ctx, saga)
	if err != nil {
		return nil, "", nil, err
	}
	if slices.Contains(v.names, endName) {
		return nil, "", nil, errEnded
	}
	in, err := js.loadIntent(ctx, saga)
	if err != nil {
		return nil, "", nil, err
	}
	l := v.lease(in)
	st, err := js.stuckOf(ctx, saga, l)
	switch {
	case err != nil:
		return nil, "", nil, err
	case owned.has(saga):
		return in, StateRunning, nil, nil
	case st != nil:
		return in, StateStuck, st, nil
	case now().After(l.Expires):
		return in, StateOrphaned, nil, nil
	}
	return in, StateRunning, nil, nil
}

// lostSummary is a journal without its beginning as a listing shows it:
// stuck, with why, once the scan marked it (lostBeginning);
// ErrUnknownSaga before that, and for what is left of a removal.
func (js *Journals) lostSummary(ctx context.Context, saga string) (Summary, error) {
	var mark stuck
	found, err := loadJSON(ctx, js.storage, stuckKey(saga), &mark)
	switch {
	case err != nil:
		return Summary{}, err
	case !found:
		return Summary{}, ErrUnknownSaga
	}
	return Summary{ID: saga, State: StateStuck, Started: mark.At, Reason: mark.Reason}, nil
}

// folderSummary is what a listing shows of a journal folder: its
// journal's summary; a journal whose beginning the storage lost, once it
// is marked stuck; ErrUnknownSaga for one not marked yet, and for what
// is left of a removal under its end marker (the saga ended).
func (js *Journals) folderSummary(ctx context.Context, saga string) (Summary, error) {
	s, err := js.journalSummary(ctx, saga)
	switch {
	case errors.Is(err, errEnded):
		return Summary{}, ErrUnknownSaga
	case errors.Is(err, errNoIntent):
		return js.lostSummary(ctx, saga)
	}
	return s, err
}

func (js *Journals) journalSummary(ctx context.Context, saga string) (Summary, error) {
	in, state, st, err := js.journalState(ctx, saga)
	if err != nil {
		return Summary{}, err
	}
	s := Summary{
		ID: saga, State: state, OriginView: in.Origin.view(), Op: in.Snapshot.Op, Resource: in.Resource,
		Items: len(in.Snapshot.Items), Started: in.Started,
	}
	if st != nil {
		s.Reason = st.Reason
	}
	return s, nil
}

// redacted stands for a value a view does not show.
const redacted = "[redacted]"

// redactQuery is uri with the values of the names parameters redacted.
func redactQuery(uri string, names []string) string {
	p, q, ok := strings.Cut(uri, "?")
	if !ok || len(names) == 0 {
		return uri
	}
	if r := redactRawQuery(q, names); r != q {
		return p + "?" + r
	}
	return uri
}

// redactRawQuery is a raw query with the values of names redacted, the
// rest left as sent.
func redactRawQuery(q string, names []string) string {
	parts := strings.Split(q, "&")
	for i, part := range parts {
		k, _, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(k)
		if err == nil && slices.Contains(names, name) {
			parts[i] = k + "=" + redacted
		}
	}
	return strings.Join(parts, "&")
}
