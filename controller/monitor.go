package controller

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Prober checks one engine's health.
type Prober interface {
	// Probe resolves address (host:port; the host may be a name), checks the engine's health
	// at the resolved address and returns that address. It returns the address whenever it
	// resolved, also with an error from the check.
	Probe(ctx context.Context, address string) (netip.AddrPort, error)
}

// ProbeObserver sees every probe result (metrics).
type ProbeObserver interface {
	ObserveProbe(engine string, ok bool, took time.Duration)
}

// Monitor is the live health monitor: every health.interval_s it probes all engines at once
// (each probe bounded by health.timeout_s), records resolved addresses, and feeds the results,
// in fleet order, to the Health core.
type Monitor struct {
	cfg      config.Health
	fleet    *fleet.Fleet
	core     *Health
	prober   Prober
	now      func() time.Time
	after    func(time.Duration) <-chan time.Time
	observer ProbeObserver
	log      *slog.Logger
}

// NewMonitor returns a monitor on the clock now (time.Now in serve; the core never reads a
// clock), sleeping between rounds with after (time.After). observer may be nil.
func NewMonitor(cfg config.Health, f *fleet.Fleet, p Prober, now func() time.Time, after func(time.Duration) <-chan time.Time, observer ProbeObserver, log *slog.Logger) *Monitor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Monitor{cfg: cfg, fleet: f, core: NewHealth(cfg), prober: p, now: now, after: after, observer: observer, log: log}
}

// Run probes until ctx is done; it returns ctx's error.
func (m *Monitor) Run(ctx context.Context) error {
	interval := config.Seconds(m.cfg.IntervalS)
	next := m.now()
	for {
		m.Pass(ctx)
		next = next.Add(interval)
		if now := m.now(); next.Before(now) {
			next = now // fell behind: do not burst
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.after(next.Sub(m.now())):
		}
	}
}

type probeResult struct {
	addr netip.AddrPort
	err  error
	took time.Duration
}

// Pass probes every engine once and applies the results.
func (m *Monitor) Pass(ctx context.Context) {
	snap := m.fleet.Snapshot()
	results := make([]probeResult, len(snap.Engines))
	var wg sync.WaitGroup
	for i := range snap.Engines {
		wg.Add(1)
		go func(i int, address string) {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, config.Seconds(m.cfg.TimeoutS))
			defer cancel()
			start := m.now()
			addr, err := m.prober.Probe(pctx, address)
			results[i] = probeResult{addr: addr, err: err, took: m.now().Sub(start)}
		}(i, snap.Engines[i].Address)
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // shutting down: a cancelled probe says nothing about the engine
	}
	now := m.now()
	m.core.Retain(snap)
	for i, r := range results {
		id := snap.Engines[i].ID
		if _, ok := m.fleet.Engine(id); !ok {
			continue // removed while it was probed
		}
		if r.addr.IsValid() {
			if _, err := m.fleet.SetAddr(id, r.addr, now); err != nil {
				m.log.Warn("record resolved address", "engine", id, "err", err)
			}
		}
		ok := r.err == nil
		if m.observer != nil {
			m.observer.ObserveProbe(id, ok, r.took)
		}
		if !ok {
			m.log.Debug("health probe failed", "engine", id, "err", r.err)
		}
		switch _, err := Apply(m.core, m.fleet, now, id, ok); {
		case errors.Is(err, fleet.ErrTransition):
			m.log.Debug("health transition refused", "engine", id, "err", err)
		case err != nil:
			m.log.Warn("health", "engine", id, "err", err)
		}
	}
}
