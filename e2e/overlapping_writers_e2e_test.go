package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestOverlappingWritersSerialize sends all-or-nothing batch updates and
// deletes, envelopes that PATCH two widgets or PATCH one and DELETE
// another (docs/envelope.md), and single PATCHes and DELETEs, at once
// through one Caddy over a few shared ids. Some batches and envelopes
// fail on purpose (an element the legacy API refuses), and the first
// DELETE of one id is answered 503 without being applied, whoever sends
// it. No batch may end rollback_failed, and the legacy API must hold what
// the committed writes (single writes answered 2xx, writes of batches
// and envelopes that succeeded, the succeeded items of partial ones)
// leave when replayed in the order it received them: writes to one item
// never interleave with a saga's (its locks), and a batch that failed
// leaves no trace, whatever else wrote to its items before and after.
func TestOverlappingWritersSerialize(t *testing.T) {
	const clients, nIDs, rounds = 40, 8, 2
	for _, tc := range []struct {
		name        string
		etags       bool
		options     string
		tenants     bool
		normalising bool
		list        bool
		rails       bool
	}{
		{"re-read proofs, restore by put", false, "restore_updated put", false, false, false, false},
		{"etags, restore by patch", true, "restore_updated patch", false, false, false, false},
		// Every write trimmed, stamped and stripped of an unknown member:
		// the write's answer is what each undo's proof expects.
		{"normalising API, re-read proofs, restore by put", false, "restore_updated put", false, true, false, false},
		{"normalising API, etags, restore by patch", true, "restore_updated patch\n\t\tconditional_writes", false, true, false, false},
		// Pre-images read through the LIST, with the client's query on it.
		{"list filter preflight, normalising API", false, "restore_updated put", false, true, true, false},
		// The same ids in two tenants, chosen by ?tenant=: one lock per
		// id (the query is not in a lock's name), and every request of a
		// batch, undos included, must reach its own tenant.
		{"two tenants, re-read proofs", false, "restore_updated put", true, false, false, false},
		// Every save stamped, as Rails does, and named in stamped_fields.
		{"stamping API, stamped_fields, re-read proofs", false, "restore_updated put", false, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range rounds {
				testOverlappingWriters(t, round, clients, nIDs, tc.etags, tc.options, overlap{twoTenants: tc.tenants, normalising: tc.normalising, listPreflight: tc.list, rails: tc.rails})
			}
		})
	}
}

func testOverlappingWriters(t *testing.T, round, clients, nIDs int, etags bool, options string, mode overlap) {
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, ETags: etags, Tenants: mode.twoTenants,
		Normalize: mode.normalising, Rails: mode.rails, Fields: mode.fields(), FilterParam: mode.filterParam(), Seed: records("w", 1, nIDs)})
	g := startGateway(t, api, `
	batch {
		envelope /api/batch
		concurrency 3
		item_timeout 20s
		batch_timeout 60s
		allow_override
		scope_query by tenant
		`+mode.stampedFields()+`
		`+options+`
		resource /api/widgets {`+resourceMethods+mode.listFilter()+`
		}
	}
	reverse_proxy UPSTREAM
`)
	overlappingWriters(t, round, api, g.upstream, []string{g.URL}, clients, nIDs, mode)
}

// overlap is how a round of overlapping writers meets the legacy API.
type overlap struct {
	// twoTenants: the same ids in two tenants, chosen by ?tenant=.
	twoTenants bool
	// normalising: the API trims what it stores, stamps updated_at on
	// every save and ignores members it does not know, as real
	// frameworks do; the writes send padded notes and an unknown member.
	normalising bool
	// listPreflight: the API filters its LIST by ?id=, and the gateway
	// reads the sagas' pre-images through it (list_filter with
	// preflight).
	listPreflight bool
	// rails: the API stamps updated_at on every save, as Rails does
	// (its DELETE answers 204), and the gateway names it in
	// stamped_fields.
	rails bool
}

// stamps reports whether the API stamps updated_at on every save.
func (m overlap) stamps() bool { return m.normalising || m.rails }

// stampedFields is the gateway's stamped_fields line.
func (m overlap) stampedFields() string {
	if !m.rails {
		return ""
	}
	return "stamped_fields updated_at"
}

// filterParam is the API's LIST filter.
func (m overlap) filterParam() string {
	if m.listPreflight {
		return "id"
	}
	return ""
}

// listFilter is the resource's list_filter lines.
func (m overlap) listFilter() string {
	if !m.listPreflight {
		return ""
	}
	return `
			list_filter "id={id}" {
				preflight
			}`
}

// fields are the members a normalising API knows.
func (m overlap) fields() []string {
	if m.normalising {
		return []string{"name", "v", "note"}
	}
	return nil
}

