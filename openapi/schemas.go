package openapi

// The schemas of the batch answers (docs/wire-format.md), valid in
// OpenAPI 3.0 and 3.1 alike: no nullable, no type lists.

func str(description string) map[string]any {
	return map[string]any{"type": "string", "description": description}
}

func integer(description string) map[string]any {
	return map[string]any{"type": "integer", "description": description}
}

var outcomes = []any{"succeeded", "failed", "not_attempted", "rolled_back", "rollback_failed", "unknown"}

var batchOutcomes = []any{"succeeded", "partial", "failed", "rolled_back", "rollback_failed"}

// itemResultSchema is one item of a batch answer, its body typed as
// body (the resource's item schema); envelope items name their
// operation too.
func itemResultSchema(body any, envelope bool) map[string]any {
	props := map[string]any{
		"index":     integer("the item's place in the request"),
		"id":        str("the item's id"),
		"status":    integer("the legacy API's status for the item"),
		"outcome":   map[string]any{"type": "string", "enum": outcomes},
		"body":      body,
		"body_text": str("an answer that is not JSON, cut at 4 KiB"),
		"headers":   map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}, "description": "the item's Location, ETag, Last-Modified and Retry-After"},
		"error":     str("what went wrong, when the gateway knows"),
		"compensation": map[string]any{"type": "object", "description": "how the item was undone",
			"properties": map[string]any{"method": str(""), "path": str(""), "status": integer(""), "attempts": integer(""), "error": str("")}},
	}
	if envelope {
		props["op"] = str("the operation's id")
		props["method"] = str("the operation's method")
		props["url"] = str("the operation's url, references filled")
	}
	return map[string]any{"type": "object", "required": []any{"index", "outcome"}, "properties": props}
}

// answerSchema is a batch answer whose items are itemRef.
func answerSchema(itemRef string) map[string]any {
	return map[string]any{
		"type":     "object",
		"required": []any{"atomicity", "outcome", "succeeded", "failed", "items"},
		"properties": map[string]any{
			"atomicity": map[string]any{"type": "string", "enum": []any{"all_or_nothing", "partial"}},
			"outcome":   map[string]any{"type": "string", "enum": batchOutcomes},
			"succeeded": integer("items that succeeded"),
			"failed":    integer("items that did not"),
			"items":     map[string]any{"type": "array", "items": ref(itemRef)},
		},
	}
}

// problemSchema is the gateway's problem (RFC 9457), with the batch's
// members when a batch failed.
func problemSchema() map[string]any {
	s := answerSchema("#/components/schemas/BatchProblemItem")
	s["required"] = []any{"type", "title", "status", "detail"}
	props := s["properties"].(map[string]any)
	props["type"] = str("the problem type, a URI")
	props["title"] = str("")
	props["status"] = integer("")
	props["detail"] = str("what was wrong, and for an item its index and id")
	return s
}

// envelopeSchema is the envelope's request (docs/envelope.md).
func envelopeSchema() map[string]any {
	return map[string]any{
		"type":     "object",
		"required": []any{"operations"},
		"properties": map[string]any{
			"atomicity": map[string]any{"type": "string", "enum": []any{"all_or_nothing", "partial"}},
			"operations": map[string]any{"type": "array", "minItems": 1, "items": map[string]any{
				"type":     "object",
				"required": []any{"id", "method", "url"},
				"properties": map[string]any{
					"id":         map[string]any{"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
					"method":     map[string]any{"type": "string", "enum": []any{"GET", "POST", "PUT", "PATCH", "DELETE"}},
					"url":        str("a path of one of the gateway's resources; a segment $<op> is the id that operation created or named"),
					"body":       map[string]any{"description": "the operation's JSON body; a string $<op> or $<op>#<pointer> is filled in"},
					"depends_on": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
				},
			}},
		},
	}
}
