// Package history keeps what an operator looks back at (docs/history.md): a bounded ring of
// samples of the fleet and the data path, one an interval, and a bounded ring of the role
// controller's decision records. Sample builds one sample from two consecutive readings of the
// fleet, the router and the data path's histograms; the caller reads them (cores return values,
// edges read clocks). It is safe for concurrent use.
package history

import (
	"math"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Sample is the fleet and the data path over one interval, ending at T.
type Sample struct {
	T       time.Time      `json:"t"`
	Prefill int            `json:"prefill"` // live engines of each role at T
	Decode  int            `json:"decode"`
	Engines []EngineSample `json:"engines"`
	// OfferedPerS and AdmittedPerS are the interval's offers and admissions a second.
	OfferedPerS  float64 `json:"offered_per_s"`
	AdmittedPerS float64 `json:"admitted_per_s"`
	// Waiting is the waiting set at T; Rejected the offers turned away in the interval, by code.
	Waiting   int             `json:"waiting"`
	Rejected  router.Overflow `json:"rejected"`
	Completed uint64          `json:"completed"` // requests completed in the interval
	// TTFT (observed and projected at placement) and TPOT percentiles of the requests of the
	// interval (nil when none); Attainment the share of them whose observed TTFT was within
	// slo.ttft_s (nil when none).
	TTFT          *Quantiles `json:"ttft_s,omitempty"`
	TTFTProjected *Quantiles `json:"ttft_projected_s,omitempty"`
	TPOT          *Quantiles `json:"tpot_s,omitempty"`
	Attainment    *float64   `json:"attainment,omitempty"`
}

// EngineSample is one engine at a sample's time.
type EngineSample struct {
	ID               string `json:"id"`
	Role             string `json:"role"`
	Lifecycle        string `json:"lifecycle"`
	Pinned           bool   `json:"pinned,omitempty"`
	Drained          bool   `json:"drained,omitempty"`
	SwitchTo         string `json:"switch_to,omitempty"`
	PrefillResidents int    `json:"prefill_residents"`
	DecodeResidents  int    `json:"decode_residents"`
}

// Quantiles are the p50, p90 and p99 of a distribution in seconds: one interval's observations
// in a sample, a replay's or a load run's requests in the sim's and load's reports. Where there
// were no observations they are nil (null in JSON, or the field left out), never zeros that
// would read as instant requests.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// At is q's percentile p (50, 90 or 99), or nil when q is nil (no observations): the one way a
// caller hands a single percentile to a printer or a field that shows none as "—" or null,
// rather than a nil check at every call. Any other p is a programming error and panics.
func (q *Quantiles) At(p int) *float64 {
	if q == nil {
		return nil
	}
	var v float64
	switch p {
	case 50:
		v = q.P50
	case 90:
		v = q.P90
	case 99:
		v = q.P99
	default:
		panic("history: Quantiles.At of a percentile other than 50, 90 or 99")
	}
	return &v
}

// Hist is a histogram's cumulative bucket counts (Prometheus': Counts[i] observations ≤
// Bounds[i]) and its total count.
type Hist struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
}

// Reading is what Sample needs at one instant.
type Reading struct {
	T      time.Time
	Fleet  fleet.Snapshot
	Router router.Snapshot
	// TTFT, TTFTProjected and TPOT are the data path's histograms (narwhal_ttft_seconds
	// observed and projected, narwhal_tpot_seconds).
	TTFT, TTFTProjected, TPOT Hist
}

// NewSample is the sample of the interval from prev to cur; sloTTFT is slo.ttft_s (attainment).
func NewSample(prev, cur *Reading, sloTTFT float64) Sample {
	s := Sample{T: cur.T, Engines: make([]EngineSample, 0, len(cur.Fleet.Engines)), Waiting: cur.Router.Retained.Waiting}
	s.Prefill, s.Decode = cur.Fleet.Split()
	loads := make(map[string]*router.EngineLoad, len(cur.Router.Engines))
	for i := range cur.Router.Engines {
		loads[cur.Router.Engines[i].ID] = &cur.Router.Engines[i]
	}
	for _, e := range cur.Fleet.Engines {
		es := EngineSample{ID: e.ID, Role: e.Role.String(), Lifecycle: e.Lifecycle.String(), Pinned: e.Pinned, Drained: e.Held}
		if e.SwitchTo != 0 {
			es.SwitchTo = e.SwitchTo.String()
		}
		if l := loads[e.ID]; l != nil {
			es.PrefillResidents, es.DecodeResidents = l.PrefillResidents, l.DecodeResidents
		}
		s.Engines = append(s.Engines, es)
	}
	if prev == nil {
		return s
	}
	span := cur.T.Sub(prev.T).Seconds()
	a, b := &prev.Router.Counters, &cur.Router.Counters
	if span > 0 {
		s.OfferedPerS = float64(b.Offers-a.Offers) / span
		s.AdmittedPerS = float64(b.Admitted-a.Admitted) / span
	}
	s.Completed = b.Completed - a.Completed
	o, p := &b.Overflow, &a.Overflow
	s.Rejected = router.Overflow{WaitingSetFull: o.WaitingSetFull - p.WaitingSetFull, PredictedSLOMiss: o.PredictedSLOMiss - p.PredictedSLOMiss,
		FallbackBusy: o.FallbackBusy - p.FallbackBusy, NoCapacity: o.NoCapacity - p.NoCapacity, WaitTimeout: o.WaitTimeout - p.WaitTimeout,
		ShuttingDown: o.ShuttingDown - p.ShuttingDown}
	s.TTFT = quantiles(prev.TTFT, cur.TTFT)
	s.TTFTProjected = quantiles(prev.TTFTProjected, cur.TTFTProjected)
	s.TPOT = quantiles(prev.TPOT, cur.TPOT)
	if d := delta(prev.TTFT, cur.TTFT); d.Count > 0 {
		at := d.below(sloTTFT) / float64(d.Count)
		s.Attainment = &at
	}
	return s
}

