package caddymodule

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// configMistake is one configuration an operator can get wrong, and what the
// Caddyfile adapter must answer.
type configMistake struct {
	name string
	// config is the batch directive, as lines of a site block that
	// starts on line 1: its first line is line 2.
	config []string
	line   int    // the line the error names
	want   string // the whole message, without ", at Caddyfile:<line>"
	// syntax marks a mistake only a Caddyfile can make (or, for a zero,
	// that JSON cannot carry): the adapter refuses it while reading.
	syntax bool
	// jsonWant is Provision's message for the same configuration in
	// JSON, when it differs from want (JSON has no lines).
	jsonWant string
}

// usersResource is a resource every batch operation and undo works for.
// listResource is usersResource with the given lines of list_filter,
// from line 6 of a batchBlock on.
func listResource(lines ...string) []string {
	return append(append(slices.Clone(usersResource[:3]), lines...), "\t}")
}

var usersResource = []string{
	"\tresource /users {",
	"\t\tcollection GET POST PATCH DELETE",
	"\t\titem GET PUT PATCH DELETE",
	"\t}",
}

// batchBlock builds a batch directive with the given lines inside its block.
func batchBlock(blocks ...[]string) []string {
	out := []string{"batch {"}
	for _, l := range blocks {
		out = append(out, l...)
	}
	return append(out, "}")
}

func caddyLines(l ...string) []string { return l }

