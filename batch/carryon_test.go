package batch

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/policy"
)

var idempotentUpstream = settings(func(s *policy.Settings) { s.IdempotentUpstream = true })

// sendingItem is an item a dead owner recorded as being sent, with no
// answer recorded.
func sendingItem(id, body string) ItemSnapshot {
	it := element(id, body)
	it.Phase, it.Sent = PhaseSending, &SubRequest{}
	return it
}

func TestResolveForward(t *testing.T) {
	cases := []struct {
		name  string
		op    policy.Op
		item  ItemSnapshot
		api   func(*fakeAPI)
		mods  []specMod
		want  Outcome
		sends []string // the writes sent after the reads
	}{
		{name: "create read 200 took effect", op: policy.OpCreate, item: sendingItem("7", `{"id":"7","name":"a"}`),
			api: func(f *fakeAPI) { f.seed("7") }, want: Succeeded},
		{name: "create read 404 sent again", op: policy.OpCreate, item: sendingItem("7", `{"id":"7","name":"a"}`),
			want: Succeeded, sends: []string{"POST /widgets"}},
		{name: "create without id stays unknown", op: policy.OpCreate, item: sendingItem("", `{"name":"a"}`),
			want: Unknown},
		{name: "create without id resent under idempotent_upstream", op: policy.OpCreate, item: sendingItem("", `{"name":"a"}`),
			mods: []specMod{idempotentUpstream}, want: Succeeded, sends: []string{"POST /widgets"}},
		{name: "delete read 404 took effect", op: policy.OpDelete, item: sendingItem("7", ""),
			want: Succeeded},
		{name: "delete read 200 sent again", op: policy.OpDelete, item: sendingItem("7", ""),
			api: func(f *fakeAPI) { f.seed("7") }, want: Succeeded, sends: []string{"DELETE /widgets/7"}},
		{name: "delete resent under idempotent_upstream", op: policy.OpDelete, item: sendingItem("7", ""),
			api: func(f *fakeAPI) { f.seed("7") }, mods: []specMod{idempotentUpstream}, want: Succeeded, sends: []string{"DELETE /widgets/7"}},
		{name: "update read back equal took effect", op: policy.OpUpdate, item: sendingItem("7", `{"id":"7","color":"blue"}`),
			api: func(f *fakeAPI) { f.put(widget("7"), map[string]any{"id": "7", "color": "blue", "name": "w"}) }, want: Succeeded},
		{name: "update read back different sent again", op: policy.OpUpdate, item: sendingItem("7", `{"id":"7","color":"blue"}`),
			api: func(f *fakeAPI) { f.seed("7") }, want: Succeeded, sends: []string{"PATCH /widgets/7"}},
		{name: "update resent under idempotent_upstream", op: policy.OpUpdate, item: sendingItem("7", `{"id":"7","color":"blue"}`),
			api: func(f *fakeAPI) { f.seed("7") }, mods: []specMod{idempotentUpstream}, want: Succeeded, sends: []string{"PATCH /widgets/7"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			if c.api != nil {
				c.api(f)
			}
			mods := append([]specMod{itemTimeout(20 * time.Millisecond)}, c.mods...)
			res := runWindow(t, jobWindow(c.op, 40, c.item), f, nil, WindowOpts{}, mods...)
			got := res.Items[0]
			if got.Outcome != c.want || got.Index != 40 {
				t.Errorf("item %+v; want %s at index 40", got, c.want)
			}
			var writes []string
			for _, call := range f.log() {
				if call.Method != http.MethodGet {
					writes = append(writes, call.String())
					if key := call.Header.Get("Idempotency-Key"); key != "job:40" {
						t.Errorf("%s carried Idempotency-Key %q, want the item's own, job:40", call, key)
					}
				}
			}
			if len(writes) != len(c.sends) || len(writes) > 0 && writes[0] != c.sends[0] {
				t.Errorf("writes %v, want %v", writes, c.sends)
			}
		})
	}
}

func TestResolveForwardUnreadableStaysUnknown(t *testing.T) {
	f := newFake().on(http.MethodGet, widget("7"), reply(http.StatusInternalServerError, ""))
	res := runWindow(t, jobWindow(policy.OpDelete, 0, sendingItem("7", "")), f, nil, WindowOpts{},
		itemTimeout(20*time.Millisecond), compensationRetries(0))
	if got := res.Items[0]; got.Outcome != Unknown || got.Error == "" {
		t.Errorf("item %+v; want unknown, with why", got)
	}
	if w := f.sentWith(http.MethodDelete); len(w) != 0 {
		t.Errorf("sent %v; want no write", f.sent())
	}
}

// A write answered with no answer (unknown) is resolved on a carry-on
// too; one answered for sure keeps its outcome, and is not sent again.
func TestCarriedOnWindowResolvesAnsweredUnknown(t *testing.T) {
	f := newFake().seed("7")
	unknown := element("7", `{"id":"7","name":"a"}`)
	unknown.Phase, unknown.Outcome, unknown.Status = PhaseAnswered, Unknown, http.StatusGatewayTimeout
	failed := element("8", `{"id":"8","name":"b"}`)
	failed.Phase, failed.Outcome, failed.Status = PhaseAnswered, Failed, http.StatusUnprocessableEntity
	res := runWindow(t, jobWindow(policy.OpCreate, 0, unknown, failed), f, nil, WindowOpts{}, itemTimeout(20*time.Millisecond))
	if res.Items[0].Outcome != Succeeded || res.Items[1].Outcome != Failed || res.Items[1].Status != http.StatusUnprocessableEntity {
		t.Errorf("items %+v; want the unknown create found made, the failed one kept", res.Items)
	}
	if w := f.sentWith(http.MethodPost); len(w) != 0 {
		t.Errorf("sent %v; want only a read", f.sent())
	}
}
