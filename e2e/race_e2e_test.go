package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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

// TestBatchConcurrentThroughCaddy runs many batches of 20 items at once
// through one Caddy (run it with -race): GETs, CREATEs, UPDATEs and
// DELETEs on disjoint ids, some all-or-nothing ones failing on purpose.
// Every answer must say what happened, and the legacy API must hold
// exactly what the answers say.
func TestBatchConcurrentThroughCaddy(t *testing.T) {
	const (
		perOp  = 30 // batches of each operation
		items  = 20 // items per batch
		failed = 4  // one batch in failed fails on purpose
	)
	api := legacyapi.NewRecording(
		// updates use widgets 1..600, GETs 601..1200
		legacyapi.Collection{Path: "/api/widgets", Seed: records("w", 1, 2*perOp*items)},
		legacyapi.Collection{Path: "/api/gadgets", PutCreates: true, Seed: records("g", 1, perOp*items)},
		legacyapi.Collection{Path: "/api/things"},
	)
	g := startGateway(t, api, `
	batch {
		concurrency 8
		resource /api/widgets {`+resourceMethods+`
		}
		resource /api/gadgets {`+resourceMethods+`
		}
		resource /api/things {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	widgets, gadgets := api.Items("/api/widgets"), api.Items("/api/gadgets")
	failing := func(b int) bool { return b%failed == 1 }
	id := func(b, i int) int { return b*items + i + 1 }

	type call struct {
		op, method, path, body string
		batch                  int
	}
	var calls []call
	for b := range perOp {
		var ids []string
		var creates, updates []map[string]any
		for i := range items {
			ids = append(ids, strconv.Itoa(id(b, i)))
			name := fmt.Sprintf("b%d-%d", b, i)
			if failing(b) && i == 13 {
				name = "" // the legacy API's 422
			}
			creates = append(creates, map[string]any{"name": name, "batch": b})
			updates = append(updates, map[string]any{"id": id(b, i), "name": name})
		}
		gets := make([]string, items)
		for i := range items {
			gets[i] = strconv.Itoa(perOp*items + id(b, i))
		}
		if failing(b) {
			api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/api/gadgets/" + strconv.Itoa(id(b, 7)), Status: 503, Body: htmlError})
		}
		create, _ := json.Marshal(creates)
		update, _ := json.Marshal(updates)
		calls = append(calls,
			call{"get", "GET", "/api/widgets?ids=" + strings.Join(gets, ","), "", b},
			call{"create", "POST", "/api/things", string(create), b},
			call{"update", "PATCH", "/api/widgets", string(update), b},
			call{"delete", "DELETE", "/api/gadgets?ids=" + strings.Join(ids, ","), "", b},
		)
	}

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: len(calls)}}
	defer client.CloseIdleConnections()
	answers := make([]response, len(calls))
	errs := make([]error, len(calls))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k, c := range calls {
		wg.Go(func() {
			<-start
			answers[k], errs[k] = send(client, g.URL, c.method, c.path, c.body)
		})
	}
	close(start)
	wg.Wait()

	things := api.Items("/api/things")
	createdBy := map[int]int{} // batch -> records of things it left
	for _, rec := range things {
		n, _ := rec["batch"].(json.Number).Int64()
		createdBy[int(n)]++
	}
	for k, c := range calls {
		if errs[k] != nil {
			t.Errorf("%s batch %d: %v", c.op, c.batch, errs[k])
			continue
		}
		r := answers[k]
		var b batchAnswer
		if err := json.Unmarshal(r.Body, &b); err != nil || len(b.Items) != items {
			t.Errorf("%s batch %d: %d %s", c.op, c.batch, r.Status, r.Body)
			continue
		}
		fail := failing(c.batch) && c.op != "get"
		wantStatus := map[string]int{"get": 200, "create": 201, "update": 200, "delete": 200}[c.op]
		if fail {
			wantStatus = map[string]int{"create": 422, "update": 422, "delete": 502}[c.op]
		}
		if r.Status != wantStatus || fail != (b.Outcome == "rolled_back") || !fail && b.Outcome != "succeeded" {
			t.Errorf("%s batch %d: status %d outcome %q, want %d (failing on purpose: %v)", c.op, c.batch, r.Status, b.Outcome, wantStatus, fail)
			continue
		}
		for i, it := range b.Items {
			ok := it.Outcome == "succeeded"
			if fail {
				ok = it.Outcome == "rolled_back" || it.Outcome == "failed" || it.Outcome == "not_attempted"
			}
			if !ok || it.Index != i {
				t.Errorf("%s batch %d item %d: index %d outcome %q", c.op, c.batch, i, it.Index, it.Outcome)
			}
		}
		switch c.op {
		case "get":
			for i, it := range b.Items {
				want := widgets[strconv.Itoa(perOp*items+id(c.batch, i))]
				if !sameJSON(t, it.Body, want) {
					t.Errorf("get batch %d item %d: %s, want %v", c.batch, i, it.Body, want)
				}
			}
		case "create":
			if fail {
				if createdBy[c.batch] != 0 {
					t.Errorf("create batch %d failed but left %d records behind", c.batch, createdBy[c.batch])
				}
				continue
			}
			if createdBy[c.batch] != items {
				t.Errorf("create batch %d succeeded and left %d records, want %d", c.batch, createdBy[c.batch], items)
			}
			for i, it := range b.Items {
				if rec := things[it.ID]; rec["name"] != fmt.Sprintf("b%d-%d", c.batch, i) {
					t.Errorf("create batch %d item %d: id %q holds %v", c.batch, i, it.ID, rec)
				}
			}
		case "update":
			for i := range items {
				key := strconv.Itoa(id(c.batch, i))
				rec, _ := api.Item("/api/widgets", key)
				if fail && !reflect.DeepEqual(rec, widgets[key]) || !fail && rec["name"] != fmt.Sprintf("b%d-%d", c.batch, i) {
					t.Errorf("update batch %d (failing: %v): widget %s is %v (was %v)", c.batch, fail, key, rec, widgets[key])
				}
			}
		case "delete":
			for i := range items {
				key := strconv.Itoa(id(c.batch, i))
				rec, exists := api.Item("/api/gadgets", key)
				if fail && !reflect.DeepEqual(rec, gadgets[key]) || !fail && exists {
					t.Errorf("delete batch %d (failing: %v): gadget %s is %v (exists: %v)", c.batch, fail, key, rec, exists)
				}
			}
		}
	}
	want := 0
	for b := range perOp {
		if !failing(b) {
			want += items
		}
	}
	if len(things) != want {
		t.Errorf("/api/things holds %d records, want %d: orphans", len(things), want)
	}
	for k := range widgets {
		if n, _ := strconv.Atoi(k); n > perOp*items {
			if rec, _ := api.Item("/api/widgets", k); !reflect.DeepEqual(rec, widgets[k]) {
				t.Errorf("widget %s, only ever read, is %v", k, rec)
			}
		}
	}
}

// send is g.do for goroutines other than the test's: it reports errors
// instead of failing the test.
func send(client *http.Client, base, method, path, body string) (response, error) {
	return sendHeader(client, base, method, path, body, nil)
}

// sendHeader is send with header added to the request.
func sendHeader(client *http.Client, base, method, path, body string, header http.Header) (response, error) {
	var reader io.Reader
	if body != "" {
		reader = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, base+path, reader)
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: raw}, err
}

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

// TestUndoNeverOverwritesDirectWriters: with strong ETags, all-or-nothing
// batch updates and deletes through the gateway (some failing on
// purpose) meet writers that go straight to the legacy API, taking no
// lock. In the order the API carried writes out, an undo lands only
// right on top of its own batch's write to that item, never on another
// writer's; and an item reported rolled_back had its write undone.
// The API enforces its ETags' conditions: with conditional_writes they
// are the undos' proofs; without, every undo is also read first.
func TestUndoNeverOverwritesDirectWriters(t *testing.T) {
	t.Run("conditions and reads", func(t *testing.T) { testUndoNeverOverwritesDirectWriters(t, "") })
	t.Run("conditional_writes", func(t *testing.T) { testUndoNeverOverwritesDirectWriters(t, "conditional_writes") })
}

func testUndoNeverOverwritesDirectWriters(t *testing.T, options string) {
	const batches, directWriters, nIDs = 36, 3, 8
	api := legacyapi.NewRecording(legacyapi.Collection{Path: "/api/widgets", PutCreates: true, ETags: true, Seed: records("w", 1, nIDs)})
	g := startGateway(t, api, `
	batch {
		concurrency 3
		batch_timeout 60s
		`+options+`
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	for range 3 {
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: fmt.Sprintf("/api/widgets/%d", 1+rand.IntN(nIDs)), Status: 503, Body: htmlError, Times: 1})
	}
	client := &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: batches + directWriters}}
	defer client.CloseIdleConnections()

	done := make(chan struct{})
	var direct sync.WaitGroup
	for d := range directWriters {
		direct.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-done:
					return
				case <-time.After(time.Duration(1+rand.IntN(5)) * time.Millisecond):
				}
				id := 1 + rand.IntN(nIDs)
				if rand.IntN(2) == 0 {
					// The newest item: most likely one a batch has just
					// created.
					for k := range api.Items("/api/widgets") {
						if n, _ := strconv.Atoi(k); n > id {
							id = n
						}
					}
				}
				path := fmt.Sprintf("/api/widgets/%d?by=direct", id)
				var err error
				switch rand.IntN(8) {
				case 0:
					_, err = send(client, "http://"+g.upstream, "DELETE", path, "")
				case 1, 2, 3:
					_, err = send(client, "http://"+g.upstream, "PUT", path, fmt.Sprintf(`{"id":%d,"name":"w%d","v":"d%d-%d"}`, id, id, d, k))
				default:
					_, err = send(client, "http://"+g.upstream, "PATCH", path, fmt.Sprintf(`{"v":"d%d-%d"}`, d, k))
				}
				if err != nil {
					t.Errorf("direct writer %d: %v", d, err)
					return
				}
			}
		})
	}

	answers := make([]batchAnswer, batches)
	var wg sync.WaitGroup
	for b := range batches {
		wg.Go(func() {
			perm := rand.Perm(nIDs)[:2+rand.IntN(3)]
			method, path, body := "PATCH", "/api/widgets", ""
			switch b % 4 {
			case 0:
				var ids []string
				for _, i := range perm {
					ids = append(ids, strconv.Itoa(i+1))
				}
				method, path = "DELETE", "/api/widgets?ids="+strings.Join(ids, ",")
			default:
				elems := make([]map[string]any, len(perm))
				for k, i := range perm {
					elems[k] = map[string]any{"id": i + 1, "v": fmt.Sprintf("b%d", b)}
					if b%4 == 3 {
						elems[k] = map[string]any{"name": fmt.Sprintf("new b%d-%d", b, k)}
					}
				}
				if b%8 == 1 || b%8 == 7 {
					elems[len(elems)-1]["name"] = "" // the legacy API's 422
				}
				if b%4 == 3 {
					method = "POST"
				}
				raw, _ := json.Marshal(elems)
				body = string(raw)
			}
			answers[b] = sendKeyedBatch(t, client, g.URL, b, method, path, body, nil)
		})
	}
	wg.Wait()
	close(done)
	direct.Wait()

	l := judgeUndos(t, api, answers)
	if l.repeated != 0 {
		t.Errorf("%d undos landed on themselves: a retried conditional undo must fail on its own result", l.repeated)
	}
	for b, a := range answers {
		for _, it := range a.Items {
			if it.Outcome == "rollback_failed" && it.Compensation == nil {
				t.Errorf("batch %d item %d (id %s) is rollback_failed without saying why", b, it.Index, it.ID)
			}
		}
	}
	t.Logf("batch outcomes %v; %d writes carried out; %d re-creates after a direct writer's own delete", l.outcomes, len(l.applied), l.reborn)
}

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

