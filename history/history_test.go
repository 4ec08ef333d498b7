package history

import (
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Quantiles and attainment from the interval's share of two cumulative histograms, as
// Prometheus' histogram_quantile reads them.
func TestQuantilesOfAnInterval(t *testing.T) {
	bounds := []float64{0.1, 0.25, 0.5, 1}
	before := Hist{Bounds: bounds, Counts: []uint64{10, 10, 10, 10}, Count: 10} // ten fast ones, before
	// Then 100 more: 40 ≤ 0.1, 40 in (0.1, 0.25], 10 in (0.25, 0.5], 10 in (0.5, 1].
	after := Hist{Bounds: bounds, Counts: []uint64{50, 90, 100, 110}, Count: 110}
	q := quantiles(before, after)
	want := Quantiles{P50: 0.1 + 0.15*10/40, P90: 0.5, P99: 0.5 + 0.5*9/10}
	if q == nil || math.Abs(q.P50-want.P50) > 1e-12 || math.Abs(q.P90-want.P90) > 1e-12 || math.Abs(q.P99-want.P99) > 1e-12 {
		t.Fatalf("quantiles %+v, want %+v", q, want)
	}
	if got := delta(before, after).below(0.25); got != 80 {
		t.Fatalf("within 0.25 s: %v, want 80", got)
	}
	if quantiles(after, after) != nil {
		t.Fatal("quantiles of an empty interval")
	}
}

func testFleet(t *testing.T, n int) *fleet.Fleet {
	t.Helper()
	cfg := config.Default()
	for i := range n {
		role := "prefill"
		if i%2 == 1 {
			role = "decode"
		}
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i+1), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: role, Profile: config.DefaultProfileName})
	}
	f, err := fleet.New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A sample: the split and the engines at its end, the interval's rates, rejections by code,
// completions and percentiles.
func TestSample(t *testing.T) {
	f := testFleet(t, 4)
	bounds := []float64{0.25, 0.5, 1}
	prev := Reading{T: t0, Fleet: f.Snapshot(), Router: router.Snapshot{Counters: router.Counters{Offers: 10, Admitted: 9, Completed: 5}},
		TTFT: Hist{Bounds: bounds, Counts: []uint64{5, 5, 5}, Count: 5}}
	if _, err := f.Drain("e4", t0, "admin", fleet.Floors{}); err != nil {
		t.Fatal(err)
	}
	cur := Reading{T: t0.Add(2 * time.Second), Fleet: f.Snapshot(),
		Router: router.Snapshot{Counters: router.Counters{Offers: 30, Admitted: 25, Completed: 15, Overflow: router.Overflow{WaitingSetFull: 3, PredictedSLOMiss: 2}},
			Retained: router.Retained{Waiting: 4}, Engines: []router.EngineLoad{{ID: "e1", PrefillResidents: 2}, {ID: "e2", DecodeResidents: 7}}},
		TTFT: Hist{Bounds: bounds, Counts: []uint64{11, 14, 15}, Count: 15}}
	s := NewSample(&prev, &cur, 0.5)
	if s.Prefill != 2 || s.Decode != 1 || s.OfferedPerS != 10 || s.AdmittedPerS != 8 || s.Completed != 10 || s.Waiting != 4 ||
		s.Rejected != (router.Overflow{WaitingSetFull: 3, PredictedSLOMiss: 2}) || s.Attainment == nil || *s.Attainment != 0.9 || s.TPOT != nil {
		t.Fatalf("sample %+v", s)
	}
	if e := s.Engines[3]; e.Lifecycle != "draining" || !e.Drained || s.Engines[0].PrefillResidents != 2 || s.Engines[1].DecodeResidents != 7 {
		t.Fatalf("engines %+v", s.Engines)
	}
	if first := NewSample(nil, &cur, 0.5); first.OfferedPerS != 0 || first.TTFT != nil || len(first.Engines) != 4 {
		t.Fatalf("the first sample %+v", first)
	}
}

type rec struct{ at time.Time }

// A day of samples, one a second, into a ring of ten: the ring keeps the last ten and the
// decisions' last five, returns them oldest first after a time, and its memory stays where the
// ten samples put it (a full ring allocates nothing more).
func TestRingStaysBounded(t *testing.T) {
	f := testFleet(t, 64)
	r := NewRing(10, 5, func(d rec) time.Time { return d.at })
	read := Reading{T: t0, Fleet: f.Snapshot()}
	s := NewSample(nil, &read, 0.5)
	var ms runtime.MemStats
	heap := func() uint64 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for i := range 20 { // full, and each slot's engine slice sized
		s.T = t0.Add(time.Duration(i) * time.Second)
		r.Add(s)
	}
	base := heap()
	allocs := testing.AllocsPerRun(86400, func() {
		s.T = s.T.Add(time.Second)
		r.Add(s)
		r.AddDecision(rec{s.T})
	})
	if allocs != 0 {
		t.Errorf("a full ring allocated %.1f times an add", allocs)
	}
	if grown := int64(heap()) - int64(base); grown > 64<<10 {
		t.Errorf("the heap grew %d bytes over a day of samples", grown)
	}
	n, dn, sc, dc := r.Len()
	ss, ds := r.Since(s.T.Add(-3 * time.Second))
	if n != 10 || dn != 5 || sc != 10 || dc != 5 || len(ss) != 3 || len(ds) != 3 || !ss[2].T.Equal(s.T) || !ds[0].at.Before(ds[2].at) || len(ss[0].Engines) != 64 {
		t.Fatalf("ring %d/%d of %d/%d; since: %d samples, %d decisions", n, dn, sc, dc, len(ss), len(ds))
	}
}
