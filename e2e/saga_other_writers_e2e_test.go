package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/internal/legacyapi"
)

// TestSagaUndoLosesNoLaterWrite (case 1, the lost update by an undo):
// batch A updates users 1 and 2; its write to user 2 fails after about a
// second, while another writer changes user 1. A writer through the
// gateway (a single write or a batch) waits for A's lock and is applied
// after A's rollback, so its acknowledged write stands; a writer straight
// at the upstream changes user 1 before A's undo, and the undo's proof
// read sees it: A leaves user 1 alone and says so.
func TestSagaUndoLosesNoLaterWrite(t *testing.T) {
	const batchA = `[{"id": 1, "name": "A"}, {"id": 2, "name": "A"}]`
	slowFailure := legacyapi.Fault{Method: "PATCH", Path: "/users/2", Delay: time.Second, Status: 500, Body: htmlError}

	for _, tc := range []struct {
		name         string
		method, path string
		body         string
		status       int
		outcome      string
	}{
		{"a single PATCH through the gateway", "PATCH", "/users/1", `{"name": "B"}`, 200, ""},
		{"batch B through the gateway", "PATCH", "/users", `[{"id": 1, "name": "B"}]`, 200, "succeeded"},
	} {
		t.Run(tc.name+" waits for A's lock and lands after A's rollback", func(t *testing.T) {
			api := usersAPI(legacyapi.Collection{}, 2)
			g := startGateway(t, api, usersSite(slowSaga...))
			api.Inject(slowFailure)

			a := start(g.URL, "PATCH", "/users", batchA)
			eventually(t, 5*time.Second, "A's write to user 2", func() bool { return received(api, "PATCH", "/users/2") })
			holds(t, api, "", "1", user(1, "A")) // A wrote user 1; its undo is to come
			b := start(g.URL, tc.method, tc.path, tc.body)
			ra, rb := a.answer(t), b.answer(t)
			overlapped(t, a, b)

			holds(t, api, "", "1", user(1, "B"))
			holds(t, api, "", "2", user(2, "u2"))
			if rb.Status != tc.status {
				t.Fatalf("B: %v, want %d", rb, tc.status)
			}
			if tc.outcome != "" {
				checkEnvelope(t, rb, tc.status, tc.outcome)
			} else if !sameJSON(t, rb.Body, user(1, "B")) {
				t.Errorf("B's answer %s, want user 1 as B made it", rb.Body)
			}
			bA := checkProblem(t, ra, 502)
			if got := bA.Outcomes(); bA.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
				t.Errorf("A: outcome %q items %v, want rolled_back [rolled_back failed]", bA.Outcome, got)
			}
			// B's write reached the upstream after A's undo, not before.
			undo := arrival(api, func(r legacyapi.Request) bool { return r.Method == "PUT" && r.Path == "/users/1" })
			bWrite := arrival(api, func(r legacyapi.Request) bool {
				return r.Method == "PATCH" && r.Path == "/users/1" && strings.Contains(string(r.Body), `"B"`)
			})
			if undo < 0 || bWrite < undo {
				t.Errorf("A's undo is request %d, B's write request %d: B did not wait for A:%s", undo, bWrite, describeRequests(api.Requests()))
			}
		})
	}

	for _, etags := range []bool{false, true} {
		name := "a write straight at the upstream is not overwritten by A's undo"
		why := `another writer changed "name"`
		if etags {
			name += " (ETags: the undo's If-Match fails)"
			why = "precondition failed"
		}
		t.Run(name, func(t *testing.T) {
			api := usersAPI(legacyapi.Collection{ETags: etags}, 2)
			g := startGateway(t, api, usersSite(sagaOptions(etags)...))
			held, release := heldUntilReleased(slowFailure)
			api.Inject(held)

			a := start(g.URL, "PATCH", "/users", batchA)
			eventually(t, 5*time.Second, "A's write to user 2", func() bool { return received(api, "PATCH", "/users/2") })
			if r := g.direct(t, "PATCH", "/users/1", `{"name": "B"}`); r.Status != 200 {
				t.Fatalf("B at the upstream: %v", r)
			}
			if a.answered() {
				t.Fatal("A answered before B's write: the window was missed")
			}
			release()
			r := a.answer(t)

			holds(t, api, "", "1", user(1, "B"))
			holds(t, api, "", "2", user(2, "u2"))
			b := checkLeftBehind(t, r, 0, why)
			if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
				t.Errorf("item outcomes %v", got)
			}
			checkRepairLog(t, g, 0, user(1, "u1"))
			if !etags {
				if f := found(t, r, 0); !sameJSON(t, f, user(1, "B")) {
					t.Errorf("compensation.found %v, want what the proof read: user 1 as B made it", f)
				}
				if puts := sent(api, "PUT", "/users/1"); len(puts) > 0 {
					t.Errorf("A's undo was sent although its proof failed:%s", describeRequests(puts))
				}
			}
		})
	}
}

