package e2e

// A bulk job's trace (docs/operations.md, "Traces"): a root span per
// run, its windows its children, their requests theirs, a link to the
// start's span, and nothing of the token or the bodies in any span.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// tracedJobsSite is jobsSite in a route that traces and taps the spans.
const tracedJobsSite = `
	route {
		tracing
		batchtest_spans
		batch {
			atomicity partial
			jobs /api/jobs
			resource /api/widgets {` + resourceMethods + `
			}
		}
		reverse_proxy UPSTREAM
	}`

// jobRunSpan waits for the ended run span of job id and returns it.
func jobRunSpan(t *testing.T, id string) sdktrace.ReadOnlySpan {
	t.Helper()
	var run sdktrace.ReadOnlySpan
	eventually(t, 10*time.Second, "the job's run span ends", func() bool {
		for _, s := range recordedSpans.Ended() {
			if s.Name() == "batch.job" && attrsOf(s)["batch.job.id"] == id {
				run = s
				return true
			}
		}
		return false
	})
	return run
}

// markedLines is a JSON Lines body of n widgets whose names hold a
// marker no span may hold.
func markedLines(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"name\":\"BODY-MARKER-%d\"}\n", i)
	}
	return b.String()
}

// A job of 300 items under tracing, 3 of which the API refuses once the
// start answered: the run's span, its windows under it, a span for each
// refused item's request under its window (the others' requests carry
// their window's context), the first item under the start.
func TestJobsTraceOfItsOwn(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 2 * time.Millisecond})
	g := startGateway(t, api, tracedJobsSite)
	const n = 300
	const startTrace = "abf92f3577b34da6a3ce929d0e0e4736"
	start := g.do(t, "POST", "/api/widgets", markedLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async",
		"Authorization", "Bearer CREDENTIAL-MARKER", "Traceparent", "00-"+startTrace+"-00f067aa0ba902b7-01")
	if start.Status != 202 {
		t.Fatalf("start: %s", start)
	}
	job := decodeJob(t, start)
	api.Inject(legacyapi.Fault{Method: "POST", Path: "/api/widgets", Status: 422, Body: `{"detail":"ANSWER-MARKER"}`, ContentType: "application/json", Times: 3})
	st := pollJob(t, g, job, time.Minute)
	if st.Done != n || st.Failed != 3 {
		t.Fatalf("job ended %+v, want %d done, 3 failed", st, n)
	}
	run := jobRunSpan(t, job.ID)
	startSpans := spansOf(t, startTrace)
	startServer := kindOf(startSpans, trace.SpanKindServer)
	if len(startServer) != 1 {
		t.Fatalf("%d server spans in the start's trace, want 1", len(startServer))
	}

	t.Run("the run's span: a root with the job's attributes, linked to the start", func(t *testing.T) {
		a := attrsOf(run)
		want := map[string]string{"batch.op": "create", "batch.resource": "/api/widgets", "batch.atomicity": "partial",
			"batch.items": fmt.Sprint(n), "batch.job.epoch": "0", "batch.job.state": st.State, "batch.items.done": fmt.Sprint(n),
			"batch.items.succeeded": fmt.Sprint(n - 3), "batch.items.failed": "3", "batch.job.run_end": "ended"}
		for k, v := range want {
			if a[k] != v {
				t.Errorf("%s = %q, want %q (attributes %v)", k, a[k], v, a)
			}
		}
		if run.Parent().IsValid() || run.SpanContext().TraceID().String() == startTrace {
			t.Errorf("the run's span has parent %v in trace %s: want a root of a trace of its own", run.Parent(), run.SpanContext().TraceID())
		}
		links := run.Links()
		if len(links) != 1 || links[0].SpanContext.SpanID() != startServer[0].SpanContext().SpanID() ||
			links[0].SpanContext.TraceID().String() != startTrace {
			t.Errorf("the run's links %+v, want the start's span %s", links, startServer[0].SpanContext().SpanID())
		}
	})

	var inRun []sdktrace.ReadOnlySpan
	for _, s := range recordedSpans.Ended() {
		if s.SpanContext().TraceID() == run.SpanContext().TraceID() {
			inRun = append(inRun, s)
		}
	}
	t.Run("windows under the run, refused requests under the windows", func(t *testing.T) {
		windows := map[trace.SpanID]bool{}
		items := 0
		for _, s := range inRun {
			if s.Name() == "batch.job.window" {
				if s.Parent().SpanID() != run.SpanContext().SpanID() {
					t.Errorf("window span under %s, not the run's", s.Parent().SpanID())
				}
				windows[s.SpanContext().SpanID()] = true
				var k int
				fmt.Sscan(attrsOf(s)["batch.items"], &k)
				items += k
			}
		}
		if len(windows) < 2 {
			t.Errorf("%d window spans, want the job's windows (at least 2 of 256 items)", len(windows))
		}
		if items != n-1 {
			t.Errorf("the run's windows hold %d items, want %d (all but the first, which the start ran)", items, n-1)
		}
		requests := 0
		for _, s := range inRun {
			if s.SpanKind() == trace.SpanKindClient {
				requests++
				if !windows[s.Parent().SpanID()] || attrsOf(s)["http.response.status_code"] != "422" || attrsOf(s)["batch.item.outcome"] != "failed" {
					t.Errorf("request span %s %v is under %s, want a refused item's under a window", s.Name(), attrsOf(s), s.Parent().SpanID())
				}
			}
		}
		if requests != 3 {
			t.Errorf("%d request spans in the run's trace, want the 3 refused items'", requests)
		}
	})

	t.Run("the first item is traced under the start", func(t *testing.T) {
		var window sdktrace.ReadOnlySpan
		for _, s := range startSpans {
			if s.Name() == "batch.job.window" {
				window = s
			}
		}
		if window == nil || window.Parent().SpanID() != startServer[0].SpanContext().SpanID() || attrsOf(window)["batch.window.first"] != "0" {
			t.Fatalf("the start's trace has no window of item 0 under its span: %v", window)
		}
		if c := kindOf(startSpans, trace.SpanKindClient); len(c) != 1 || c[0].Parent().SpanID() != window.SpanContext().SpanID() {
			t.Errorf("%d request spans in the start's trace, want the first item's under its window", len(c))
		}
	})

	t.Run("no span holds the token, a credential or a body", func(t *testing.T) {
		for _, s := range append(inRun, startSpans...) {
			raw, err := json.Marshal(tracetest.SpanStubFromReadOnlySpan(s))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []string{job.Token, "CREDENTIAL-MARKER", "BODY-MARKER", "ANSWER-MARKER"} {
				if strings.Contains(string(raw), m) {
					t.Errorf("span %q holds %q: %s", s.Name(), m, raw)
				}
			}
		}
	})

	t.Run("each request names a span of the job upstream, never the start's", func(t *testing.T) {
		byTraceparent := map[string]bool{}
		for _, s := range append(inRun, startSpans...) {
			if s.SpanKind() == trace.SpanKindClient || s.Name() == "batch.job.window" {
				byTraceparent[traceparentOf(s)] = true
			}
		}
		for _, req := range api.Requests() {
			if req.Method != "POST" {
				continue
			}
			if tp := req.Header.Get("Traceparent"); !byTraceparent[tp] {
				t.Errorf("%s %s carried traceparent %q, which names none of the job's request spans", req.Method, req.Path, tp)
			}
		}
	})
}

