package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// Outcome is what became of one item, or of a whole batch.
type Outcome string

// Item outcomes; a batch's outcome is Succeeded, Partial, Failed,
// RolledBack or RollbackFailed.
const (
	Succeeded      Outcome = "succeeded"
	Failed         Outcome = "failed"
	NotAttempted   Outcome = "not_attempted"
	RolledBack     Outcome = "rolled_back"
	RollbackFailed Outcome = "rollback_failed"
	// Unknown is a write that was sent and that no answer said what it
	// did (none came, or a 302, 303, 502 or 504): it may have been
	// applied.
	Unknown Outcome = "unknown"
	// Partial is a partial-mode batch in which some items succeeded and
	// some did not.
	Partial Outcome = "partial"
)

// ItemResult is one item of a batch response, as the client reads it.
type ItemResult struct {
	Index int `json:"index"`
	// OperationID, Method and URL name an envelope's operation: the id
	// the client gave it (answered as "op"), its method and its url as
	// sent, references filled.
	OperationID string  `json:"op,omitempty"`
	Method      string  `json:"method,omitempty"`
	URL         string  `json:"url,omitempty"`
	ID          string  `json:"id,omitempty"`
	Status      int     `json:"status,omitempty"`
	Outcome     Outcome `json:"outcome"`
	// Body is the upstream's JSON body; BodyText any other body, cut at
	// bodyTextLimit bytes.
	Body     json.RawMessage   `json:"body,omitempty"`
	BodyText string            `json:"body_text,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	// Error says what went wrong where the upstream's answer does not: no
	// answer, a timeout, a pre-image that could not be read.
	Error        string        `json:"error,omitempty"`
	Compensation *Compensation `json:"compensation,omitempty"`

	cause error // why there was no answer, for the log only
	// challenge is the header the item's status requires (RFC 9110):
	// WWW-Authenticate for 401, Proxy-Authenticate for 407, Allow for
	// 405. It is not one of the kept headers, since a client learns it
	// only when the batch answers with that status; see Result.Write.
	challenge http.Header
	// cut marks a body a job's window cut to its KeepBody (BodyCut).
	cut bool
}

// BodyCut reports whether the item's body was cut: a job's window keeps
// at most WindowOpts.KeepBody bytes of it, as body_text.
func (it *ItemResult) BodyCut() bool { return it.cut }

// Compensation is the request that undid an item, or tried to.
type Compensation struct {
	Method   string `json:"method"`
	Path     string `json:"path"`
	Status   int    `json:"status,omitempty"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error,omitempty"`
	// Found is what a read of the item showed when it could not be proved
	// to be as the batch left it, so the undo was not sent; and what the
	// read that resolved an unknown write found, whatever came of it.
	Found json.RawMessage `json:"found,omitempty"`
	// CreatedID is the id a POST restore re-created the item under when
	// the upstream gave it another than its own: something now exists
	// there, so the restore is never sent again (a retry would make a
	// duplicate).
	CreatedID string `json:"created_id,omitempty"`

	cause error // why the last attempt got no answer, for the log only
}

// bodyTextLimit cuts a non-JSON body (an HTML error page, say): enough to
// read the message, not enough to bloat a batch of a hundred.
const bodyTextLimit = 4 << 10

// keptHeaders are the item response headers a client may need: where a
// created item lives, its validators, and when to retry.
var keptHeaders = headerNames("Location", "ETag", "Last-Modified", "Retry-After")

