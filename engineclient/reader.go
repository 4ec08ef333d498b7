package engineclient

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Observer takes the readings (router.Live): a nil observation says the engine's metrics could
// not be read.
type Observer interface {
	Observe(id string, o *router.Observation) (router.Observed, bool)
}

// readConcurrency is how many engines a MetricsReader reads at once: a few hundred engines
// are read within an interval at a timeout each.
const readConcurrency = 16

// MetricsReader reads every live engine's metrics each health.metrics.interval_s
// (docs/engine-metrics.md) and hands the readings to the router. It logs once when an
// engine's metrics cannot be read and when they can again, when an engine reports a KV cache
// other than its profile says, and when the handoff check marks an engine or clears it.
type MetricsReader struct {
	cfg      config.Metrics
	profiles map[string]config.Profile
	fleet    interface{ Snapshot() fleet.Snapshot }
	router   Observer
	client   *http.Client
	resolver *net.Resolver
	log      *slog.Logger
	reads    *prometheus.CounterVec

	mu    sync.Mutex
	noted map[string]*noted // per engine id: what was last logged
}

// noted is what was last logged of one engine, so that each is logged once.
type noted struct {
	observed      bool // a reading was handed on: cleared (Observe nil) when the engine leaves placement
	failing       bool
	kvMismatch    bool
	unserved      bool
	noHandoff     bool
	kvCapacityMet int
}

// NewMetricsReader returns a reader for the fleet's engines; reg counts its readings
// (narwhal_engine_metrics_reads_total{result}).
func NewMetricsReader(cfg *config.Config, f interface{ Snapshot() fleet.Snapshot }, r Observer, log *slog.Logger, reg prometheus.Registerer) *MetricsReader {
	m := &MetricsReader{
		cfg: cfg.Health.Metrics, profiles: cfg.Profiles, fleet: f, router: r, log: log,
		client: &http.Client{Timeout: config.Seconds(cfg.Health.Metrics.TimeoutS),
			Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}},
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "narwhal_engine_metrics_reads_total",
			Help: "Readings of the engines' own metrics (health.metrics), by result: ok, error."}, []string{"result"}),
		noted: map[string]*noted{},
	}
	m.reads.WithLabelValues("ok")
	m.reads.WithLabelValues("error")
	if reg != nil {
		reg.MustRegister(m.reads)
	}
	return m
}

// Run reads every interval until ctx is done; the first pass is at once.
func (m *MetricsReader) Run(ctx context.Context) {
	if m.cfg.IntervalS <= 0 {
		return
	}
	t := time.NewTicker(config.Seconds(m.cfg.IntervalS))
	defer t.Stop()
	for {
		m.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass reads every engine in placement once (at most readConcurrency at a time) and returns
// when all are read.
func (m *MetricsReader) Pass(ctx context.Context) {
	snap := m.fleet.Snapshot()
	sem := make(chan struct{}, readConcurrency)
	var wg sync.WaitGroup
	for _, e := range snap.Engines {
		if !e.Live() || e.Addr == "" {
			m.unobserve(e.ID)
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			m.read(ctx, e)
		})
	}
	wg.Wait()
	m.forget(snap)
}

// read reads one engine and hands the reading on.
func (m *MetricsReader) read(ctx context.Context, e fleet.Engine) {
	ap, err := Resolve(ctx, m.resolver, e.Addr)
	var mt Metrics
	if err == nil {
		mt, err = ScrapeMetrics(ctx, m.client, "http://"+ap.String()+m.cfg.Path)
	}
	if ctx.Err() != nil {
		return // stopping: not the engine's failure
	}
	if err != nil {
		m.reads.WithLabelValues("error").Inc()
		m.router.Observe(e.ID, nil)
		m.note(e.ID, func(n *noted) {
			if !n.failing {
				n.failing = true
				m.log.Warn("engine metrics: cannot read them; the projection counts only Narwhal's own requests on this engine",
					"engine", e.ID, "path", m.cfg.Path, "err", err)
			}
		})
		return
	}
	m.reads.WithLabelValues("ok").Inc()
	got, _ := m.router.Observe(e.ID, &router.Observation{
		Running: mt.Running, Waiting: mt.Waiting, KVUsage: mt.KVUsage, HasKVUsage: mt.HasKVUsage,
		Finished: mt.Finished, PromptTokens: mt.PromptTokens, HasPromptTokens: mt.HasPromptTokens,
	})
	m.note(e.ID, func(n *noted) {
		n.observed = true
		if n.failing {
			n.failing = false
			m.log.Info("engine metrics: read again", "engine", e.ID, "dialect", mt.Dialect)
		}
		m.checkProfile(n, e, mt)
		if u := got.UnservedLegs > 0; u != n.unserved {
			n.unserved = u
			if u {
				m.log.Warn("handoff check: this prefill engine's finished count does not grow while the requests it was named for get their first tokens; the decode engines are doing the whole requests themselves (no P/D sidecar or KV connector in front of them?)",
					"engine", e.ID, "unserved_legs", got.UnservedLegs)
			} else {
				m.log.Info("handoff check: this prefill engine serves its legs again", "engine", e.ID)
			}
		}
		if n.noHandoff != got.NoHandoff {
			n.noHandoff = got.NoHandoff
			if got.NoHandoff {
				m.log.Warn("handoff check: this decode engine does not use the prefill engines it is named (their finished counts stay flat): P/D is not happening through it; put llm-d's P/D sidecar (or the engine's KV connector) in front of it and check with narwhal preflight",
					"engine", e.ID)
			} else {
				m.log.Info("handoff check: this decode engine's prefill engine serves its legs again", "engine", e.ID)
			}
		}
	})
}

// checkProfile logs once when the engine's KV cache is other than its profile's max_kv_tokens
// says: smaller, and the projection places streams the engine will queue; much larger, and it
// leaves capacity unused.
func (m *MetricsReader) checkProfile(n *noted, e fleet.Engine, mt Metrics) {
	p, ok := m.profiles[e.Profile]
	if !ok || p.Decode == nil || mt.KVCapacity <= 0 || mt.KVCapacity == n.kvCapacityMet {
		return
	}
	n.kvCapacityMet = mt.KVCapacity
	want := p.Decode.MaxKVTokens
	mismatch := float64(mt.KVCapacity) < 0.95*float64(want) || float64(mt.KVCapacity) > 2*float64(want)
	if mismatch && !n.kvMismatch {
		m.log.Warn("engine metrics: the engine's KV cache is not what its profile says; measure it again (narwhal profile) or give it a profile of its own",
			"engine", e.ID, "profile", e.Profile, "kv_cache_tokens", mt.KVCapacity, "max_kv_tokens", want,
			"ratio", fmt.Sprintf("%.2f", float64(mt.KVCapacity)/float64(want)))
	}
	n.kvMismatch = mismatch
}

// unobserve clears the router's reading of an engine out of placement (draining, failed): what
// it said when it was read is not what it runs now.
func (m *MetricsReader) unobserve(id string) {
	was := false
	m.note(id, func(n *noted) { was, n.observed = n.observed, false })
	if was {
		m.router.Observe(id, nil)
	}
}

// note runs fn on the engine's logged state under the lock.
func (m *MetricsReader) note(id string, fn func(*noted)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.noted[id]
	if !ok {
		n = &noted{}
		m.noted[id] = n
	}
	fn(n)
}

// forget drops the logged state of engines that left the fleet.
func (m *MetricsReader) forget(snap fleet.Snapshot) {
	ids := snap.IDs()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.noted {
		if _, ok := ids[id]; !ok {
			delete(m.noted, id)
		}
	}
}
