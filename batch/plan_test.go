package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/itemlock"
)

// userAndItsPosts references the created user from a url alone (g, m), a
// url and a body (p), so that each way a run fills an operation in is
// there.
const userAndItsPosts = `{"operations": [
	{"id": "u", "method": "POST", "url": "/users", "body": {"name": "ada"}},
	{"id": "g", "method": "GET", "url": "/users/$u"},
	{"id": "m", "method": "PATCH", "url": "/users/$u", "body": {"name": "bea"}, "depends_on": ["g"]},
	{"id": "p", "method": "POST", "url": "/users/$u/posts", "body": {"title": "hi", "author_id": "$u#/id"}}
]}`

// snapshotJSON is everything a journal would keep of the plan.
func snapshotJSON(t testing.TB, p *Plan) string {
	t.Helper()
	b, err := json.Marshal(p.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// planText reads every field of the plan, its items, their operations
// and targets (fmt reads unexported fields too); pointers it prints as
// addresses, so a field pointed elsewhere shows as well.
func planText(p *Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%+v\n", *p)
	for _, it := range p.Items {
		if it.operation != nil {
			fmt.Fprintf(&b, "%+v\n", *it.operation)
		}
		if it.tgt != nil {
			fmt.Fprintf(&b, "%+v\n", *it.tgt)
		}
	}
	return b.String()
}

// A run keeps what it learns in its own state: the plan stays as it was
// admitted, so running it again does what the first run did, on the ids
// the second run creates, not on the first run's.
func TestPlanRunsAgainAsAdmitted(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/100/posts", "/users/102/posts")
	p, prob := admitEnvelope(t, shop(t), userAndItsPosts)
	if prob != nil {
		t.Fatalf("refused: %d %s", prob.Status, prob.Detail)
	}
	admitted, text := snapshotJSON(t, p), planText(p)
	for _, user := range []string{"100", "102"} {
		w := write(t, Run(context.Background(), p, Runtime{Send: api, Locks: &itemlock.Local{}}))
		equal(t, "outcome", w.Outcome, "succeeded")
		w.checkIndices(t, 4)
		equal(t, "the created user", w.Items[0].ID, user)
		equal(t, "g's url", w.Items[1].URL, "/users/"+user)
		equal(t, "m's url", w.Items[2].URL, "/users/"+user)
		equal(t, "p's url", w.Items[3].URL, "/users/"+user+"/posts")
		jsonEqual(t, "the user as read", string(w.Items[1].Body), `{"id":`+user+`,"name":"ada"}`)
		equal(t, "the plan after the run", snapshotJSON(t, p), admitted)
		equal(t, "every field of the plan after the run", planText(p), text)
	}
	want := map[string]string{
		"/users/100":           `{"id":100,"name":"bea"}`,
		"/users/100/posts/101": `{"author_id":100,"id":101,"title":"hi"}`,
		"/users/102":           `{"id":102,"name":"bea"}`,
		"/users/102/posts/103": `{"author_id":102,"id":103,"title":"hi"}`,
	}
	got := api.state()
	equal(t, "records", len(got), len(want))
	for path, rec := range want {
		jsonEqual(t, path, got[path], rec)
	}
}

// A batch's created ids are the run's too: the plan's items keep the ids
// their elements had.
func TestBatchPlanRunsAgainAsAdmitted(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/widgets")
	p := mustPlan(t, newRequest("POST", "/widgets", `[{"name":"a"},{"id":"w7","name":"b"}]`))
	admitted, text := snapshotJSON(t, p), planText(p)
	first := write(t, Run(context.Background(), p, Runtime{Send: api, Locks: &itemlock.Local{}}))
	equal(t, "outcome", first.Outcome, "succeeded")
	equal(t, "the created id", first.Items[0].ID, "100")
	equal(t, "the element's id", first.Items[1].ID, "w7")
	equal(t, "the plan after the run", snapshotJSON(t, p), admitted)
	// The element's id now exists: the second run's preflight finds it
	// taken, and nothing is written.
	second := write(t, Run(context.Background(), p, Runtime{Send: api, Locks: &itemlock.Local{}}))
	equal(t, "second outcome", second.Outcome, "failed")
	equal(t, "second item 0", second.Items[0].ID, "")
	equal(t, "the plan after the second run", snapshotJSON(t, p), admitted)
	equal(t, "every field of the plan after the runs", planText(p), text)
	equal(t, "records", len(api.state()), 2)
}

// Under -race: every field of the plan may be read while it runs, since
// nothing writes it.
func TestPlanReadWhileItRuns(t *testing.T) {
	t.Parallel()
	api := newShopAPI("/users", "/users/100/posts")
	p, prob := admitEnvelope(t, shop(t), userAndItsPosts)
	if prob != nil {
		t.Fatalf("refused: %d %s", prob.Status, prob.Detail)
	}
	admitted, text := snapshotJSON(t, p), planText(p)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			_, _ = p.Snapshot(), planText(p)
		}
	})
	w := write(t, Run(context.Background(), p, Runtime{Send: api, Locks: &itemlock.Local{}}))
	close(done)
	wg.Wait()
	equal(t, "outcome", w.Outcome, "succeeded")
	equal(t, "the plan after the run", snapshotJSON(t, p), admitted)
	equal(t, "every field of the plan after the run", planText(p), text)
}
