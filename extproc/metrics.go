package extproc

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the data path's histograms: Narwhal's own processing time per ext_proc message
// kind (the overhead a gateway adds, without the time a request waits for an engine), the wait
// in the waiting set, projected and observed time to first token, and time per output token.
// A nil *Metrics records nothing.
type Metrics struct {
	processing *prometheus.HistogramVec
	phases     map[string]prometheus.Observer
	wait       prometheus.Histogram
	ttft       *prometheus.HistogramVec
	tpot       prometheus.Histogram
	protocol   prometheus.Counter
	refused    prometheus.Counter
	router     *prometheus.CounterVec
}

// NewMetrics registers the data path metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2}
	slo := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &Metrics{
		processing: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "narwhal_extproc_processing_seconds",
			Help:    "Narwhal's processing time per ext_proc message, by message kind (waiting-set time excluded).",
			Buckets: latency,
		}, []string{"phase"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narwhal_waiting_seconds", Help: "Time placed requests spent in the waiting set.", Buckets: slo,
		}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "narwhal_ttft_seconds", Help: "Time to first token from the offer: projected at placement, and observed.", Buckets: slo,
		}, []string{"kind"}),
		tpot: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narwhal_tpot_seconds", Help: "Observed mean time per output token after the first, per request.",
			Buckets: []float64{.002, .005, .01, .02, .03, .05, .075, .1, .2, .5},
		}),
	}
	m.protocol = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "narwhal_extproc_protocol_errors_total",
		Help: "ext_proc streams ended with InvalidArgument: a message that does not fit the stream (a second request, out of order).",
	})
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "narwhal_extproc_streams_refused_total",
		Help: "ext_proc streams answered 503 overloaded because the concurrent stream limit was reached.",
	})
	m.router = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "narwhal_extproc_router_errors_total",
		Help: "Response events (first_token, complete, fail, cancel) the router refused: a request it no longer knew.",
	}, []string{"event"})
	m.phases = map[string]prometheus.Observer{}
	for _, p := range []string{"request_headers", "request_body", "request_trailers", "response_headers", "response_body", "response_trailers"} {
		m.phases[p] = m.processing.WithLabelValues(p)
	}
	reg.MustRegister(m.processing, m.wait, m.ttft, m.tpot, m.protocol, m.refused, m.router)
	m.ttft.WithLabelValues("projected") // both series from the start (a dashboard reads them)
	m.ttft.WithLabelValues("observed")
	return m
}

func (m *Metrics) observePhase(phase string, d time.Duration) {
	if m != nil {
		m.phases[phase].Observe(max(d, 0).Seconds())
	}
}

func (m *Metrics) observeWait(d time.Duration) {
	if m != nil {
		m.wait.Observe(d.Seconds())
	}
}

func (m *Metrics) observeTTFT(projected, observed float64) {
	if m != nil {
		m.ttft.WithLabelValues("projected").Observe(projected)
		m.ttft.WithLabelValues("observed").Observe(observed)
	}
}

func (m *Metrics) observeTPOT(s float64) {
	if m != nil {
		m.tpot.Observe(s)
	}
}

func (m *Metrics) protocolError() {
	if m != nil {
		m.protocol.Inc()
	}
}

func (m *Metrics) routerError(event string) {
	if m != nil {
		m.router.WithLabelValues(event).Inc()
	}
}

func (m *Metrics) streamRefused() {
	if m != nil {
		m.refused.Inc()
	}
}
