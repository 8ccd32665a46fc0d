package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestFaultStormKeepsPromises sends all-or-nothing and partial batch
// updates and deletes, and envelopes over two widgets (some refused on
// purpose), at once through one Caddy, over shared ids, while
// the legacy API fails a random request now and then in every way it can:
// an answer lost after the write was applied, a proxy's 502 or 504 after
// it was applied, its own 500 or 503, a hang past item_timeout. The
// faults hit whatever comes first, the batches' writes, preflight and
// proof reads, and undos alike. Judged by the writes the API carried out,
// in order: every undo lands on its own batch's write, no batch that
// failed leaves a write of its own as an item's last unless it names that
// item as left behind (rollback_failed, or unknown in partial mode), and
// an item reported rolled_back had its write undone.
func TestFaultStormKeepsPromises(t *testing.T) {
	for _, etags := range []bool{false, true} {
		for _, normalising := range []bool{false, true} {
			t.Run(fmt.Sprintf("etags %v, normalising %v", etags, normalising), func(t *testing.T) {
				testFaultStorm(t, etags, overlap{normalising: normalising})
			})
		}
	}
	// Pre-images read through the LIST, which the storm fails too.
	t.Run("list filter preflight, normalising", func(t *testing.T) {
		testFaultStorm(t, false, overlap{normalising: true, listPreflight: true})
	})
	// Every save stamped, as Rails does, and named in stamped_fields: a
	// write whose answer the storm lost is undone like any other, and
	// no item is left blaming a writer or the API's stamp (only
	// batches, locked out of each other's items, write here).
	t.Run("stamping API, stamped_fields", func(t *testing.T) {
		testFaultStorm(t, false, overlap{rails: true})
	})
}

// testFaultStorm is one storm; a normalising legacy API trims what it
// stores, stamps updated_at and ignores members it does not know.
func testFaultStorm(t *testing.T, etags bool, mode overlap) {
	const batches, nIDs, faults = 30, 8, 40
	normalising := mode.normalising
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, ETags: etags, Normalize: normalising, Rails: mode.rails, Fields: mode.fields(),
		FilterParam: mode.filterParam(), Seed: records("w", 1, nIDs)})
	g := startGateway(t, api, `
	batch {
		envelope /api/batch
		concurrency 3
		item_timeout 300ms
		batch_timeout 30s
		compensation_timeout 1s
		compensation_retries 3
		allow_override
		`+mode.stampedFields()+`
		resource /api/widgets {`+resourceMethods+mode.listFilter()+`
		}
	}
	reverse_proxy UPSTREAM
`)
	kinds := []legacyapi.Fault{
		{Drop: true, AfterApply: true},
		{Drop: true},
		{Status: 502, Body: htmlError, AfterApply: true},
		{Status: 504, Body: htmlError},
		{Status: 500, Body: htmlError},
		{Status: 503, Body: htmlError},
		{Hang: true, AfterApply: true},
	}
	methods := []string{"GET", "PATCH", "PUT", "DELETE"}
	for range faults {
		f := kinds[rand.IntN(len(kinds))]
		f.Method, f.Path, f.Times = methods[rand.IntN(len(methods))], fmt.Sprintf("/api/widgets/%d", 1+rand.IntN(nIDs)), 1
		api.Inject(f)
	}
	if mode.listPreflight {
		for range faults / 4 {
			f := kinds[rand.IntN(len(kinds))]
			f.Method, f.Path, f.Times = "GET", "/api/widgets", 1
			api.Inject(f)
		}
	}

	client := &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: batches}}
	defer client.CloseIdleConnections()
	answers := make([]batchAnswer, batches)
	partial := func(b int) bool { return b%5 == 4 }
	var wg sync.WaitGroup
	for b := range batches {
		wg.Go(func() {
			perm := rand.Perm(nIDs)[:2+rand.IntN(3)]
			method, path, body := "PATCH", "/api/widgets", ""
			switch {
			case b%6 == 2:
				// An envelope: PATCH two widgets, or PATCH one and DELETE
				// another; those with b%4 == 2 refused on purpose.
				patch := map[string]any{"v": fmt.Sprintf("b%d", b)}
				if normalising {
					patch["v"], patch["nickname"] = fmt.Sprintf("  b%d ", b), "x"
				}
				method, path, body = "POST", "/api/batch", widgetEnvelope(perm[0]+1, perm[1]+1, patch, b%12 == 8, b%4 == 2)
			case b%3 == 0:
				var ids []string
				for _, i := range perm {
					ids = append(ids, strconv.Itoa(i+1))
				}
				method, path = "DELETE", "/api/widgets?ids="+strings.Join(ids, ",")
			default:
				elems := make([]map[string]any, len(perm))
				for k, i := range perm {
					elems[k] = map[string]any{"id": i + 1, "v": fmt.Sprintf("b%d", b)}
					if normalising {
						elems[k]["v"], elems[k]["nickname"] = fmt.Sprintf("  b%d ", b), "x"
					}
				}
				raw, _ := json.Marshal(elems)
				body = string(raw)
			}
			var header http.Header
			if partial(b) {
				header = http.Header{"Prefer": {"atomicity=partial"}}
			}
			answers[b] = sendKeyedBatch(t, client, g.URL, b, method, path, body, header)
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// item names the batch item whose own write carried key; an undo's
	// key names none.
	item := func(key string) (b, i int, ok bool) {
		if _, err := fmt.Sscanf(key, "b%d:%d", &b, &i); err != nil || strings.HasSuffix(key, ":undo") {
			return 0, 0, false
		}
		return b, i, b < batches && i < len(answers[b].Items)
	}
	l := judgeUndos(t, api, answers)
	if l.reborn != 0 {
		t.Errorf("%d undos re-created an item another batch had deleted", l.reborn)
	}
	for path, w := range l.last {
		b, i, ok := item(batchKey(w))
		if !ok {
			continue // an undo's
		}
		a, it := answers[b], answers[b].Items[i]
		kept := a.Outcome == "succeeded" || it.Outcome == "rollback_failed" || partial(b) && (it.Outcome == "succeeded" || it.Outcome == "unknown")
		if !kept {
			t.Errorf("%s was last written by batch %d item %d, which ended %s (item %s) and does not say it left it", path, b, i, a.Outcome, it.Outcome)
		}
	}
	if mode.rails {
		for b, a := range answers {
			for _, it := range a.Items {
				if c := it.Compensation; c != nil && (strings.Contains(c.Error, "another writer") || strings.Contains(c.Error, "stamped_fields")) {
					t.Errorf("batch %d item %d (id %s) was left: %s; found %s", b, it.Index, it.ID, c.Error, c.Found)
				}
			}
		}
	}
	t.Logf("batch outcomes %v", l.outcomes)
}
