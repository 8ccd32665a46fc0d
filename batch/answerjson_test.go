package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// marshalled is the answer as the gateway wrote it before it streamed
// answers: the whole of it through encoding/json, HTML unescaped.
func marshalled(t testing.TB, r *Result) []byte {
	t.Helper()
	type whole struct {
		Atomicity string       `json:"atomicity"`
		Outcome   Outcome      `json:"outcome"`
		Succeeded int          `json:"succeeded"`
		Failed    int          `json:"failed"`
		Items     []ItemResult `json:"items"`
	}
	env := whole{r.Atomicity.String(), r.Outcome, r.Succeeded, r.Failed, r.Items}
	var v any = env
	if r.Atomicity != policy.Partial && r.Outcome != Succeeded {
		kind := map[Outcome]string{RolledBack: "batch-rolled-back", RollbackFailed: "rollback-failed"}[r.Outcome]
		if kind == "" {
			kind = "batch-failed"
		}
		v = struct {
			problem.Details
			whole
		}{problem.New(r.Status, kind, r.Detail), env}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The streamed answer is, byte for byte, what encoding/json made of the
// whole answer (for bodies without whitespace between their tokens,
// which encoding/json took out): the same members in the same order,
// omitted in the same cases, escaped the same way.
func TestAnswerAsMarshalled(t *testing.T) {
	t.Parallel()
	full := ItemResult{
		Index: 0, OperationID: "p\u00e9-1", Method: "POST", URL: "/users/7/posts?x=<y>&z=\"", ID: "a<b>&c", Status: 502, Outcome: RollbackFailed,
		Body:     json.RawMessage(`{"html":"<b>&amp;</b>","line":"` + "\u2028" + `","n":[1,2.5e3,null,true]}`),
		BodyText: "<html>\u2028é\x7f</html>",
		Headers:  map[string]string{"Location": "/widgets/1?a=1&b=<2>", "ETag": `"v1"`, "Retry-After": "3"},
		Error:    "a reason with \"quotes\" and \\ and \t",
		Compensation: &Compensation{
			Method: "PUT", Path: "/widgets/a%3Cb%3E", Status: 412, Attempts: 2, Error: "answered 412",
			Found: json.RawMessage(`{"id":"a<b>&c","by":"someone else"}`),
		},
	}
	handBuilt := func(atomicity policy.Atomicity, outcome Outcome, status int) *Result {
		return &Result{
			Atomicity: atomicity, Outcome: outcome, Status: status, Succeeded: 1, Failed: 2,
			Detail: `item 0 (id "a<b>&c") failed with 502`,
			Items: []ItemResult{
				full,
				{Index: 1, Outcome: NotAttempted},
				{Index: 2, ID: "2", Status: 200, Outcome: Succeeded, Body: json.RawMessage(`[]`)},
				{Index: 3, ID: "3", Status: 204, Outcome: Succeeded, Headers: map[string]string{"ETag": `W/"x"`}},
				{Index: 4, ID: "4", Outcome: Failed, Error: "the upstream did not answer"},
				{Index: 5, ID: "5", Status: 500, Outcome: Failed, BodyText: "oops"},
				{Index: 6, ID: "6", Status: 200, Outcome: RolledBack, Body: json.RawMessage(`"x"`), Compensation: &Compensation{Method: "DELETE", Path: "/widgets/6", Status: 204, Attempts: 1}},
				{Index: 7, ID: "q\"é\u2028 ~\\\\", Status: 404, Outcome: Failed},
				{Index: 8, ID: `back\slash "quoted"`, Outcome: NotAttempted, Headers: map[string]string{}},
			},
		}
	}
	results := map[string]*Result{
		"partial, every member":          handBuilt(policy.Partial, Partial, 207),
		"rollback failed, every member":  handBuilt(policy.AllOrNothing, RollbackFailed, 500),
		"rolled back, every member":      handBuilt(policy.AllOrNothing, RolledBack, 502),
		"failed, every member":           handBuilt(policy.AllOrNothing, Failed, 502),
		"succeeded, no items (for form)": {Atomicity: policy.AllOrNothing, Outcome: Succeeded, Status: 200, Items: []ItemResult{}},
		"GET": run(mustPlan(t, newRequest("GET", "/widgets?ids=1,2,1,3", "")), newFake().seed("1", "2", "3").
			on("GET", "/widgets/3", reply(200, `{"id":"3","etag":true}`, "ETag", `"e3"`, "Last-Modified", "Tue, 01 Jan 2030 00:00:00 GMT"))),
		"GET, partial": run(mustPlan(t, newRequest("GET", "/widgets?ids=1,2,3,4", ""), partial), newFake().seed("1").
			on("GET", "/widgets/3", reply(503, "<h1>down & out</h1>", "Content-Type", "text/html", "Retry-After", "9")).
			on("GET", "/widgets/4", answer{err: errors.New("dial tcp 10.0.0.1:80: refused")})),
		"update rolled back": run(mustPlan(t, newRequest("PATCH", "/widgets", `[{"id":"1","name":"n1"},{"id":"2","name":"n2"}]`), concurrency(1)),
			newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(422, `{"error":"no <b>"}`))),
		"delete refused with a challenge": run(mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), concurrency(1)),
			newFake().seed("1", "2").on("DELETE", "/widgets/2", reply(401, "", "WWW-Authenticate", `Basic realm="r"`))),
		"create": run(mustPlan(t, newRequest("POST", "/widgets", elements(3)), partial), newFake()),
	}
	for name, res := range results {
		t.Run(name, func(t *testing.T) {
			want := marshalled(t, res)
			rec := writeRaw(t, res)
			if got := rec.Body.Bytes(); !bytes.Equal(got, want) {
				t.Errorf("streamed answer\n\t%s\nwant, as encoding/json wrote it,\n\t%s", got, want)
			}
			equal(t, "Content-Length", rec.Header().Get("Content-Length"), strconv.Itoa(len(want)))
			equal(t, "X-Content-Type-Options", rec.Header().Get("X-Content-Type-Options"), "nosniff")
			wantType := "application/json"
			if res.Atomicity != policy.Partial && res.Outcome != Succeeded {
				wantType = problem.ContentType
			}
			equal(t, "Content-Type", rec.Header().Get("Content-Type"), wantType)
			equal(t, "status", rec.Code, res.Status)
		})
	}
}