// Without tracing, a job makes no span, and its requests carry none of
// the start's tracing headers.
func TestJobsNoTracingNoSpan(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, jobsSite)
	const startTrace = "bbf92f3577b34da6a3ce929d0e0e4736"
	start := g.do(t, "POST", "/api/widgets", widgetLines(5), "Content-Type", "application/x-ndjson", "Prefer", "respond-async",
		"Authorization", "Bearer client-a", "Traceparent", "00-"+startTrace+"-00f067aa0ba902b7-01")
	if start.Status != 202 {
		t.Fatalf("start: %s", start)
	}
	job := decodeJob(t, start)
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" {
		t.Fatalf("job ended %+v", st)
	}
	time.Sleep(100 * time.Millisecond) // the run's end, after its status says so
	for _, s := range recordedSpans.Ended() {
		if attrsOf(s)["batch.job.id"] == job.ID || s.SpanContext().TraceID().String() == startTrace {
			t.Errorf("span %q recorded without tracing", s.Name())
		}
	}
	for _, req := range api.Requests() {
		if tp := req.Header.Get("Traceparent"); tp != "" {
			t.Errorf("%s %s carried traceparent %q", req.Method, req.Path, tp)
		}
	}
}

// A job handed over at a reload is two runs, each a trace of its own
// linked to the start's span: the first ends handed over, the second,
// under the next epoch, with the job.
func TestJobsTraceOfEachRun(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", WriteDelay: 5 * time.Millisecond})
	dir := t.TempDir()
	site := strings.Replace(tracedJobsSite, "jobs /api/jobs\n", "jobs /api/jobs\n\t\t\tconcurrency 4\n", 1)
	g := startGatewayStorage(t, api, newUpstream(t, api), "storage file_system "+dir, site)
	const n = 1500
	const startTrace = "cbf92f3577b34da6a3ce929d0e0e4736"
	r := g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async",
		"Authorization", "Bearer client-a", "Traceparent", "00-"+startTrace+"-00f067aa0ba902b7-01")
	if r.Status != 202 {
		t.Fatalf("start: %s", r)
	}
	job := decodeJob(t, r)
	for jobStatus(t, g, job).Done < 200 {
		time.Sleep(20 * time.Millisecond)
	}
	g.reload(t, site+"\n\theader X-Reloaded yes\n")
	if st := pollJob(t, g, job, 2*time.Minute); st.State != "succeeded" || st.Done != n {
		t.Fatalf("job ended %+v, want succeeded", st)
	}
	startSpan := kindOf(spansOf(t, startTrace), trace.SpanKindServer)[0].SpanContext()
	var runs []sdktrace.ReadOnlySpan
	eventually(t, 10*time.Second, "both runs' spans end", func() bool {
		runs = runs[:0]
		for _, s := range recordedSpans.Ended() {
			if s.Name() == "batch.job" && attrsOf(s)["batch.job.id"] == job.ID {
				runs = append(runs, s)
			}
		}
		return len(runs) == 2
	})
	ends := map[string]map[string]string{}
	for _, s := range runs {
		a := attrsOf(s)
		ends[a["batch.job.run_end"]] = a
		if links := s.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != startSpan.SpanID() || links[0].SpanContext.TraceID() != startSpan.TraceID() {
			t.Errorf("run %s links %+v, want the start's span", a["batch.job.epoch"], links)
		}
	}
	if runs[0].SpanContext().TraceID() == runs[1].SpanContext().TraceID() {
		t.Error("both runs are in one trace")
	}
	first, last := ends["handed_over"], ends["ended"]
	if first == nil || last == nil {
		t.Fatalf("the runs ended %v, want one handed over and one ended", ends)
	}
	if first["batch.job.state"] != "running" || first["batch.items.done"] == fmt.Sprint(n) || last["batch.job.state"] != "succeeded" ||
		last["batch.items.done"] != fmt.Sprint(n) || first["batch.job.epoch"] == last["batch.job.epoch"] {
		t.Errorf("the handed over run %v, the ending one %v", first, last)
	}
}

