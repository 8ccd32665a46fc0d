package batch

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// inputCase is one row of the "Bad input" table (docs/wire-format.md).
type inputCase struct {
	name         string
	method       string
	target       string
	body         string
	header       []string
	prep         func(*http.Request)
	mods         []specMod
	status       int      // 0: accepted
	detail       []string // substrings of the problem's detail
	itemsIfValid int      // items of an accepted batch
}

// docs/wire-format.md, "Bad input": every bad input is answered before any
// sub-request is sent, with a problem whose detail names what was wrong
// (for an item: its index and id).
func TestInputRules(t *testing.T) {
	t.Parallel()
	long := `[{"name":"` + strings.Repeat("x", 100) + `"}]`    // 114 bytes
	exact := `[{"name":"` + strings.Repeat("x", 64-13) + `"}]` // 64 bytes
	if len(exact) != 64 {
		t.Fatalf("exact is %d bytes", len(exact))
	}
	smallBody := settings(func(s *policy.Settings) { s.MaxBodySize = 64 })
	integers := idFormat(policy.IDInteger)
	uuids := idFormat(policy.IDUUID)
	unknownLength := func(r *http.Request) { r.ContentLength = -1 }

	tests := []inputCase{
		// body is not valid JSON, or not an array, or an element is not an object → 400
		{name: "invalid JSON", method: "POST", target: "/widgets", body: `[{"name":"a"},`, status: 400, detail: []string{"not valid JSON"}},
		{name: "invalid JSON after the bracket", method: "PATCH", target: "/widgets", body: `[{"id":1,}]`, status: 400, detail: []string{"not valid JSON"}},
		{name: "update body is an object", method: "PATCH", target: "/widgets", body: `{"id":1,"name":"a"}`, status: 400, detail: []string{"JSON object", "array"}},
		{name: "update body is a string", method: "PATCH", target: "/widgets", body: `"1"`, status: 400, detail: []string{"JSON string"}},
		{name: "update body is null", method: "PATCH", target: "/widgets", body: `null`, status: 400, detail: []string{"JSON null"}},
		{name: "update body is empty", method: "PATCH", target: "/widgets", body: ``, status: 400, detail: []string{"not valid JSON"}},
		{name: "element is a number", method: "POST", target: "/widgets", body: `[{"name":"a"}, 2]`, status: 400, detail: []string{"item 1", "JSON object", "number"}},
		{name: "element is an array", method: "POST", target: "/widgets", body: `[[{"name":"a"}]]`, status: 400, detail: []string{"item 0", "array"}},
		{name: "element is null", method: "PATCH", target: "/widgets", body: `[{"id":1,"a":1},null]`, status: 400, detail: []string{"item 1", "null"}},

		// empty ids, empty array, an empty id → 400
		{name: "empty ids (GET)", method: "GET", target: "/widgets?ids=", status: 400, detail: []string{"ids", "empty"}},
		{name: "empty ids (DELETE)", method: "DELETE", target: "/widgets?ids=", status: 400, detail: []string{"ids", "empty"}},
		{name: "ids with no value", method: "GET", target: "/widgets?ids", status: 400, detail: []string{"empty"}},
		{name: "empty array (create)", method: "POST", target: "/widgets", body: `[]`, status: 400, detail: []string{"empty"}},
		{name: "empty array (update)", method: "PATCH", target: "/widgets", body: ` [ ] `, status: 400, detail: []string{"empty"}},
		{name: "empty id between commas", method: "GET", target: "/widgets?ids=1,,2", status: 400, detail: []string{"item 1", `""`, "empty"}},
		{name: "empty id at the end", method: "DELETE", target: "/widgets?ids=1,2,", status: 400, detail: []string{"item 2", `""`}},
		{name: "empty id in an update element", method: "PATCH", target: "/widgets", body: `[{"id":"1"},{"id":""}]`, status: 400, detail: []string{"item 1", `""`, "empty"}},

		// more than max_items ids or elements → 413
		{name: "too many ids (GET)", method: "GET", target: "/widgets?ids=1,2,3,4", mods: []specMod{maxItems(3)}, status: 413, detail: []string{"4 items", "3"}},
		{name: "too many ids (DELETE, repeated parameter)", method: "DELETE", target: "/widgets?ids=1,2&ids=3,4", mods: []specMod{maxItems(3)}, status: 413, detail: []string{"4 items"}},
		{name: "too many elements", method: "POST", target: "/widgets", body: elements(4), mods: []specMod{maxItems(3)}, status: 413, detail: []string{"4 items", "3"}},
		{name: "max_items ids is fine", method: "GET", target: "/widgets?ids=1,2,3", mods: []specMod{maxItems(3)}, itemsIfValid: 3},
		{name: "max_items elements is fine", method: "POST", target: "/widgets", body: elements(3), mods: []specMod{maxItems(3)}, itemsIfValid: 3},

		// body larger than max_body_size → 413
		{name: "body too large by Content-Length", method: "POST", target: "/widgets", body: long, mods: []specMod{smallBody}, status: 413, detail: []string{"max_body_size", "64"}},
		{name: "body too large, Content-Length unknown", method: "POST", target: "/widgets", body: long, prep: unknownLength, mods: []specMod{smallBody}, status: 413, detail: []string{"max_body_size"}},
		{name: "body too large, Content-Length understated", method: "PATCH", target: "/widgets", body: long, prep: func(r *http.Request) { r.ContentLength = 10 }, mods: []specMod{smallBody}, status: 413},
		{name: "body of exactly max_body_size", method: "POST", target: "/widgets", body: exact, prep: unknownLength, mods: []specMod{smallBody}, itemsIfValid: 1},

		// a Content-Type other than JSON → 415; none is accepted
		{name: "Content-Type text/plain", method: "POST", target: "/widgets", body: elements(1), header: []string{"Content-Type", "text/plain"}, status: 415, detail: []string{"text/plain"}},
		{name: "Content-Type form", method: "PATCH", target: "/widgets", body: `[{"id":1}]`, header: []string{"Content-Type", "application/x-www-form-urlencoded"}, status: 415},
		{name: "Content-Encoding gzip", method: "POST", target: "/widgets", body: elements(1), header: []string{"Content-Type", "application/json", "Content-Encoding", "gzip"}, status: 415, detail: []string{"gzip"}},
		{name: "no Content-Type", method: "POST", target: "/widgets", body: elements(2), itemsIfValid: 2},
		{name: "Content-Type JSON with charset", method: "POST", target: "/widgets", body: elements(2), header: []string{"Content-Type", "application/json; charset=utf-8"}, itemsIfValid: 2},
		{name: "Content-Type merge-patch+json", method: "PATCH", target: "/widgets", body: `[{"id":1,"a":2}]`, header: []string{"Content-Type", "application/merge-patch+json"}, itemsIfValid: 1},

		// an update element without the id field → 400; an id that is not a string or number → 400
		{name: "update element without id", method: "PATCH", target: "/widgets", body: `[{"id":1,"a":1},{"a":2}]`, status: 400, detail: []string{"item 1", `"id"`}},
		{name: "update element with null id", method: "PATCH", target: "/widgets", body: `[{"id":null,"a":2}]`, status: 400, detail: []string{"item 0", "id is null"}},
		{name: "update element with id under id_field's neighbour", method: "PATCH", target: "/widgets", body: `[{"ID":1,"a":2}]`, status: 400, detail: []string{"item 0"}},
		{name: "update id is an object", method: "PATCH", target: "/widgets", body: `[{"id":{"x":1}}]`, status: 400, detail: []string{"item 0", "object"}},
		{name: "update id is a bool", method: "PATCH", target: "/widgets", body: `[{"id":1},{"id":true}]`, status: 400, detail: []string{"item 1", "boolean"}},
		{name: "update id is an array", method: "PATCH", target: "/widgets", body: `[{"id":[1]}]`, status: 400, detail: []string{"item 0", "array"}},
		{name: "create id is an object", method: "POST", target: "/widgets", body: `[{"name":"a"},{"id":{"x":1}}]`, status: 400, detail: []string{"item 1", "object"}},

		// an id in a JSON element that is neither a string nor an integer
		// (a fraction or exponent is not an integer) → 400
		{name: "update id with an exponent", method: "PATCH", target: "/widgets", body: `[{"id":1,"a":1},{"id":1.5e300,"a":2}]`, status: 400, detail: []string{"item 1", "1.5e300", "integer"}},
		{name: "update id with a zero fraction", method: "PATCH", target: "/widgets", body: `[{"id":1.0,"a":1}]`, status: 400, detail: []string{"item 0", "1.0", "integer"}},
		{name: "update id 1e3", method: "PATCH", target: "/widgets", body: `[{"id":7},{"id":1e3}]`, status: 400, detail: []string{"item 1", "1e3"}},
		{name: "update id 1E3", method: "PATCH", target: "/widgets", body: `[{"id":1E3}]`, status: 400, detail: []string{"item 0", "1E3"}},
		{name: "update id with a negative fraction", method: "PATCH", target: "/widgets", body: `[{"id":-0.5}]`, status: 400, detail: []string{"item 0", "-0.5"}},
		{name: "create id with a fraction", method: "POST", target: "/widgets", body: `[{"name":"a"},{"id":2.5,"name":"b"}]`, status: 400, detail: []string{"item 1", "2.5"}},
		{name: "create id with an exponent", method: "POST", target: "/widgets", body: `[{"id":1e400,"name":"b"}]`, status: 400, detail: []string{"item 0", "1e400"}},
		{name: "integer ids, negative and large", method: "PATCH", target: "/widgets", body: `[{"id":-3,"a":1},{"id":123456789012345678901234567890,"a":2},{"id":0}]`, itemsIfValid: 3},
		{name: "integer id in a create", method: "POST", target: "/widgets", body: `[{"id":42,"name":"a"}]`, itemsIfValid: 1},

		// the same id twice in a batch UPDATE or DELETE → 400
		{name: "duplicate id in update", method: "PATCH", target: "/widgets", body: `[{"id":"7","a":1},{"id":"8"},{"id":"7","a":2}]`, status: 400, detail: []string{"items 0 and 2", `"7"`}},
		{name: "duplicate id in update, number and string", method: "PATCH", target: "/widgets", body: `[{"id":7,"a":1},{"id":"7","a":2}]`, status: 400, detail: []string{"items 0 and 1", `"7"`}},
		{name: "duplicate id in delete", method: "DELETE", target: "/widgets?ids=7,8,7", status: 400, detail: []string{"items 0 and 2", `"7"`}},
		{name: "duplicate id in delete, escaped differently", method: "DELETE", target: "/widgets?ids=a,%61", status: 400, detail: []string{"items 0 and 1", `"a"`}},
		{name: "duplicate id in get is fine", method: "GET", target: "/widgets?ids=7,8,7", itemsIfValid: 3},
		{name: "duplicate id in create", method: "POST", target: "/widgets", body: `[{"id":"7","a":1},{"name":"no id"},{"id":7,"a":2}]`, status: 400, detail: []string{"items 0 and 2", `"7"`, "batch create"}},
		{name: "creates without ids are no duplicates", method: "POST", target: "/widgets", body: `[{"name":"a"},{"name":"a"}]`, itemsIfValid: 2},

		// a query that is not percent-encoding
		{name: "bad escape in ids", method: "GET", target: "/widgets?ids=1,%zz", status: 400, detail: []string{"percent-encoding"}},

		// a DELETE on the collection without the ids parameter while batch
		// DELETE is on → 400
		{name: "DELETE without ids", method: "DELETE", target: "/widgets", status: 400, detail: []string{"ids parameter", "?ids=1,2", "delete everything"}},
		{name: "DELETE without ids, with other parameters", method: "DELETE", target: "/widgets?force=1&idsx=1", status: 400, detail: []string{"ids parameter"}},
		{name: "DELETE without ids, custom ids_param", method: "DELETE", target: "/widgets?ids=1", mods: []specMod{settings(func(s *policy.Settings) { s.IDsParam = "keys" })},
			status: 400, detail: []string{"keys parameter", "?keys=1,2"}},

		// under id_format integer, an id that is not a decimal integer;
		// under uuid, one that is not a UUID → 400
		{name: "integer: not an integer in ids", method: "GET", target: "/widgets?ids=3,3x", mods: []specMod{integers}, status: 400,
			detail: []string{"item 1", `"3x"`, "not an integer", "id_format integer", "id_format any"}},
		{name: "integer: 3.json", method: "DELETE", target: "/widgets?ids=3.json", mods: []specMod{integers}, status: 400, detail: []string{"item 0", `"3.json"`, "not an integer"}},
		{name: "integer: empty id", method: "DELETE", target: "/widgets?ids=1,,2", mods: []specMod{integers}, status: 400, detail: []string{"item 1", `""`}},
		{name: "integer: string 3.0 in an update", method: "PATCH", target: "/widgets", body: `[{"id":1,"a":1},{"id":"3.0","a":2}]`, mods: []specMod{integers}, status: 400,
			detail: []string{"item 1", `"3.0"`, "not an integer"}},
		{name: "integer: number 1.0 in an update", method: "PATCH", target: "/widgets", body: `[{"id":1.0,"a":1}]`, mods: []specMod{integers}, status: 400, detail: []string{"item 0", "1.0", "integer"}},
		{name: "integer: a word in a create", method: "POST", target: "/widgets", body: `[{"name":"a"},{"id":"seven","name":"b"}]`, mods: []specMod{integers}, status: 400,
			detail: []string{"item 1", `"seven"`, "not an integer"}},
		{name: "integer: 3 and 03 in a delete", method: "DELETE", target: "/widgets?ids=3,03", mods: []specMod{integers}, status: 400, detail: []string{"items 0 and 1", `"3"`}},
		{name: "integer: 3 and +3 in a delete", method: "DELETE", target: "/widgets?ids=%2B3,3", mods: []specMod{integers}, status: 400, detail: []string{"items 0 and 1", `"3"`}},
		{name: "integer: 3 and \"003\" in an update", method: "PATCH", target: "/widgets", body: `[{"id":3,"a":1},{"id":"003","a":2}]`, mods: []specMod{integers}, status: 400,
			detail: []string{"items 0 and 1", `"3"`}},
		{name: "integer: 3 and 03 in a get are fetched once", method: "GET", target: "/widgets?ids=3,03,%2B3", mods: []specMod{integers}, itemsIfValid: 3},
		{name: "any: 3 and 03 are two ids", method: "DELETE", target: "/widgets?ids=3,03", itemsIfValid: 2},
		{name: "uuid: not a UUID", method: "GET", target: "/widgets?ids=0f8fad5b-d9cb-469f-a165-70867728950e,42", mods: []specMod{uuids}, status: 400,
			detail: []string{"item 1", `"42"`, "not a UUID", "id_format uuid"}},
		{name: "uuid: a hyphen out of place", method: "DELETE", target: "/widgets?ids=0f8fad5bd-9cb-469f-a165-70867728950e", mods: []specMod{uuids}, status: 400, detail: []string{"item 0", "not a UUID"}},
		{name: "uuid: an integer in an update", method: "PATCH", target: "/widgets", body: `[{"id":7,"a":1}]`, mods: []specMod{uuids}, status: 400, detail: []string{"item 0", `"7"`, "not a UUID"}},
		{name: "uuid: two spellings in a delete", method: "DELETE", target: "/widgets?ids=0F8FAD5B-D9CB-469F-A165-70867728950E,0f8fad5bd9cb469fa16570867728950e", mods: []specMod{uuids}, status: 400,
			detail: []string{"items 0 and 1", `"0f8fad5b-d9cb-469f-a165-70867728950e"`}},

		// an all-or-nothing write batch whose query holds a parameter
		// scope_query does not name → 400
		{name: "unscoped parameter on a delete", method: "DELETE", target: "/widgets?ids=1&fields=name", status: 400, detail: []string{`"fields"`, "scope_query"}},
		{name: "unscoped parameter on a create", method: "POST", target: "/widgets?$select[]=name", body: elements(1), status: 400, detail: []string{`"$select[]"`, "scope_query"}},
		{name: "unscoped parameter among scoped ones", method: "PATCH", target: "/widgets?tenant=a&include=x", body: `[{"id":1}]`, mods: []specMod{scopeQuery("tenant")}, status: 400,
			detail: []string{`"include"`}},
		{name: "scoped parameter", method: "PATCH", target: "/widgets?tenant=a", body: `[{"id":1}]`, mods: []specMod{scopeQuery("tenant")}, itemsIfValid: 1},
		{name: "any parameter on a partial write", method: "DELETE", target: "/widgets?ids=1&fields=name", mods: []specMod{partial}, itemsIfValid: 1},
	}

	// an id containing /, \, a control character, or equal to . or .. (after
	// percent-decoding) → 400, in ids= ...
	hostileQuery := []struct{ raw, id string }{
		{"..", ".."}, {".", "."}, {"%2e%2e", ".."}, {"%2E%2E", ".."}, {"%2e", "."}, {".%2e", ".."},
		{"1%2F2", "1/2"}, {"%2F", "/"}, {"a%5Cb", `a\b`}, {"%5C", `\`},
		{"%00", "\x00"}, {"a%0Ab", "a\nb"}, {"%09", "\t"}, {"%1F", "\x1f"}, {"%7F", "\x7f"}, {"%C2%85", "\u0085"},
		{"%FF", "\xff"}, {"a%C3", "a\xc3"},
	}
	for _, method := range []string{"GET", "DELETE"} {
		for _, h := range hostileQuery {
			tests = append(tests, inputCase{
				name: fmt.Sprintf("hostile id %s in ids (%s)", h.raw, method), method: method,
				target: "/widgets?ids=1," + h.raw + ",3", status: 400,
				detail: []string{"item 1", fmt.Sprintf("%q", h.id)},
			})
		}
	}
	// ... and in update elements and in create elements that carry an id.
	hostileJSON := []struct{ json, id string }{
		{`".."`, ".."}, {`"."`, "."}, {`"1/2"`, "1/2"}, {`"/"`, "/"}, {`"a\\b"`, `a\b`},
		{`"\u0000"`, "\x00"}, {`"a\nb"`, "a\nb"}, {`"\u007f"`, "\x7f"}, {`"\u0085"`, "\u0085"},
		// docs/wire-format.md, "Bad input": "(after percent-decoding)". A JSON id is checked as the
		// upstream may come to see it once decoded, like a query id.
		{`"%2e%2e"`, "%2e%2e"}, {`"%2E."`, "%2E."}, {`"1%2F2"`, "1%2F2"}, {`"a%5Cb"`, "a%5Cb"},
		{`"%00"`, "%00"}, {`"%7F"`, "%7F"}, {`"%FF"`, "%FF"},
	}
	for _, method := range []string{"PATCH", "POST"} {
		for _, h := range hostileJSON {
			tests = append(tests, inputCase{
				name: fmt.Sprintf("hostile id %s in an element (%s)", h.json, method), method: method,
				target: "/widgets", body: `[{"id":"1","a":1},{"id":` + h.json + `,"a":2}]`, status: 400,
				detail: []string{"item 1", fmt.Sprintf("%q", h.id)},
			})
		}
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest(tt.method, tt.target, tt.body, tt.header...)
			if tt.prep != nil {
				tt.prep(r)
			}
			f := newFake()
			p, prob := parse(t, r, tt.mods...)
			if p != nil {
				run(p, f) // as the handler does with a valid plan
			}
			if tt.status == 0 {
				if prob != nil {
					t.Fatalf("refused with %d %q; want it accepted", prob.Status, prob.Detail)
				}
				equal(t, "items", len(p.Items), tt.itemsIfValid)
				return
			}
			if prob == nil {
				t.Fatalf("accepted with %d items; want %d", len(p.Items), tt.status)
			}
			if got := f.sent(); len(got) != 0 {
				t.Errorf("sub-requests were sent for a refused batch: %q", got)
			}
			equal(t, "status", prob.Status, tt.status)
			equal(t, "Content-Type", prob.ContentType, "application/problem+json")
			equal(t, "title", prob.Title, http.StatusText(tt.status))
			if !strings.HasPrefix(prob.Type, "https://") {
				t.Errorf("type = %q, want a URI", prob.Type)
			}
			for _, s := range tt.detail {
				if !strings.Contains(prob.Detail, s) {
					t.Errorf("detail %q does not contain %q", prob.Detail, s)
				}
			}
		})
	}
}

func idFormat(f policy.IDFormat) specMod {
	return settings(func(s *policy.Settings) { s.IDFormat = f })
}

// Under id_format, an item's id is its canonical text: what the batch
// sends, locks and reports. A create's element goes as the client wrote
// it; an update's loses its id member anyway.
func TestIDFormatCanonicalIDs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		format               policy.IDFormat
		method, target, body string
		ids                  []string
		sent                 []string
		bodies               []string // of the writes, when there is a body
	}{
		{name: "integer get", format: policy.IDInteger, method: "GET", target: "/widgets?ids=007,%2B8,-0",
			ids: []string{"7", "8", "0"}, sent: []string{"GET /widgets/7", "GET /widgets/8", "GET /widgets/0"}},
		{name: "integer get, two spellings fetched once", format: policy.IDInteger, method: "GET", target: "/widgets?ids=3,03",
			ids: []string{"3", "3"}, sent: []string{"GET /widgets/3"}},
		{name: "integer delete", format: policy.IDInteger, method: "DELETE", target: "/widgets?ids=-03",
			ids: []string{"-3"}, sent: []string{"DELETE /widgets/-3"}},
		{name: "integer update", format: policy.IDInteger, method: "PATCH", target: "/widgets", body: `[{"id":"07","v":1},{"id":8,"v":2}]`,
			ids: []string{"7", "8"}, sent: []string{"PATCH /widgets/7", "PATCH /widgets/8"}, bodies: []string{`{"v":1}`, `{"v":2}`}},
		{name: "integer create", format: policy.IDInteger, method: "POST", target: "/widgets", body: `[{"id":"+09","v":1}]`,
			ids: []string{"9"}, sent: []string{"POST /widgets"}, bodies: []string{`{"id":"+09","v":1}`}},
		{name: "uuid delete", format: policy.IDUUID, method: "DELETE", target: "/widgets?ids=0F8FAD5BD9CB469FA16570867728950E",
			ids: []string{"0f8fad5b-d9cb-469f-a165-70867728950e"}, sent: []string{"DELETE /widgets/0f8fad5b-d9cb-469f-a165-70867728950e"}},
		{name: "any keeps the text", format: policy.IDAny, method: "DELETE", target: "/widgets?ids=007",
			ids: []string{"007"}, sent: []string{"DELETE /widgets/007"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPlan(t, newRequest(tt.method, tt.target, tt.body), partial, concurrency(1), idFormat(tt.format))
			equalSlices(t, "ids", itemIDs(p), tt.ids)
			f := newFake()
			w := write(t, run(p, f))
			equalSlices(t, "sent", f.sent(), tt.sent)
			for i, b := range tt.bodies {
				equal(t, fmt.Sprintf("write %d body", i), f.log()[i].Body, b)
			}
			if tt.method != "POST" { // a created item is reported by the id its answer names
				equalSlices(t, "reported ids", w.IDs(), tt.ids)
			}
		})
	}
}

// Ids are percent-encoded into the item path: an odd but legal id becomes
// exactly one escaped segment of the collection.
func TestIDsAreEscapedIntoOneSegment(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		method string
		target string
		body   string
		ids    []string // the items' ids
		paths  []string // the escaped paths the upstream is sent, in order
	}{
		{
			name: "batch GET", method: "GET",
			target: "/widgets?ids=a%20b,%C3%A9,a:b,1%2C2,x+y,%3Fq%23f,semi%3B",
			ids:    []string{"a b", "é", "a:b", "1,2", "x y", "?q#f", "semi;"},
			paths:  []string{"/widgets/a%20b", "/widgets/%C3%A9", "/widgets/a:b", "/widgets/1%2C2", "/widgets/x%20y", "/widgets/%3Fq%23f", "/widgets/semi%3B"},
		},
		{
			name: "batch DELETE", method: "DELETE",
			target: "/widgets?ids=a%20b,%C3%A9,1%2C2",
			ids:    []string{"a b", "é", "1,2"},
			paths:  []string{"/widgets/a%20b", "/widgets/%C3%A9", "/widgets/1%2C2"},
		},
		{
			name: "batch UPDATE", method: "PATCH", target: "/widgets",
			body:  `[{"id":"a b","v":1},{"id":"é","v":1},{"id":"a:b","v":1},{"id":"a;b","v":1},{"id":-12,"v":1}]`,
			ids:   []string{"a b", "é", "a:b", "a;b", "-12"},
			paths: []string{"/widgets/a%20b", "/widgets/%C3%A9", "/widgets/a:b", "/widgets/a%3Bb", "/widgets/-12"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPlan(t, newRequest(tt.method, tt.target, tt.body), partial, concurrency(1))
			equalSlices(t, "ids", itemIDs(p), tt.ids)
			f := newFake()
			run(p, f)
			equalSlices(t, "escaped paths sent", pathsOf(f.log()), tt.paths)
		})
	}
}

func pathsOf(calls []call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Path)
	}
	return out
}

// Duplicate ids in a batch GET are fetched once and reported at every
// index, in order.
func TestBatchGetFetchesDuplicatesOnce(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1", "2")
	w := write(t, run(mustPlan(t, newRequest("GET", "/widgets?ids=1,2,1,1", "")), f))
	got := f.sent()
	slices.Sort(got)
	equalSlices(t, "sent", got, []string{"GET /widgets/1", "GET /widgets/2"})
	w.checkIndices(t, 4)
	equalSlices(t, "ids", w.IDs(), []string{"1", "2", "1", "1"})
	equalSlices(t, "outcomes", w.Outcomes(), []string{"succeeded", "succeeded", "succeeded", "succeeded"})
	equalSlices(t, "statuses", w.Statuses(), []int{200, 200, 200, 200})
	for _, i := range []int{2, 3} {
		equal(t, fmt.Sprintf("items[%d].body", i), string(w.Items[i].Body), string(w.Items[0].Body))
	}
	equal(t, "status", w.Code, 200)
	equal(t, "outcome", w.Outcome, "succeeded")
}

// A failed duplicate in a batch GET is reported at both indices.
func TestBatchGetDuplicateFailure(t *testing.T) {
	t.Parallel()
	f := newFake().seed("1")
	w := write(t, run(mustPlan(t, newRequest("GET", "/widgets?ids=9,1,9", ""), partial), f))
	equal(t, "GETs of /widgets/9", len(slices.DeleteFunc(f.sent(), func(s string) bool { return s != "GET /widgets/9" })), 1)
	w.checkIndices(t, 3)
	equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "succeeded", "failed"})
	equalSlices(t, "statuses", w.Statuses(), []int{404, 200, 404})
}

// "%2C" inside an id is a comma of the id, not a separator; repeated ids
// parameters add up; a percent-encoded parameter name still names ids.
func TestIDsFromQuery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		query string
		ids   []string
		rest  string
	}{
		{"ids=1%2C2", []string{"1,2"}, ""},
		{"ids=1%2C2,3", []string{"1,2", "3"}, ""},
		{"ids=1&ids=2,3", []string{"1", "2", "3"}, ""},
		{"a=1&ids=2&b=%20", []string{"2"}, "a=1&b=%20"},
		{"%69ds=4", []string{"4"}, ""},
		{"ids=5&&x", []string{"5"}, "x"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			p := mustPlan(t, newRequest("GET", "/widgets?"+tt.query, ""))
			equalSlices(t, "ids", itemIDs(p), tt.ids)
			equal(t, "query kept", p.Items[0].tgt.query, tt.rest)
		})
	}
}

// An element whose id is null is refused, a create's as an update's, in
// a batch and in a job: null is neither a string nor an integer, and a
// client that sent it may have meant an id it failed to fill in.
func TestNullElementIDIsRefused(t *testing.T) {
	t.Parallel()
	for method, advice := range map[string]string{http.MethodPost: "leave the id out", http.MethodPatch: "the id of the item to update"} {
		body := `[{"id":1,"name":"a"},{"id":null,"name":"b"}]`
		want := []string{"item 1", "id is null", advice}
		t.Run(method, func(t *testing.T) {
			_, prob := parse(t, newRequest(method, "/widgets", body))
			if prob == nil || prob.Status != http.StatusBadRequest {
				t.Fatalf("%s with an element whose id is null: problem %v, want 400", method, prob)
			}
			for _, w := range want {
				if !strings.Contains(prob.Detail, w) {
					t.Errorf("detail %q does not say %q", prob.Detail, w)
				}
			}
			refused(t, admitJob(t, newRequest(method, "/widgets", body), nil, partial), http.StatusBadRequest, want...)
		})
	}
}

// The ids parameter is read as form encoders write it (a '+' is a
// space, a plus is %2B: URLSearchParams, Go's url.Values, Python's
// urlencode), but under id_format integer a leading '+' is the sign
// written by hand: +3 is the id 3, one item with 03.
func TestIDsParameterSignUnderInteger(t *testing.T) {
	t.Parallel()
	tests := []struct {
		format policy.IDFormat
		target string
		ids    []string
		sent   []string
	}{
		{policy.IDInteger, "/widgets?ids=+3,03", []string{"3", "3"}, []string{"GET /widgets/3"}},
		{policy.IDInteger, "/widgets?ids=%2B4,4", []string{"4", "4"}, []string{"GET /widgets/4"}},
		{policy.IDAny, "/widgets?ids=a+b,c%20d,e%2Bf", []string{"a b", "c d", "e+f"},
			[]string{"GET /widgets/a%20b", "GET /widgets/c%20d", "GET /widgets/e+f"}},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			p := mustPlan(t, newRequest(http.MethodGet, tt.target, ""), partial, concurrency(1), idFormat(tt.format))
			equalSlices(t, "ids", itemIDs(p), tt.ids)
			f := newFake()
			run(p, f)
			equalSlices(t, "sent", f.sent(), tt.sent)
		})
	}
}

// The engine's own id check, directly.
func TestBadID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"", ".", "..", "/", "a/b", `a\b`, "\x00", "a\x1fb", "\x7f", "\u0085", "\xff", "a\xc3"} {
		if badID(id) == "" {
			t.Errorf("badID(%q) accepts it", id)
		}
	}
	for _, id := range []string{"1", "a b", "é", "a:b", "...", "1,2", "-", "日本", "a.b"} {
		if r := badID(id); r != "" {
			t.Errorf("badID(%q) = %q; want it accepted", id, r)
		}
	}
}

// ItemPath never lets an id add a segment.
func TestItemPathEscapes(t *testing.T) {
	t.Parallel()
	m, _ := widgets(t).Lookup("/widgets")
	for _, id := range []string{"a b", "é", "?x", "#", "%", "%2F", "a;b"} {
		p := m.ItemPath(id)
		seg, ok := strings.CutPrefix(p, "/widgets/")
		if !ok || strings.Contains(seg, "/") {
			t.Errorf("ItemPath(%q) = %q", id, p)
			continue
		}
		if u, err := url.PathUnescape(seg); err != nil || u != id {
			t.Errorf("ItemPath(%q) = %q, which unescapes to %q, %v", id, p, u, err)
		}
	}
}

// itemIDs are the ids of p's items, in order.
func itemIDs(p *Plan) []string {
	var ids []string
	for _, it := range p.Items {
		ids = append(ids, it.ID)
	}
	return ids
}
