package telemetry

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-batch/caddy-batch/batch"
)

type fakeSlots struct{ inFlight, waiting, cap int }

func (f *fakeSlots) InFlight() int { return f.inFlight }
func (f *fakeSlots) Waiting() int  { return f.waiting }
func (f *fakeSlots) Cap() int      { return f.cap }

// TestMetricsSlotGauges: the in-flight and waiting gauges report nothing
// until a handler's slots are tracked, then their sum, counting slots that
// the handlers of two configs share once.
func TestMetricsSlotGauges(t *testing.T) {
	g := newSlotGauges("caddy", "http_batch")
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(g); err != nil {
		t.Fatal(err)
	}
	gauges := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
		return out
	}
	if got := gauges(); len(got) != 0 {
		t.Errorf("with no slots tracked: %v, want nothing", got)
	}
	a, b := &fakeSlots{3, 1, 32}, &fakeSlots{2, 0, 7}
	untrackA := g.Track(a)
	untrackReloaded := g.Track(a) // the next config's handler, same pooled slots
	untrackB := g.Track(b)
	want := map[string]float64{"caddy_http_batch_subrequests_in_flight": 5, "caddy_http_batch_subrequests_waiting": 1, "caddy_http_batch_in_flight_limit": 39}
	if got := gauges(); !maps.Equal(got, want) {
		t.Errorf("gauges %v, want %v", got, want)
	}
	untrackA()
	untrackA() // a Cleanup called twice takes one share only
	untrackB()
	want = map[string]float64{"caddy_http_batch_subrequests_in_flight": 3, "caddy_http_batch_subrequests_waiting": 1, "caddy_http_batch_in_flight_limit": 32}
	if got := gauges(); !maps.Equal(got, want) {
		t.Errorf("gauges %v, want %v", got, want)
	}
	untrackReloaded()
	if got := gauges(); len(got) != 0 {
		t.Errorf("with every handler gone: %v, want nothing", got)
	}
	// Every batch handler of a config registers the module's metrics on
	// the config's registry: the second finds them there.
	reg = prometheus.NewPedanticRegistry()
	for range 2 {
		if err := Register(reg); err != nil {
			t.Fatalf("registering: %v", err)
		}
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("gathering: %v", err)
	}
}

// TestMetricsJobItems: a window's items are counted by outcome, those
// not attempted left out.
func TestMetricsJobItems(t *testing.T) {
	m := newBatchMetrics()
	m.JobItemsFinished([]batch.ItemResult{{Outcome: batch.Succeeded}, {Outcome: batch.Succeeded}, {Outcome: batch.Failed},
		{Outcome: batch.Unknown}, {Outcome: batch.NotAttempted}, {}})
	m.JobItemsFinished([]batch.ItemResult{{Outcome: batch.Succeeded}})
	got := map[string]float64{}
	for _, o := range []string{"succeeded", "failed", "unknown", "not_attempted"} {
		var v dto.Metric
		_ = m.JobItems.WithLabelValues(o).Write(&v)
		got[o] = v.GetCounter().GetValue()
	}
	want := map[string]float64{"succeeded": 3, "failed": 1, "unknown": 1, "not_attempted": 0}
	if !maps.Equal(got, want) {
		t.Errorf("job items %v, want %v", got, want)
	}
}