// widgetEnvelope is an envelope of two operations: a PATCH of widget
// first with patch, then a PATCH of widget second with patch, or its
// DELETE when del. failing makes the first PATCH one the legacy API
// refuses (422).
func widgetEnvelope(first, second int, patch map[string]any, del, failing bool) string {
	ops := []map[string]any{
		{"id": "a", "method": "PATCH", "url": fmt.Sprintf("/api/widgets/%d", first), "body": patch},
		{"id": "b", "method": "PATCH", "url": fmt.Sprintf("/api/widgets/%d", second), "body": patch},
	}
	if del {
		ops[1] = map[string]any{"id": "b", "method": "DELETE", "url": fmt.Sprintf("/api/widgets/%d", second)}
	}
	if failing {
		refused := maps.Clone(patch)
		refused["name"] = "" // the legacy API's 422
		ops[0]["body"] = refused
	}
	raw, _ := json.Marshal(map[string]any{"operations": ops})
	return string(raw)
}

// sendKeyedBatch sends batch b of a randomized test, with the
// Idempotency-Key "b<b>" (so that its sub-requests carry "b<b>:<item>")
// and header, and returns its answer.
func sendKeyedBatch(t *testing.T, client *http.Client, base string, b int, method, path, body string, header http.Header) batchAnswer {
	h := http.Header{"Idempotency-Key": {fmt.Sprintf(`"b%d"`, b)}}
	maps.Copy(h, header)
	var a batchAnswer
	r, err := sendHeader(client, base, method, path, body, h)
	if err != nil {
		t.Errorf("batch %d: %v", b, err)
		return a
	}
	if err := json.Unmarshal(r.Body, &a); err != nil {
		t.Errorf("batch %d: %d, not a batch answer: %s", b, r.Status, r.Body)
	}
	return a
}

