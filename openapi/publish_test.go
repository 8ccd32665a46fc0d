package openapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// publish imports a document with default settings and publishes it.
func publish(t testing.TB, file string, g Gateway) (map[string]any, []byte) {
	t.Helper()
	im, err := Import(load(t, file), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := gateway(t, im)
	var served []Served
	for i, r := range p.Resources() {
		served = append(served, Served{Resource: r, DocPath: im.Resources[i].DocPath, DocItemPath: im.Resources[i].DocItemPath})
	}
	if g.Prefix == "" {
		g.Prefix = im.Prefix
	}
	raw, err := Publish(im, served, g)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc, raw
}

// at walks a published document by keys.
func at(t testing.TB, v any, keys ...string) any {
	t.Helper()
	for i, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("%s is not an object", strings.Join(keys[:i], "/"))
		}
		if v, ok = m[k]; !ok {
			t.Fatalf("%s has no %s", strings.Join(keys[:i], "/"), k)
		}
	}
	return v
}

func has(v any, key string) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	_, ok = m[key]
	return ok
}

func param(op any, name string) map[string]any {
	list, _ := op.(map[string]any)["parameters"].([]any)
	for _, p := range list {
		if m, ok := p.(map[string]any); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

// TestPublishDjangoRESTFramework checks, on the document Django REST
// framework generates, every addition the gateway publishes.
func TestPublishDjangoRESTFramework(t *testing.T) {
	t.Parallel()
	doc, raw := publish(t, "drf.yaml", Gateway{Envelope: "/api/batch"})
	if _, err := Parse("published.json", raw); err != nil {
		t.Fatalf("the published document does not parse: %v", err)
	}
	if at(t, doc, "openapi") != "3.0.2" || at(t, doc, "info", "version") != "unversioned" {
		t.Errorf("openapi %v, info %v", doc["openapi"], doc["info"])
	}
	servers := at(t, doc, "servers").([]any)
	if len(servers) != 1 || at(t, servers[0], "url") != "/" {
		t.Errorf("servers %v", servers)
	}
	authors := at(t, doc, "paths", "/api/authors/")
	list := at(t, authors, "get")
	ids := param(list, "ids")
	if ids == nil || ids["style"] != "form" || ids["explode"] != false || at(t, ids, "schema", "type") != "array" || ids["required"] != false {
		t.Errorf("ids on the LIST: %v", ids)
	}
	if param(list, "page") == nil {
		t.Error("the LIST lost its own page parameter")
	}
	oneOf := at(t, list, "responses", "200", "content", "application/json", "schema", "oneOf").([]any)
	if len(oneOf) != 2 || !has(at(t, oneOf[0], "properties"), "results") || at(t, oneOf[1], "$ref") != "#/components/schemas/BatchAnswerAuthors" {
		t.Errorf("LIST 200: %v", oneOf)
	}
	if has(at(t, list, "responses"), "207") {
		t.Error("207 on an all-or-nothing batch GET without allow_override")
	}
	// The batch answer's items carry the author as their body.
	if at(t, doc, "components", "schemas", "BatchItemAuthors", "properties", "body", "$ref") != "#/components/schemas/Author" {
		t.Error("the batch items' body is not the Author")
	}
	create := at(t, authors, "post")
	alts := at(t, create, "requestBody", "content", "application/json", "schema", "oneOf").([]any)
	if len(alts) != 2 || at(t, alts[1], "type") != "array" || at(t, alts[1], "items", "$ref") != "#/components/schemas/Author" {
		t.Errorf("POST body: %v", alts)
	}
	if param(create, "Idempotency-Key") == nil || param(create, "Prefer") == nil {
		t.Error("no Idempotency-Key or Prefer on the batch create")
	}
	for _, h := range []string{"Preference-Applied", "Retry-After", "Idempotent-Replayed"} {
		if !has(at(t, create, "responses", "201", "headers"), h) || !has(at(t, doc, "components", "headers"), strings.ReplaceAll(h, "-", "")) {
			t.Errorf("no %s header on the batch create's answer", h)
		}
	}
	update := at(t, authors, "patch")
	if at(t, update, "operationId") != "batchUpdateAuthors" || at(t, update, "requestBody", "content", "application/json", "schema", "type") != "array" {
		t.Errorf("PATCH: %v", update)
	}
	del := at(t, authors, "delete")
	if at(t, del, "operationId") != "batchDeleteAuthors" || param(del, "ids")["required"] != true {
		t.Errorf("DELETE: %v", del)
	}
	for _, status := range []string{"400", "405", "409", "412", "413", "422", "424", "500", "503", "504"} {
		if at(t, del, "responses", status, "$ref") != problemResponse {
			t.Errorf("no problem %s on the batch delete", status)
		}
	}
	// Books: no batch delete (nothing could put a book back), so no
	// DELETE on the collection; the item's own DELETE stays.
	if has(at(t, doc, "paths", "/api/books/"), "delete") || !has(at(t, doc, "paths", "/api/books/{isbn}/"), "delete") {
		t.Error("books' DELETEs are published wrong")
	}
	// Stats have no items: no batch, no ids.
	if param(at(t, doc, "paths", "/api/stats/", "get"), "ids") != nil {
		t.Error("ids on a resource without items")
	}
	env := at(t, doc, "paths", "/api/batch", "post")
	if at(t, env, "operationId") != "batchEnvelope" {
		t.Errorf("envelope: %v", env)
	}
}

// TestPublishLeavesOutWhatTheMapRefuses: an operation the gateway
// answers 405 or 501 is not published, nor is an excluded path; the
// servers url is the gateway's, with the prefix; 207 where a batch can
// be partial.
func TestPublishLeavesOutWhatTheMapRefuses(t *testing.T) {
	t.Parallel()
	d := load(t, "express.yaml")
	im, err := Import(d, Options{Exclude: []string{"/health"}})
	if err != nil {
		t.Fatal(err)
	}
	var specs []policy.ResourceSpec
	for _, r := range im.Resources {
		s := r.Spec(policy.Defaults(), policy.GatewayDefaults())
		if r.DocPath == "/users" {
			s.ItemMethods = []string{"GET", "DELETE"} // a resource block: item GET DELETE
			s.Settings.Atomicity[policy.OpDelete] = policy.Partial
		}
		Derive(&s, false)
		specs = append(specs, s)
	}
	p, err := policy.New(specs)
	if err != nil {
		t.Fatal(err)
	}
	var served []Served
	for i, r := range p.Resources() {
		served = append(served, Served{Resource: r, DocPath: im.Resources[i].DocPath, DocItemPath: im.Resources[i].DocItemPath})
	}
	raw, err := Publish(im, served, Gateway{Prefix: im.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "localhost:3000") || at(t, doc, "servers").([]any)[0].(map[string]any)["url"] != "/api/v1" {
		t.Errorf("servers: %v", doc["servers"])
	}
	user := at(t, doc, "paths", "/users/{id}")
	if has(user, "put") || has(user, "trace") || !has(user, "get") || !has(user, "delete") {
		t.Errorf("/users/{id} publishes %v", user)
	}
	if has(at(t, doc, "paths"), "/health") {
		t.Error("an excluded path is published")
	}
	if !has(at(t, doc, "paths", "/users", "delete", "responses"), "207") {
		t.Error("no 207 on a partial batch delete")
	}
	if _, err := Parse("published.json", raw); err != nil {
		t.Fatal(err)
	}
}

// TestPublishFastAPIKeeps31: a 3.1 input is published as 3.1, its
// anyOf nullables untouched.
func TestPublishFastAPIKeeps31(t *testing.T) {
	t.Parallel()
	doc, raw := publish(t, "fastapi.json", Gateway{})
	if doc["openapi"] != "3.1.0" {
		t.Errorf("openapi %v", doc["openapi"])
	}
	if at(t, doc, "components", "schemas", "Item", "properties", "description", "anyOf") == nil {
		t.Error("the anyOf nullable is lost")
	}
	if at(t, doc, "components", "schemas", "BatchItemItems", "properties", "body", "$ref") != "#/components/schemas/Item" {
		t.Error("the batch items' body is not the Item")
	}
	if _, err := Parse("published.json", raw); err != nil {
		t.Fatal(err)
	}
}

// TestPublishDeclaredOnly: without a document, the resources make one,
// 3.0.3, with free-form bodies and every path parameter declared; a
// variable's format is the gateway's, not part of the path's name.
func TestPublishDeclaredOnly(t *testing.T) {
	t.Parallel()
	s := policy.ResourceSpec{Path: "/api/users/{user:integer}/posts", CollectionMethods: []string{"GET", "POST", "DELETE"}, ItemMethods: []string{"GET", "PUT", "DELETE"},
		Settings: policy.Defaults(), Gateway: policy.GatewayDefaults()}
	p, err := policy.New([]policy.ResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := Publish(nil, []Served{{Resource: p.Resources()[0]}}, Gateway{Prefix: "/api"})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["openapi"] != DefaultVersion || !has(at(t, doc, "paths", "/users/{user}/posts"), "delete") || !has(at(t, doc, "paths", "/users/{user}/posts/{id}"), "put") {
		t.Errorf("%s", raw)
	}
	if _, err := Parse("published.json", raw); err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
}
