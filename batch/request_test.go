package batch

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

// ---------------------------------------------------------------------
// What each sub-request looks like (docs/wire-format.md,
// "Batch requests and responses").

// scopeQuery names the query parameters an all-or-nothing write batch
// keeps (scope_query).
func scopeQuery(names ...string) specMod {
	return settings(func(s *policy.Settings) { s.ScopeQuery = names })
}

// Other query parameters are kept on each sub-request, in their order;
// the ids parameter goes. An all-or-nothing write keeps only what
// scope_query names, and is refused when the query holds anything else
// (TestScopeQuery).
func TestSubRequestQuery(t *testing.T) {
	t.Parallel()
	keys := settings(func(s *policy.Settings) { s.IDsParam = "keys" })
	tests := []struct {
		name, method, target, body string
		mods                       []specMod
		paths                      []string
		query                      string
	}{
		{name: "batch GET", method: "GET", target: "/widgets?b=2&ids=1,2&a=1&c=%20x&a=0",
			paths: []string{"/widgets/1", "/widgets/2"}, query: "b=2&a=1&c=%20x&a=0"},
		{name: "batch GET, ids first", method: "GET", target: "/widgets?ids=1&fields=name,color",
			paths: []string{"/widgets/1"}, query: "fields=name,color"},
		{name: "batch GET, ids only", method: "GET", target: "/widgets?ids=1",
			paths: []string{"/widgets/1"}, query: ""},
		{name: "custom ids_param", method: "GET", target: "/widgets?ids=9&keys=1,2", mods: []specMod{keys},
			paths: []string{"/widgets/1", "/widgets/2"}, query: "ids=9"},
		{name: "batch DELETE", method: "DELETE", target: "/widgets?force=1&ids=1,2", mods: []specMod{partial},
			paths: []string{"/widgets/1", "/widgets/2"}, query: "force=1"},
		{name: "batch CREATE, partial", method: "POST", target: "/widgets?notify=0&fields=a", body: elements(2), mods: []specMod{partial},
			paths: []string{"/widgets", "/widgets"}, query: "notify=0&fields=a"},
		{name: "batch CREATE, scoped", method: "POST", target: "/widgets?tenant=t%201", body: elements(2), mods: []specMod{scopeQuery("tenant")},
			paths: []string{"/widgets", "/widgets"}, query: "tenant=t%201"},
		{name: "batch DELETE, scoped, in the client's order and spelling", method: "DELETE", target: "/widgets?key=k&ids=1,2&%74enant=a+b&key=j",
			mods:  []specMod{scopeQuery("tenant", "key")},
			paths: []string{"/widgets/1", "/widgets/2", "/widgets/1", "/widgets/2"}, query: "key=k&%74enant=a+b&key=j"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake().seed("1", "2")
			w := write(t, run1(t, tt.method, tt.target, tt.body, f, append(tt.mods, concurrency(1))...))
			equal(t, "outcome", w.Outcome, "succeeded")
			log := f.log()
			equalSlices(t, "paths", pathsOf(log), tt.paths)
			for _, c := range log {
				equal(t, c.String()+" query", c.RawQuery, tt.query)
			}
		})
	}
}

// id_field names the id in update and create elements and in a created
// item's body.
func TestCustomIDField(t *testing.T) {
	t.Parallel()
	uuid := settings(func(s *policy.Settings) { s.IDField = "uuid" })
	t.Run("update", func(t *testing.T) {
		f := newFake().seed("u1")
		w := write(t, run1(t, "PATCH", "/widgets", `[{"uuid":"u1","name":"x","id":"keep"}]`, f, uuid, partial))
		equalSlices(t, "sent", f.sent(), []string{"PATCH /widgets/u1"})
		jsonEqual(t, "update body", f.log()[0].Body, `{"id":"keep","name":"x"}`)
		equalSlices(t, "ids", w.IDs(), []string{"u1"})
	})
	t.Run("update without it", func(t *testing.T) {
		_, prob := parse(t, newRequest("PATCH", "/widgets", `[{"id":"1","name":"x"}]`), uuid)
		if prob == nil || prob.Status != 400 || !strings.Contains(prob.Detail, `"uuid"`) {
			t.Errorf("problem = %+v; want 400 naming \"uuid\"", prob)
		}
	})
	t.Run("created id from the body", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", reply(201, `{"id":"not-this","uuid":"u-9"}`), reply(409, `{}`)).
			on("GET", "/widgets/u-9", reply(200, `{"id":"not-this","uuid":"u-9"}`))
		w := write(t, run1(t, "POST", "/widgets", elements(2), f, uuid, concurrency(1)))
		equalSlices(t, "compensations", pathsOf(f.sentWith("DELETE")), []string{"/widgets/u-9"})
		equal(t, "created id", w.Items[0].ID, "u-9")
	})
}

