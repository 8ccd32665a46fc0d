package batch

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/problem"
	"github.com/caddy-batch/caddy-batch/policy"
)

// streamChunk is one call of AdmitJob's chunk.
type streamChunk struct {
	first int
	items []ItemSnapshot
}

// admitted is what AdmitJob did with one request.
type admitted struct {
	plan   *JobPlan
	prob   *problem.Details
	err    error
	chunks []streamChunk
}

// items are every item the chunks handed over, in order.
func (a admitted) items() []ItemSnapshot {
	var all []ItemSnapshot
	for _, c := range a.chunks {
		all = append(all, c.items...)
	}
	return all
}

// jobLimits are §18's defaults, with max_body_size as the element's.
func jobLimits(m policy.Match) JobLimits {
	return JobLimits{MaxItems: 100000, MaxAtomic: 5000, MaxBody: 64 << 20, MaxElement: m.Resource.Settings.MaxBodySize}
}

// admitJob admits r as a job on /widgets under mods, with the limits
// lim makes of the defaults.
func admitJob(t testing.TB, r *http.Request, lim func(*JobLimits), mods ...specMod) admitted {
	t.Helper()
	m, ok := widgets(t, mods...).Lookup(r.URL.EscapedPath())
	if !ok || m.Item {
		t.Fatalf("%s: not the /widgets collection", r.URL)
	}
	return admitOn(m, r, lim)
}

func admitOn(m policy.Match, r *http.Request, lim func(*JobLimits)) admitted {
	limits := jobLimits(m)
	if lim != nil {
		lim(&limits)
	}
	var a admitted
	a.plan, a.prob, a.err = AdmitJob(r, m, jobOp(r.Method), limits, func(first int, items []ItemSnapshot) error {
		a.chunks = append(a.chunks, streamChunk{first, items})
		return nil
	})
	return a
}

func jobOp(method string) policy.Op {
	return map[string]policy.Op{"GET": policy.OpGet, "POST": policy.OpCreate, "PATCH": policy.OpUpdate, "DELETE": policy.OpDelete}[method]
}

// mustAdmit admits a job that must pass.
func mustAdmit(t testing.TB, r *http.Request, lim func(*JobLimits), mods ...specMod) admitted {
	t.Helper()
	a := admitJob(t, r, lim, mods...)
	if a.prob != nil {
		t.Fatalf("%s %s: refused: %d %s", r.Method, r.URL, a.prob.Status, a.prob.Detail)
	}
	return a
}

// refused checks that a job was refused with status, its detail holding
// every one of detail.
func refused(t testing.TB, a admitted, status int, detail ...string) {
	t.Helper()
	if a.prob == nil {
		t.Fatalf("admitted %d items, want %d", a.plan.Items, status)
	}
	if a.prob.Status != status {
		t.Errorf("status %d (%s), want %d", a.prob.Status, a.prob.Detail, status)
	}
	for _, d := range detail {
		if !strings.Contains(a.prob.Detail, d) {
			t.Errorf("detail %q does not say %q", a.prob.Detail, d)
		}
	}
}

const ndjson = "application/x-ndjson"

func linesRequest(method, body string, header ...string) *http.Request {
	return newRequest(method, "/widgets", body, append([]string{"Content-Type", ndjson}, header...)...)
}

// updates are n update elements, each with id i and a field.
func updates(n int) []string {
	elems := make([]string, n)
	for i := range elems {
		elems[i] = fmt.Sprintf(`{"id":%d,"name":"w%d"}`, i, i)
	}
	return elems
}

func TestIsAsync(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		prefer []string
		want   bool
	}{
		{nil, false},
		{[]string{"respond-async"}, true},
		{[]string{"Respond-Async"}, true},
		{[]string{"wait=10, respond-async"}, true},
		{[]string{"return=minimal", "respond-async; x=y"}, true},
		{[]string{" respond-async ,atomicity=partial"}, true},
		{[]string{"respond-asynchronously"}, false},
		{[]string{"atomicity=partial", "wait=5"}, false},
		{[]string{`x="respond-async"`}, false},
	} {
		h := http.Header{}
		for _, p := range c.prefer {
			h.Add("Prefer", p)
		}
		equal(t, fmt.Sprintf("IsAsync(%q)", c.prefer), IsAsync(h), c.want)
	}
}