// delta is the histogram of the observations between a and b.
func delta(a, b Hist) Hist {
	d := Hist{Bounds: b.Bounds, Counts: make([]uint64, len(b.Counts)), Count: b.Count}
	copy(d.Counts, b.Counts)
	if len(a.Counts) == len(b.Counts) && a.Count <= b.Count {
		for i := range d.Counts {
			d.Counts[i] -= min(a.Counts[i], d.Counts[i])
		}
		d.Count -= a.Count
	}
	return d
}

// below estimates how many observations are ≤ x (linear within a bucket, as Prometheus'
// histogram_quantile does).
func (h Hist) below(x float64) float64 {
	lo, prev := 0.0, 0.0
	for i, ub := range h.Bounds {
		c := float64(h.Counts[i])
		if x <= ub {
			return prev + (c-prev)*(x-lo)/(ub-lo)
		}
		lo, prev = ub, c
	}
	return float64(h.Count)
}

// quantile estimates the q-quantile of h, as Prometheus' histogram_quantile: linear within the
// bucket, the last finite bound for the overflow bucket.
func (h Hist) quantile(q float64) float64 {
	rank := q * float64(h.Count)
	lo, prev := 0.0, 0.0
	for i, ub := range h.Bounds {
		c := float64(h.Counts[i])
		if c >= rank {
			if c == prev {
				return ub
			}
			return lo + (ub-lo)*(rank-prev)/(c-prev)
		}
		lo, prev = ub, c
	}
	if len(h.Bounds) == 0 {
		return math.NaN()
	}
	return h.Bounds[len(h.Bounds)-1]
}

func quantiles(a, b Hist) *Quantiles {
	d := delta(a, b)
	if d.Count == 0 {
		return nil
	}
	return &Quantiles{P50: d.quantile(0.5), P90: d.quantile(0.9), P99: d.quantile(0.99)}
}

// Document is the history as GET /narwhal/history answers it and a recorded page draws it
// (docs/history.md); D is the decision record (decisionlog.Decision, or its JSON).
type Document[D any] struct {
	// Epoch is the time decision records count their time_s from (the process's start).
	Epoch     time.Time  `json:"epoch"`
	IntervalS float64    `json:"interval_s"`
	Capacity  Capacity   `json:"capacity"`
	Advisory  bool       `json:"advisory"`
	SLO       config.SLO `json:"slo"`
	Samples   []Sample   `json:"samples"`
	Decisions []D        `json:"decisions"`
}

// Capacity is what a history keeps.
type Capacity struct {
	Samples   int `json:"samples"`
	Decisions int `json:"decisions"`
}

// Ring keeps the last samples and the last decision records, each in a fixed capacity.
type Ring[D any] struct {
	mu        sync.Mutex
	samples   []Sample
	next, n   int
	decisions []D
	dnext, dn int
	decTime   func(D) time.Time
}

// NewRing keeps samples samples and decisions decision records; at gives a record's time.
func NewRing[D any](samples, decisions int, at func(D) time.Time) *Ring[D] {
	return &Ring[D]{samples: make([]Sample, max(samples, 1)), decisions: make([]D, max(decisions, 1)), decTime: at}
}

// Add keeps s, dropping the oldest sample when full; the ring reuses the dropped sample's engine
// slice, so a full ring allocates nothing more.
func (r *Ring[D]) Add(s Sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	slot := &r.samples[r.next]
	engines := append(slot.Engines[:0], s.Engines...)
	*slot = s
	slot.Engines = engines
	r.next = (r.next + 1) % len(r.samples)
	r.n = min(r.n+1, len(r.samples))
}

// AddDecision keeps a decision record, dropping the oldest when full.
func (r *Ring[D]) AddDecision(d D) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions[r.dnext] = d
	r.dnext = (r.dnext + 1) % len(r.decisions)
	r.dn = min(r.dn+1, len(r.decisions))
}

// Since returns the samples and decision records after t, oldest first (copies).
func (r *Ring[D]) Since(t time.Time) ([]Sample, []D) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ss []Sample
	for i := range r.n {
		s := r.samples[(r.next-r.n+i+len(r.samples))%len(r.samples)]
		if s.T.After(t) {
			s.Engines = append([]EngineSample(nil), s.Engines...)
			ss = append(ss, s)
		}
	}
	var ds []D
	for i := range r.dn {
		d := r.decisions[(r.dnext-r.dn+i+len(r.decisions))%len(r.decisions)]
		if r.decTime(d).After(t) {
			ds = append(ds, d)
		}
	}
	return ss, ds
}

// Len reports how many samples and decision records the ring holds, and its capacities.
func (r *Ring[D]) Len() (samples, decisions, sampleCap, decisionCap int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.dn, len(r.samples), len(r.decisions)
}