// Write bodies are JSON; an update's is its element without the id field,
// a create's its element as sent.
func TestWriteBodies(t *testing.T) {
	t.Parallel()
	t.Run("update", func(t *testing.T) {
		f := newFake().seed("1", "2")
		run1(t, "PATCH", "/widgets", `[{"id":"1","name":"n","nested":{"id":5}}, {"color":null,"id":2}]`, f, partial, concurrency(1))
		log := f.log()
		jsonEqual(t, "item 0 body", log[0].Body, `{"name":"n","nested":{"id":5}}`)
		jsonEqual(t, "item 1 body", log[1].Body, `{"color":null}`)
		for _, c := range log {
			equal(t, c.String()+" Content-Type", c.Header.Get("Content-Type"), "application/json")
		}
	})
	t.Run("create", func(t *testing.T) {
		f := newFake()
		run1(t, "POST", "/widgets", `[{"id":"x","name":"a"}, {"name":"b","tags":[1,2]}]`, f, partial, concurrency(1))
		log := f.log()
		equal(t, "item 0 body", log[0].Body, `{"id":"x","name":"a"}`)
		equal(t, "item 1 body", log[1].Body, `{"name":"b","tags":[1,2]}`)
		for _, c := range log {
			equal(t, c.String()+" Content-Type", c.Header.Get("Content-Type"), "application/json")
		}
	})
	t.Run("bodiless requests carry no Content-Type", func(t *testing.T) {
		f := newFake().seed("1")
		run(mustPlan(t, newRequest("DELETE", "/widgets?ids=1", "", "Content-Type", "application/json")), f)
		for _, c := range f.log() {
			if c.Body != "" || c.Header.Get("Content-Type") != "" {
				t.Errorf("%s: body %q, Content-Type %q", c, c.Body, c.Header.Get("Content-Type"))
			}
		}
	})
}

// The client's headers are forwarded, except hop-by-hop ones, those named
// in Connection, Content-Length, Expect, Accept-Encoding, Idempotency-Key,
// preconditions, and the Content-* of the batch body.
func TestForwardedHeaders(t *testing.T) {
	t.Parallel()
	kept := map[string]string{
		"Authorization": "Bearer t0k3n",
		"Cookie":        "session=abc; theme=dark",
		"X-Trace":       "trace-1",
		"Traceparent":   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Accept":        "application/json",
		"User-Agent":    "client/1.0",
	}
	dropped := map[string]string{
		"Connection":          "keep-alive, X-Secret",
		"X-Secret":            "named in Connection",
		"Keep-Alive":          "timeout=5",
		"Proxy-Connection":    "keep-alive",
		"Proxy-Authorization": "Basic eDp5",
		"Te":                  "trailers",
		"Trailer":             "X-Sum",
		"Upgrade":             "h2c",
		"Content-Length":      "123",
		"Expect":              "100-continue",
		"Accept-Encoding":     "gzip",
		"Idempotency-Key":     `"batch-key"`,
		"If-Match":            `"etag-of-the-collection"`,
		"If-None-Match":       "*",
		"Content-Language":    "en",
		"Content-Md5":         "Q2hlY2sgSW50ZWdyaXR5IQ==",
		"Content-Disposition": "inline",
	}
	var header []string
	for k, v := range kept {
		header = append(header, k, v)
	}
	for k, v := range dropped {
		header = append(header, k, v)
	}
	header = append(header, "Content-Type", "application/json; charset=utf-8")
	for _, tt := range []struct{ method, target, body string }{
		{"PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`},
		{"GET", "/widgets?ids=1,2", ""},
	} {
		t.Run(tt.method, func(t *testing.T) {
			f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(409, `{}`)) // so that a compensation is sent too
			run(mustPlan(t, newRequest(tt.method, tt.target, tt.body, header...)), f)
			log := f.log()
			if tt.method == "PATCH" && len(log) != 6 { // 2 GETs, 2 PATCHes, 1 GET (the undo's proof), 1 PUT
				t.Fatalf("sent %v", f.sent())
			}
			for _, c := range log {
				for k, v := range kept {
					equal(t, c.String()+" "+k, strings.Join(c.Header.Values(k), "|"), v)
				}
				for k := range dropped {
					if v := c.Header.Values(k); len(v) > 0 && !(k == "Idempotency-Key" && c.Method != "GET") {
						t.Errorf("%s carries %s: %q", c, k, v)
					}
				}
				switch c.Method {
				case "GET":
					equal(t, c.String()+" Content-Type", c.Header.Get("Content-Type"), "")
					equal(t, c.String()+" Idempotency-Key", c.Header.Get("Idempotency-Key"), "")
				default:
					equal(t, c.String()+" Content-Type", c.Header.Get("Content-Type"), "application/json")
					if k := c.Header.Get("Idempotency-Key"); k == "" || k == `"batch-key"` {
						t.Errorf("%s Idempotency-Key = %q", c, k)
					}
				}
			}
		})
	}
}

