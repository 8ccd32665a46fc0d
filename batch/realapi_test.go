package batch

import (
	"context"
	"strings"
	"testing"
)

// What real legacy APIs do with what the saga sends: they normalise what
// they store, ignore ids, and redirect to a trailing slash. Each test
// plays such an API and reads its final state.

// normalised answers a write with body after storing rec as the item id:
// an API that trims, lower-cases, stamps or ignores what it was sent.
func normalised(f *fakeAPI, id string, rec map[string]any, body string) answer {
	return answer{status: 200, body: body, hook: func(context.Context, *SubRequest) { f.put(widget(id), rec) }}
}

func TestUndoOfANormalisedWrite(t *testing.T) {
	t.Parallel()
	t.Run("update: the write's answer is the item as the write left it", func(t *testing.T) {
		f := newFake().seed("1", "2")
		stored := map[string]any{"id": "1", "name": "padded", "color": "red", "updated_at": "t1"}
		f.on("PATCH", "/widgets/1", normalised(f, "1", stored, `{"id":"1","name":"padded","color":"red","updated_at":"t1"}`))
		f.on("PATCH", "/widgets/2", reply(400, `<p>bad email</p>`))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"  padded  ","nickname":"ignored"},{"id":"2","email":"x"}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
		equal(t, "status", w.Code, 400)
		jsonEqual(t, "widget 1", f.state()["/widgets/1"], `{"id":"1","name":"widget 1","color":"red"}`)
	})
	t.Run("update: an answer that is not the item falls back to what was sent", func(t *testing.T) {
		for _, body := range []string{`{}`, `{"status":"ok"}`, ``, `{"id":"9","name":"padded"}`} {
			f := newFake().seed("1", "2")
			stored := map[string]any{"id": "1", "name": "padded", "color": "red"}
			f.on("PATCH", "/widgets/1", normalised(f, "1", stored, body))
			f.on("PATCH", "/widgets/2", reply(400, ``))
			w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":"  padded  "},{"id":"2","v":1}]`, f, concurrency(1)))
			// What was sent is not what is there, and nothing said the
			// API made it so: the item is left, and said to be.
			equalSlices(t, "outcomes "+body, w.Outcomes(), []string{"rollback_failed", "failed"})
			equal(t, "PUTs sent "+body, len(f.sentWith("PUT")), 0)
		}
	})
	t.Run("update: a writer after the normalised write is still caught", func(t *testing.T) {
		f := newFake().seed("1", "2")
		stored := map[string]any{"id": "1", "name": "padded", "color": "red", "updated_at": "t1"}
		f.on("PATCH", "/widgets/1", normalised(f, "1", stored, `{"id":"1","name":"padded","color":"red","updated_at":"t1"}`))
		f.on("PATCH", "/widgets/2", otherWriter(f, "1", map[string]any{"id": "1", "name": "padded", "color": "red", "updated_at": "t2"}))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"1","name":" padded"},{"id":"2","v":1}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed", "failed"})
		jsonEqual(t, "widget 1", f.state()["/widgets/1"], `{"id":"1","name":"padded","color":"red","updated_at":"t2"}`)
	})
	t.Run("create: the answer is the proof before the delete", func(t *testing.T) {
		f := newFake()
		f.on("POST", "/widgets", answer{status: 201, body: `{"id":1000,"name":"ada","email":"ada@example.com","created_at":"t1"}`,
			header: map[string][]string{"Location": {"http://h/widgets/1000"}},
			hook: func(context.Context, *SubRequest) {
				f.put(widget("1000"), map[string]any{"id": 1000, "name": "ada", "email": "ada@example.com", "created_at": "t1"})
			}}, reply(422, `<p>no</p>`))
		w := write(t, run1(t, "POST", "/widgets", `[{"name":" ada ","email":"ADA@example.com"},{"name":""}]`, f, concurrency(1)))
		equalSlices(t, "outcomes", w.Outcomes(), []string{"rolled_back", "failed"})
		equal(t, "widget 1000 deleted", f.state()["/widgets/1000"], "")
	})
}

// An unknown create whose id only its element named: a read that finds
// nothing there proves nothing, since the API may have put it under an
// id of its own; it is never "nothing was changed".
func TestUnknownCreateUnderTheElementsID(t *testing.T) {
	t.Parallel()
	f := newFake()
	// The API ignores the element's id and answers too late: the item
	// exists, under an id of the API's own.
	f.on("POST", "/widgets", answer{err: errLost, hook: func(context.Context, *SubRequest) {
		f.put(widget("1000"), map[string]any{"id": "1000", "name": "x"})
	}})
	w := write(t, run1(t, "POST", "/widgets", `[{"id":"9990","name":"x"}]`, f))
	equalSlices(t, "outcomes", w.Outcomes(), []string{"rollback_failed"})
	equal(t, "status", w.Code, 500)
	equal(t, "outcome", w.Outcome, "rollback_failed")
	equal(t, "widget 1000 kept", f.state()["/widgets/1000"] != "", true)
	if strings.Contains(w.Detail, "nothing was changed") {
		t.Errorf("detail %q says nothing was changed", w.Detail)
	}
}