// Result is a finished batch.
type Result struct {
	Op        policy.Op
	Atomicity policy.Atomicity
	Outcome   Outcome
	Status    int
	Items     []ItemResult
	// Succeeded counts items whose outcome is succeeded; Failed, items
	// whose own request failed or went unanswered.
	Succeeded, Failed int
	// Compensations counts the compensating requests sent, retries
	// included.
	Compensations int
	// LeftBehind names the items a rollback_failed batch could not undo,
	// each with the reason.
	LeftBehind []string
	// Preimages are those of the items left behind that the batch had
	// read before writing them, for an operator to repair them by hand.
	Preimages []Preimage
	// Errors are the underlying errors of the sub-requests that got no
	// answer, for the log: the client is told only what they mean, since
	// they can name internal addresses.
	Errors []string
	// Detail explains a failed batch in one sentence.
	Detail string
	// ListRequests counts the LISTs the batch read its items through
	// (list_filter), ListFallbacks the ids it then read one by one, and
	// ListFailures the LISTs it could not use.
	ListRequests, ListFallbacks int
	ListFailures                []ListFailure
	// Warning is what the operator should change in the configuration,
	// found while the batch ran (a resource declared without the trailing
	// slash its legacy API redirects to, say); empty when nothing was.
	Warning           string
	PreferenceApplied string
	RetryAfter        string
	// LeaseLost marks a saga that lost its lease (docs/durability.md, "A saga never writes after it lost its lease"):
	// whoever ends the saga settles its Idempotency-Key, not this
	// answer. Saga names it, in the answer, and Kept the saga of its own
	// it kept what it left behind under, if any.
	LeaseLost bool
	Saga      string
	Kept      string
	// Orphaned marks, with LeaseLost, a saga nobody else will end (its
	// journal gone, no other instance's lease shown): this answer is its
	// end, and settles its Idempotency-Key.
	Orphaned bool
}

// Preimage is an item as it was before the batch.
type Preimage struct {
	Item string          `json:"item"`
	Body json.RawMessage `json:"preimage"`
}

// Write answers the client: the answer as JSON, or, for a failed
// all-or-nothing batch, as RFC 9457 problem details with the answer's
// members added. The answer is written from the items' own bodies (see
// writeAnswer), never gathered into one buffer: a batch holds each
// body once.
func (r *Result) Write(w http.ResponseWriter) error {
	h := w.Header()
	if r.PreferenceApplied != "" {
		h.Set("Preference-Applied", r.PreferenceApplied)
	}
	if r.RetryAfter != "" {
		h.Set("Retry-After", r.RetryAfter)
	}
	// A 401 without WWW-Authenticate (or a 405 without Allow) leaves the
	// client nothing to act on; the item that gave the batch its status
	// has what it needs.
	for _, it := range r.Items {
		if it.Status == r.Status && it.challenge != nil {
			for name, values := range it.challenge {
				h[name] = values
			}
			break
		}
	}
	contentType, head := "application/json", any(r.answerHead())
	if r.Atomicity != policy.Partial && r.Outcome != Succeeded {
		kind := "batch-failed"
		switch r.Outcome {
		case RolledBack:
			kind = "batch-rolled-back"
		case RollbackFailed:
			kind = "rollback-failed"
		}
		contentType = problem.ContentType
		head = struct {
			problem.Details
			answerHead
		}{problem.New(r.Status, kind, r.Detail), r.answerHead()}
	}
	// Content-Length, not chunked: the answer is encoded twice, once only
	// to count it, where a body costs its length and the other members a
	// small marshal each. A client (or a proxy before it) then knows the
	// answer's size before it comes, as with every other answer of the
	// gateway, and an encoding error is found before the status is sent,
	// when it can still become a 500.
	var size byteCounter
	if err := writeAnswer(&size, head, r.Items); err != nil {
		return err
	}
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.FormatInt(int64(size), 10))
	h.Set("X-Content-Type-Options", "nosniff") // as problem.Details.Write: see there
	w.WriteHeader(r.Status)
	bw := answerWriters.Get().(*bufio.Writer)
	bw.Reset(w)
	defer func() {
		bw.Reset(nil) // not to keep the client's writer alive in the pool
		answerWriters.Put(bw)
	}()
	if err := writeAnswer(bw, head, r.Items); err != nil {
		return err
	}
	return bw.Flush()
}

func (r *Result) answerHead() answerHead {
	return answerHead{Atomicity: r.Atomicity.String(), Outcome: r.Outcome, Succeeded: r.Succeeded, Failed: r.Failed, Saga: r.Saga}
}

// itemAnswer is what an item shows of an upstream answer. It is worked
// out before the saga's lock is taken (answerOf), so that checking a
// large body holds up none of the batch's other items.
type itemAnswer struct {
	status    int
	body      json.RawMessage // set only when valid JSON and valid UTF-8
	bodyText  string
	challenge http.Header
	headers   map[string]string
}