// TestWithoutPreference: a job's requests carry the client's other
// preferences, not respond-async.
func TestWithoutPreference(t *testing.T) {
	t.Parallel()
	h := http.Header{"Prefer": {"respond-async", "wait=5, Respond-Async; x=1 ,return=minimal"}}
	equal(t, "Prefer", fmt.Sprint(withoutPreference(h, "respond-async")["Prefer"]), "[wait=5, return=minimal]")
	h = http.Header{"Prefer": {"respond-async"}}
	equal(t, "a Prefer left with nothing", len(withoutPreference(h, "respond-async")["Prefer"]), 0)
}

// TestJobArrayAndLinesAgree: the same elements as an array and as JSON
// Lines (blank lines, CRLF, no last line end) give the same chunks and
// digest; the chunks hold what a synchronous batch's Snapshot would.
func TestJobArrayAndLinesAgree(t *testing.T) {
	t.Parallel()
	elems := updates(2500)
	array := "[\n  " + strings.Join(elems, " ,\n  ") + "\n]\n"
	var lines strings.Builder
	for i, e := range elems {
		if i%7 == 0 {
			lines.WriteString("\r\n  \n")
		}
		lines.WriteString(" " + e + "\t\r\n")
	}
	jsonl := strings.TrimSuffix(lines.String(), "\r\n")

	fromArray := mustAdmit(t, newRequest("PATCH", "/widgets", array), nil, partial)
	fromLines := mustAdmit(t, linesRequest("PATCH", jsonl), nil, partial)
	equal(t, "items", fromArray.plan.Items, 2500)
	equal(t, "JSON Lines items", fromLines.plan.Items, 2500)
	if !reflect.DeepEqual(fromArray.chunks, fromLines.chunks) {
		t.Error("an array and JSON Lines of the same elements gave different chunks")
	}
	equal(t, "digest", fmt.Sprintf("%x", fromLines.plan.Digest), fmt.Sprintf("%x", fromArray.plan.Digest))
	var firsts []int
	for _, c := range fromArray.chunks {
		firsts = append(firsts, c.first)
	}
	equal(t, "chunks' first items", fmt.Sprint(firsts), "[0 1000 2000]")

	// The synchronous batch of the first 100 elements snapshots its items
	// as the job's first 100 are.
	sync := mustPlan(t, newRequest("PATCH", "/widgets", "["+strings.Join(elems[:100], ",")+"]"), partial)
	if got, want := fromLines.items()[:100], sync.Snapshot().Items; !reflect.DeepEqual(got, want) {
		t.Errorf("the job's items differ from a synchronous batch's: %+v, want %+v", got[0], want[0])
	}
	equal(t, "a different body's digest differs", bytes.Equal(fromArray.plan.Digest,
		mustAdmit(t, linesRequest("PATCH", strings.Join(elems[1:], "\n")), nil, partial).plan.Digest), false)
}

// TestJobPlan: what a job is, besides its items, is what a synchronous
// batch's Snapshot says.
func TestJobPlan(t *testing.T) {
	t.Parallel()
	r := linesRequest("POST", `{"name":"a"}`, "Idempotency-Key", `"k1"`, "Prefer", "respond-async, atomicity=partial", "X-Tenant", "t1")
	r.URL.RawQuery = "tenant=t1&_method=POST"
	a := mustAdmit(t, r, nil, override)
	s := a.plan.Spec
	equal(t, "op", s.Op, "create")
	equal(t, "path", s.Path, "/widgets")
	equal(t, "query", s.Query, "tenant=t1")
	equal(t, "key", s.Key, "k1")
	equal(t, "key quoted", s.KeyQuoted, true)
	equal(t, "header", s.Header.Get("X-Tenant"), "t1")
	equal(t, "the job's own preference is not its requests'", fmt.Sprint(s.Header.Values("Prefer")), "[atomicity=partial]")
	equal(t, "atomicity", a.plan.Atomicity, policy.Partial)
	equal(t, "Preference-Applied", a.plan.PreferenceApplied, "atomicity=partial")
	equal(t, "no items in the spec", len(s.Items), 0)

	ids := mustAdmit(t, newRequest("DELETE", "/widgets?ids=3,1,2&tenant=t1", ""), nil, partial)
	equal(t, "ids", fmt.Sprint([]string{ids.items()[0].ID, ids.items()[1].ID, ids.items()[2].ID}), "[3 1 2]")
	equal(t, "ids' query", ids.plan.Spec.Query, "tenant=t1")
	equal(t, "a DELETE job's outcome before it runs", ids.items()[0].Outcome, NotAttempted)
}