var configMistakes = []configMistake{
	// The directive and its block.
	{name: "argument after batch", config: caddyLines("batch extra {", "}"), line: 2, syntax: true,
		want: `batch takes a matcher and a block, nothing else: remove "extra"`},
	{name: "no resources", config: batchBlock(caddyLines("\tmax_items 5")), line: 2,
		want: `no resources: declare at least one, with the methods its collection and items support, e.g. resource /api/users { collection GET POST }`},
	{name: "unknown option, misspelt", config: batchBlock(caddyLines("\tmax_item 5"), usersResource), line: 3, syntax: true,
		want: `unknown batch option "max_item": did you mean max_items?`},
	{name: "unknown option", config: batchBlock(caddyLines("\tparallelism 4"), usersResource), line: 3, syntax: true,
		want: `unknown batch option "parallelism" (this block takes resource, envelope, jobs, openapi, atomicity, allow_override, max_items, max_body_size, max_response_size, concurrency, max_in_flight, max_throttle_wait, item_timeout, batch_timeout, ids_param, id_field, delete_semantics, restore_deleted, restore_updated, compensation_retries, compensation_timeout, idempotent_upstream, conditional_writes, item_locks, idempotency_ttl, journal, scope_query, scope_headers, id_format, stamped_fields, max_job_items, max_atomic_job_items, max_job_body_size, max_jobs, max_jobs_per_client, max_queued_jobs, job_ttl, job_timeout, job_concurrency, job_throttle_wait)`},
	{name: "unknown option in a resource", config: batchBlock(caddyLines("\tresource /users {", "\t\tcolection GET", "\t}")), line: 4, syntax: true,
		want: `unknown batch option "colection": did you mean collection?`},
	{name: "resource subdirective outside a resource", config: batchBlock(caddyLines("\tcollection GET"), usersResource), line: 3, syntax: true,
		want: `collection belongs in a resource block: resource <collection path> { collection ... }`},
	{name: "option set twice", config: batchBlock(caddyLines("\tmax_items 5", "\tmax_items 6"), usersResource), line: 4, syntax: true,
		want: `max_items is set twice (lines 3 and 4): keep one`},
	{name: "operation's atomicity set twice", config: batchBlock(caddyLines("\tatomicity delete partial", "\tatomicity delete all_or_nothing"), usersResource), line: 4, syntax: true,
		want: `atomicity delete is set twice (lines 3 and 4): keep one`},
	{name: "methods set twice", config: batchBlock(caddyLines("\tresource /users {", "\t\tcollection GET", "\t\tcollection POST", "\t}")), line: 5, syntax: true,
		want: `collection is set twice (lines 4 and 5): keep one`},

	// Option values.
	{name: "atomicity with three values", config: batchBlock(caddyLines("\tatomicity get partial now"), usersResource), line: 3, syntax: true,
		want: `atomicity takes a mode, or an operation and a mode: atomicity [get|create|update|delete] all_or_nothing|partial`},
	{name: "unknown atomicity", config: batchBlock(caddyLines("\tatomicity partal"), usersResource), line: 3,
		want: `unknown atomicity "partal" (want all_or_nothing or partial): did you mean partial?`},
	{name: "atomicity in the Prefer header's spelling", config: batchBlock(caddyLines("\tatomicity all-or-nothing"), usersResource), line: 3,
		want: `unknown atomicity "all-or-nothing" (want all_or_nothing or partial): did you mean all_or_nothing?`},
	{name: "unknown operation's atomicity", config: batchBlock(caddyLines("\tatomicity upsert partial"), usersResource), line: 3,
		want: `atomicity upsert: unknown batch operation "upsert" (want get, create, update or delete)`},
	{name: "unknown atomicity of an operation", config: batchBlock(caddyLines("\tatomicity create maybe"), usersResource), line: 3,
		want: `atomicity create: unknown atomicity "maybe" (want all_or_nothing or partial)`},
	{name: "flag with a bad value", config: batchBlock(caddyLines("\tallow_override yes"), usersResource), line: 3, syntax: true,
		want: `allow_override takes no value, or on or off, not "yes"`},
	{name: "flag with two values", config: batchBlock(caddyLines("\tidempotent_upstream on off"), usersResource), line: 3, syntax: true,
		want: `idempotent_upstream takes no value, or on or off, not "on off"`},
	{name: "not a number", config: batchBlock(caddyLines("\tmax_items many"), usersResource), line: 3, syntax: true,
		want: `max_items takes a whole number, e.g. max_items 100, not "many"`},
	{name: "zero max_items", config: batchBlock(caddyLines("\tmax_items 0"), usersResource), line: 3, syntax: true,
		want: `max_items must be greater than zero, not 0: set a positive value, or leave it out for the default, 100`},
	{name: "zero max_in_flight", config: batchBlock(caddyLines("\tmax_in_flight 0"), usersResource), line: 3, syntax: true,
		want: `max_in_flight must be greater than zero, not 0: set a positive value, or leave it out for the default, 32`},
	{name: "zero idempotency_ttl", config: batchBlock(caddyLines("\tidempotency_ttl 0s"), usersResource), line: 3, syntax: true,
		want: `idempotency_ttl must be greater than zero, not 0s: set a positive value, or leave it out for the default, 24h0m0s`},
	{name: "zero max_response_size", config: batchBlock(caddyLines("\tmax_response_size 0"), usersResource), line: 3, syntax: true,
		want: `max_response_size must be greater than zero, not 0: set a positive value, or leave it out for the default, 16MiB`},
	{name: "zero item_timeout", config: batchBlock(caddyLines("\titem_timeout 0s"), usersResource), line: 3, syntax: true,
		want: `item_timeout must be greater than zero, not 0s: set a positive value, or leave it out for the default, 10s`},
	{name: "negative max_items", config: batchBlock(caddyLines("\tmax_items -1"), usersResource), line: 3,
		want: `max_items must be greater than zero, not -1: set a positive value, or leave it out for the default, 100`},
	{name: "negative batch_timeout", config: batchBlock(caddyLines("\tbatch_timeout -5s"), usersResource), line: 3,
		want: `batch_timeout must be greater than zero, not -5s: set a positive value, or leave it out for the default, 30s`},
	{name: "negative compensation_retries", config: batchBlock(caddyLines("\tcompensation_retries -1"), usersResource), line: 3,
		want: `compensation_retries must be 0 or more, not -1: 0 sends an undo once, with no retry`},
	{name: "negative limit in a resource", config: batchBlock(usersResource[:3], caddyLines("\t\tconcurrency -2", "\t}")), line: 6,
		want: `resource /users: concurrency must be greater than zero, not -2: set a positive value, or leave it out for the default, 8`},
	{name: "bad size", config: batchBlock(caddyLines("\tmax_body_size lots"), usersResource), line: 3, syntax: true,
		want: `max_body_size takes a size such as 1MiB, 512KiB or 1048576 (bytes), not "lots"`},
	{name: "size too large", config: batchBlock(caddyLines("\tmax_response_size 5EiB"), usersResource), line: 3, syntax: true,
		want: `max_response_size 5EiB is more than any machine holds: give a size such as 1MiB`},
	{name: "bad duration", config: batchBlock(caddyLines("\tbatch_timeout soon"), usersResource), line: 3, syntax: true,
		want: `batch_timeout takes a duration such as 10s, 1m30s or 2h, not "soon"`},
	{name: "option without value", config: batchBlock(caddyLines("\tids_param"), usersResource), line: 3, syntax: true,
		want: `ids_param takes one value, e.g. ids_param ids`},
	{name: "option with two values", config: batchBlock(caddyLines("\tid_field a b"), usersResource), line: 3, syntax: true,
		want: `id_field takes one value, e.g. id_field id`},
	{name: "empty value", config: batchBlock(caddyLines("\tid_field \"\""), usersResource), line: 3, syntax: true,
		want: `id_field takes a value, not an empty string, e.g. id_field id`},
	{name: "conditional_writes with a bad value", config: batchBlock(caddyLines("\tconditional_writes yes"), usersResource), line: 3, syntax: true,
		want: `conditional_writes takes no value, or on or off, not "yes"`},
	{name: "scope_query without names", config: batchBlock(caddyLines("\tscope_query"), usersResource), line: 3, syntax: true,
		want: `scope_query takes one or more query parameter names, e.g. scope_query tenant api_key`},
	{name: "scope_query set twice", config: batchBlock(caddyLines("\tscope_query tenant", "\tscope_query api_key"), usersResource), line: 4, syntax: true,
		want: `scope_query is set twice (lines 3 and 4): keep one`},
	{name: "scope_query with an empty name", config: batchBlock(caddyLines("\tscope_query tenant \"\""), usersResource), line: 3,
		want: `scope_query holds an empty name: name each query parameter that scopes a request, e.g. scope_query tenant api_key`},
	{name: "scope_query naming the ids parameter", config: batchBlock(caddyLines("\tscope_query tenant ids"), usersResource), line: 3,
		want: `scope_query must not name "ids", the ids parameter (ids_param): the gateway takes the ids out of the query and sends each item's id in its path; remove it from scope_query`},
	{name: "scope_query naming a resource's ids parameter", config: batchBlock(caddyLines("\tscope_query tenant keys"), usersResource[:3], caddyLines("\t\tids_param keys", "\t}")), line: 4,
		want: `resource /users: scope_query must not name "keys", the ids parameter (ids_param): the gateway takes the ids out of the query and sends each item's id in its path; remove it from scope_query`},
	{name: "scope_query naming _method", config: batchBlock(usersResource[:3], caddyLines("\t\tscope_query _method", "\t}")), line: 6,
		want: `resource /users: scope_query must not name "_method": the gateway reads that parameter as a method override and never passes it on; remove it from scope_query`},
	{name: "scope_query naming one twice", config: batchBlock(caddyLines("\tscope_query tenant api_key tenant"), usersResource), line: 3,
		want: `scope_query names "tenant" twice: keep one`},
	{name: "unknown id_format, misspelt", config: batchBlock(caddyLines("\tid_format intger"), usersResource), line: 3,
		want: `unknown id_format "intger" (want any, integer or uuid): did you mean integer?`},
	{name: "unknown id_format in a resource", config: batchBlock(usersResource[:3], caddyLines("\t\tid_format number", "\t}")), line: 6,
		want: `resource /users: unknown id_format "number" (want any, integer or uuid)`},
	{name: "id_format without value", config: batchBlock(caddyLines("\tid_format"), usersResource), line: 3, syntax: true,
		want: `id_format takes one value, e.g. id_format integer`},
	{name: "stamped_fields without names", config: batchBlock(caddyLines("\tstamped_fields"), usersResource), line: 3, syntax: true,
		want: `stamped_fields takes one or more member names, e.g. stamped_fields updated_at`},
	{name: "stamped_fields naming the id field", config: batchBlock(caddyLines("\tstamped_fields updated_at id"), usersResource), line: 3,
		want: `stamped_fields must not name "id", the id field (id_field): the id is what proves a read is of the item; remove it from stamped_fields`},
	{name: "stamped_fields naming a resource's id field", config: batchBlock(caddyLines("\tstamped_fields modified uuid"), usersResource[:3], caddyLines("\t\tid_field uuid", "\t}")), line: 4,
		want: `resource /users: stamped_fields must not name "uuid", the id field (id_field): the id is what proves a read is of the item; remove it from stamped_fields`},
	{name: "unknown delete_semantics", config: batchBlock(caddyLines("\tdelete_semantics soft"), usersResource), line: 3,
		want: `unknown delete_semantics "soft" (want imperative or declarative)`},
	{name: "unknown restore_deleted", config: batchBlock(caddyLines("\trestore_deleted patch"), usersResource), line: 3,
		want: `unknown restore_deleted "patch" (want put or post)`},
	{name: "unknown restore_updated", config: batchBlock(caddyLines("\trestore_updated post"), usersResource), line: 3,
		want: `unknown restore_updated "post" (want put or patch)`},
	{name: "unknown item_locks", config: batchBlock(caddyLines("\titem_locks redis"), usersResource), line: 3,
		want: `unknown item_locks "redis" (want local or storage)`},
	{name: "unknown value in a resource", config: batchBlock(usersResource[:3], caddyLines("\t\titem_locks stroage", "\t}")), line: 6,
		want: `resource /users: unknown item_locks "stroage" (want local or storage): did you mean storage?`},

	// Resources.
	{name: "resource without path", config: batchBlock(caddyLines("\tresource {", "\t}")), line: 3, syntax: true,
		want: `resource needs the collection's path template, e.g. resource /api/users { collection GET POST }`},
	{name: "resource with two paths", config: batchBlock(caddyLines("\tresource /a /b {", "\t}")), line: 3, syntax: true,
		want: `resource takes one path template, not "/b" too: declare each collection in its own resource block`},
	{name: "nested resource", config: batchBlock(caddyLines("\tresource /a {", "\t\tresource /b", "\t}")), line: 4, syntax: true,
		want: `resource blocks do not nest: close the block of resource /a before the next resource`},
	{name: "resource declared twice", config: batchBlock(usersResource, caddyLines("\tresource /posts {", "\t\tcollection GET", "\t}"), usersResource), line: 10,
		want:     `resource /users is declared twice (lines 3 and 10): merge them into one`,
		jsonWant: `resource /users is declared twice (resources[0] and resources[2]): merge them into one`},
	{name: "same route, other spelling", config: batchBlock(caddyLines("\tresource /u/{a}/p {", "\t\tcollection GET", "\t}", "\tresource /u/{b}/p/ {", "\t\tcollection GET", "\t}")), line: 6,
		want:     `resource /u/{b}/p/: the path is the same route as resource /u/{a}/p (lines 3 and 6): merge them into one`,
		jsonWant: `resource /u/{b}/p/: the path is the same route as resource /u/{a}/p (resources[0] and resources[1]): merge them into one`},
	{name: "collection on another's items", config: batchBlock(caddyLines("\tresource /u {", "\t\titem GET", "\t}", "\tresource /u/{x} {", "\t\tcollection GET", "\t}")), line: 6,
		want:     `resource /u/{x}: the path is the same route as /u/{id}, the items of resource /u (lines 3 and 6): declare these methods as item methods of /u, or give /u another item_path`,
		jsonWant: `resource /u/{x}: the path is the same route as /u/{id}, the items of resource /u (resources[0] and resources[1]): declare these methods as item methods of /u, or give /u another item_path`},
	{name: "items on another's items", config: batchBlock(caddyLines("\tresource /a {", "\t\titem GET", "\t\titem_path /x/{id}", "\t}", "\tresource /b {", "\t\titem GET", "\t\titem_path /x/{id}", "\t}")), line: 9,
		want:     `resource /b: the item path /x/{id} is the same route as the items of resource /a (lines 3 and 7): give this resource another item_path`,
		jsonWant: `resource /b: the item path /x/{id} is the same route as the items of resource /a (resources[0] and resources[1]): give this resource another item_path`},
	{name: "items on another's collection", config: batchBlock(caddyLines("\tresource /u/{x} {", "\t\tcollection GET", "\t}", "\tresource /u {", "\t\titem GET", "\t}")), line: 6,
		want:     `resource /u: the item path /u/{id} is the same route as resource /u/{x} (lines 3 and 6): give this resource another item_path`,
		jsonWant: `resource /u: the item path /u/{id} is the same route as resource /u/{x} (resources[0] and resources[1]): give this resource another item_path`},
	{name: "resource without methods", config: batchBlock(caddyLines("\tresource /a {", "\t\tbatch none", "\t}")), line: 3,
		want: `resource /a: no methods: declare the methods the API supports, with collection <METHOD...>, item <METHOD...> or both`},

	// Templates.
	{name: "unclosed variable", config: batchBlock(caddyLines("\tresource /api/{ {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /api/{: template "/api/{": segment "{" has unbalanced braces: a variable is a whole segment, {name}`},
	{name: "wildcard", config: batchBlock(caddyLines("\tresource /api/* {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /api/*: template "/api/*" has a wildcard (*), which templates do not have: name one segment with a variable instead, e.g. {name} (wildcards go in the batch directive's matcher)`},
	{name: "relative path", config: batchBlock(caddyLines("\tresource api/users {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource api/users: template "api/users" must start with /: write "/api/users"`},
	{name: "root path", config: batchBlock(caddyLines("\tresource / {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /: template "/" has no segment: write the collection's path, e.g. "/api/users"`},
	{name: "empty path", config: batchBlock(caddyLines("\tresource \"\" {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resources[0]: the template is empty: write the path, e.g. "/api/users"`},
	{name: "empty segment", config: batchBlock(caddyLines("\tresource /api//users {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /api//users: template "/api//users" has an empty segment (//): remove the extra slash`},
	{name: "dot segment", config: batchBlock(caddyLines("\tresource /api/../users {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /api/../users: template "/api/../users" has a dot segment (..): write the path it resolves to`},
	{name: "query in a template", config: batchBlock(caddyLines("\tresource /users?all=1 {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /users?all=1: template "/users?all=1" holds a query or a fragment: a template is a path alone`},
	{name: "variable with text", config: batchBlock(caddyLines("\tresource /users/u{user}/posts {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /users/u{user}/posts: template "/users/u{user}/posts": segment "u{user}" mixes a variable with text: a variable is a whole segment, {name}`},
	{name: "bad variable name", config: batchBlock(caddyLines("\tresource /users/{1st}/posts {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /users/{1st}/posts: template "/users/{1st}/posts": variable "{1st}" must be named with letters, digits and underscores, not starting with a digit, e.g. {user_id}`},
	{name: "unknown variable format", config: batchBlock(caddyLines("\tresource /users/{user:int}/posts {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /users/{user:int}/posts: template "/users/{user:int}/posts": variable "{user:int}": unknown format "int" (want any, integer or uuid)`},
	{name: "a format on the id", config: batchBlock(caddyLines("\tresource /users {", "\t\tcollection GET", "\t\titem_path /users/{id:uuid}", "\t}")), line: 5,
		want: `resource /users: item_path: template "/users/{id:uuid}": variable "{id:uuid}": the id's format is id_format's to say: write {id} and set id_format uuid`},
	{name: "variable twice", config: batchBlock(caddyLines("\tresource /a/{x}/b/{x} {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /a/{x}/b/{x}: template "/a/{x}/b/{x}" uses variable {x} twice: give each variable its own name`},
	{name: "id in the collection's path", config: batchBlock(caddyLines("\tresource /users/{id}/posts {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /users/{id}/posts: the path uses {id}, which is the item's id: give that variable another name, e.g. {parent_id}`},
	{name: "bad escape", config: batchBlock(caddyLines("\tresource /a%zz {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /a%zz: template "/a%zz": segment "a%zz" has a bad percent-escape: invalid URL escape "%zz"`},
	{name: "item_path without id", config: batchBlock(caddyLines("\tresource /users/{user}/posts {", "\t\tcollection GET", "\t\titem GET", "\t\titem_path /posts/{post}", "\t}")), line: 6,
		want: `resource /users/{user}/posts: item_path /posts/{post} has no {id}: an item's path must contain {id}, where each id goes (did you mean /posts/{id}?)`},
	{name: "item_path without any variable", config: batchBlock(caddyLines("\tresource /a {", "\t\titem GET", "\t\titem_path /a/one", "\t}")), line: 5,
		want: `resource /a: item_path /a/one has no {id}: an item's path must contain {id}, where each id goes`},
	{name: "item_path with a stranger", config: batchBlock(caddyLines("\tresource /a {", "\t\titem GET", "\t\titem_path /a/{x}/{id}", "\t}")), line: 5,
		want: `resource /a: item_path /a/{x}/{id} uses {x}, which the collection's path /a does not have, so no request gives it a value: use only {id} and the collection's variables`},
	{name: "too many segments", config: batchBlock(caddyLines("\tresource /"+strings.Repeat("a/", 33)+" {", "\t\tcollection GET", "\t}")), line: 3,
		want: `resource /` + strings.Repeat("a/", 33) + `: template "/` + strings.Repeat("a/", 33) + `" has more than 32 segments, the most a template may have`},
	{name: "bad item_path", config: batchBlock(caddyLines("\tresource /a {", "\t\titem GET", "\t\titem_path a/{id}", "\t}")), line: 5,
		want: `resource /a: item_path: template "a/{id}" must start with /: write "/a/{id}"`},

	// Methods and batch operations.
	{name: "collection without methods", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection", "\t}")), line: 4, syntax: true,
		want: `collection needs one or more methods, e.g. collection GET POST`},
	{name: "item without methods", config: batchBlock(caddyLines("\tresource /a {", "\t\titem", "\t}")), line: 4, syntax: true,
		want: `item needs one or more methods, e.g. item GET PUT DELETE`},
	{name: "unknown method, misspelt", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET DELET", "\t}")), line: 4,
		want: `resource /a: collection: unknown method "DELET" (want GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS): did you mean DELETE?`},
	{name: "unknown method", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem GET BREW", "\t}")), line: 5,
		want: `resource /a: item: unknown method "BREW" (want GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS)`},
	{name: "item_path without value", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem_path", "\t}")), line: 5, syntax: true,
		want: `item_path takes one template, e.g. item_path /a/{id}`},
	{name: "batch without operations", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\tbatch", "\t}")), line: 5, syntax: true,
		want: `batch needs operations (get create update delete) or none`},
	{name: "batch none with an operation", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\tbatch none get", "\t}")), line: 5, syntax: true,
		want: `batch none turns every operation off, so it stands alone: write batch none, or list the operations to keep`},
	{name: "unknown batch operation", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem GET", "\t\tbatch get upsert", "\t}")), line: 6,
		want: `resource /a: batch: unknown batch operation "upsert" (want get, create, update or delete)`},
	{name: "list as a batch operation", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\tbatch list", "\t}")), line: 5,
		want: `resource /a: batch: unknown batch operation "list" (want get, create, update or delete): a list (GET on the collection without ids) always passes through, so it needs no batch operation`},
	{name: "batch operation without its methods", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET DELETE", "\t\titem GET", "\t\tbatch delete", "\t}")), line: 6,
		want: `resource /a: batch delete needs DELETE on the collection and DELETE on the item, and the map does not allow DELETE on the item: allow it, or leave delete out of batch`},
	{name: "batch create without POST", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem GET DELETE", "\t\tbatch create", "\t}")), line: 6,
		want: `resource /a: batch create needs POST on the collection, and the map does not allow POST on the collection: allow it, or leave create out of batch`},

	{name: "max_in_flight auto, least above most", config: batchBlock(caddyLines("\tmax_in_flight auto 8 4"), usersResource), line: 3,
		want: `max_in_flight auto 8 4: the least must be at least 1 and at most the most, e.g. max_in_flight auto 4 32`},
	{name: "max_in_flight auto, one bound", config: batchBlock(caddyLines("\tmax_in_flight auto 8"), usersResource), line: 3, syntax: true,
		want: `max_in_flight auto takes no bounds, or the least and the most, e.g. max_in_flight auto 4 32`},
	{name: "max_in_flight auto, not numbers", config: batchBlock(caddyLines("\tmax_in_flight auto few many"), usersResource), line: 3, syntax: true,
		want: `max_in_flight auto takes two whole numbers above zero, the least and the most, e.g. max_in_flight auto 4 32, not "few many"`},
	{name: "max_in_flight auto in a resource", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem GET", "\t\tmax_in_flight auto", "\t}")), line: 6,
		want: `resource /a: max_in_flight bounds the sub-requests of every batch of the handler together, so a resource cannot have its own: set it in the batch block`},
	{name: "negative max_throttle_wait", config: batchBlock(caddyLines("\tmax_throttle_wait -1s"), usersResource), line: 3, syntax: true,
		want: `max_throttle_wait takes a duration such as 5s or 0 (off), not "-1s"`},
	{name: "max_in_flight in a resource", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem GET", "\t\tmax_in_flight 8", "\t}")), line: 6,
		want: `resource /a: max_in_flight bounds the sub-requests of every batch of the handler together, so a resource cannot have its own: set it in the batch block`},

	// The list filter.
	{name: "list_filter without a query", config: batchBlock(listResource("\t\tlist_filter")), line: 6, syntax: true,
		want: `list_filter takes one query template, quoted, e.g. list_filter "id__in={ids}&page_size=100"`},
	{name: "list_filter without a placeholder", config: batchBlock(listResource("\t\tlist_filter id=1")), line: 6,
		want: `resource /users: list_filter's query "id=1" must hold exactly one {id} (repeated once per id) or {ids} (the ids joined by commas), not 0; e.g. "id={id}" (json-server), "id__in={ids}" (django-filter), "filter[id]={ids}"`},
	{name: "list_filter with two placeholders", config: batchBlock(listResource(`		list_filter "id={id}&in={ids}"`)), line: 6,
		want: `resource /users: list_filter's query "id={id}&in={ids}" must hold exactly one {id} (repeated once per id) or {ids} (the ids joined by commas), not 2; e.g. "id={id}" (json-server), "id__in={ids}" (django-filter), "filter[id]={ids}"`},
	{name: "list_filter with a bad pointer", config: batchBlock(listResource(`		list_filter "id={id}" {`, "\t\t\titems results", "\t\t}")), line: 7,
		want: `resource /users: list_filter's items "results" is not a JSON pointer (RFC 6901): it must start with /; write it as /results, or leave it out when the answer is the array itself`},
	{name: "list_filter with max_ids 0", config: batchBlock(listResource(`		list_filter "id={id}" {`, "\t\t\tmax_ids 0", "\t\t}")), line: 7, syntax: true,
		want: `list_filter's max_ids must be 1 or more, not 0: it is how many ids one LIST asks for (default 50)`},
	{name: "list_filter with max_ids -2", config: batchBlock(listResource(`		list_filter "id={id}" {`, "\t\t\tmax_ids -2", "\t\t}")), line: 7,
		want: `resource /users: list_filter's max_ids must be 1 or more, not -2: it is how many ids one LIST asks for (default 50)`},
	{name: "list_filter with an unknown option", config: batchBlock(listResource(`		list_filter "id={id}" {`, "\t\t\tmax_id 5", "\t\t}")), line: 7, syntax: true,
		want: `unknown list_filter option "max_id": did you mean max_ids?`},
	{name: "list_filter without GET on the collection", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection POST", "\t\titem GET DELETE", `		list_filter "id={id}"`, "\t}")), line: 6,
		want: `resource /a: list_filter reads through the collection's LIST, and the map does not allow GET on the collection: allow it, or leave list_filter out`},
	{name: "list_filter preflight without update or delete", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET", "\t\titem GET", `		list_filter "id={id}" {`, "\t\t\tpreflight", "\t\t}", "\t}")), line: 7,
		want: `resource /a: list_filter's preflight reads the pre-images of batch updates and deletes, and neither is on for this resource: leave preflight out`},
	{name: "list_filter outside a resource", config: batchBlock(caddyLines(`	list_filter "id={id}"`), usersResource), line: 3, syntax: true,
		want: `list_filter belongs in a resource block: resource <collection path> { list_filter ... }`},

	// Undo.
	{name: "create cannot be undone", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET POST", "\t\titem GET", "\t}")), line: 5,
		want: `resource /a: batch create runs all_or_nothing, and a failed batch is undone: a created item is deleted (DELETE on the item); the map does not allow DELETE on the item: allow DELETE on the item, set atomicity create partial or leave create out of batch`},
	{name: "update cannot be undone with put", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET PATCH", "\t\titem GET PATCH", "\t}")), line: 5,
		want: `resource /a: batch update runs all_or_nothing, and a failed batch is undone: the pre-image is read (GET on the item) and put back (PUT on the item, restore_updated put); the map does not allow PUT on the item: allow PUT on the item, set restore_updated patch, set atomicity update partial or leave update out of batch`},
	{name: "delete cannot be undone with post", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET DELETE", "\t\titem GET DELETE PUT", "\t\trestore_deleted post", "\t}")), line: 4,
		want: `resource /a: batch delete runs all_or_nothing, and a failed batch is undone: the pre-image is read (GET on the item) and re-created (POST on the collection, restore_deleted post); the map does not allow POST on the collection: allow POST on the collection, set restore_deleted put, set atomicity delete partial or leave delete out of batch`},
	{name: "delete cannot be undone with put", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET POST DELETE", "\t\titem GET DELETE", "\t\tbatch delete", "\t}")), line: 5,
		want: `resource /a: batch delete runs all_or_nothing, and a failed batch is undone: the pre-image is read (GET on the item) and re-created (PUT on the item, restore_deleted put); the map does not allow PUT on the item: allow PUT on the item, set restore_deleted post, set atomicity delete partial or leave delete out of batch`},
	{name: "update cannot be undone with patch", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection PATCH", "\t\titem PATCH", "\t\trestore_updated patch", "\t}")), line: 5,
		want: `resource /a: batch update runs all_or_nothing, and a failed batch is undone: the pre-image is read (GET on the item) and patched back (PATCH on the item, restore_updated patch); the map does not allow GET on the item: allow GET on the item, set atomicity update partial or leave update out of batch`},
	{name: "undo while clients may ask for all_or_nothing", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET POST", "\t\titem GET", "\t\tatomicity partial", "\t\tallow_override", "\t}")), line: 5,
		want: `resource /a: batch create is partial, but allow_override lets a client ask for all_or_nothing, and a failed all_or_nothing batch is undone: a created item is deleted (DELETE on the item); the map does not allow DELETE on the item. Setting it partial alone does not help while allow_override is on: allow DELETE on the item, turn allow_override off or leave create out of batch`},
	{name: "undo with override on", config: batchBlock(caddyLines("\tallow_override"), caddyLines("\tresource /a {", "\t\tcollection GET POST", "\t\titem GET", "\t}")), line: 6,
		want: `resource /a: batch create runs all_or_nothing, and a failed batch is undone: a created item is deleted (DELETE on the item); the map does not allow DELETE on the item: allow DELETE on the item, set atomicity create partial and turn allow_override off or leave create out of batch`},
	{name: "envelope on a resource's path", config: batchBlock(caddyLines("\tenvelope /users/"), usersResource), line: 3,
		want: `envelope /users is a path of the resource /users: give the envelope a path of its own, such as /users/batch`},
	{name: "envelope not a path", config: batchBlock(caddyLines("\tenvelope batch"), usersResource), line: 3,
		want: `envelope "batch" must be a plain path, such as envelope /api/batch`},
	{name: "envelope without a path", config: batchBlock(caddyLines("\tenvelope"), usersResource), line: 3, syntax: true,
		want: `envelope takes the path its POSTs come on, e.g. envelope /api/batch`},
	{name: "envelope in a resource", config: batchBlock(caddyLines("\tresource /users {", "\t\tcollection GET", "\t\tenvelope /b", "\t}")), line: 5, syntax: true,
		want: `envelope belongs in the batch block, not in resource /users: one envelope serves every resource`},
	{name: "envelope twice", config: batchBlock(caddyLines("\tenvelope /a", "\tenvelope /b"), usersResource), line: 4, syntax: true,
		want: `envelope is set twice (lines 3 and 4): keep one`},
	{name: "jobs on a resource's path", config: batchBlock(caddyLines("\tjobs /users/"), usersResource), line: 3,
		want: `jobs /users: /users is a path of the resource /users: give the jobs a path no resource template matches, such as /jobs`},
	{name: "jobs whose monitors are items", config: batchBlock(caddyLines("\tjobs /api"), caddyLines("\tresource /api/{kind} {", "\t\tcollection GET", "\t}")), line: 3,
		want: `jobs /api: /api/x is a path of the resource /api/{kind}: give the jobs a path no resource template matches, such as /jobs`},
	{name: "jobs not a path", config: batchBlock(caddyLines("\tjobs jobs"), usersResource), line: 3,
		want: `jobs "jobs" must be a plain path other than /, such as jobs /api/jobs`},
	{name: "jobs on the envelope's path", config: batchBlock(caddyLines("\tenvelope /api/batch", "\tjobs /api/batch"), usersResource), line: 4,
		want: `jobs /api/batch is the envelope's path: give the jobs a path of their own, such as /api/jobs`},
	{name: "jobs without a path", config: batchBlock(caddyLines("\tjobs"), usersResource), line: 3, syntax: true,
		want: `jobs takes the path its jobs' monitors live under, e.g. jobs /api/jobs`},
	{name: "jobs in a resource", config: batchBlock(caddyLines("\tresource /users {", "\t\tcollection GET", "\t\tjobs /j", "\t}")), line: 5, syntax: true,
		want: `jobs belongs in the batch block, not in resource /users: one jobs path serves every resource`},
	{name: "max_jobs in a resource", config: batchBlock(caddyLines("\tresource /users {", "\t\tcollection GET POST", "\t\titem GET DELETE", "\t\tmax_jobs 2", "\t}")), line: 6,
		want: `resource /users: max_jobs counts the jobs of every resource of the handler together, so a resource cannot have its own: set it in the batch block`},
	{name: "zero max_job_items", config: batchBlock(caddyLines("\tmax_job_items 0"), usersResource), line: 3, syntax: true,
		want: `max_job_items must be greater than zero, not 0: set a positive value, or leave it out for the default, 100000`},
	{name: "job body below an element", config: batchBlock(caddyLines("\tmax_body_size 2MiB", "\tmax_job_body_size 1MiB"), usersResource), line: 4,
		want: `max_job_body_size (1048576 bytes) is below max_body_size (2097152 bytes), which bounds one element of a job: raise max_job_body_size, e.g. max_job_body_size 64MiB`},
	{name: "job_timeout within item_timeout", config: batchBlock(caddyLines("\tjob_timeout 5s"), usersResource), line: 3,
		want: `job_timeout (5s) must be longer than item_timeout (10s), which one of its sub-requests may take: raise job_timeout, e.g. job_timeout 6h`},
	{name: "undo without an item line", config: batchBlock(caddyLines("\tresource /a {", "\t\tcollection GET POST", "\t}")), line: 3,
		want: `resource /a: batch create runs all_or_nothing, and a failed batch is undone: a created item is deleted (DELETE on the item); the map does not allow DELETE on the item: allow DELETE on the item, set atomicity create partial or leave create out of batch`},
}

// TestConfigMistakes holds every mistake a configuration can make to the
// error that says what is wrong and what to do, at its line: caddy adapt
// fails, not only caddy validate. A mistake JSON can carry too gets the
// same message from Provision.
func TestConfigMistakes(t *testing.T) {
	for _, tt := range configMistakes {
		t.Run(tt.name, func(t *testing.T) {
			config := ":8080 {\n" + strings.Join(tt.config, "\n") + "\n\treverse_proxy localhost:3000\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(config), map[string]any{"filename": "Caddyfile"})
			want := fmt.Sprintf("parsing caddyfile tokens for 'batch': %s, at Caddyfile:%d", tt.want, tt.line)
			if err == nil || err.Error() != want {
				t.Errorf("adapting\n%s\n got: %v\nwant: %s", config, err, want)
			}

			// Read the directive without judging it, and provision the
			// JSON it makes.
			var h Handler
			_, err = h.unmarshal(caddyfile.NewTestDispenser(strings.Join(tt.config, "\n")))
			if tt.syntax {
				if err == nil {
					t.Errorf("reading the directive passed; it should refuse a mistake that JSON cannot carry")
				}
				return
			}
			if err != nil {
				t.Fatalf("reading the directive: %v", err)
			}
			raw, err := json.Marshal(&h)
			if err != nil {
				t.Fatal(err)
			}
			var fromJSON Handler
			if err := json.Unmarshal(raw, &fromJSON); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
			defer cancel()
			jsonWant := tt.want
			if tt.jsonWant != "" {
				jsonWant = tt.jsonWant
			}
			if err := fromJSON.Provision(ctx); err == nil || err.Error() != "batch: "+jsonWant {
				t.Errorf("provisioning %s\n got: %v\nwant: batch: %s", raw, err, jsonWant)
			}
		})
	}
}

// TestCaddyfileEveryMistake checks that a Caddyfile with several
// mistakes gets them all, each at its own line.
func TestCaddyfileEveryMistake(t *testing.T) {
	t.Parallel()
	config := strings.Join([]string{
		":8080 {",
		"	batch {",
		"		atomicity partal",
		"		resource /a {",
		"			collection GET",
		"			item_path /a/{x}",
		"		}",
		"		resource /b {",
		"			collection GET DELET",
		"			delete_semantics soft",
		"		}",
		"	}",
		"}",
	}, "\n")
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(config), map[string]any{"filename": "Caddyfile"})
	// Wrong handler options stop there: every resource would inherit them.
	want := `parsing caddyfile tokens for 'batch': unknown atomicity "partal" (want all_or_nothing or partial): did you mean partial?, at Caddyfile:3`
	if err == nil || err.Error() != want {
		t.Fatalf(" got: %v\nwant: %s", err, want)
	}

	config = strings.Replace(config, "atomicity partal", "atomicity partial", 1)
	_, _, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(config), map[string]any{"filename": "Caddyfile"})
	want = "parsing caddyfile tokens for 'batch': " +
		"resource /a: item_path /a/{x} has no {id}: an item's path must contain {id}, where each id goes (did you mean /a/{id}?), at Caddyfile:6\n" +
		`resource /b: collection: unknown method "DELET" (want GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS): did you mean DELETE?, at Caddyfile:9` + "\n" +
		`resource /b: unknown delete_semantics "soft" (want imperative or declarative), at Caddyfile:10`
	if err == nil || err.Error() != want {
		t.Fatalf(" got: %v\nwant: %s", err, want)
	}
}

// TestProvisionErrors holds mistakes only JSON can make to the error
// Provision gives.
func TestProvisionErrors(t *testing.T) {
	tests := []struct{ name, handler, want string }{
		{"no path", `{"resources":[{"collection":["GET"]}]}`, `resources[0]: the template is empty: write the path, e.g. "/api/users"`},
		{"negative size", `{"max_body_size":-1,"resources":[{"path":"/a","collection":["GET"]}]}`,
			`max_body_size must be greater than zero, not -1: set a positive value, or leave it out for the default, 1MiB`},
		{"negative duration in nanoseconds", `{"resources":[{"path":"/a","collection":["GET"],"item_timeout":-1000000}]}`,
			`resource /a: item_timeout must be greater than zero, not -1ms: set a positive value, or leave it out for the default, 10s`},
		{"unknown operation in operation_atomicity", `{"operation_atomicity":{"upsert":"partial"},"resources":[{"path":"/a","collection":["GET"]}]}`,
			`atomicity upsert: unknown batch operation "upsert" (want get, create, update or delete)`},
		{"ids_param that is the method override parameter", `{"ids_param":"_method","resources":[{"path":"/a","collection":["GET"]}]}`,
			`ids_param must not be "_method": the gateway reads that parameter as a method override; choose another name, e.g. ids`},
		{"id_format in upper case", `{"resources":[{"path":"/a","collection":["GET"],"id_format":"UUID"}]}`,
			`resource /a: unknown id_format "UUID" (want any, integer or uuid): did you mean uuid?`},
		{"scope_query naming the method override parameter", `{"scope_query":["tenant","_method"],"resources":[{"path":"/a","collection":["GET"]}]}`,
			`scope_query must not name "_method": the gateway reads that parameter as a method override and never passes it on; remove it from scope_query`},
		{"the Caddyfile's none in JSON", `{"resources":[{"path":"/a","collection":["GET"],"batch":["none"]}]}`,
			`resource /a: batch: "none" is no operation: an empty list turns every operation off`},
		{"lower-case methods", `{"resources":[{"path":"/a","collection":["get", "delet"]}]}`,
			`resource /a: collection: unknown method "delet" (want GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS): did you mean DELETE?`},
		{"every mistake, each with its resource", `{"resources":[{"path":"/a","collection":["GET"],"max_items":-1},{"path":"/b"}]}`,
			"resource /a: max_items must be greater than zero, not -1: set a positive value, or leave it out for the default, 100\n" +
				"resource /b: no methods: declare the methods the API supports, with collection <METHOD...>, item <METHOD...> or both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handler
			if err := json.Unmarshal([]byte(tt.handler), &h); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
			defer cancel()
			if err := h.Provision(ctx); err == nil || err.Error() != "batch: "+tt.want {
				t.Fatalf(" got: %v\nwant: batch: %s", err, tt.want)
			}
		})
	}
}
