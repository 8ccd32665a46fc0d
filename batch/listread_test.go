package batch

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Reads through the legacy API's LIST filter (docs/list-filter.md):
// fewer requests, and every id a LIST did not answer
// read alone, as without the filter.

func idsUpTo(n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	return strings.Join(ids, ",")
}

func TestListReadBatchGET(t *testing.T) {
	t.Parallel()
	t.Run("100 ids in two LISTs of 50", func(t *testing.T) {
		f := newFake()
		for i := 1; i <= 100; i++ {
			f.seed(fmt.Sprint(i))
		}
		res := run1(t, "GET", "/widgets?ids="+idsUpTo(100), "", f, listFilter(policy.ListFilterSpec{}))
		w := write(t, res)
		equal(t, "status", w.Code, 200)
		equal(t, "requests", len(f.log()), 2)
		equal(t, "list_requests", res.ListRequests, 2)
		equal(t, "fallbacks", res.ListFallbacks, 0)
		for i, it := range w.Items {
			if it.ID != fmt.Sprint(i+1) || it.Status != 200 || !strings.Contains(string(it.Body), `"widget `+it.ID+`"`) {
				t.Fatalf("item %d: %+v", i, it)
			}
		}
		for _, c := range f.log() {
			if q, _ := url.ParseQuery(c.RawQuery); len(q["id"]) != 50 {
				t.Errorf("a LIST asked for %d ids, want 50", len(q["id"]))
			}
		}
	})
	t.Run("the client's query is kept, the ids parameter is not", func(t *testing.T) {
		f := newFake().seed("1", "2")
		write(t, run1(t, "GET", "/widgets?ids=1,2&tenant=a", "", f, listFilter(policy.ListFilterSpec{Template: "x=1&id={id}&y=2"})))
		equalSlices(t, "queries", []string{f.log()[0].RawQuery}, []string{"tenant=a&x=1&id=1&id=2&y=2"})
	})
	t.Run("every id no LIST holds is read alone: 404 and 403 stay the item's", func(t *testing.T) {
		f := newFake().seed("1", "3").on("GET", "/widgets/3", reply(403, `<p>no</p>`))
		// The LIST leaves 3 out (the caller may not see it); 2 does not
		// exist.
		f.on("GET", "/widgets", reply(200, `[{"id":"1","name":"one"}]`))
		res := run1(t, "GET", "/widgets?ids=1,2,3", "", f, listFilter(policy.ListFilterSpec{}), partial, concurrency(1))
		w := write(t, res)
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets", "GET /widgets/2", "GET /widgets/3"})
		equalSlices(t, "statuses", w.Statuses(), []int{200, 404, 403})
		equal(t, "fallbacks", res.ListFallbacks, 2)
	})
	t.Run("a LIST that ignores the filter: elements of other ids are ignored", func(t *testing.T) {
		f := newFake().seed("1", "2").on("GET", "/widgets", reply(200, `[{"id":"7"},{"id":8},{"id":"2","name":"two"},"junk",{"id":2,"name":"dup"}]`))
		w := write(t, run1(t, "GET", "/widgets?ids=1,2", "", f, listFilter(policy.ListFilterSpec{})))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets", "GET /widgets/1"})
		jsonEqual(t, "item 1", string(w.Items[1].Body), `{"id":"2","name":"two"}`)
	})
	t.Run("a LIST that fails sends its ids to their own GETs", func(t *testing.T) {
		for name, a := range map[string]answer{
			"500":                                  reply(500, `<h1>oops</h1>`),
			"503 without Retry-After, no throttle": reply(503, ``),
			"not JSON":                             reply(200, `<html>`),
			"no array":                             reply(200, `{"results":{}}`),
			"no answer":                            {err: errLost},
			"wrong place":                          reply(200, `{"data":[]}`),
		} {
			f := newFake().seed("1", "2").on("GET", "/widgets", a)
			// One at a time: the fallback GETs' order is checked.
			res := run1(t, "GET", "/widgets?ids=1,2", "", f, listFilter(policy.ListFilterSpec{Items: "/results"}), concurrency(1))
			w := write(t, res)
			equal(t, name+": status", w.Code, 200)
			equalSlices(t, name+": sent", f.sent(), []string{"GET /widgets", "GET /widgets/1", "GET /widgets/2"})
			if len(res.ListFailures) != 1 || res.ListFailures[0].IDs != 2 || res.ListFailures[0].Detail == "" {
				t.Errorf("%s: failures %+v", name, res.ListFailures)
			}
		}
	})
	t.Run("items points into a wrapped, paginated answer", func(t *testing.T) {
		f := newFake().seed("1", "2").on("GET", "/widgets", reply(200, `{"count":2,"next":null,"results":[{"id":1,"name":"a"},{"id":2,"name":"b"}]}`))
		w := write(t, run1(t, "GET", "/widgets?ids=2,1", "", f, listFilter(policy.ListFilterSpec{Items: "/results"})))
		equal(t, "requests", len(f.log()), 1)
		jsonEqual(t, "item 0", string(w.Items[0].Body), `{"id":2,"name":"b"}`)
	})
	t.Run("a long request target is split before 4 KiB", func(t *testing.T) {
		f := newFake()
		var ids []string
		for i := range 60 {
			id := strings.Repeat("x", 100) + fmt.Sprint(i)
			f.seed(id)
			ids = append(ids, id)
		}
		res := run1(t, "GET", "/widgets?ids="+strings.Join(ids, ","), "", f, listFilter(policy.ListFilterSpec{}), maxItems(100))
		equal(t, "status", write(t, res).Code, 200)
		if res.ListRequests < 2 {
			t.Errorf("%d LISTs for 6 KiB of ids", res.ListRequests)
		}
		for _, c := range f.log() {
			if n := len(c.Path) + 1 + len(c.RawQuery); n > 4096 {
				t.Errorf("a LIST's target is %d bytes", n)
			}
		}
	})
}

