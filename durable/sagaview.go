package durable

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-batch/caddy-batch/batch"
)

// SagaView is a saga whole, as an operator reads it: every item with its
// request as sent, pre-image, answer, undo and what its proof read, and
// why it was left. Header values are shown only for the harmless
// headers, every other header by name with its value "[redacted]", and
// the values of the scope_query parameters redacted wherever a URI is
// shown.
type SagaView struct {
	ID    string `json:"id"`
	State string `json:"state"`
	OriginView
	ClientAddress string            `json:"client_address"`
	Op            string            `json:"op"`
	Resource      string            `json:"resource"`
	Path          string            `json:"path"`
	Headers       map[string]string `json:"headers"`
	Started       time.Time         `json:"started"`
	Ended         *time.Time        `json:"ended"`
	Reason        string            `json:"reason"`
	// LeftBehind names each item left behind, and why.
	LeftBehind []string   `json:"left_behind"`
	Items      []ItemView `json:"items"`
	// LostFrom names the saga whose lease the instance that kept this
	// one lost (Kept.LostFrom); empty for every other saga.
	LostFrom string `json:"lost_from,omitempty"`
}

// OriginView is where a saga came from, as a listing (Summary) and a
// view (SagaView) show it.
type OriginView struct {
	Server string `json:"server"`
	Host   string `json:"host"`
	Method string `json:"method"`
	// URI is the client's, the values of its scope_query parameters
	// redacted.
	URI string `json:"uri"`
}

func (o Origin) view() OriginView {
	return OriginView{Server: o.Server, Host: o.Host, Method: o.Method, URI: redactQuery(o.URI, o.ScopeQuery)}
}

// ItemView is one item of a SagaView.
type ItemView struct {
	Index int `json:"index"`
	// Op, Method and URL name an envelope's operation.
	Op       string          `json:"op,omitempty"`
	Method   string          `json:"method,omitempty"`
	URL      string          `json:"url,omitempty"`
	ID       string          `json:"id,omitempty"`
	Outcome  batch.Outcome   `json:"outcome"`
	Status   int             `json:"status,omitempty"`
	Error    string          `json:"error,omitempty"`
	Request  *RequestView    `json:"request,omitempty"`
	Preimage json.RawMessage `json:"preimage,omitempty"`
	PreETag  string          `json:"pre_etag,omitempty"`
	// Answer is the upstream's answer to the item's write.
	Answer       json.RawMessage     `json:"answer,omitempty"`
	Undo         *RequestView        `json:"undo,omitempty"`
	Compensation *batch.Compensation `json:"compensation,omitempty"`
	// Reason is why the item was left behind.
	Reason string `json:"reason,omitempty"`
}

// RequestView is a request a saga sent, or would send.
type RequestView struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
}

// Saga reads one saga whole: its journal if it has one, else its kept
// copy; ErrUnknownSaga if neither.
func (js *Journals) Saga(ctx context.Context, saga string) (*SagaView, error) {
	_, state, mark, err := js.journalState(ctx, saga)
	if err == nil {
		st, err := js.load(ctx, saga)
		if err != nil {
			return nil, err
		}
		v := viewOf(st.intent.Origin, st.snap, nil)
		v.ID, v.State, v.Started = saga, state, st.intent.Started
		if mark != nil {
			v.Reason = mark.Reason
		}
		return v, nil
	}
	if !errors.Is(err, errNoIntent) {
		return nil, err
	}
	ended := errors.Is(err, errEnded)
	k, err := js.loadKept(ctx, saga)
	if errors.Is(err, ErrUnknownSaga) && !ended {
		if s, lerr := js.lostSummary(ctx, saga); lerr == nil {
			return &SagaView{ID: saga, State: StateStuck, Started: s.Started, Reason: s.Reason, LeftBehind: []string{}, Items: []ItemView{}}, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return k.view(), nil
}

func (k *Kept) view() *SagaView {
	v := viewOf(k.Origin, k.Snapshot, k.Items)
	ended := k.Ended
	v.ID, v.State, v.Started, v.Ended, v.Reason = k.Saga, StateLeftBehind, k.Started, &ended, k.Detail
	v.LeftBehind, v.LostFrom = k.LeftBehind, k.LostFrom
	return v
}

// viewOf shows a saga's origin and items; results are the items as the
// saga answered them, where it kept them.
func viewOf(o Origin, snap *batch.Snapshot, results []batch.ItemResult) *SagaView {
	v := &SagaView{
		OriginView: o.view(), ClientAddress: o.RemoteAddr, Op: snap.Op, Resource: o.Resource, Path: snap.Path,
		Headers: shownHeaders(snap.Header), LeftBehind: []string{}, Items: make([]ItemView, len(snap.Items)),
	}
	for i, it := range snap.Items {
		iv := ItemView{
			Index: i, Op: it.OperationID, Method: it.Method, URL: redactQuery(it.URL, o.ScopeQuery),
			ID: it.ID, Outcome: it.Outcome, Status: it.Status, Error: it.Error,
			Preimage: it.Preimage, PreETag: it.PreETag, Reason: it.NoUndo,
		}
		if it.Sent != nil {
			iv.Request = requestView(it.Sent.Method, it.Sent.Path, it.Sent.RawQuery, it.Sent.Header, it.Sent.Body, o.ScopeQuery)
		}
		if u := it.Undo; u != nil {
			iv.Undo = requestView(u.Method, u.Path, "", nil, u.Body, o.ScopeQuery)
		}
		if i < len(results) {
			r := results[i]
			iv.Outcome, iv.Status, iv.Error, iv.Answer, iv.Compensation = r.Outcome, r.Status, r.Error, r.Body, r.Compensation
			if c := r.Compensation; c != nil && c.Error != "" {
				iv.Reason = c.Error
			}
		}
		if iv.Outcome != batch.RollbackFailed && iv.Outcome != batch.Unknown {
			iv.Reason = ""
		}
		v.Items[i] = iv
	}
	return v
}

func requestView(method, path, query string, h http.Header, body []byte, scope []string) *RequestView {
	u := path
	if query != "" {
		u += "?" + redactRawQuery(query, scope)
	}
	r := &RequestView{Method: method, URL: u}
	if len(h) > 0 {
		r.Headers = shownHeaders(h)
	}
	switch {
	case len(body) == 0:
	case json.Valid(body):
		r.Body = body
	default:
		r.Body, _ = json.Marshal(string(body))
	}
	return r
}

// shownHeaders is h as a view shows it: the harmless headers' values,
// every other header's name with "[redacted]".
func shownHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for name, vs := range h {
		if isHarmless(name) {
			out[name] = strings.Join(vs, ", ")
		} else {
			out[name] = redacted
		}
	}
	return out
}

// ItemIDs are the ids of a view's items that were left behind, for an
// audit line; every item's index where it has no id.
func (v *SagaView) ItemIDs() []string {
	var ids []string
	for _, it := range v.Items {
		if it.Outcome != batch.RollbackFailed && it.Outcome != batch.Unknown {
			continue
		}
		id := it.ID
		if id == "" {
			id = "#" + strconv.Itoa(it.Index)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}
