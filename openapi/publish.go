package openapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Served is one resource as the gateway serves it, and where it comes
// from in the input document.
type Served struct {
	Resource *policy.Resource
	// DocPath and DocItemPath are the input document's keys of the
	// collection and its items; "" for a resource the document does not
	// have (declared in the configuration alone).
	DocPath, DocItemPath string
}

// Gateway is what the published document says of the gateway itself.
type Gateway struct {
	// Prefix is the path the document's paths are served under, "" for
	// the root; it becomes the document's only servers url.
	Prefix string
	// Envelope is the envelope's path (docs/envelope.md), "" for none.
	Envelope string
}

// DefaultVersion is the version of a document built without input: the
// one most client generators read best.
const DefaultVersion = "3.0.3"

// Publish writes the document as the gateway serves it: the input's
// paths the map serves (im nil: a document built from the resources,
// with free-form item schemas) and the operations the gateway adds
// (docs/openapi.md, "From OpenAPI"). Its servers are the gateway's, a relative
// url, so no internal host name is published.
func Publish(im *Imported, served []Served, g Gateway) ([]byte, error) {
	p := &publication{doc: map[string]any{}, gateway: g, names: map[string]bool{}, opIDs: map[string]bool{}}
	if im != nil {
		if err := json.Unmarshal(im.Doc.raw, &p.doc); err != nil {
			return nil, err
		}
	} else {
		p.doc["openapi"] = DefaultVersion
	}
	p.fillInfo()
	url := g.Prefix
	if url == "" {
		url = "/"
	}
	p.doc["servers"] = []any{map[string]any{"url": url, "description": "the gateway"}}
	p.paths = mapAt(p.doc, "paths")
	p.schemas = mapAt(mapAt(p.doc, "components"), "schemas")
	p.keepServed(im, served)
	p.collectOperationIDs()
	p.sharedComponents()
	for _, s := range served {
		p.addResource(s)
	}
	if g.Envelope != "" {
		p.addEnvelope()
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p.doc); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

type publication struct {
	doc     map[string]any
	paths   map[string]any
	schemas map[string]any
	gateway Gateway
	names   map[string]bool // resource names given out
	opIDs   map[string]bool // operationIds in the document
}

func (p *publication) fillInfo() {
	info := mapAt(p.doc, "info")
	if s, _ := info["title"].(string); s == "" {
		info["title"] = "API served by caddy-batch"
	}
	if s, _ := info["version"].(string); s == "" {
		info["version"] = "unversioned"
	}
}

// docMethods are the operations of a path item, by their field names.
var docMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// keepServed leaves in the input's paths only those the gateway imported,
// and in each only the operations its method map allows.
func (p *publication) keepServed(im *Imported, served []Served) {
	allowed := map[string]policy.MethodSet{}
	for _, s := range served {
		if s.DocPath != "" {
			allowed[s.DocPath] = s.Resource.CollectionMethods
		}
		if s.DocItemPath != "" {
			allowed[s.DocItemPath] = s.Resource.ItemMethods
		}
	}
	for key, v := range p.paths {
		item, _ := v.(map[string]any)
		methods, ok := allowed[key]
		if im == nil || !im.Paths[key] || !ok || item == nil {
			delete(p.paths, key)
			continue
		}
		for _, m := range docMethods {
			bit, known := policy.ParseMethod(strings.ToUpper(m))
			if _, has := item[m]; has && (!known || !methods.Has(bit)) {
				delete(item, m)
			}
		}
	}
}

func (p *publication) collectOperationIDs() {
	for _, v := range p.paths {
		item, _ := v.(map[string]any)
		for _, m := range docMethods {
			if op, ok := item[m].(map[string]any); ok {
				if id, ok := op["operationId"].(string); ok {
					p.opIDs[id] = true
				}
			}
		}
	}
}

// operationID returns want, or want with a number when the document
// has it already.
func (p *publication) operationID(want string) string {
	id := want
	for n := 2; p.opIDs[id]; n++ {
		id = want + strconv.Itoa(n)
	}
	p.opIDs[id] = true
	return id
}

// addResource writes what the gateway serves on one resource: the
// operations its map allows that the input lacks, and the batch ones.
func (p *publication) addResource(s Served) {
	r := s.Resource
	collKey, ok := p.key(s.DocPath, r.Collection.Plain())
	if !ok {
		return
	}
	name := p.resourceName(collKey)
	coll := mapAt(p.paths, collKey)
	itemKey, hasItem := p.key(s.DocItemPath, r.Item.Plain())
	hasItem = hasItem && (r.ItemMethods&^(policy.MethodHead|policy.MethodOptions) != 0)
	var item map[string]any
	if hasItem {
		item = mapAt(p.paths, itemKey)
		p.addSingles(item, itemKey, r.ItemMethods, name, true, r)
	}
	p.addSingles(coll, collKey, r.CollectionMethods, name, false, r)
	if !slices.ContainsFunc([]policy.Op{policy.OpGet, policy.OpCreate, policy.OpUpdate, policy.OpDelete}, r.BatchEnabled) {
		return
	}
	itemSchema := bodySchema(item, "get", "200")
	if itemSchema == nil {
		itemSchema = requestSchema(coll, "post")
	}
	if itemSchema == nil {
		itemSchema = map[string]any{"type": "object"}
	}
	p.schemas["BatchItem"+name] = itemResultSchema(itemSchema, false)
	p.schemas["BatchAnswer"+name] = answerSchema("#/components/schemas/BatchItem" + name)
	answer := ref("#/components/schemas/BatchAnswer" + name)
	b := batchOps{p: p, r: r, name: name, coll: coll, collKey: collKey, answer: answer}
	if r.BatchEnabled(policy.OpGet) {
		b.get()
	}
	if r.BatchEnabled(policy.OpCreate) {
		b.create(itemSchema)
	}
	if r.BatchEnabled(policy.OpUpdate) {
		elem := requestSchema(item, "patch")
		if elem == nil {
			elem = itemSchema
		}
		b.update(elem)
	}
	if r.BatchEnabled(policy.OpDelete) {
		b.delete()
	}
}

// key is the path key of a route in the published document: the
// input's, or the gateway's template under the prefix.
func (p *publication) key(docPath, template string) (string, bool) {
	if docPath != "" {
		return docPath, true
	}
	if p.gateway.Prefix == "" {
		return template, true
	}
	rest, ok := strings.CutPrefix(template, p.gateway.Prefix)
	if !ok || !strings.HasPrefix(rest, "/") {
		return "", false // not under the servers url: it cannot be written
	}
	return rest, true
}

// resourceName names a resource's schemas and operations: its last
// literal segment in CamelCase ("Users"), or all of them when that name
// is taken.
func (p *publication) resourceName(key string) string {
	var lits []string
	for _, seg := range strings.Split(strings.Trim(key, "/"), "/") {
		if !strings.HasPrefix(seg, "{") {
			lits = append(lits, camel(seg))
		}
	}
	name := "Resource"
	if len(lits) > 0 {
		name = lits[len(lits)-1]
		if p.names[name] {
			name = strings.Join(lits, "")
		}
	}
	base := name
	for n := 2; p.names[name]; n++ {
		name = base + strconv.Itoa(n)
	}
	p.names[name] = true
	return name
}

func camel(s string) string {
	var b strings.Builder
	up := true
	for _, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
			if up && 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			b.WriteRune(c)
			up = false
		default:
			up = true
		}
	}
	return b.String()
}