func answerOf(resp *SubResponse) itemAnswer {
	a := itemAnswer{status: resp.Status}
	switch {
	case len(resp.Body) == 0:
	// json.Valid lets invalid UTF-8 through inside strings, and a raw
	// body is copied into the answer as it is: the answer would not be
	// JSON any more.
	case jsonvalue.Valid(resp.Body):
		// The answer carries the body byte for byte (writeAnswer); the
		// whitespace around it, insignificant in JSON, need not go too.
		a.body = bytes.TrimSpace(resp.Body)
	default:
		a.bodyText = cutText(resp.Body, bodyTextLimit)
		if len(a.bodyText) > bodyTextLimit {
			// Each run of invalid bytes became a 3-byte U+FFFD.
			a.bodyText = cutText([]byte(a.bodyText), bodyTextLimit)
		}
	}
	var challenge string
	switch resp.Status {
	case http.StatusUnauthorized:
		challenge = "Www-Authenticate"
	case http.StatusProxyAuthRequired:
		challenge = "Proxy-Authenticate"
	case http.StatusMethodNotAllowed:
		challenge = "Allow"
	}
	// Header keys are canonical here (Go's client and Caddy's recorder
	// both make them so): indexing the map spares the canonicalization
	// that Header.Get does for every item.
	if v := resp.Header[challenge]; challenge != "" && len(v) > 0 {
		a.challenge = http.Header{challenge: slices.Clone(v)}
	}
	for _, h := range keptHeaders {
		if v := resp.Header[h.key]; len(v) > 0 && v[0] != "" {
			if a.headers == nil {
				a.headers = map[string]string{}
			}
			a.headers[h.name] = v[0]
		}
	}
	return a
}

// setAnswer records an upstream's answer on the item.
func (it *ItemResult) setAnswer(a itemAnswer) {
	it.Status, it.Body, it.BodyText, it.challenge, it.Headers = a.status, a.body, a.bodyText, a.challenge, a.headers
}

// setResponse records resp on the item, where the time its body takes to
// check does not matter (an answer that fails the batch).
func (it *ItemResult) setResponse(resp *SubResponse) { it.setAnswer(answerOf(resp)) }

// clearResponse forgets an answer that no longer describes the item.
func (it *ItemResult) clearResponse() {
	it.Status, it.Body, it.BodyText, it.Headers, it.Error, it.cause, it.cut = 0, nil, "", nil, "", nil, false
}

// cutText returns at most limit bytes of b as valid UTF-8, cut on a rune
// boundary.
func cutText(b []byte, limit int) string {
	if len(b) > limit {
		b = b[:limit]
		for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
			if utf8.RuneStart(b[i]) {
				if !utf8.FullRune(b[i:]) {
					b = b[:i]
				}
				break
			}
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// describe names an item in a sentence: its index, and its id if known.
func (it *ItemResult) describe() string {
	if it.OperationID != "" {
		return fmt.Sprintf("operation %q (%s %s)", it.OperationID, it.Method, it.URL)
	}
	if it.ID == "" {
		return "item " + strconv.Itoa(it.Index)
	}
	return fmt.Sprintf("item %d (id %q)", it.Index, it.ID)
}

// retryAfter returns the Retry-After among the items that asks the client
// to wait longest, as the item sent it.
func retryAfter(items []ItemResult, now time.Time) string {
	var best string
	var longest time.Duration = -1
	for _, it := range items {
		v := it.Headers["Retry-After"]
		if v == "" {
			continue
		}
		d, ok := parseRetryAfter(v, now)
		if !ok {
			continue
		}
		if d > longest {
			best, longest = v, d
		}
	}
	return best
}

// batchStatus maps the first failing item's status to the batch's: its
// own 4xx, 504 for a timeout, and 502 for anything else the upstream or
// the way to it did wrong.
func batchStatus(item int) int {
	switch {
	case item >= 400 && item < 500:
		return item
	case item == http.StatusGatewayTimeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}
