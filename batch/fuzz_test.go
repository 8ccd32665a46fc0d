package batch

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/jsonvalue"
	"github.com/caddy-batch/caddy-batch/policy"
)

// fuzzMaxItems keeps the fuzzers' batches small, so the max_items rule is
// reached often.
const fuzzMaxItems = 8

func fuzzMatch(t testing.TB) policy.Match {
	m, ok := widgets(t, maxItems(fuzzMaxItems), settings(func(s *policy.Settings) { s.MaxBodySize = 4096 })).Lookup("/widgets")
	if !ok {
		t.Fatal("no /widgets")
	}
	return m
}

// checkPlan asserts what every plan Parse accepts must hold: no id can
// reach another path, and the limits hold.
func checkPlan(t *testing.T, p *Plan, op policy.Op) {
	t.Helper()
	if len(p.Items) == 0 || len(p.Items) > fuzzMaxItems {
		t.Fatalf("%s plan with %d items (max_items %d)", op, len(p.Items), fuzzMaxItems)
	}
	seen := map[string]bool{}
	for i, it := range p.Items {
		if it.ID == "" {
			if op != policy.OpCreate {
				t.Fatalf("%s item %d has an empty id", op, i)
			}
			continue
		}
		if reason := badID(it.ID); reason != "" {
			t.Fatalf("item %d id %q was accepted, but %s", i, it.ID, reason)
		}
		if (op == policy.OpUpdate || op == policy.OpDelete) && seen[it.ID] {
			t.Fatalf("%s accepted id %q twice", op, it.ID)
		}
		seen[it.ID] = true
		path := p.Match.ItemPath(it.ID)
		seg, ok := strings.CutPrefix(path, p.Match.CollectionPath()+"/")
		if !ok || seg == "" || strings.Contains(seg, "/") {
			t.Fatalf("id %q: item path %q is not one segment under the collection", it.ID, path)
		}
		if u, err := url.PathUnescape(seg); err != nil || u != it.ID {
			t.Fatalf("id %q: item path %q unescapes to %q, %v", it.ID, path, u, err)
		}
	}
}

func checkProblem(t *testing.T, status int) {
	t.Helper()
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
	default:
		t.Fatalf("problem status %d, want 400, 413 or 415", status)
	}
}

func FuzzParseIDs(f *testing.F) {
	for _, q := range []string{
		"ids=1,2,3", "ids=", "ids", "ids=1,,2", "ids=1,", "ids=,", "ids=1&ids=2", "a=1&ids=2&b=3",
		"ids=..", "ids=.", "ids=%2e%2e", "ids=%2E%2e", "ids=.%2e", "ids=1%2F2", "ids=a%5Cb", "ids=%00", "ids=%7F",
		"ids=%FF", "ids=%C3", "ids=%C2%85", "ids=a%0Ab", "ids=1%2C2", "ids=a%20b", "ids=%C3%A9", "ids=a:b", "ids=x+y",
		"ids=%zz", "ids=%", "%69ds=1", "ids=1,2,3,4,5,6,7,8,9", "ids=1,1,1", "ids=%2F%2F", "ids=..%2F..%2Fadmin",
		"ids=%252e%252e", "%zz=1&ids=1", "a%=&ids=2", "ids=;", "ids=?", "ids=%23", "ids=%3F", "ids=\u00e9", "ids=a&ids=", "&&ids=1&&",
	} {
		f.Add(q)
	}
	m := fuzzMatch(f)
	f.Fuzz(func(t *testing.T, rawQuery string) {
		for _, op := range []policy.Op{policy.OpGet, policy.OpDelete} {
			method := http.MethodGet
			if op == policy.OpDelete {
				method = http.MethodDelete
			}
			r := &http.Request{Method: method, URL: &url.URL{Path: "/widgets", RawQuery: rawQuery}, Header: http.Header{}}
			_, isBatch, err := detectOp(r, m.Resource)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			if named := namesParam(rawQuery, "ids"); isBatch != named {
				t.Fatalf("%s ?%s: Detect says batch %v, but the query names ids: %v", method, rawQuery, isBatch, named)
			}
			if !isBatch { // a LIST, or a DELETE of the collection: Parse is never asked
				continue
			}
			p, prob := parsePlan(r, m, op)
			if prob != nil {
				checkProblem(t, prob.Status)
				continue
			}
			checkPlan(t, p, op)
			if strings.Contains("&"+p.Items[0].tgt.query+"&", "&ids=") {
				t.Fatalf("the ids parameter is left in the sub-requests' query %q", p.Items[0].tgt.query)
			}
		}
	})
}

