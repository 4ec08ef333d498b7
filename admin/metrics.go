package admin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/narwhal-llm/narwhal/fleet"
)

// Metrics are the fleet and health metrics. The fleet gauges are read from a snapshot at
// scrape time, so they never disagree with /narwhal/state; probe results and fleet changes are
// counted as they happen.
type Metrics struct {
	fleet        *fleet.Fleet
	probes       *prometheus.CounterVec
	probeSeconds *prometheus.HistogramVec
	changes      *prometheus.CounterVec

	engines      *prometheus.Desc
	engineInfo   *prometheus.Desc
	fleetVersion *prometheus.Desc
}

// NewMetrics registers the fleet and health metrics, and the Go runtime and process
// collectors, with reg, and counts the fleet's changes.
func NewMetrics(reg prometheus.Registerer, f *fleet.Fleet, version string) *Metrics {
	m := &Metrics{
		fleet: f,
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_health_probes_total", Help: "Health probes by engine and result (ok, fail).",
		}, []string{"engine", "result"}),
		probeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "narwhal_health_probe_duration_seconds",
			Help:    "Health probe latency by engine.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"engine"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_fleet_changes_total", Help: "Fleet changes by kind (lifecycle, role, pin, hold, address, switch, added, removed, restored: a standby taking its leader's state).",
		}, []string{"kind"}),
		engines: prometheus.NewDesc("narwhal_engines",
			"Engines by role and lifecycle.", []string{"role", "lifecycle"}, nil),
		engineInfo: prometheus.NewDesc("narwhal_engine_info",
			"One series per engine with its current role, lifecycle and pin (value 1).",
			[]string{"engine", "address", "role", "lifecycle", "pinned"}, nil),
		fleetVersion: prometheus.NewDesc("narwhal_fleet_version",
			"The fleet version; it increases by one with every change.", nil, nil),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "narwhal_build_info", Help: "Narwhal's version (value 1).", ConstLabels: prometheus.Labels{"version": version},
	})
	build.Set(1)
	f.OnChange(m.observeFleet)
	reg.MustRegister(m, m.probes, m.probeSeconds, m.changes, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, e := range f.Snapshot().Engines { // every engine's series from the start, at 0
		m.probes.WithLabelValues(e.ID, "ok")
		m.probes.WithLabelValues(e.ID, "fail")
	}
	return m
}

// ObserveProbe counts one probe result (controller.ProbeObserver).
func (m *Metrics) ObserveProbe(engine string, ok bool, took time.Duration) {
	result := "ok"
	if !ok {
		result = "fail"
	}
	m.probes.WithLabelValues(engine, result).Inc()
	m.probeSeconds.WithLabelValues(engine).Observe(took.Seconds())
}

// observeFleet counts a fleet change; an engine that joins gets its probe series at 0, one
// that leaves loses them.
func (m *Metrics) observeFleet(ev fleet.Event) {
	m.changes.WithLabelValues(string(ev.Kind)).Inc()
	switch ev.Kind {
	case fleet.EventAdded:
		m.probes.WithLabelValues(ev.Engine, "ok")
		m.probes.WithLabelValues(ev.Engine, "fail")
	case fleet.EventRemoved:
		m.probes.DeletePartialMatch(prometheus.Labels{"engine": ev.Engine})
		m.probeSeconds.DeleteLabelValues(ev.Engine)
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.engines
	ch <- m.engineInfo
	ch <- m.fleetVersion
}

// Collect implements prometheus.Collector from one fleet snapshot.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	snap := m.fleet.Snapshot()
	var count [len(fleet.Roles)][len(fleet.Lifecycles)]int
	for _, e := range snap.Engines {
		pinned := "false"
		if e.Pinned {
			pinned = "true"
		}
		ch <- prometheus.MustNewConstMetric(m.engineInfo, prometheus.GaugeValue, 1,
			e.ID, e.Addr, e.Role.String(), e.Lifecycle.String(), pinned)
		count[e.Role-1][e.Lifecycle-1]++
	}
	for _, r := range fleet.Roles {
		for _, l := range fleet.Lifecycles {
			ch <- prometheus.MustNewConstMetric(m.engines, prometheus.GaugeValue,
				float64(count[r-1][l-1]), r.String(), l.String())
		}
	}
	ch <- prometheus.MustNewConstMetric(m.fleetVersion, prometheus.GaugeValue, float64(snap.Version))
}