// batchKey is the Idempotency-Key a write to the legacy API carried,
// unquoted: "b3:1" for item 1 of the batch sendKeyedBatch sent as 3,
// "b3:1:undo" for its undo, "" for a write the gateway did not send.
func batchKey(r legacyapi.Request) string {
	return strings.Trim(r.Header.Get("Idempotency-Key"), `"`)
}

// undoLedger is what the writes a legacy API carried out say of the
// undos of batches sent by sendKeyedBatch.
type undoLedger struct {
	applied  []legacyapi.Request
	last     map[string]legacyapi.Request // item path -> the last write carried out on it
	outcomes map[string]int               // batches by outcome
	// Undos that landed on something other than their batch's write, of
	// the two kinds a caller may allow: a re-create after another
	// writer's delete (a missing item has no ETag to tell deletes apart),
	// and a retried undo on its own first copy.
	reborn, repeated int
}

// judgeUndos walks the writes api carried out, in order, for the batches
// whose answers are given. It fails the test where an undo landed on a
// write its batch did not make (beyond the two kinds undoLedger counts),
// and where an item reported rolled_back had its write carried out and
// no undo after it.
func judgeUndos(t *testing.T, api *legacyapi.API, answers []batchAnswer) undoLedger {
	t.Helper()
	l := undoLedger{applied: api.AppliedWrites(), last: map[string]legacyapi.Request{}, outcomes: map[string]int{}}
	wrote := map[string]bool{}  // keys of batch writes carried out
	undone := map[string]bool{} // keys of batch writes whose undo was carried out
	// A create is undone, with no undo of its own, when another writer
	// deleted what it made (docs/all-or-nothing.md).
	created := map[string]string{} // item path -> the key of the create that made it
	deletedBy := map[string]bool{} // keys of creates whose item another writer deleted
	for _, w := range l.applied {
		key := batchKey(w)
		if w.Method == http.MethodDelete && created[w.Path] != "" && key != created[w.Path]+":undo" {
			deletedBy[created[w.Path]] = true
		}
		if w.Method == http.MethodPost {
			// A create's effect is on the item it made: the id its batch
			// answered with.
			var b, i int
			if _, err := fmt.Sscanf(key, "b%d:%d", &b, &i); err != nil || b >= len(answers) || i >= len(answers[b].Items) {
				t.Fatalf("a create the test cannot place: %s (%q)", w.Body, key)
			}
			w.Path = "/api/widgets/" + answers[b].Items[i].ID
			created[w.Path] = key
		}
		if write, isUndo := strings.CutSuffix(key, ":undo"); isUndo {
			switch prev := l.last[w.Path]; {
			case batchKey(prev) == write:
			case batchKey(prev) == key:
				l.repeated++
			case w.Header.Get("If-None-Match") == "*" && prev.Method == http.MethodDelete:
				l.reborn++
			default:
				t.Errorf("the undo %s %s (%s) landed on a write it did not make: %s %s (%q)", w.Method, w.Path, key, prev.Method, prev.Body, batchKey(prev))
			}
			undone[write] = true
		} else {
			wrote[key] = true
		}
		l.last[w.Path] = w
	}
	for b, a := range answers {
		l.outcomes[a.Outcome]++
		for _, it := range a.Items {
			key := fmt.Sprintf("b%d:%d", b, it.Index)
			if it.Outcome == "rolled_back" && wrote[key] && !undone[key] && !deletedBy[key] {
				t.Errorf("batch %d item %d (id %s) is reported rolled_back, but its write was never undone", b, it.Index, it.ID)
			}
		}
	}
	return l
}