// TestJobErrorsNameTheElement: a bad element is named by its line in
// JSON Lines (from 1, blank lines counted) and by its index in an array,
// however far into the body it is; duplicates are found across chunks.
func TestJobErrorsNameTheElement(t *testing.T) {
	t.Parallel()
	good := updates(10000)
	for _, c := range []struct {
		name       string
		bad        string
		line, item string // how JSON Lines and an array name it
		detail     []string
	}{
		{"not an object", `[1]`, "line 10005", "item 10000", []string{"must be a JSON object", "array"}},
		{"no id", `{"name":"x"}`, "line 10005", "item 10000", []string{`no "id" field`}},
		{"hostile id", `{"id":".."}`, "line 10005", "item 10000", []string{"dot segment"}},
		{"not JSON", `{"id":1,}`, "line 10005", "not valid JSON at byte", []string{"invalid character"}},
		{"two values on a line", `{"id":"a"} {"id":"b"}`, "line 10005", "", []string{"after top-level value"}},
		{"an id of 10,000 lines before", `{"id":3}`, "lines 4 and 10005", "items 3 and 10000", []string{"both have id", `"3"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// 10,000 good lines, with 4 blank ones among them, then the bad one.
			body := strings.Join(good[:5000], "\n") + "\n\n\n" + strings.Join(good[5000:], "\r\n") + "\n\n\n" + c.bad + "\n" + good[0]
			refused(t, admitJob(t, linesRequest("PATCH", body), nil, partial), 400, append([]string{c.line}, c.detail...)...)
			if c.item == "" {
				return // an array has no lines
			}
			array := "[" + strings.Join(good, ",") + "," + c.bad + "]"
			refused(t, admitJob(t, newRequest("PATCH", "/widgets", array), nil, partial), 400, append([]string{c.item}, c.detail...)...)
		})
	}
}

// TestJobBodyShapes: what a body must be, and how JSON Lines are read.
func TestJobBodyShapes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, contentType, body string
		items                   int    // when accepted
		detail                  string // when refused (400)
	}{
		{"one line, no line end", ndjson, `{"name":"a"}`, 1, ""},
		{"CRLF", ndjson, "{\"name\":\"a\"}\r\n{\"name\":\"b\"}\r\n", 2, ""},
		{"blank and white lines", ndjson, "\n \t\r\n{\"name\":\"a\"}\n\n{\"name\":\"b\"}\n \n", 2, ""},
		{"application/jsonl", "application/jsonl; charset=utf-8", "{\"name\":\"a\"}\n", 1, ""},
		{"a bad line after blank ones", ndjson, "\n\n{\"name\":\"a\"}\n\nnull\n", 0, "line 5: must be a JSON object, not a JSON null"},
		{"empty JSON Lines", ndjson, "\n\r\n  \n", 0, "the job is empty"},
		{"no body", ndjson, "", 0, "the job is empty"},
		{"JSON Lines of arrays", ndjson, `[{"name":"a"}]`, 0, "line 1: must be a JSON object, not a JSON array"},
		{"not Unicode's white space", ndjson, "\u00a0{\"name\":\"a\"}", 0, "line 1: must be a JSON object"},
		{"array", "application/json", ` [ {"name":"a"} , {"name":"b"} ] `, 2, ""},
		{"array without Content-Type", "", `[{"name":"a"}]`, 1, ""},
		{"empty array", "", `[ ]`, 0, "the job is empty"},
		{"empty body", "", ``, 0, "the body is empty"},
		{"an object", "", `{"name":"a"}`, 0, "the body is a JSON object"},
		{"a string", "", `"a"`, 0, "the body is a JSON string"},
		{"cut short", "", `[{"name":"a"},`, 0, "ends at byte 14"},
		{"cut inside an element", "", `[{"name":"a"`, 0, "not valid JSON"},
		{"after the array", "", `[{"name":"a"}] [`, 0, "goes on after its array"},
		{"two closing brackets", "", `[{"name":"a"}]]`, 0, "not valid JSON"},
		{"no comma", "", `[{"name":"a"} {"name":"b"}]`, 0, "not valid JSON"},
		{"an element not an object", "", `[{"name":"a"}, 7]`, 0, "item 1: must be a JSON object, not a JSON number"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRequest("POST", "/widgets", c.body)
			if c.contentType != "" {
				r.Header.Set("Content-Type", c.contentType)
			}
			a := admitJob(t, r, nil, partial)
			if c.detail != "" {
				refused(t, a, 400, c.detail)
				return
			}
			if a.prob != nil {
				t.Fatalf("refused: %s", a.prob.Detail)
			}
			equal(t, "items", a.plan.Items, c.items)
			equal(t, "items handed over", len(a.items()), c.items)
		})
	}
}

// TestJobLimits: every 413 and 415 of a job, and the limits' edges.
func TestJobLimits(t *testing.T) {
	t.Parallel()
	lines := func(n int) string { return strings.Join(updates(n), "\n") }
	limit := func(f func(*JobLimits)) func(*JobLimits) { return f }
	unknownLength := func(r *http.Request) *http.Request { r.ContentLength = -1; return r }
	for _, c := range []struct {
		name   string
		r      *http.Request
		lim    func(*JobLimits)
		mods   []specMod
		status int // 0: accepted
		detail []string
	}{
		{"max_job_items", linesRequest("PATCH", lines(11)), limit(func(l *JobLimits) { l.MaxItems = 10 }), []specMod{partial}, 413, []string{"more than 10 items", "max_job_items"}},
		{"max_job_items reached", linesRequest("PATCH", lines(10)), limit(func(l *JobLimits) { l.MaxItems = 10 }), []specMod{partial}, 0, nil},
		{"max_job_items in an array", newRequest("PATCH", "/widgets", "["+strings.Join(updates(11), ",")+"]"), limit(func(l *JobLimits) { l.MaxItems = 10 }), []specMod{partial}, 413, []string{"max_job_items"}},
		{"max_job_items of ids", newRequest("DELETE", "/widgets?ids=1,2,3", ""), limit(func(l *JobLimits) { l.MaxItems = 2 }), []specMod{partial}, 413, []string{"3 items", "max_job_items allows at most 2"}},
		{"ids beyond max_items are a job's", newRequest("GET", "/widgets?ids=1,2,3", ""), nil, []specMod{maxItems(2)}, 0, nil},
		{"elements beyond max_items are a job's", linesRequest("POST", lines(3)), nil, []specMod{maxItems(2), partial}, 0, nil},
		{"max_atomic_job_items", linesRequest("PATCH", lines(6)), limit(func(l *JobLimits) { l.MaxAtomic = 5 }), nil, 413, []string{"at most 5 (max_atomic_job_items)", "split it"}},
		{"max_atomic_job_items, override allowed", linesRequest("PATCH", lines(6)), limit(func(l *JobLimits) { l.MaxAtomic = 5 }), []specMod{override}, 413, []string{"Prefer: atomicity=partial"}},
		{"max_atomic_job_items of ids", newRequest("DELETE", "/widgets?ids=1,2,3", ""), limit(func(l *JobLimits) { l.MaxAtomic = 2 }), nil, 413, []string{"max_atomic_job_items"}},
		{"max_atomic_job_items reached", linesRequest("PATCH", lines(5)), limit(func(l *JobLimits) { l.MaxAtomic = 5 }), nil, 0, nil},
		{"max_atomic_job_items binds no partial job", linesRequest("PATCH", lines(6)), limit(func(l *JobLimits) { l.MaxAtomic = 5 }), []specMod{partial}, 0, nil},
		{"partial asked for past max_atomic_job_items", linesRequest("PATCH", lines(6), "Prefer", "atomicity=partial"), limit(func(l *JobLimits) { l.MaxAtomic = 5 }), []specMod{override}, 0, nil},
		{"max_job_body_size by Content-Length", linesRequest("PATCH", lines(100)), limit(func(l *JobLimits) { l.MaxBody = 100 }), []specMod{partial}, 413, []string{"max_job_body_size (100 bytes)"}},
		{"max_job_body_size as read", unknownLength(linesRequest("PATCH", lines(100))), limit(func(l *JobLimits) { l.MaxBody = 100 }), []specMod{partial}, 413, []string{"max_job_body_size"}},
		{"max_job_body_size as read, an array", unknownLength(newRequest("PATCH", "/widgets", "["+strings.Join(updates(100), ",")+"]")), limit(func(l *JobLimits) { l.MaxBody = 100 }), []specMod{partial}, 413, []string{"max_job_body_size"}},
		{"max_job_body_size exactly", unknownLength(linesRequest("PATCH", lines(100))), limit(func(l *JobLimits) { l.MaxBody = int64(len(lines(100))) }), []specMod{partial}, 0, nil},
		{"an element past max_body_size", linesRequest("POST", "{}\n\n"+`{"name":"`+strings.Repeat("x", 64)+`"}`+"\n{}"), limit(func(l *JobLimits) { l.MaxElement = 64 }), []specMod{partial}, 413, []string{"line 3 is larger than max_body_size (64 bytes)"}},
		{"a long line past max_body_size", linesRequest("POST", `{"name":"`+strings.Repeat("x", 200<<10)+`"}`), limit(func(l *JobLimits) { l.MaxElement = 100 << 10 }), []specMod{partial}, 413, []string{"line 1 is larger"}},
		{"an element of max_body_size, CRLF", linesRequest("POST", "{}\r\n"+`{"name":"`+strings.Repeat("x", 64-11)+`"}`+"\r\n"), limit(func(l *JobLimits) { l.MaxElement = 64 }), []specMod{partial}, 0, nil},
		{"an array's element of max_body_size", newRequest("POST", "/widgets", "[{},\n  "+`{"name":"`+strings.Repeat("x", 64-11)+`"}`+"\n]"), limit(func(l *JobLimits) { l.MaxElement = 64 }), []specMod{partial}, 0, nil},
		{"a line of max_body_size and one more byte", linesRequest("POST", `{"name":"`+strings.Repeat("x", 64-11)+`"} `), limit(func(l *JobLimits) { l.MaxElement = 64 }), []specMod{partial}, 413, []string{"line 1"}},
		{"an array's element past max_body_size", newRequest("POST", "/widgets", `[{}, {"name":"`+strings.Repeat("x", 64)+`"}]`), limit(func(l *JobLimits) { l.MaxElement = 64 }), []specMod{partial}, 413, []string{"item 1 is larger than max_body_size"}},
		{"Content-Encoding", linesRequest("POST", "{}", "Content-Encoding", "gzip"), nil, []specMod{partial}, 415, []string{"gzip"}},
		{"Content-Encoding identity", linesRequest("POST", "{}", "Content-Encoding", "identity"), nil, []specMod{partial}, 0, nil},
		{"text/plain", newRequest("POST", "/widgets", "{}", "Content-Type", "text/plain"), nil, []specMod{partial}, 415, []string{"JSON Lines", "text/plain"}},
		{"operation off", linesRequest("POST", "{}"), nil, []specMod{func(r *policy.ResourceSpec) { r.Batch = []string{"get"} }}, 405, []string{"not enabled"}},
		{"an unscoped parameter on an all-or-nothing job", newRequest("PATCH", "/widgets?fields=a", `[{"id":1}]`), nil, nil, 400, []string{`"fields"`, "scope_query"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			a := admitJob(t, c.r, c.lim, c.mods...)
			if c.status == 0 {
				if a.prob != nil {
					t.Fatalf("refused: %d %s", a.prob.Status, a.prob.Detail)
				}
				return
			}
			refused(t, a, c.status, c.detail...)
		})
	}
}

// TestJobElementNotReadWhole: an element past max_body_size is refused
// once its first max_body_size bytes (and a little) are read, not once
// it is whole.
func TestJobElementNotReadWhole(t *testing.T) {
	t.Parallel()
	huge := `{"name":"` + strings.Repeat("x", 8<<20) + `"}`
	for _, c := range []struct{ name, contentType, body, named string }{
		{"JSON Lines", ndjson, "{}\n" + huge + "\n{}", "line 2"},
		{"array", "application/json", "[{}, " + huge + ", {}]", "item 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			body := &countingReader{r: strings.NewReader(c.body)}
			r := newRequest("POST", "/widgets", "", "Content-Type", c.contentType)
			r.Body, r.ContentLength = io.NopCloser(body), -1
			refused(t, admitJob(t, r, func(l *JobLimits) { l.MaxElement = 1 << 20 }, partial), 413, c.named, "max_body_size (1048576 bytes)")
			if body.n > 2<<20 {
				t.Errorf("read %d bytes of the body to refuse an element past 1 MiB", body.n)
			}
		})
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestJobChunks: chunks hold at most 1,000 items and about 1 MiB of
// elements, numbered across the job.
func TestJobChunks(t *testing.T) {
	t.Parallel()
	big := `{"name":"` + strings.Repeat("x", 100<<10) + `"}`
	var elems []string
	for range 25 {
		elems = append(elems, big)
	}
	a := mustAdmit(t, linesRequest("POST", strings.Join(elems, "\n")), nil, partial)
	var sizes []int
	for _, c := range a.chunks {
		sizes = append(sizes, len(c.items))
		n := 0
		for _, it := range c.items {
			n += len(it.Element)
		}
		if n > chunkBytes {
			t.Errorf("chunk at %d holds %d bytes of elements, more than %d", c.first, n, chunkBytes)
		}
	}
	equal(t, "chunk sizes", fmt.Sprint(sizes), "[10 10 5]")
	equal(t, "third chunk's first", a.chunks[2].first, 20)

	huge := `{"name":"` + strings.Repeat("x", 2<<20) + `"}`
	a = mustAdmit(t, linesRequest("POST", "{}\n"+huge+"\n{}"), func(l *JobLimits) { l.MaxElement = 4 << 20 }, partial)
	equal(t, "an element past 1 MiB is a chunk of its own", len(a.chunks), 3)
}

// TestJobChunkFailure: a chunk that cannot be stored stops the job: 503,
// and chunk's error for the log.
func TestJobChunkFailure(t *testing.T) {
	t.Parallel()
	m, _ := widgets(t, partial).Lookup("/widgets")
	storage := errors.New("storage down")
	calls := 0
	plan, prob, err := AdmitJob(linesRequest("PATCH", strings.Join(updates(3000), "\n")), m, policy.OpUpdate, jobLimits(m),
		func(first int, items []ItemSnapshot) error {
			if calls++; first == 1000 {
				return storage
			}
			return nil
		})
	if plan != nil || prob == nil || prob.Status != 503 || !strings.HasSuffix(prob.Type, "#problem-storage-unavailable") {
		t.Fatalf("AdmitJob = %v, %+v; want a 503 storage-unavailable", plan, prob)
	}
	if !errors.Is(err, storage) || !strings.Contains(err.Error(), "items 1000 to 1999") {
		t.Errorf("error %v, want the chunk's, naming its items", err)
	}
	equal(t, "chunks tried", calls, 2)
}

// TestJobMemoryIsBounded: admitting 100,000 lines holds no more than
// admitting 10,000 does, but for an update's ids: 16 bytes of digest and
// a position each, in a map. Not parallel: it reads the process's heap,
// and the parallel tests wait until it is done.
func TestJobMemoryIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("admits 220,000 lines")
	}
	peak := func(method string, n int) int64 {
		m, _ := widgets(t, partial).Lookup("/widgets")
		r := linesRequest(method, "")
		r.Body, r.ContentLength = io.NopCloser(&generatedLines{n: n, update: method == "PATCH"}), -1
		var most uint64
		var stats runtime.MemStats
		_, prob, _ := AdmitJob(r, m, jobOp(method), jobLimits(m), func(int, []ItemSnapshot) error {
			runtime.GC()
			runtime.ReadMemStats(&stats)
			most = max(most, stats.HeapAlloc)
			return nil
		})
		if prob != nil {
			t.Fatalf("refused: %s", prob.Detail)
		}
		return int64(most)
	}
	for _, c := range []struct {
		method  string
		perItem int64 // what each item may add to the peak
	}{
		{"POST", 0},
		{"PATCH", 48},
	} {
		grown := peak(c.method, 100000) - peak(c.method, 10000)
		if allowed := 90000*c.perItem + 1<<20; grown > allowed {
			t.Errorf("%s: the peak heap grew by %d bytes from 10,000 to 100,000 lines, more than %d", c.method, grown, allowed)
		}
	}
}

// generatedLines is a JSON Lines body of n creates or updates, made as it
// is read, so that the test holds no body.
type generatedLines struct {
	n, i    int
	update  bool
	pending []byte
}

func (g *generatedLines) Read(p []byte) (int, error) {
	for len(g.pending) < len(p) && g.i < g.n {
		if g.update {
			g.pending = fmt.Appendf(g.pending, "{\"id\":%d,\"name\":\"w\"}\n", g.i)
		} else {
			g.pending = fmt.Appendf(g.pending, "{\"name\":\"w%d\"}\n", g.i)
		}
		g.i++
	}
	if len(g.pending) == 0 {
		return 0, io.EOF
	}
	n := copy(p, g.pending)
	g.pending = g.pending[:copy(g.pending, g.pending[n:])]
	return n, nil
}

// TestJobOp: what starts a job is what a synchronous batch is, and JSON
// Lines besides; a single create and a LIST stay what they are, their
// bodies whole.
func TestJobOp(t *testing.T) {
	for _, tt := range []struct {
		name   string
		r      *http.Request
		op     policy.Op
		isJob  bool
		bodyIs string
	}{
		{"JSON Lines create", linesRequest("POST", `{"name":"a"}`), policy.OpCreate, true, `{"name":"a"}`},
		{"JSON Lines update", linesRequest("PATCH", `{"id":1}`), policy.OpUpdate, true, `{"id":1}`},
		{"array create", newRequest("POST", "/widgets", ` [{"name":"a"}]`), policy.OpCreate, true, ` [{"name":"a"}]`},
		{"single create", newRequest("POST", "/widgets", `{"name":"a"}`), policy.OpCreate, false, `{"name":"a"}`},
		{"GET with ids", newRequest("GET", "/widgets?ids=1,2", ""), policy.OpGet, true, ""},
		{"LIST", newRequest("GET", "/widgets", ""), policy.OpGet, false, ""},
		{"DELETE", newRequest("DELETE", "/widgets?ids=1", ""), policy.OpDelete, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, _ := widgets(t).Lookup("/widgets")
			op, isJob, err := JobOp(tt.r, m.Resource)
			if err != nil || isJob != tt.isJob || isJob && op != tt.op {
				t.Fatalf("JobOp = %v, %v, %v; want %v, %v", op, isJob, err, tt.op, tt.isJob)
			}
			if body, _ := io.ReadAll(tt.r.Body); string(body) != tt.bodyIs {
				t.Errorf("body left %q, want %q", body, tt.bodyIs)
			}
		})
	}
}
