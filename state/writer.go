package state

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Writer writes the durable state after every change it is told of (Kick: a fleet event, a
// decision), coalescing a burst into one write, and every WriteEvery for the correction factors
// (they move with every finished request, which does not kick a write). Writes happen on its
// own goroutine (Run), off the placement path. It is built before the role controller's live
// wrapper (it observes its decisions) and is handed the controller's guard state, with the fleet
// as of the same decisions, when it runs.
type Writer struct {
	o       WriterOptions
	kick    chan struct{}
	writes  *prometheus.CounterVec
	latency prometheus.Histogram
}

// WriterOptions are what a Writer captures and where it writes.
type WriterOptions struct {
	Save  func(*File) error          // the file (Save), or a replica's store (fenced)
	Loads func() []router.EngineLoad // the router's correction factors, read at each write
	// Failed is told every write that failed, after it is logged and counted (a replica ends
	// when its write was fenced off); nil ignores them.
	Failed func(error)
	Logger *slog.Logger
}

// WriteEvery is how often the state is written without a change.
const WriteEvery = 10 * time.Second

// NewWriter is a writer with o, its metrics registered on reg.
func NewWriter(o WriterOptions, reg prometheus.Registerer) *Writer {
	w := &Writer{o: o, kick: make(chan struct{}, 1),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "narwhal_state_writes_total", Help: "Durable state writes, by result (ok, error).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "narwhal_state_write_seconds", Help: "Time to write the durable state (fsync included).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
	}
	reg.MustRegister(w.writes, w.latency)
	return w
}

// Kick asks for a write soon; it never blocks.
func (w *Writer) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// ObserveDecision kicks a write after every decision (its sequence number is durable state): a
// controller.Observer.
func (w *Writer) ObserveDecision(*decisionlog.Decision, time.Duration) { w.Kick() }

// Run writes on kicks and every WriteEvery until ctx is done, then once more; durable is the
// controller's guard state and the fleet as of the same decisions (controller.Live.Durable),
// read at each write.
func (w *Writer) Run(ctx context.Context, durable func() (controller.Durable, fleet.Snapshot)) {
	t := time.NewTicker(WriteEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			w.write(durable)
			return
		case <-w.kick:
		case <-t.C:
		}
		w.write(durable)
	}
}

func (w *Writer) write(durable func() (controller.Durable, fleet.Snapshot)) {
	begin := time.Now()
	c, snap := durable()
	err := w.o.Save(Capture(snap, c, w.o.Loads(), begin))
	w.latency.Observe(time.Since(begin).Seconds())
	if err != nil {
		w.writes.WithLabelValues("error").Inc()
		w.o.Logger.Error("durable state not written", "err", err)
		if w.o.Failed != nil {
			w.o.Failed(err)
		}
		return
	}
	w.writes.WithLabelValues("ok").Inc()
}
