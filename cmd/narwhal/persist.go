package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/ha"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/state"
)

// restored is what a previous run's state file gave back, for the router and the controller
// (the fleet takes its part in loadState).
type restored struct {
	corrections map[string]router.Correction
	controller  *controller.Durable
}

// loadState restores the fleet from the state file under state.dir (docs/durable-state.md),
// unless reset: the config's roles then start, and the next write replaces the file. A file
// that cannot be read, is corrupt or belongs to another fleet stops serve with one line naming
// it; engines added to or removed from the config since are said in the log.
func loadState(cfg *config.Config, f *fleet.Fleet, reset bool, rep *replica, log *slog.Logger) (restored, error) {
	where := "state file " + cfg.State.StateDir() + "/" + state.FileName
	if rep != nil {
		where = rep.where
	}
	if reset {
		log.Info("durable state ignored (--reset-state): starting from the config's roles", "state", where)
		return restored{}, nil
	}
	var file *state.File
	var err error
	if rep != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		file, err = rep.load(ctx)
		cancel()
	} else if file, err = state.Load(cfg.State.StateDir()); errors.Is(err, state.ErrNoState) {
		file, err = nil, nil
	}
	if err != nil {
		return restored{}, err
	}
	if file == nil {
		log.Info("no durable state yet: starting from the config's roles", "state", where)
		return restored{}, nil
	}
	return restore(cfg, f, file, where, log)
}

// restore puts a state back into the fleet and returns the router's and controller's parts.
func restore(cfg *config.Config, f *fleet.Fleet, file *state.File, where string, log *slog.Logger) (restored, error) {
	added, removed, err := file.Match(cfg)
	if err != nil {
		return restored{}, fmt.Errorf("%s: %w; start with --reset-state to begin from this config", where, err)
	}
	engines, err := file.Fleet()
	if err != nil {
		return restored{}, err
	}
	engines = slices.DeleteFunc(engines, func(e fleet.Engine) bool {
		_, known := cfg.Profiles[e.Profile]
		if e.Source != fleet.SourceConfig && !known {
			log.Warn("engine added at run time names a profile the config no longer has: not restored (its source may add it again)", "engine", e.ID, "profile", e.Profile)
			return true
		}
		return false
	})
	if _, err := f.Restore(engines); err != nil {
		return restored{}, fmt.Errorf("%s: %w", where, err)
	}
	for _, id := range added {
		log.Info("engine added to the config since the state was written: it starts in its configured role", "engine", id)
	}
	for _, id := range removed {
		log.Info("engine removed from the config since the state was written: its saved state is dropped", "engine", id)
	}
	snap := f.Snapshot()
	p, d := snap.Split()
	log.Info("durable state restored", "state", where, "written", file.Written,
		"prefill", p, "decode", d, "decision_seq", file.Controller.Seq)
	return restored{corrections: file.Corrections(), controller: &file.Controller}, nil
}

// persister writes the durable state after every change it is told of (Kick: a fleet event, a
// decision), coalescing a burst into one write, and every few seconds for the corrections.
// Writes happen on its own goroutine, off the placement path.
type persister struct {
	save   func(*state.File) error // the file, or etcd (fenced)
	lost   func(error)             // a fenced write refused: this replica no longer leads
	fleet  *fleet.Fleet
	roles  *controller.Live
	router *router.Live
	log    *slog.Logger
	kick   chan struct{}

	writes  *prometheus.CounterVec
	latency prometheus.Histogram
}

// persistEvery is how often the state is written without a change (the correction factors move
// with every finished request, which does not kick a write).
const persistEvery = 10 * time.Second

func newPersister(save func(*state.File) error, f *fleet.Fleet, roles *controller.Live, rt *router.Live, log *slog.Logger, reg prometheus.Registerer) *persister {
	p := &persister{save: save, fleet: f, roles: roles, router: rt, log: log, kick: make(chan struct{}, 1),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_state_writes_total", Help: "Durable state writes, by result (ok, error).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narwhal_state_write_seconds", Help: "Time to write the durable state (fsync included).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
	}
	reg.MustRegister(p.writes, p.latency)
	return p
}

// Kick asks for a write soon; it never blocks.
func (p *persister) Kick() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// ObserveDecision kicks a write after every decision (its sequence number is durable state).
func (p *persister) ObserveDecision(*decisionlog.Decision, time.Duration) { p.Kick() }

// Run writes on kicks and every persistEvery until ctx is done, then once more.
func (p *persister) Run(ctx context.Context) {
	t := time.NewTicker(persistEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.write()
			return
		case <-p.kick:
		case <-t.C:
		}
		p.write()
	}
}

func (p *persister) write() {
	begin := time.Now()
	f := state.Capture(p.fleet.Snapshot(), p.roles.Durable(), p.router.Snapshot().Engines, begin)
	err := p.save(f)
	p.latency.Observe(time.Since(begin).Seconds())
	if err != nil {
		p.writes.WithLabelValues("error").Inc()
		p.log.Error("durable state not written", "err", err)
		if errors.Is(err, ha.ErrNotLeader) && p.lost != nil {
			p.lost(err)
		}
		return
	}
	p.writes.WithLabelValues("ok").Inc()
}

// observers hands every decision to each of its observers.
type observers []controller.Observer

func (o observers) ObserveDecision(d *decisionlog.Decision, took time.Duration) {
	for _, x := range o {
		x.ObserveDecision(d, took)
	}
}
