package batch

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// writeRaw answers the client with res and returns what it would receive,
// undecoded: a lenient decoder (Go's replaces invalid UTF-8) would hide
// the answer's faults.
func writeRaw(t testing.TB, res *Result) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := res.Write(rec); err != nil {
		t.Fatalf("Write: %v", err)
	}
	return rec
}

// strictJSON fails the test unless raw is JSON as RFC 8259 defines it for
// interchange: valid syntax, and UTF-8 throughout.
func strictJSON(t testing.TB, raw []byte) {
	t.Helper()
	if !utf8.Valid(raw) {
		t.Fatalf("the answer is not valid UTF-8: %q", raw)
	}
	if !json.Valid(raw) {
		t.Fatalf("the answer is not valid JSON: %s", raw)
	}
}

// docs/wire-format.md, "Batch requests and responses": a JSON item body that is not valid UTF-8 goes in body_text,
// as valid UTF-8 cut at 4 KiB, so the answer is always valid JSON.
func TestItemBodyNotUTF8(t *testing.T) {
	t.Parallel()
	manyBad := strings.Repeat("\xffa", 3000) // 6000 bytes; each \xff becomes 3
	f := newFake().
		on("GET", "/widgets/1", reply(200, "{\"name\":\"\xff\"}", "Content-Type", "application/json")).
		on("GET", "/widgets/2", reply(200, `{"name":"é"}`, "Content-Type", "application/json")).
		on("GET", "/widgets/3", reply(200, `{"name":"`+manyBad+`"}`, "Content-Type", "application/json")).
		on("GET", "/widgets/4", reply(500, manyBad, "Content-Type", "text/plain"))
	res := run(mustPlan(t, newRequest("GET", "/widgets?ids=1,2,3,4", ""), partial), f)
	rec := writeRaw(t, res)
	strictJSON(t, rec.Body.Bytes())

	w := write(t, res)
	one, two, three, four := w.Items[0], w.Items[1], w.Items[2], w.Items[3]
	if one.Body != nil {
		t.Errorf("items[0].body = %q, want none: it is not UTF-8", one.Body)
	}
	equal(t, "items[0].body_text", one.BodyText, `{"name":"`+"\uFFFD"+`"}`)
	jsonEqual(t, "items[1].body (valid UTF-8 stays JSON)", string(two.Body), `{"name":"é"}`)
	equal(t, "items[1].body_text", two.BodyText, "")
	for i, it := range []struct {
		name string
		text string
	}{{"items[2]", three.BodyText}, {"items[3]", four.BodyText}} {
		if it.text == "" || len(it.text) > bodyTextLimit || !utf8.ValidString(it.text) {
			t.Errorf("%s.body_text: %d bytes, valid UTF-8 %v; want 1 to %d bytes of valid UTF-8",
				it.name, len(it.text), utf8.ValidString(it.text), bodyTextLimit)
		}
		if i == 1 && !strings.HasPrefix(it.text, "\uFFFDa\uFFFDa") {
			t.Errorf("%s.body_text starts %q", it.name, it.text[:min(len(it.text), 12)])
		}
	}
}

// docs/wire-format.md, "Batch requests and responses": when the batch's status is an item's status, the headers that
// status requires come with it — and only then.
func TestStatusHeadersLifted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		target string
		mods   []specMod
		fake   func() *fakeAPI
		status int
		header string // the header the answer must carry, and its values
		want   []string
		absent []string // headers the answer must not carry
	}{
		{name: "401 with WWW-Authenticate, every challenge", target: "/widgets?ids=1,2",
			fake: func() *fakeAPI {
				return newFake().seed("1", "2").on("GET", "/widgets/2",
					reply(401, `{"error":"who are you"}`, "WWW-Authenticate", `Bearer realm="api"`, "WWW-Authenticate", `Basic realm="api"`))
			},
			status: 401, header: "WWW-Authenticate", want: []string{`Bearer realm="api"`, `Basic realm="api"`}},
		{name: "405 with Allow", target: "/widgets?ids=1",
			fake: func() *fakeAPI {
				return newFake().on("GET", "/widgets/1", reply(405, "no", "Allow", "PUT, DELETE"))
			},
			status: 405, header: "Allow", want: []string{"PUT, DELETE"}},
		{name: "407 with Proxy-Authenticate", target: "/widgets?ids=1",
			fake: func() *fakeAPI {
				return newFake().on("GET", "/widgets/1", reply(407, "no", "Proxy-Authenticate", `Basic realm="proxy"`))
			},
			status: 407, header: "Proxy-Authenticate", want: []string{`Basic realm="proxy"`}},
		{name: "the batch's status is another item's: nothing lifted", target: "/widgets?ids=1,2", mods: []specMod{concurrency(1)},
			fake: func() *fakeAPI {
				return newFake().
					on("GET", "/widgets/1", reply(403, "no")).
					on("GET", "/widgets/2", reply(401, "no", "WWW-Authenticate", `Basic realm="api"`))
			},
			status: 403, absent: []string{"WWW-Authenticate"}},
		{name: "partial: 207, nothing lifted", target: "/widgets?ids=1,2", mods: []specMod{partial},
			fake: func() *fakeAPI {
				return newFake().seed("1").on("GET", "/widgets/2", reply(401, "no", "WWW-Authenticate", `Basic realm="api"`))
			},
			status: 207, absent: []string{"WWW-Authenticate"}},
		{name: "a header the status does not require is not lifted", target: "/widgets?ids=1",
			fake: func() *fakeAPI {
				return newFake().on("GET", "/widgets/1", reply(401, "no", "Allow", "GET", "Proxy-Authenticate", "Basic"))
			},
			status: 401, absent: []string{"Allow", "Proxy-Authenticate", "WWW-Authenticate"}},
		{name: "a success: nothing lifted", target: "/widgets?ids=1",
			fake: func() *fakeAPI {
				return newFake().on("GET", "/widgets/1", reply(200, `{"id":"1"}`, "WWW-Authenticate", "Basic", "Allow", "GET"))
			},
			status: 200, absent: []string{"WWW-Authenticate", "Allow"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := write(t, run(mustPlan(t, newRequest("GET", tt.target, ""), tt.mods...), tt.fake()))
			equal(t, "status", w.Code, tt.status)
			if tt.header != "" {
				equalSlices(t, tt.header, w.Header.Values(tt.header), tt.want)
			}
			for _, name := range tt.absent {
				if v := w.Header.Values(name); len(v) > 0 {
					t.Errorf("the answer carries %s %q", name, v)
				}
			}
			for i, it := range w.Items {
				for _, name := range []string{"WWW-Authenticate", "Proxy-Authenticate", "Allow"} {
					if _, ok := it.Headers[name]; ok {
						t.Errorf("items[%d].headers holds %s: it is the answer's header, not the item's", i, name)
					}
				}
			}
		})
	}
}

// The answer of an item refused by a handler before the upstream (a
// sender that answers without a body) still lifts its challenge.
func TestStatusHeadersOfAWrite(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2").on("DELETE", "/widgets/2",
		reply(http.StatusUnauthorized, "", "WWW-Authenticate", `Basic realm="restricted"`))
	before := f.state()
	w := write(t, run(mustPlan(t, newRequest("DELETE", "/widgets?ids=1,2", ""), concurrency(1)), f))
	equal(t, "status", w.Code, 401)
	equal(t, "outcome", w.Outcome, "rolled_back")
	equal(t, "WWW-Authenticate", w.Header.Get("WWW-Authenticate"), `Basic realm="restricted"`)
	f.checkUnchanged(t, before)
}