// namesParam reports whether a raw query has a parameter of that name,
// whatever else in it is malformed.
func namesParam(rawQuery, name string) bool {
	for _, pair := range strings.Split(rawQuery, "&") {
		key, _, _ := strings.Cut(pair, "=")
		if k, err := url.QueryUnescape(key); err == nil && k == name {
			return true
		}
	}
	return false
}

// integerText is a JSON integer: no fraction, no exponent.
var integerText = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

func FuzzParseBody(f *testing.F) {
	for _, b := range []string{
		`[{"id":"1","a":1},{"id":2}]`, `[{"name":"a"},{"name":"b"}]`, `[]`, `[{}]`, `{}`, `null`, `"x"`, `7`, ``, ` `,
		`[1]`, `[[]]`, `[null]`, `[{"id":null}]`, `[{"id":{}}]`, `[{"id":true}]`, `[{"id":[1]}]`, `[{"id":""}]`,
		`[{"id":".."}]`, `[{"id":"."}]`, `[{"id":"%2e%2e"}]`, `[{"id":"1/2"}]`, `[{"id":"1%2F2"}]`, `[{"id":"a\\b"}]`,
		`[{"id":"\u0000"}]`, `[{"id":"\u007f"}]`, `[{"id":"\u0085"}]`, `[{"id":"\ud800"}]`, "[{\"id\":\"\xff\"}]",
		`[{"id":"a b"}]`, `[{"id":"é"}]`, `[{"id":"a:b"}]`, `[{"id":1e400}]`, `[{"id":-0}]`, `[{"id":1.50}]`,
		`[{"id":"7"},{"id":7}]`, `[{"id":1,"id":2}]`, `[{"id":"1"}`, `[{"id":"1"}]]`, `  [ {"id" : "1" } ]  `,
		`[{"id":"1"},{"id":"2"},{"id":"3"},{"id":"4"},{"id":"5"},{"id":"6"},{"id":"7"},{"id":"8"},{"id":"9"}]`,
		"\ufeff[{\"id\":1}]", `[{"ID":1}]`, `[{"id":"x","id":".."}]`,
	} {
		f.Add([]byte(b))
	}
	m := fuzzMatch(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, op := range []policy.Op{policy.OpCreate, policy.OpUpdate} {
			method := http.MethodPost
			if op == policy.OpUpdate {
				method = http.MethodPatch
			}
			r := &http.Request{
				Method: method, URL: &url.URL{Path: "/widgets"}, Header: http.Header{},
				Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
			}
			_, isBatch, err := detectOp(r, m.Resource)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			if op == policy.OpCreate && isBatch != (firstNonSpace(body) >= 0 && body[firstNonSpace(body)] == '[') {
				t.Fatalf("Detect says batch %v for a body starting %q", isBatch, body[:min(len(body), 16)])
			}
			if !isBatch {
				continue
			}
			p, prob := parsePlan(r, m, op)
			if prob != nil {
				checkProblem(t, prob.Status)
				continue
			}
			checkPlan(t, p, op)
			var elems []map[string]json.RawMessage
			_ = json.Unmarshal(body, &elems)
			for i, it := range p.Items {
				if i < len(elems) {
					if raw := elems[i]["id"]; jsonvalue.Kind(raw) == "number" && !integerText.MatchString(it.ID) {
						t.Fatalf("item %d: the number id %s was accepted as %q, which is not an integer", i, raw, it.ID)
					}
				}
				var members map[string]json.RawMessage
				if err := json.Unmarshal(it.Body, &members); err != nil {
					t.Fatalf("item %d body %q is not a JSON object: %v", i, it.Body, err)
				}
				if _, has := members["id"]; has && op == policy.OpUpdate {
					t.Fatalf("update item %d body %s still holds the id", i, it.Body)
				}
			}
		}
	})
}
