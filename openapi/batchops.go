package openapi

import (
	"fmt"
	"strconv"

	"github.com/caddy-batch/caddy-batch/policy"
)

// batchOps writes one resource's batch operations on its collection.
type batchOps struct {
	p       *publication
	r       *policy.Resource
	name    string
	coll    map[string]any
	collKey string
	answer  map[string]any // the $ref of the resource's batch answer
}

// mayBePartial says whether a batch of op can answer 207: it runs
// partial, or clients may ask for it.
func (b batchOps) mayBePartial(op policy.Op) bool {
	return b.r.Settings.Atomicity[op] == policy.Partial || b.r.Settings.AllowOverride
}

// idsParam is the ids parameter: an array sent form-style, unexploded,
// so that generated clients send ids=1,2,3 with literal commas (as a
// plain string they would send %2C, which is part of one id).
func (b batchOps) idsParam(required bool) map[string]any {
	return map[string]any{
		"name": b.r.Settings.IDsParam, "in": "query", "required": required,
		"style": "form", "explode": false,
		"description": "the ids of a batch, comma-separated; each is one item of the batch",
		"schema":      map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "minItems": 1},
	}
}

// writeHeaders are the request headers of a batch write.
func writeHeaders() []any {
	return []any{
		map[string]any{"name": "Idempotency-Key", "in": "header", "required": false,
			"description": "the same key again is answered with the first answer, and nothing runs again",
			"schema":      map[string]any{"type": "string"}},
		map[string]any{"name": "Prefer", "in": "header", "required": false,
			"description": "atomicity=partial or atomicity=all-or-nothing, where the gateway allows clients to choose",
			"schema":      map[string]any{"type": "string"}},
	}
}

// operation returns the collection's operation for method, made when
// the input lacks it, with the path parameters it needs.
func (b batchOps) operation(method string) map[string]any {
	op, ok := b.coll[method].(map[string]any)
	if !ok {
		op = map[string]any{"parameters": pathParams(b.coll, b.collKey, b.r.Settings.IDFormat), "responses": map[string]any{}}
		b.coll[method] = op
	}
	return op
}

func (b batchOps) get() {
	op := b.operation("get")
	if op["operationId"] == nil {
		op["operationId"] = b.p.operationID("list" + b.name)
	}
	addParams(op, b.r.Settings.IDsParam, b.idsParam(false))
	resps := mapAt(op, "responses")
	b.answerAs(resps, "200", "the list, or with "+b.r.Settings.IDsParam+" the batch answer", false)
	if b.mayBePartial(policy.OpGet) {
		resps["207"] = b.batchAnswer(false)
	}
	addProblems(resps)
}

func (b batchOps) create(itemSchema any) {
	op := b.operation("post")
	if op["operationId"] == nil {
		op["operationId"] = b.p.operationID("create" + b.name)
	}
	single := requestSchema(b.coll, "post")
	if single == nil {
		single = itemSchema
	}
	if rb, ok := op["requestBody"].(map[string]any); !ok || rb["$ref"] != nil {
		op["requestBody"] = map[string]any{} // a shared body cannot take the array beside it
	}
	body := mapAt(op, "requestBody")
	body["required"] = true
	body["content"] = jsonContent(map[string]any{"oneOf": []any{single, map[string]any{"type": "array", "items": single, "minItems": 1}}})
	addParams(op, "", writeHeaders()...)
	resps := mapAt(op, "responses")
	b.answerAs(resps, "201", "created; with an array body, the batch answer", true)
	if b.mayBePartial(policy.OpCreate) {
		resps["207"] = b.batchAnswer(true)
	}
	addProblems(resps)
}

func (b batchOps) update(elem any) {
	op := map[string]any{
		"operationId": b.p.operationID("batchUpdate" + b.name),
		"summary":     "Update many items in one batch",
		"description": fmt.Sprintf("Each element carries its id in %q and is sent as PATCH to its item, without it.", b.r.Settings.IDField),
		"parameters":  append(pathParams(b.coll, b.collKey, b.r.Settings.IDFormat), writeHeaders()...),
		"requestBody": map[string]any{"required": true, "content": jsonContent(map[string]any{"type": "array", "items": elem, "minItems": 1})},
		"responses":   b.writeResponses(policy.OpUpdate),
	}
	b.coll["patch"] = op
}

func (b batchOps) delete() {
	op := map[string]any{
		"operationId": b.p.operationID("batchDelete" + b.name),
		"summary":     "Delete many items in one batch",
		"parameters":  append(append(pathParams(b.coll, b.collKey, b.r.Settings.IDFormat), b.idsParam(true)), writeHeaders()...),
		"responses":   b.writeResponses(policy.OpDelete),
	}
	b.coll["delete"] = op
}

