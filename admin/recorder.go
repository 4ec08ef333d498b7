package admin

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/history"
	"github.com/narwhal-llm/narwhal/router"
)

// Recorder fills the history ring that GET /narwhal/history serves (docs/history.md): a sample
// of the fleet, the router and the data path's histograms every admin.history.interval_s (Run),
// and every decision record (it is a controller.Observer).
type Recorder struct {
	Ring   *history.Ring[decisionlog.Decision]
	fleet  *fleet.Fleet
	router interface{ Snapshot() router.Snapshot }
	reg    prometheus.Gatherer
	slo    float64
}

// NewRecorder is a recorder of the fleet f and the router rt, reading the histograms from reg.
func NewRecorder(cfg *config.Config, start time.Time, f *fleet.Fleet, rt interface{ Snapshot() router.Snapshot }, reg prometheus.Gatherer) *Recorder {
	h := cfg.Admin.History
	at := func(d decisionlog.Decision) time.Time { return start.Add(config.Seconds(d.TimeS)) }
	return &Recorder{Ring: history.NewRing(h.Samples, h.Decisions, at), fleet: f, router: rt, reg: reg, slo: cfg.SLO.TTFTS}
}

// ObserveDecision keeps the record.
func (r *Recorder) ObserveDecision(d *decisionlog.Decision, _ time.Duration) { r.Ring.AddDecision(*d) }

// Run samples every interval until ctx ends.
func (r *Recorder) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	prev := r.read(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cur := r.read(now)
			r.Ring.Add(history.NewSample(&prev, &cur, r.slo))
			prev = cur
		}
	}
}

func (r *Recorder) read(now time.Time) history.Reading {
	rd := history.Reading{T: now, Fleet: r.fleet.Snapshot(), Router: r.router.Snapshot()}
	fams, _ := r.reg.Gather() // a partial gather still has what it could read
	for _, mf := range fams {
		switch mf.GetName() {
		case "narwhal_ttft_seconds":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					switch {
					case l.GetName() != "kind":
					case l.GetValue() == "observed":
						rd.TTFT = hist(m)
					case l.GetValue() == "projected":
						rd.TTFTProjected = hist(m)
					}
				}
			}
		case "narwhal_tpot_seconds":
			if ms := mf.GetMetric(); len(ms) > 0 {
				rd.TPOT = hist(ms[0])
			}
		}
	}
	return rd
}

// hist reads a Prometheus histogram's cumulative buckets.
func hist(m *dto.Metric) history.Hist {
	h := m.GetHistogram()
	out := history.Hist{Count: h.GetSampleCount()}
	for _, b := range h.GetBucket() {
		out.Bounds = append(out.Bounds, b.GetUpperBound())
		out.Counts = append(out.Counts, b.GetCumulativeCount())
	}
	return out
}