// extra is what a write of client c sends besides its v: a padded note
// and a member the API does not know, which a normalising API trims and
// ignores.
func (m overlap) extra(c int) string {
	if !m.normalising {
		return ""
	}
	return fmt.Sprintf(`,"note":"  n%d  ","nickname":"x"`, c)
}

// overlappingWriters is TestOverlappingWritersSerialize's round against
// api (served at upstream, host:port), its clients sent in turn to each
// of gateways (base URLs).
func overlappingWriters(t *testing.T, round int, api *legacyapi.API, upstream string, gateways []string, clients, nIDs int, mode overlap) {
	tenants := []string{""} // the default tenant holds the seeds
	if mode.twoTenants {
		tenants = append(tenants, "t1")
		for i := 1; i <= nIDs; i++ {
			if _, err := send(http.DefaultClient, "http://"+upstream, "PUT", fmt.Sprintf("/api/widgets/%d?tenant=t1", i), fmt.Sprintf(`{"id":%d,"name":"w%d"}`, i, i)); err != nil {
				t.Fatal(err)
			}
		}
		api.ResetLog()
	}
	api.Inject(legacyapi.Fault{Method: "DELETE", Path: fmt.Sprintf("/api/widgets/%d", 1+rand.IntN(nIDs)), Status: 503, Body: htmlError, Times: 1})

	// Every request names its client in the query, which the gateway
	// keeps on each sub-request of a batch (scope_query names it, for the
	// all-or-nothing ones).
	type write struct {
		single, failing, partial bool
		method, path             string
		body                     string
	}
	writes := make([]write, clients)
	for c := range writes {
		by := fmt.Sprintf("?by=%d", c)
		if tenant := tenants[c/10%len(tenants)]; tenant != "" {
			by += "&tenant=" + tenant
		}
		id := 1 + rand.IntN(nIDs)
		perm := rand.Perm(nIDs)[:2+rand.IntN(3)]
		switch c % 10 {
		case 0, 5:
			writes[c] = write{single: true, method: "PATCH", path: fmt.Sprintf("/api/widgets/%d%s", id, by), body: fmt.Sprintf(`{"v":%d%s}`, c, mode.extra(c))}
		case 1:
			// Creates the widget again if it was deleted (PUT creates here).
			writes[c] = write{single: true, method: "PUT", path: fmt.Sprintf("/api/widgets/%d%s", id, by), body: fmt.Sprintf(`{"id":%d,"name":"w%d","v":%d%s}`, id, id, c, mode.extra(c))}
		case 2:
			writes[c] = write{single: true, method: "DELETE", path: fmt.Sprintf("/api/widgets/%d%s", id, by)}
		case 3:
			var ids []string
			for _, i := range perm[:2] {
				ids = append(ids, strconv.Itoa(i+1))
			}
			writes[c] = write{method: "DELETE", path: "/api/widgets" + by + "&ids=" + strings.Join(ids, ",")}
		case 6, 8:
			// An envelope on two widgets: PATCH both, or PATCH one and
			// DELETE the other; its query goes on every operation. One
			// in two of the second kind asks for partial.
			patch := map[string]any{"v": c}
			if mode.normalising {
				patch["note"], patch["nickname"] = fmt.Sprintf("  n%d  ", c), "x"
			}
			failing := rand.IntN(3) == 0
			writes[c] = write{failing: failing, partial: c%20 == 18, method: "POST", path: "/api/batch" + by,
				body: widgetEnvelope(perm[0]+1, perm[1]+1, patch, c%10 == 8, failing)}
		default:
			failing := rand.IntN(3) == 0
			elems := make([]map[string]any, len(perm))
			for k, i := range perm {
				elems[k] = map[string]any{"id": i + 1, "v": c}
				if mode.normalising {
					elems[k]["note"], elems[k]["nickname"] = fmt.Sprintf("  n%d  ", c), "x"
				}
			}
			if failing {
				elems[len(elems)-1]["name"] = "" // the legacy API's 422
			}
			body, _ := json.Marshal(elems)
			// One in five asks for partial: each item then stands alone.
			writes[c] = write{failing: failing, partial: c%10 == 9, method: "PATCH", path: "/api/widgets" + by, body: string(body)}
		}
	}

	client := &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	answers := make([]response, clients)
	errs := make([]error, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c, w := range writes {
		wg.Go(func() {
			<-start
			var header http.Header
			if w.partial {
				header = http.Header{"Prefer": {"atomicity=partial"}}
			}
			answers[c], errs[c] = sendHeader(client, gateways[c%len(gateways)], w.method, w.path, w.body, header)
		})
	}
	close(start)
	wg.Wait()

	committed := make([]bool, clients)
	itemCommitted := make([]map[int]bool, clients) // a partial batch's items that succeeded
	ended := map[string]int{}
	defer func() { t.Logf("round %d: %v", round, ended) }()
	for c, w := range writes {
		r := answers[c]
		switch {
		case errs[c] != nil:
			t.Fatalf("round %d: client %d: %v", round, c, errs[c])
		case w.single:
			// 201: a PUT that created the widget again; 204: a DELETE
			// of a Rails-like API; 404: another client deleted it
			// first; 503: the fault.
			committed[c] = r.Status == http.StatusOK || r.Status == http.StatusCreated || r.Status == http.StatusNoContent
			if !committed[c] && r.Status != http.StatusNotFound && r.Status != http.StatusServiceUnavailable {
				t.Fatalf("round %d: single %s %s: %d %s", round, w.method, w.path, r.Status, r.Body)
			}
			ended[fmt.Sprintf("single %s %d", w.method, r.Status)]++
		default:
			var b batchAnswer
			if err := json.Unmarshal(r.Body, &b); err != nil {
				t.Fatalf("round %d: batch %d: %d %s", round, c, r.Status, r.Body)
			}
			// failed: a target deleted before the batch began, or the
			// fault on its first write; rolled_back: a failure after a
			// write took effect; partial: some items of a partial batch.
			allowed := b.Outcome == "succeeded" || b.Outcome == "failed" || b.Outcome == "rolled_back" && !w.partial || b.Outcome == "partial" && w.partial
			if !allowed || w.failing && b.Outcome == "succeeded" {
				t.Fatalf("round %d: batch %d (failing on purpose: %v, partial: %v): %d %s", round, c, w.failing, w.partial, r.Status, r.Body)
			}
			committed[c] = b.Outcome == "succeeded"
			if w.partial {
				itemCommitted[c] = map[int]bool{}
				for _, it := range b.Items {
					itemCommitted[c][it.Index] = it.Outcome == "succeeded"
				}
			}
			ended[fmt.Sprintf("batch %s %s (partial: %v)", strings.Replace(w.method, "POST", "envelope", 1), b.Outcome, w.partial)]++
		}
	}

	// Replay the committed writes in the order the legacy API received
	// them; undos (their keys end in :undo) and reads change nothing in
	// the replay.
	if mode.listPreflight && len(sent(api, http.MethodGet, "/api/widgets")) == 0 {
		t.Errorf("round %d: no saga read its pre-images through the LIST", round)
	}
	want := map[string]map[string]any{} // by tenant/id
	for _, tenant := range tenants {
		for i := 1; i <= nIDs; i++ {
			want[tenant+"/"+strconv.Itoa(i)] = map[string]any{"id": json.Number(strconv.Itoa(i)), "name": "w" + strconv.Itoa(i)}
		}
	}
	for _, req := range api.Requests() {
		if req.Method == http.MethodGet || strings.HasSuffix(strings.Trim(req.Header.Get("Idempotency-Key"), `"`), ":undo") {
			continue
		}
		q, _ := url.ParseQuery(req.RawQuery)
		c, err := strconv.Atoi(q.Get("by"))
		if err != nil || req.Method != http.MethodPatch && req.Method != http.MethodPut && req.Method != http.MethodDelete {
			t.Fatalf("round %d: a request the test did not make: %s %s?%s %s", round, req.Method, req.Path, req.RawQuery, req.Body)
		}
		if writes[c].partial {
			key := strings.Trim(req.Header.Get("Idempotency-Key"), `"`)
			i, err := strconv.Atoi(key[strings.LastIndexByte(key, ':')+1:])
			if err != nil || !itemCommitted[c][i] {
				continue
			}
		} else if !committed[c] {
			continue
		}
		id := strings.TrimPrefix(req.Path, "/api/widgets/")
		item := q.Get("tenant") + "/" + id
		switch req.Method {
		case http.MethodDelete:
			delete(want, item)
		case http.MethodPut:
			want[item] = map[string]any{"id": json.Number(id), "name": "w" + id, "v": json.Number(strconv.Itoa(c))}
		default:
			want[item]["v"] = json.Number(strconv.Itoa(c))
		}
		if mode.normalising && req.Method != http.MethodDelete {
			want[item]["note"] = fmt.Sprintf("n%d", c) // trimmed; the unknown member ignored
		}
	}
	for _, tenant := range tenants {
		for i := 1; i <= nIDs; i++ {
			id := strconv.Itoa(i)
			rec, exists := api.TenantItem("/api/widgets", tenant, id)
			if mode.stamps() && exists {
				rec = withoutStamp(rec) // the API's own clock, which an undo does not put back
			}
			if w, ok := want[tenant+"/"+id]; exists != ok || !reflect.DeepEqual(rec, w) {
				t.Errorf("round %d: widget %q/%s is %v (exists: %v); the committed writes leave %v (exists: %v)", round, tenant, id, rec, exists, w, ok)
			}
		}
	}
}