func (b batchOps) writeResponses(op policy.Op) map[string]any {
	resps := map[string]any{"200": b.batchAnswer(true)}
	if b.mayBePartial(op) {
		resps["207"] = b.batchAnswer(true)
	}
	addProblems(resps)
	return resps
}

// answerAs makes the batch answer the response with status, beside what
// the input answers there (oneOf).
func (b batchOps) answerAs(resps map[string]any, status, description string, write bool) {
	existing, _ := resps[status].(map[string]any)
	if existing == nil || existing["$ref"] != nil {
		resps[status] = b.batchAnswer(write)
		return
	}
	if s := jsonSchemaOf(existing); s != nil {
		existing["content"] = jsonContent(map[string]any{"oneOf": []any{s, b.answer}})
	} else {
		existing["content"] = jsonContent(b.answer)
	}
	existing["description"] = description
	existing["headers"] = answerHeaders(write)
}

func (b batchOps) batchAnswer(write bool) map[string]any {
	return map[string]any{"description": "the batch answer, items in request order", "headers": answerHeaders(write), "content": jsonContent(b.answer)}
}

// answerHeaders are the headers a batch answer may carry, as
// references to components.headers (sharedComponents).
func answerHeaders(write bool) map[string]any {
	h := map[string]any{
		"Preference-Applied": ref("#/components/headers/PreferenceApplied"),
		"Retry-After":        ref("#/components/headers/RetryAfter"),
	}
	if write {
		h["Idempotent-Replayed"] = ref("#/components/headers/IdempotentReplayed")
	}
	return h
}

func header(description string) map[string]any {
	return map[string]any{"description": description, "schema": map[string]any{"type": "string"}}
}

// problemStatuses are the gateway's own answers to a batch, as problems.
var problemStatuses = []int{400, 405, 409, 412, 413, 422, 424, 500, 503, 504}

// problemResponse is the gateway's problem answer, shared by reference.
const problemResponse = "#/components/responses/BatchProblem"

func addProblems(resps map[string]any) {
	for _, status := range problemStatuses {
		key := strconv.Itoa(status)
		existing, ok := resps[key].(map[string]any)
		switch {
		case !ok:
			resps[key] = ref(problemResponse)
		case existing["$ref"] == nil:
			mapAt(existing, "content")["application/problem+json"] = map[string]any{"schema": ref("#/components/schemas/BatchProblem")}
		}
	}
}

// sharedComponents writes what every batch operation refers to.
func (p *publication) sharedComponents() {
	p.schemas["BatchProblem"] = problemSchema()
	p.schemas["BatchProblemItem"] = itemResultSchema(map[string]any{}, true)
	components := mapAt(p.doc, "components")
	mapAt(components, "responses")["BatchProblem"] = map[string]any{
		"description": "a problem (RFC 9457); for a failed batch, with its items",
		"content":     map[string]any{"application/problem+json": map[string]any{"schema": ref("#/components/schemas/BatchProblem")}},
	}
	headers := mapAt(components, "headers")
	headers["PreferenceApplied"] = header("atomicity=…, when the client's Prefer was honoured")
	headers["RetryAfter"] = header("the largest Retry-After among the items")
	headers["IdempotentReplayed"] = header("true when the answer is replayed for an Idempotency-Key")
}

// addParams adds parameters to an operation, replacing one of the input
// named replace (an ids parameter of its own would clash).
func addParams(op map[string]any, replace string, params ...any) {
	list, _ := op["parameters"].([]any)
	var out []any
	for _, e := range list {
		if m, ok := e.(map[string]any); ok && replace != "" && m["name"] == replace && m["in"] == "query" {
			continue
		}
		out = append(out, e)
	}
	op["parameters"] = append(out, params...)
}

// addEnvelope writes the envelope's POST (docs/envelope.md).
func (p *publication) addEnvelope() {
	key, ok := p.key("", p.gateway.Envelope)
	if !ok {
		return
	}
	p.schemas["BatchEnvelope"] = envelopeSchema()
	p.schemas["BatchEnvelopeItem"] = itemResultSchema(map[string]any{}, true)
	p.schemas["BatchEnvelopeAnswer"] = answerSchema("#/components/schemas/BatchEnvelopeItem")
	answer := map[string]any{"description": "the envelope's answer, items in operation order", "headers": answerHeaders(true),
		"content": jsonContent(ref("#/components/schemas/BatchEnvelopeAnswer"))}
	resps := map[string]any{"200": answer, "207": answer}
	addProblems(resps)
	mapAt(p.paths, key)["post"] = map[string]any{
		"operationId": p.operationID("batchEnvelope"),
		"summary":     "Run single-item operations on several resources as one batch",
		"parameters":  writeHeaders(),
		"requestBody": map[string]any{"required": true, "content": jsonContent(ref("#/components/schemas/BatchEnvelope"))},
		"responses":   resps,
	}
}