// TestSagaDeleteOfAChangedItem (case 2, the stale re-create): B changes
// user 3 straight at the upstream after A's preflight read it and before
// A's DELETE lands. With ETags A's DELETE carries If-Match and fails 412:
// nothing is lost. Without ETags the gateway cannot tell: A deletes B's
// version, its item 4 fails, and its rollback re-creates user 3 from the
// pre-image, so B's direct write is lost: the limit of an upstream
// without validators, asserted here so that it stays known. A writer
// through the gateway waits for A's lock and loses nothing.
func TestSagaDeleteOfAChangedItem(t *testing.T) {
	slowDelete := legacyapi.Fault{Method: "DELETE", Path: "/users/3", Delay: time.Second, Times: 1}

	t.Run("ETags: A's DELETE carries If-Match and fails 412, B's write stands", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{ETags: true, PutCreates: true}, 4)
		g := startGateway(t, api, usersSite(slowSaga...))
		held, release := heldUntilReleased(slowDelete)
		api.Inject(held)

		a := start(g.URL, "DELETE", "/users?ids=3,4", "")
		eventually(t, 5*time.Second, "A's DELETE of user 3", func() bool { return received(api, "DELETE", "/users/3") })
		if r := g.direct(t, "PATCH", "/users/3", `{"name": "B"}`); r.Status != 200 {
			t.Fatalf("B at the upstream: %v", r)
		}
		if a.answered() {
			t.Fatal("A answered before B's write: the window was missed")
		}
		release()
		r := a.answer(t)

		holds(t, api, "", "3", user(3, "B"))
		holds(t, api, "", "4", user(4, "u4"))
		b := checkProblem(t, r, 412)
		if got := b.Outcomes(); b.Outcome != "failed" || !slices.Equal(got, []string{"failed", "not_attempted"}) {
			t.Errorf("outcome %q items %v, want failed [failed not_attempted]", b.Outcome, got)
		}
		if dels := sent(api, "DELETE", "/users/3"); len(dels) != 1 || !strings.HasPrefix(dels[0].Header.Get("If-Match"), `"v`) {
			t.Errorf("A's DELETE of user 3:%s, want one, with the preflight's ETag in If-Match", describeRequests(dels))
		}
		if w := writes(api.Requests()); len(w) != 2 {
			t.Errorf("writes at the upstream:%s; want B's PATCH and A's refused DELETE", describeRequests(w))
		}
	})

	t.Run("no ETags, B straight at the upstream: A deletes B's version and re-creates the pre-image", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{PutCreates: true}, 4)
		g := startGateway(t, api, usersSite(slowSaga...))
		held, release := heldUntilReleased(slowDelete)
		api.Inject(held)
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})

		a := start(g.URL, "DELETE", "/users?ids=3,4", "")
		eventually(t, 5*time.Second, "A's DELETE of user 3", func() bool { return received(api, "DELETE", "/users/3") })
		if r := g.direct(t, "PATCH", "/users/3", `{"name": "B"}`); r.Status != 200 {
			t.Fatalf("B at the upstream: %v", r)
		}
		if a.answered() {
			t.Fatal("A answered before B's write: the window was missed")
		}
		release()
		r := a.answer(t)

		// The upstream has no validator, so neither A's DELETE nor its
		// undo can be made conditional on the version A read: B's write,
		// made past the gateway, is gone, and user 3 is as it was before
		// A. What A says is true of the item; nothing A wrote is left.
		holds(t, api, "", "3", user(3, "u3"))
		holds(t, api, "", "4", user(4, "u4"))
		b := checkProblem(t, r, 502)
		if got := b.Outcomes(); b.Outcome != "rolled_back" || !slices.Equal(got, []string{"rolled_back", "failed"}) {
			t.Errorf("outcome %q items %v, want rolled_back [rolled_back failed]", b.Outcome, got)
		}
		puts := sent(api, "PUT", "/users/3")
		if len(puts) != 1 || puts[0].Header.Get("If-None-Match") != "*" || !sameJSON(t, puts[0].Body, user(3, "u3")) {
			t.Errorf("A's re-create:%s, want one PUT of the pre-image with If-None-Match: *", describeRequests(puts))
		}
		if reads := sent(api, "GET", "/users/3"); len(reads) != 2 {
			t.Errorf("reads of user 3:%s; want the preflight and the proof that it is absent", describeRequests(reads))
		}
	})

	t.Run("no ETags, B through the gateway: B waits for A's lock and its write stands", func(t *testing.T) {
		api := usersAPI(legacyapi.Collection{PutCreates: true}, 4)
		g := startGateway(t, api, usersSite(slowSaga...))
		api.Inject(slowDelete)
		api.Inject(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})

		a := start(g.URL, "DELETE", "/users?ids=3,4", "")
		eventually(t, 5*time.Second, "A's DELETE of user 3", func() bool { return received(api, "DELETE", "/users/3") })
		b := start(g.URL, "PATCH", "/users/3", `{"name": "B"}`)
		ra, rb := a.answer(t), b.answer(t)
		overlapped(t, a, b)

		holds(t, api, "", "3", user(3, "B"))
		holds(t, api, "", "4", user(4, "u4"))
		if rb.Status != 200 || !sameJSON(t, rb.Body, user(3, "B")) {
			t.Errorf("B: %v, want 200 with user 3 as B made it", rb)
		}
		if bA := checkProblem(t, ra, 502); bA.Outcome != "rolled_back" {
			t.Errorf("A: outcome %q, want rolled_back", bA.Outcome)
		}
		undo := arrival(api, func(r legacyapi.Request) bool { return r.Method == "PUT" && r.Path == "/users/3" })
		bWrite := arrival(api, func(r legacyapi.Request) bool { return r.Method == "PATCH" && r.Path == "/users/3" })
		if undo < 0 || bWrite < undo {
			t.Errorf("A's re-create is request %d, B's write request %d: B did not wait for A:%s", undo, bWrite, describeRequests(api.Requests()))
		}
	})
}

