package caddymodule

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-batch/caddy-batch/internal/options"
)

// everyOption sets every option, as the handler's or a resource's.
func everyOption() options.Options {
	on, off, three, wait := true, false, 3, caddy.Duration(2*time.Second)
	return options.Options{
		Atomicity: "partial", OperationAtomicity: map[string]string{"delete": "all_or_nothing"},
		AllowOverride: &on, MaxItems: 50, MaxBodySize: 1 << 20, Concurrency: 4,
		ItemTimeout: caddy.Duration(time.Second), BatchTimeout: caddy.Duration(time.Minute),
		IDsParam: "id", IDField: "key", DeleteSemantics: "declarative", RestoreDeleted: "post", RestoreUpdated: "patch",
		CompensationRetries: &three, CompensationTimeout: caddy.Duration(5 * time.Second),
		IdempotentUpstream: &on, ConditionalWrites: &off, ScopeQuery: []string{"tenant"}, IDFormat: "integer",
		StampedFields: []string{"updated_at"}, ItemLocks: "storage", MaxResponseSize: 1 << 24,
		MaxInFlight: 16, MaxInFlightAuto: &options.AutoInFlight{Min: 2, Max: 8}, MaxThrottleWait: &wait,
		IdempotencyTTL: caddy.Duration(time.Hour), Journal: &off,
	}
}

// TestHandlerJSON pins the handler's JSON: the options, embedded in the
// handler and in each resource, stay members of their objects.
func TestHandlerJSON(t *testing.T) {
	ops := []string{"get", "update"}
	h := Handler{
		Options: everyOption(),
		Resources: []Resource{{
			Path: "/api/users", Collection: []string{"GET", "POST"}, Item: []string{"GET", "PUT"}, ItemPath: "/api/users/{id}/",
			Batch: &ops, ListFilter: &ListFilterConfig{Query: "id={id}", Items: "/results", MaxIDs: 20, Preflight: true},
			Options: everyOption(),
		}},
		Envelope: "/api/batch",
		OpenAPI:  &OpenAPIConfig{File: "/etc/api.yaml", SHA256: "00", Publish: "/openapi.json", Include: []string{"/users*"}, Exclude: []string{"/x"}},
	}
	got, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	const options = `"atomicity":"partial","operation_atomicity":{"delete":"all_or_nothing"},"allow_override":true,"max_items":50,"max_body_size":1048576,"concurrency":4,"item_timeout":1000000000,"batch_timeout":60000000000,"ids_param":"id","id_field":"key","delete_semantics":"declarative","restore_deleted":"post","restore_updated":"patch","compensation_retries":3,"compensation_timeout":5000000000,"idempotent_upstream":true,"conditional_writes":false,"scope_query":["tenant"],"id_format":"integer","stamped_fields":["updated_at"],"item_locks":"storage","max_response_size":16777216,"max_in_flight":16,"max_in_flight_auto":{"min":2,"max":8},"max_throttle_wait":2000000000,"idempotency_ttl":3600000000000,"journal":false`
	want := `{` + options + `,"resources":[{"path":"/api/users","collection":["GET","POST"],"item":["GET","PUT"],"item_path":"/api/users/{id}/","batch":["get","update"],"list_filter":{"query":"id={id}","items":"/results","max_ids":20,"preflight":true},` + options + `}],"envelope":"/api/batch","openapi":{"file":"/etc/api.yaml","sha256":"00","publish":"/openapi.json","include":["/users*"],"exclude":["/x"]}}`
	if !bytes.Equal(got, []byte(want)) {
		t.Errorf("the handler's JSON is\n%s\nwant\n%s", got, want)
	}
}
