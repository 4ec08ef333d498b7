package admin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
)

// ControllerMetrics count the role controller's evaluations, moves and gate blocks.
type ControllerMetrics struct {
	moves, evaluations, blocks *prometheus.CounterVec
	seconds                    prometheus.Histogram
}

var _ controller.Observer = (*ControllerMetrics)(nil)

// NewControllerMetrics registers the controller's metrics with reg.
func NewControllerMetrics(reg prometheus.Registerer) *ControllerMetrics {
	m := &ControllerMetrics{
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_role_changes_total", Help: "Role changes the controller made, by from, to and caller.",
		}, []string{"from", "to", "caller"}),
		evaluations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_evaluations_total", Help: "Controller evaluations by caller and outcome.",
		}, []string{"caller", "outcome"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_gate_blocks_total", Help: "Evaluations a gate blocked, by gate.",
		}, []string{"gate"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narwhal_evaluation_duration_seconds", Help: "Time one controller evaluation took (on a fork of the router, outside its lock).",
			Buckets: []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2},
		}),
	}
	reg.MustRegister(m.moves, m.evaluations, m.blocks, m.seconds)
	// Every series a dashboard reads exists from the start, at 0 (not "no data").
	for _, c := range decisionlog.Callers {
		m.moves.WithLabelValues("prefill", "decode", string(c))
		m.moves.WithLabelValues("decode", "prefill", string(c))
		for _, o := range decisionlog.Outcomes {
			m.evaluations.WithLabelValues(string(c), string(o))
		}
	}
	for _, g := range decisionlog.Gates {
		m.blocks.WithLabelValues(g)
	}
	return m
}

// ObserveDecision counts one decision.
func (m *ControllerMetrics) ObserveDecision(d *decisionlog.Decision, took time.Duration) {
	m.evaluations.WithLabelValues(string(d.Caller), string(d.Outcome)).Inc()
	m.seconds.Observe(took.Seconds())
	for _, mv := range d.Moves {
		m.moves.WithLabelValues(mv.From.String(), mv.To.String(), string(d.Caller)).Inc()
	}
	for _, g := range d.Gates {
		if !g.Passed {
			m.blocks.WithLabelValues(g.Name).Inc()
			break
		}
	}
}