func TestListReadPreflight(t *testing.T) {
	t.Parallel()
	t.Run("pre-images come from the LIST; the rollback restores them", func(t *testing.T) {
		f := newFake().seed("1", "2", "3").on("PATCH", "/widgets/3", reply(422, `<p>bad</p>`))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","v":1},{"id":"2","v":2},{"id":"3","v":3}]`, f,
			listFilter(policy.ListFilterSpec{Preflight: true}), concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "rolled_back", "failed"})
		sent := f.sent()
		equal(t, "first request", sent[0], "GET /widgets")
		if slices.Contains(sent[:3], "GET /widgets/1") {
			t.Errorf("a pre-image was read alone: %v", sent)
		}
		for _, c := range f.log() {
			if c.Method == "PATCH" && c.Header.Get("If-Match") != "" {
				t.Errorf("a write after a LIST pre-image is conditional: %v", c.Header)
			}
		}
		for _, id := range []string{"1", "2", "3"} {
			jsonEqual(t, "widget "+id, f.state()[widget(id)], `{"id":"`+id+`","name":"widget `+id+`","color":"red"}`)
		}
	})
	t.Run("a target the LIST does not hold is read alone, and missing fails the batch", func(t *testing.T) {
		f := newFake().seed("1")
		w := write(t, run1(t, "DELETE", "/widgets?ids=1,9", "", f, listFilter(policy.ListFilterSpec{Preflight: true})))
		equal(t, "status", w.Code, 404)
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets", "GET /widgets/9"})
	})
	t.Run("without preflight, pre-images are read alone", func(t *testing.T) {
		f := newFake().seed("1", "2")
		write(t, run1(t, "DELETE", "/widgets?ids=1,2", "", f, listFilter(policy.ListFilterSpec{}), concurrency(1)))
		equalSlices(t, "sent", f.sent()[:2], []string{"GET /widgets/1", "GET /widgets/2"})
	})
	t.Run("a create's ids are checked alone", func(t *testing.T) {
		f := newFake()
		write(t, run1(t, "POST", "/widgets", `[{"id":"5"}]`, f, listFilter(policy.ListFilterSpec{Preflight: true})))
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/5", "POST /widgets"})
	})
}