// addSingles writes the single operations the map allows on a route that
// the input does not describe (a resource declared in the configuration,
// or a method its resource block adds), with free-form bodies.
func (p *publication) addSingles(pathItem map[string]any, key string, allowed policy.MethodSet, name string, isItem bool, r *policy.Resource) {
	for _, m := range []string{"get", "put", "post", "patch", "delete"} {
		bit, _ := policy.ParseMethod(strings.ToUpper(m))
		if _, has := pathItem[m]; has || !allowed.Has(bit) {
			continue
		}
		if !isItem && (m == "patch" && r.BatchEnabled(policy.OpUpdate) || m == "delete" && r.BatchEnabled(policy.OpDelete)) {
			continue // the batch operation is written there instead
		}
		what := name
		if isItem {
			what += "Item"
		}
		op := map[string]any{
			"operationId": p.operationID(m + what),
			"summary":     fmt.Sprintf("%s %s, passed to the legacy API", strings.ToUpper(m), key),
			"parameters":  pathParams(pathItem, key, r.Settings.IDFormat),
			"responses": map[string]any{
				"default": map[string]any{"description": "the legacy API's answer", "content": jsonContent(map[string]any{})},
			},
		}
		if m != "get" && m != "delete" {
			op["requestBody"] = map[string]any{"required": true, "content": jsonContent(map[string]any{"type": "object"})}
		}
		pathItem[m] = op
	}
}