// TestSagaRecreateOverANewerItem (case 3): A deleted user 3 and its item 4
// fails slowly; meanwhile B creates user 3 anew, straight at the upstream.
// A's re-create must not overwrite it: user 3 stays B's, and A answers 500
// rollback_failed for item 0 with the reason and what it found.
func TestSagaRecreateOverANewerItem(t *testing.T) {
	for _, etags := range []bool{false, true} {
		name, why := "proved absent by a read", "exists again"
		if etags {
			name, why = "ETags: the re-create's If-None-Match: * fails", "precondition failed"
		}
		t.Run(name, func(t *testing.T) {
			api := usersAPI(legacyapi.Collection{PutCreates: true, ETags: etags}, 4)
			g := startGateway(t, api, usersSite(sagaOptions(etags)...))
			held, release := heldUntilReleased(legacyapi.Fault{Method: "DELETE", Path: "/users/4", Status: 500, Body: htmlError})
			api.Inject(held)

			a := start(g.URL, "DELETE", "/users?ids=3,4", "")
			eventually(t, 5*time.Second, "A's DELETE of user 4", func() bool { return received(api, "DELETE", "/users/4") })
			holds(t, api, "", "3", nil)
			if r := g.direct(t, "PUT", "/users/3", `{"name": "B"}`); r.Status != 201 {
				t.Fatalf("B's PUT at the upstream: %v, want 201", r)
			}
			if a.answered() {
				t.Fatal("A answered before B's write: the window was missed")
			}
			release()
			r := a.answer(t)

			holds(t, api, "", "3", user(3, "B"))
			holds(t, api, "", "4", user(4, "u4"))
			b := checkLeftBehind(t, r, 0, why)
			if got := b.Outcomes(); !slices.Equal(got, []string{"rollback_failed", "failed"}) {
				t.Errorf("item outcomes %v", got)
			}
			checkRepairLog(t, g, 0, user(3, "u3"))
			if !etags {
				if f := found(t, r, 0); !sameJSON(t, f, user(3, "B")) {
					t.Errorf("compensation.found %v, want B's user 3", f)
				}
				if puts := sent(api, "PUT", "/users/3"); len(puts) != 1 {
					t.Errorf("PUTs of user 3:%s; want B's alone", describeRequests(puts))
				}
			}
		})
	}
}
