package batch

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// slashAPI is the widgets API behind a framework's router, which serves
// the collection and its items at one spelling each (with a trailing
// slash or without) and redirects the other spelling with status,
// carrying nothing out, as Django REST framework (301, both slashed) and
// FastAPI (307, the collection slashed, its items bare) do.
type slashAPI struct {
	*fakeAPI
	status               int
	collSlash, itemSlash bool
}

func (s slashAPI) Send(ctx context.Context, req *SubRequest) (*SubResponse, error) {
	bare, slashed := strings.CutSuffix(req.Path, "/")
	wanted := s.itemSlash
	if bare == "/widgets" {
		wanted = s.collSlash
	}
	if slashed != wanted {
		to := bare
		if wanted {
			to += "/"
		}
		return &SubResponse{Status: s.status, Header: http.Header{"Location": {"http://upstream.test" + to}}}, nil
	}
	routed := *req
	routed.Path = bare
	resp, err := s.fakeAPI.Send(ctx, &routed)
	if loc := resp.Header.Get("Location"); loc != "" && s.itemSlash {
		resp.Header.Set("Location", loc+"/")
	}
	return resp, err
}

// declared is the resource a declaration the advice wrote declares:
// "resource <path>", or "resource <path> { item_path <template> }".
func declared(t *testing.T, declaration string) specMod {
	t.Helper()
	f := strings.Fields(declaration)
	if len(f) != 2 && (len(f) != 6 || f[2] != "{" || f[3] != "item_path" || f[5] != "}") {
		t.Fatalf("advice %q is not a declaration", declaration)
	}
	return func(s *policy.ResourceSpec) {
		s.Path = f[1]
		if len(f) == 6 {
			s.ItemPath = f[4]
		}
	}
}

var adviceRE = regexp.MustCompile("declare the resource as `([^`]+)`")

// Followed literally, the trailing-slash advice leads, for every shape a
// framework's routes have, to a declaration under which the four batch
// operations work, changing only the side that redirected, and never
// back to a declaration it advised against.
func TestRedirectAdviceLeadsSomewhere(t *testing.T) {
	t.Parallel()
	shapes := []struct {
		name, declaration string
		api               slashAPI
		advice            []string
	}{
		{"Django REST framework: both slashed", "resource /widgets", slashAPI{status: 301, collSlash: true, itemSlash: true},
			[]string{"resource /widgets { item_path /widgets/{id}/ }", "resource /widgets/"}},
		{"both bare", "resource /widgets/", slashAPI{status: 308},
			[]string{"resource /widgets/ { item_path /widgets/{id} }", "resource /widgets"}},
		{"FastAPI, declared as its route is: collection slashed, items bare", "resource /widgets/", slashAPI{status: 307, collSlash: true},
			[]string{"resource /widgets/ { item_path /widgets/{id} }"}},
		{"FastAPI, declared bare", "resource /widgets", slashAPI{status: 307, collSlash: true},
			[]string{"resource /widgets/ { item_path /widgets/{id} }"}},
		{"collection bare, items slashed", "resource /widgets/", slashAPI{status: 308, itemSlash: true},
			[]string{"resource /widgets { item_path /widgets/{id}/ }"}},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			seen := []string{sh.declaration}
			for hint := allFour(t, sh.declaration, sh.api); hint != ""; hint = allFour(t, seen[len(seen)-1], sh.api) {
				m := adviceRE.FindStringSubmatch(hint)
				if m == nil {
					t.Fatalf("under %q: a hint with no declaration: %s", seen[len(seen)-1], hint)
				}
				if slices.Contains(seen, m[1]) {
					t.Fatalf("the advice leads back to %q (followed %q)", m[1], seen)
				}
				seen = append(seen, m[1])
			}
			equalSlices(t, "advice followed", seen[1:], sh.advice)
		})
	}
}

// allFour runs a batch GET, UPDATE, CREATE and DELETE on a new widgets
// API behind api's router, under the declaration, and returns the first
// advice one of them met; "" once all four worked and the API holds what
// they wrote.
func allFour(t *testing.T, declaration string, api slashAPI) string {
	t.Helper()
	api.fakeAPI = newFake().seed("1")
	decl := declared(t, declaration)
	var created string
	for _, op := range []struct{ method, target, body string }{
		{"GET", "/widgets?ids=1", ""},
		{"PATCH", "/widgets", `[{"id":"1","color":"blue"}]`},
		{"POST", "/widgets", `[{"name":"new"}]`},
		{"DELETE", "/widgets?ids=", ""},
	} {
		target := op.target
		if op.method == "DELETE" {
			target += created
		}
		res := run(mustPlan(t, newRequest(op.method, target, op.body), decl), api)
		if res.Warning != "" {
			return res.Warning
		}
		w := write(t, res)
		if w.Outcome != "succeeded" {
			t.Fatalf("%s %s under %q: %s %s", op.method, target, declaration, w.Outcome, w.Detail)
		}
		if op.method == "POST" {
			created = w.Items[0].ID
		}
	}
	equal(t, "widget 1 after the update", api.state()["/widgets/1"], `{"color":"blue","id":"1","name":"widget 1"}`)
	equal(t, "widgets left", len(api.state()), 1)
	return ""
}