// A create naming an existing id fails the batch before anything is
// written: every id a create carries is checked in the preflight.
func TestCreateNamingAnExistingIDWritesNothing(t *testing.T) {
	t.Parallel()
	f := newFake().seed("2")
	w := write(t, run1(t, "POST", "/widgets", `[{"name":"x1"},{"id":"3","name":"free"},{"id":"2","name":"dup"}]`, f))
	equal(t, "status", w.Code, 409)
	equal(t, "outcome", w.Outcome, "failed")
	equalSlices(t, "outcomes", w.Outcomes(), []string{"not_attempted", "not_attempted", "failed"})
	equal(t, "POSTs sent", len(f.sentWith("POST")), 0)
	if !strings.Contains(w.Detail, "nothing was changed") {
		t.Errorf("detail %q", w.Detail)
	}
}

// 301, 307 and 308 were not carried out at the URL: the item failed, and
// a write is not unknown. A redirect to the same path with a trailing
// slash says how to declare the resource (moved_test.go follows the
// advice).
func TestRedirectedItems(t *testing.T) {
	t.Parallel()
	for _, status := range []int{301, 307, 308} {
		f := newFake().seed("1", "2")
		f.on("PATCH", "/widgets/1", reply(status, `<p>moved</p>`, "Location", "http://h/widgets/1/"))
		f.on("GET", "/widgets/1", reply(status, `<p>moved</p>`, "Location", "http://h/widgets/1/"))
		res := run1(t, "PATCH", "/widgets", `[{"id":"2","v":1},{"id":"1","v":1}]`, f, concurrency(1))
		w := write(t, res)
		// The preflight met the redirect: nothing was written.
		equalSlices(t, "outcomes", w.Outcomes(), []string{"not_attempted", "failed"})
		equal(t, "status", w.Code, 502)
		equal(t, "PATCHes sent", len(f.sentWith("PATCH")), 0)
		const advice = "`resource /widgets { item_path /widgets/{id}/ }`"
		if !strings.Contains(w.Items[1].Error, advice) || !strings.Contains(res.Warning, advice) {
			t.Errorf("%d: item error %q, warning %q: want the items declared with a slash", status, w.Items[1].Error, res.Warning)
		}
	}
	t.Run("a write answered 301 is failed, not unknown, and nothing is undone", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", reply(301, ``, "Location", "http://h/widgets/"))
		res := run1(t, "POST", "/widgets", elements(2), f, concurrency(1))
		w := write(t, res)
		equalSlices(t, "outcomes", w.Outcomes(), []string{"failed", "not_attempted"})
		equal(t, "status", w.Code, 502)
		equal(t, "outcome", w.Outcome, "failed")
		equalSlices(t, "sent", f.sent(), []string{"POST /widgets"})
		if !strings.Contains(res.Warning, "trailing slash") {
			t.Errorf("warning %q", res.Warning)
		}
	})
	t.Run("a redirect elsewhere gives no hint", func(t *testing.T) {
		f := newFake().on("POST", "/widgets", reply(308, ``, "Location", "http://h/v2/widgets"))
		res := run1(t, "POST", "/widgets", elements(1), f)
		equal(t, "warning", res.Warning, "")
		equalSlices(t, "outcomes", write(t, res).Outcomes(), []string{"failed"})
	})
	t.Run("a write answered 302 may have been carried out: unknown", func(t *testing.T) {
		f := newFake().seed("1", "2").on("PATCH", "/widgets/1", reply(302, ``, "Location", "http://h/widgets/1/"))
		w := write(t, run1(t, "PATCH", "/widgets", `[{"id":"2","v":1},{"id":"1","v":1}]`, f, concurrency(1)))
		// Resolved by a read, which found the pre-image: not applied.
		equalSlices(t, "sent", f.sent(), []string{"GET /widgets/2", "GET /widgets/1", "PATCH /widgets/2", "PATCH /widgets/1", "GET /widgets/1", "GET /widgets/2", "PUT /widgets/2"})
		if !strings.Contains(w.Items[1].Error, "may have taken effect") {
			t.Errorf("item 1's error %q", w.Items[1].Error)
		}
	})
}