// An upstream's body goes into the answer as it came, its inner
// whitespace included (it is insignificant in JSON), without the
// whitespace around it.
func TestAnswerKeepsBodyAsSent(t *testing.T) {
	t.Parallel()
	pretty := "\r\n {\n  \"id\": \"1\",\n  \"tags\": [ \"a\", \"b\" ]\n}\n\n"
	f := newFake().on("GET", "/widgets/1", reply(200, pretty, "Content-Type", "application/json"))
	rec := writeRaw(t, run(mustPlan(t, newRequest("GET", "/widgets?ids=1", "")), f))
	strictJSON(t, rec.Body.Bytes())
	if want := `"body":` + strings.TrimSpace(pretty) + `}`; !bytes.Contains(rec.Body.Bytes(), []byte(want)) {
		t.Errorf("the answer %q does not hold the body as sent, %q", rec.Body, want)
	}
	var w wire
	if err := json.Unmarshal(rec.Body.Bytes(), &w); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, "items[0].body", string(w.Items[0].Body), pretty)
}

// docs/wire-format.md, "Batch requests and responses": a batch GET fetches a repeated id once; its body is held once
// however many times the batch names it, and written from that one copy.
func TestRepeatedIDBodyHeldOnce(t *testing.T) {
	// Not parallel: it counts the bytes the whole process allocates.
	const copies, size = 20, 512 << 10
	body := `{"pad":"` + strings.Repeat("x", size-len(`{"pad":""}`)) + `"}`
	f := newFake().on("GET", "/widgets/1", reply(200, body))
	target := "/widgets?ids=" + strings.TrimSuffix(strings.Repeat("1,", copies), ",")
	res := run(mustPlan(t, newRequest("GET", target, ""), maxResponseSize(copies*size)), f)
	equal(t, "GETs sent", len(f.log()), 1)
	equal(t, "outcome", res.Outcome, Succeeded)
	for i, it := range res.Items {
		if len(it.Body) != size || unsafe.SliceData(it.Body) != unsafe.SliceData(res.Items[0].Body) {
			t.Fatalf("items[%d].body: %d bytes at %p, want the %d bytes of items[0] at %p",
				i, len(it.Body), unsafe.SliceData(it.Body), size, unsafe.SliceData(res.Items[0].Body))
		}
	}

	w := &countingResponse{header: http.Header{}}
	if err := res.Write(w); err != nil { // the pool's writer, made once
		t.Fatal(err)
	}
	w.n = 0
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := res.Write(w); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("an answer of %d bytes (%d × %d bytes of body) was written with %d bytes allocated", w.n, copies, size, allocated)
	if w.n < copies*size {
		t.Errorf("the answer is %d bytes, want at least %d", w.n, copies*size)
	}
	if allocated >= size/4 {
		t.Errorf("writing the answer allocated %d bytes, want far less than one body (%d)", allocated, size)
	}
}

// countingResponse is a ResponseWriter that counts the answer and keeps
// none of it.
type countingResponse struct {
	header http.Header
	n      int
}

func (w *countingResponse) Header() http.Header { return w.header }
func (w *countingResponse) WriteHeader(int)     {}
func (w *countingResponse) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}

func maxResponseSize(n int64) specMod {
	return settings(func(s *policy.Settings) { s.MaxResponseSize = n })
}