// Each write carries an Idempotency-Key derived from the batch's and the
// item's index: the client's form (quoted or bare) is kept, every key is
// distinct and none is the client's own; the same batch sent again with
// the same key derives the same keys.
func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, client string
		quoted       bool
		base         string
	}{
		{name: "quoted", client: `"k-1"`, quoted: true, base: "k-1"},
		{name: "bare", client: `k-1`, quoted: false, base: "k-1"},
		{name: "none: generated", client: ``},
	}
	writes := []struct{ method, target, body string }{
		{"POST", "/widgets", elements(4)},
		{"PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":1},{"id":"3","v":1},{"id":"4","v":1}]`},
		{"DELETE", "/widgets?ids=1,2,3,4", ""},
	}
	for _, tt := range tests {
		for _, wr := range writes {
			t.Run(tt.name+"/"+wr.method, func(t *testing.T) {
				keysOf := func() []string {
					f := newFake().seed("1", "2", "3", "4")
					var h []string
					if tt.client != "" {
						h = []string{"Idempotency-Key", tt.client}
					}
					run(mustPlan(t, newRequest(wr.method, wr.target, wr.body, h...), concurrency(1)), f)
					var keys []string
					for _, c := range f.sentWith(wr.method) {
						keys = append(keys, c.Header.Get("Idempotency-Key"))
					}
					return keys
				}
				keys := keysOf()
				if len(keys) != 4 {
					t.Fatalf("keys %q", keys)
				}
				seen := map[string]bool{}
				for i, k := range keys {
					if k == "" || seen[k] || k == tt.client {
						t.Errorf("item %d key %q: empty, repeated, or the client's", i, k)
					}
					seen[k] = true
					if tt.client == "" {
						continue
					}
					isQuoted := len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"'
					equal(t, fmt.Sprintf("item %d key %s quoted", i, k), isQuoted, tt.quoted)
					if !strings.Contains(k, tt.base) {
						t.Errorf("item %d key %q is not derived from %q", i, k, tt.base)
					}
				}
				again := keysOf()
				if tt.client != "" {
					equalSlices(t, "keys of the same batch sent again", again, keys)
				} else if slices.Equal(again, keys) {
					t.Errorf("two batches without a key derived the same keys %q", keys)
				}
			})
		}
	}
	t.Run("GET carries none", func(t *testing.T) {
		f := newFake().seed("1")
		run(mustPlan(t, newRequest("GET", "/widgets?ids=1", "", "Idempotency-Key", `"k"`)), f)
		equal(t, "key", f.log()[0].Header.Get("Idempotency-Key"), "")
	})
}

// ---------------------------------------------------------------------
// Prefer: atomicity=... (README, "Configuration": allow_override).

func TestPreferAtomicity(t *testing.T) {
	t.Parallel()
	partialResource := settings(func(s *policy.Settings) { s.SetAtomicity(policy.Partial) })
	tests := []struct {
		name    string
		mods    []specMod
		prefer  string
		want    policy.Atomicity
		applied string
	}{
		{"override on: partial", []specMod{override}, "atomicity=partial", policy.Partial, "atomicity=partial"},
		{"override off: ignored", nil, "atomicity=partial", policy.AllOrNothing, ""},
		{"override on: all-or-nothing on a partial resource", []specMod{override, partialResource}, "atomicity=all-or-nothing", policy.AllOrNothing, "atomicity=all-or-nothing"},
		{"override off: all-or-nothing ignored", []specMod{partialResource}, "atomicity=all-or-nothing", policy.Partial, ""},
		{"among other preferences", []specMod{override}, "return=minimal, atomicity=partial; x=1", policy.Partial, "atomicity=partial"},
		{"quoted value", []specMod{override}, `atomicity="partial"`, policy.Partial, "atomicity=partial"},
		{"name is case-insensitive", []specMod{override}, "Atomicity=partial", policy.Partial, "atomicity=partial"},
		{"unknown value", []specMod{override}, "atomicity=some", policy.AllOrNothing, ""},
		{"no preference", []specMod{override}, "", policy.AllOrNothing, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h []string
			if tt.prefer != "" {
				h = []string{"Prefer", tt.prefer}
			}
			p := mustPlan(t, newRequest("POST", "/widgets", elements(2), h...), append(tt.mods, concurrency(1))...)
			equal(t, "atomicity", p.Atomicity, tt.want)
			equal(t, "PreferenceApplied", p.PreferenceApplied, tt.applied)
			f := newFake().on("POST", "/widgets", answer{}, reply(409, `{}`))
			w := write(t, run(p, f))
			equal(t, "Preference-Applied", w.Header.Get("Preference-Applied"), tt.applied)
			equal(t, "atomicity member", w.Atomicity, tt.want.String())
			if tt.want == policy.Partial {
				equal(t, "status", w.Code, 207)
				equal(t, "DELETEs", len(f.sentWith("DELETE")), 0)
			} else {
				equal(t, "status", w.Code, 409)
				equal(t, "DELETEs", len(f.sentWith("DELETE")), 1)
			}
		})
	}
}

// ---------------------------------------------------------------------
// What an item reports of its answer.

// The largest Retry-After among the items goes on the batch response,
// comparing seconds with HTTP-dates.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	inAnHour := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	inTenSeconds := time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		name   string
		values []string // one item each; "" for none
		want   string
	}{
		{"a date an hour away beats 120 seconds", []string{"120", inAnHour, "30"}, inAnHour},
		{"120 seconds beat a date ten seconds away", []string{inTenSeconds, "120", ""}, "120"},
		{"seconds", []string{"5", "", "60"}, "60"},
		{"junk is ignored", []string{"soon", "7"}, "7"},
		{"none", []string{"", ""}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			for i, v := range tt.values {
				a := reply(503, `{"error":"busy"}`)
				if v != "" {
					a.header.Set("Retry-After", v)
				}
				f.on("GET", fmt.Sprintf("/widgets/%d", i), a)
			}
			// max_throttle_wait 0: each item fails with its first answer,
			// instead of waiting out a Retry-After of 5 seconds until
			// batch_timeout (the waits are throttle_test.go's).
			noWait := settings(func(s *policy.Settings) { s.MaxThrottleWait = 0 })
			w := write(t, run1(t, "GET", "/widgets?ids="+ids(len(tt.values), 0), "", f, partial, noWait))
			equal(t, "Retry-After", w.Header.Get("Retry-After"), tt.want)
			for i, v := range tt.values {
				equal(t, fmt.Sprintf("items[%d] Retry-After", i), w.Items[i].Headers["Retry-After"], v)
			}
		})
	}
}

// A JSON body stays JSON; any other body goes to body_text, cut at 4 KiB
// on a UTF-8 boundary; Location, ETag, Last-Modified and Retry-After are
// copied into the item's headers, nothing else.
func TestItemBodyAndHeaders(t *testing.T) {
	t.Parallel()
	// 1 byte, then two-byte runes: byte 4096 falls inside one.
	html := "<" + strings.Repeat("é", 3000)
	bigJSON := `{"id":"5","blob":"` + strings.Repeat("x", 6000) + `"}`
	f := newFake().
		on("GET", "/widgets/1", reply(200, `{"id": "1", "n": [1, 2]}`,
			"Location", "/widgets/1", "ETag", `"v7"`, "Last-Modified", "Wed, 21 Oct 2015 07:28:00 GMT",
			"Retry-After", "3", "X-Other", "no", "Set-Cookie", "a=b", "Content-Type", "application/json")).
		on("GET", "/widgets/2", reply(502, html, "Content-Type", "text/html")).
		on("GET", "/widgets/3", reply(404, "not found", "Content-Type", "text/plain")).
		on("GET", "/widgets/4", reply(200, ``)).
		on("GET", "/widgets/5", reply(200, bigJSON))
	w := write(t, run1(t, "GET", "/widgets?ids=1,2,3,4,5", "", f, partial))
	one, two, three, four, five := w.Items[0], w.Items[1], w.Items[2], w.Items[3], w.Items[4]

	jsonEqual(t, "items[0].body", string(one.Body), `{"id":"1","n":[1,2]}`)
	equal(t, "items[0].body_text", one.BodyText, "")
	want := map[string]string{"Location": "/widgets/1", "ETag": `"v7"`, "Last-Modified": "Wed, 21 Oct 2015 07:28:00 GMT", "Retry-After": "3"}
	if fmt.Sprint(one.Headers) != fmt.Sprint(want) {
		t.Errorf("items[0].headers = %v, want %v", one.Headers, want)
	}

	if two.Body != nil {
		t.Errorf("items[1].body = %s, want none", two.Body)
	}
	equal(t, "items[1].body_text length", len(two.BodyText), 4095)
	if !strings.HasPrefix(html, two.BodyText) || !strings.HasSuffix(two.BodyText, "é") {
		t.Errorf("items[1].body_text is not the start of the body cut on a rune boundary: ...%q", two.BodyText[len(two.BodyText)-8:])
	}
	equal(t, "items[1].status", two.Status, 502)

	equal(t, "items[2].body_text", three.BodyText, "not found")
	if three.Body != nil || three.Headers != nil {
		t.Errorf("items[2] = %+v", three)
	}
	if four.Body != nil || four.BodyText != "" {
		t.Errorf("an empty body is reported: %+v", four)
	}
	jsonEqual(t, "a large JSON body, whole", string(five.Body), bigJSON)
}

func TestCutText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in    string
		limit int
		want  string
	}{
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"},
		{"a€b", 3, "a"},
		{"a€b", 4, "a€"},
		{"😀😀", 7, "😀"},
		{"a\xffb", 10, "a\uFFFDb"},
	}
	for _, tt := range tests {
		equal(t, fmt.Sprintf("cutText(%q, %d)", tt.in, tt.limit), cutText([]byte(tt.in), tt.limit), tt.want)
	}
}

// An all-or-nothing write batch carries only the query parameters
// scope_query names, on every request it sends: any other is refused
// before anything is sent, since one that shapes the items ($select,
// fields) would make the preflight read a partial item and an undo put
// only that back. A batch GET, and a partial batch (configured, or
// chosen with Prefer under allow_override), keep the whole query.
func TestScopeQuery(t *testing.T) {
	t.Parallel()
	tenant := scopeQuery("tenant", "api_key")
	tests := []struct {
		name, method, target, body string
		header                     []string
		mods                       []specMod
		refused                    string // the parameter the detail names; "" when accepted
		query                      string // what every sub-request carries, when accepted
	}{
		{name: "delete, shaping parameter", method: "DELETE", target: "/widgets?ids=1,2&$select[]=name", refused: "$select[]"},
		{name: "delete, escaped shaping parameter", method: "DELETE", target: "/widgets?ids=1&%24select%5B%5D=name", mods: []specMod{tenant}, refused: "$select[]"},
		{name: "update, one unscoped among scoped", method: "PATCH", target: "/widgets?tenant=a&fields=name&api_key=k", body: `[{"id":1,"v":1}]`, mods: []specMod{tenant}, refused: "fields"},
		{name: "create, bare parameter", method: "POST", target: "/widgets?include", body: elements(1), refused: "include"},
		{name: "create, the ids parameter is not a batch's own", method: "POST", target: "/widgets?ids=1", body: elements(1), refused: "ids"},
		{name: "update, scoped", method: "PATCH", target: "/widgets?api_key=k&tenant=a", body: `[{"id":1,"v":1}]`, mods: []specMod{tenant}, query: "api_key=k&tenant=a"},
		{name: "delete, _method is not the client's", method: "DELETE", target: "/widgets?ids=1&_method=DELETE", query: ""},
		{name: "delete, partial", method: "DELETE", target: "/widgets?ids=1&fields=name", mods: []specMod{partial}, query: "fields=name"},
		{name: "update, partial by Prefer", method: "PATCH", target: "/widgets?fields=name", body: `[{"id":1,"v":1}]`,
			header: []string{"Prefer", "atomicity=partial"}, mods: []specMod{override}, query: "fields=name"},
		{name: "get", method: "GET", target: "/widgets?ids=1&fields=name", query: "fields=name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake().seed("1", "2")
			p, prob := parse(t, newRequest(tt.method, tt.target, tt.body, tt.header...), append(tt.mods, concurrency(1))...)
			if tt.refused != "" {
				if prob == nil {
					t.Fatalf("accepted; want 400 naming %q", tt.refused)
				}
				equal(t, "status", prob.Status, 400)
				for _, s := range []string{strconv.Quote(tt.refused), "all-or-nothing", "scope_query"} {
					if !strings.Contains(prob.Detail, s) {
						t.Errorf("detail %q does not contain %q", prob.Detail, s)
					}
				}
				return
			}
			if prob != nil {
				t.Fatalf("refused: %d %s", prob.Status, prob.Detail)
			}
			run(p, f)
			if len(f.log()) == 0 {
				t.Fatal("nothing was sent")
			}
			for _, c := range f.log() {
				equal(t, c.String()+" query", c.RawQuery, tt.query)
			}
		})
	}
}

// The refusal says how to send the batch as partial when the client may
// choose it.
func TestScopeQueryDetailOffersPartial(t *testing.T) {
	t.Parallel()
	target := "/widgets?ids=1&fields=name"
	_, prob := parse(t, newRequest("DELETE", target, ""))
	if prob == nil || strings.Contains(prob.Detail, "Prefer") {
		t.Errorf("without allow_override: %+v; want a refusal that does not offer Prefer", prob)
	}
	_, prob = parse(t, newRequest("DELETE", target, ""), override)
	if prob == nil || !strings.Contains(prob.Detail, "Prefer: atomicity=partial") {
		t.Errorf("with allow_override: %+v; want a refusal that offers Prefer: atomicity=partial", prob)
	}
}

// docs/wire-format.md, "Method overrides": no sub-request carries a method override, whatever the
// client sent: not the headers, not _method in the query.
func TestSubRequestsCarryNoMethodOverride(t *testing.T) {
	t.Parallel()
	override := []string{"X-HTTP-Method-Override", "POST", "X-HTTP-Method", "POST", "X-Method-Override", "POST"}
	tests := []struct {
		name, method, target, body string
		query                      string
	}{
		{name: "batch GET", method: "GET", target: "/widgets?_method=GET&ids=1,2&x=1", query: "x=1"},
		{name: "batch DELETE", method: "DELETE", target: "/widgets?ids=1,2&_method=DELETE", query: ""},
		{name: "batch CREATE", method: "POST", target: "/widgets?notify=0&_method=POST", body: elements(2), query: "notify=0"},
		{name: "batch UPDATE", method: "PATCH", target: "/widgets?_method=PATCH", body: `[{"id":"1","v":1},{"id":"2","v":2}]`, query: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// An update whose second item fails, so that preflight reads
			// and an undo are sent too.
			f := newFake().seed("1", "2").on("PATCH", "/widgets/2", reply(409, `{}`))
			run(mustPlan(t, newRequest(tt.method, tt.target, tt.body, override...), concurrency(1), scopeQuery("notify")), f)
			log := f.log()
			if len(log) == 0 {
				t.Fatal("nothing was sent")
			}
			for _, c := range log {
				equal(t, c.String()+" query", c.RawQuery, tt.query)
				for i := 0; i < len(override); i += 2 {
					if v := c.Header.Values(override[i]); len(v) > 0 {
						t.Errorf("%s carries %s %q", c, override[i], v)
					}
				}
			}
		})
	}
}

// A client's Prefer: respond-async is the gateway's to honour or ignore
// (RFC 7240): it answers the batch at once, so no sub-request carries it,
// where an upstream that honoured it would answer a write 202 before
// doing it. The client's other preferences go on, as written.
func TestRespondAsyncNotForwarded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		prefer []string
		want   string
	}{
		{"with others", []string{"respond-async, return=representation"}, "return=representation"},
		{"alone", []string{"RESPOND-ASYNC"}, ""},
		{"two headers", []string{"respond-async", `wait=5, handling="lenient"`}, `wait=5, handling="lenient"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRequest("PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2}]`)
			for _, p := range tc.prefer {
				r.Header.Add("Prefer", p)
			}
			f := newFake().seed("1", "2")
			if res := run(mustPlan(t, r), f); res.Outcome != Succeeded {
				t.Fatalf("outcome %s: %s", res.Outcome, res.Detail)
			}
			for _, c := range f.log() {
				equal(t, c.String()+" Prefer", strings.Join(c.Header.Values("Prefer"), "|"), tc.want)
			}
		})
	}
}