// pathParams returns the path parameters an operation added to a path
// item needs: copied from a sibling operation that declares them, else
// strings (the id's format where the variable is the item's).
func pathParams(pathItem map[string]any, key string, f policy.IDFormat) []any {
	if _, ok := pathItem["parameters"]; ok {
		if declared := declaredPathParams(pathItem["parameters"]); len(declared) > 0 {
			return []any{} // the path item declares them for every operation
		}
	}
	for _, m := range docMethods {
		if op, ok := pathItem[m].(map[string]any); ok {
			if declared := declaredPathParams(op["parameters"]); len(declared) > 0 {
				return declared
			}
		}
	}
	var out []any
	for _, seg := range strings.Split(key, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") {
			schema := map[string]any{"type": "string"}
			if seg == "{id}" && f == policy.IDInteger {
				schema = map[string]any{"type": "integer"}
			} else if seg == "{id}" && f == policy.IDUUID {
				schema["format"] = "uuid"
			}
			out = append(out, map[string]any{"name": seg[1 : len(seg)-1], "in": "path", "required": true, "schema": schema})
		}
	}
	return out
}

func declaredPathParams(v any) []any {
	list, _ := v.([]any)
	var out []any
	for _, e := range list {
		if m, ok := e.(map[string]any); ok && (m["in"] == "path" || m["$ref"] != nil) {
			out = append(out, m)
		}
	}
	return out
}

// bodySchema is the JSON schema of an operation's answer with status.
func bodySchema(pathItem map[string]any, method, status string) any {
	op, _ := pathItem[method].(map[string]any)
	resp, _ := mapOf(op["responses"])[status].(map[string]any)
	return jsonSchemaOf(resp)
}

// requestSchema is the JSON schema of an operation's request body.
func requestSchema(pathItem map[string]any, method string) any {
	op, _ := pathItem[method].(map[string]any)
	body, _ := op["requestBody"].(map[string]any)
	return jsonSchemaOf(body)
}

func jsonSchemaOf(holder map[string]any) any {
	content := mapOf(holder["content"])
	for _, mt := range slices.Sorted(maps.Keys(content)) {
		if mt == "application/json" || strings.HasSuffix(mt, "+json") {
			if media, ok := content[mt].(map[string]any); ok && media["schema"] != nil {
				return media["schema"]
			}
		}
	}
	return nil
}

// mapAt returns m[key] as an object, making it when it is missing.
func mapAt(m map[string]any, key string) map[string]any {
	if v, ok := m[key].(map[string]any); ok {
		return v
	}
	v := map[string]any{}
	m[key] = v
	return v
}

func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func ref(pointer string) map[string]any { return map[string]any{"$ref": pointer} }

func jsonContent(schema any) map[string]any {
	return map[string]any{"application/json": map[string]any{"schema": schema}}
}
