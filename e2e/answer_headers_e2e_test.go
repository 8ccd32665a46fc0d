package e2e

import (
	"testing"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestBatchAnswerCarriesStatusHeaders (docs/wire-format.md, "Batch
// requests and responses"): when the batch's
// status is an item's, the header that status requires comes with it.
func TestBatchAnswerCarriesStatusHeaders(t *testing.T) {
	api := seededAPI()
	const realm = `Bearer realm="legacy", error="invalid_token"`
	addr := upstreamAnswers(t, api, map[string][2]string{
		"/api/widgets/1": {"WWW-Authenticate", realm},
		"/api/widgets/2": {"WWW-Authenticate", realm},
		"/api/widgets/3": {"Allow", "PUT, DELETE"},
	})
	g := startGatewayTo(t, api, addr, `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	for _, p := range []string{"/api/widgets/1", "/api/widgets/2"} {
		api.Inject(legacyapi.Fault{Method: "GET", Path: p, Status: 401, ContentType: "application/json", Body: `{"error":"invalid_token"}`})
	}
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/3", Status: 405, Body: "no GET here"})

	r := g.do(t, "GET", "/api/widgets?ids=1,2", nil)
	b := checkProblem(t, r, 401)
	if got := r.Header.Get("WWW-Authenticate"); got != realm {
		t.Errorf("WWW-Authenticate %q, want the item's %q", got, realm)
	}
	if _, ok := b.Items[0].Headers["WWW-Authenticate"]; ok {
		t.Error("WWW-Authenticate is among the item's headers")
	}

	r = g.do(t, "GET", "/api/widgets?ids=3", nil)
	checkProblem(t, r, 405)
	if got := r.Header.Get("Allow"); got != "PUT, DELETE" {
		t.Errorf("Allow %q, want the item's", got)
	}
}

// TestBatchAnswerIsAlwaysJSON (docs/wire-format.md, "Batch requests and
// responses"): an item body that claims
// to be JSON but is not UTF-8 goes in body_text, and the answer stays
// strict JSON.
func TestBatchAnswerIsAlwaysJSON(t *testing.T) {
	api := seededAPI()
	g := startGateway(t, api, `
	batch {
		resource /api/widgets {`+resourceMethods+`
		}
	}
	reverse_proxy UPSTREAM
`)
	api.Inject(legacyapi.Fault{Method: "GET", Path: "/api/widgets/2", Status: 200, ContentType: "application/json", Body: "{\"name\":\"\xff\"}"})
	r := g.do(t, "GET", "/api/widgets?ids=1,2", nil)
	strictJSON(t, r.Body)
	b := checkEnvelope(t, r, 200, "succeeded")
	if it := b.Items[1]; it.Body != nil || it.BodyText != "{\"name\":\"\uFFFD\"}" {
		t.Errorf("item 1: body %q, body_text %q", it.Body, it.BodyText)
	}
	if !sameJSON(t, b.Items[0].Body, map[string]any{"id": 1, "name": "w1"}) {
		t.Errorf("item 0 body %s", b.Items[0].Body)
	}
}