// A job paused by a refusal of its credentials: its run's span ends
// paused, the refused item's request a span with its 401, and the run
// after its resume is a trace of its own, linked to the start too.
func TestJobsTraceOfAPausedRun(t *testing.T) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", BearerTokens: []string{"old"}, WriteDelay: 10 * time.Millisecond})
	g := startGateway(t, api, tracedJobsSite)
	const n = 400
	start := g.do(t, "POST", "/api/widgets", widgetLines(n), "Content-Type", "application/x-ndjson", "Prefer", "respond-async", "Authorization", "Bearer old")
	if start.Status != 202 {
		t.Fatalf("start: %s", start)
	}
	job := decodeJob(t, start)
	eventually(t, time.Minute, "100 widgets made", func() bool { return len(api.Items("/api/widgets")) >= 100 })
	api.RevokeToken("old")
	if st := pollJob(t, g, job, time.Minute); st.State != "paused" {
		t.Fatalf("after the token expired: %+v, want paused", st)
	}
	paused := jobRunSpan(t, job.ID)
	if a := attrsOf(paused); a["batch.job.run_end"] != "paused" || a["batch.job.state"] != "paused" {
		t.Errorf("the paused run's span %v, want it ended paused", a)
	}
	refused := 0
	for _, s := range recordedSpans.Ended() {
		if s.SpanContext().TraceID() == paused.SpanContext().TraceID() && s.SpanKind() == trace.SpanKindClient && attrsOf(s)["http.response.status_code"] == "401" {
			refused++
		}
	}
	if refused == 0 {
		t.Error("no span of a refused item's request in the paused run's trace")
	}

	api.AcceptToken("new")
	if r := g.do(t, "POST", "/api/jobs/"+job.ID+"/resume", map[string]any{"headers": map[string]string{"Authorization": "Bearer new"}}, bearerOf(job.Token)...); r.Status != 202 {
		t.Fatalf("resume: %s", r)
	}
	if st := pollJob(t, g, job, time.Minute); st.State != "succeeded" {
		t.Fatalf("the resumed job ended %+v", st)
	}
	var resumed sdktrace.ReadOnlySpan
	eventually(t, 10*time.Second, "the resumed run's span ends", func() bool {
		for _, s := range recordedSpans.Ended() {
			if s.Name() == "batch.job" && attrsOf(s)["batch.job.id"] == job.ID && attrsOf(s)["batch.job.run_end"] == "ended" {
				resumed = s
				return true
			}
		}
		return false
	})
	if resumed.SpanContext().TraceID() == paused.SpanContext().TraceID() {
		t.Error("the resumed run is in the paused run's trace")
	}
	if l1, l2 := paused.Links(), resumed.Links(); len(l1) != 1 || len(l2) != 1 || l1[0].SpanContext.SpanID() != l2[0].SpanContext.SpanID() {
		t.Errorf("the runs' links %+v and %+v, want both the start's span", l1, l2)
	}
	waitEndWritten(t, g.storageDir(t), job.ID)
}
