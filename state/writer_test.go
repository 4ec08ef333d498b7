package state

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// The writer writes after a kick what the fleet and the controller hold then; a failed write is
// counted and handed to Failed, and the next kick writes again; when its context ends it writes
// once more and returns.
func TestWriterWritesOnKickAndAtTheEnd(t *testing.T) {
	f, err := fleet.New(testConfig(t, "a", "b"), t0)
	if err != nil {
		t.Fatal(err)
	}
	var seq atomic.Uint64
	written := make(chan *File, 1)
	failed := make(chan error, 1)
	refuse := errors.New("fenced off")
	var fail atomic.Bool
	reg := prometheus.NewRegistry()
	w := NewWriter(WriterOptions{
		Save: func(file *File) error {
			if fail.Load() {
				return refuse
			}
			written <- file
			return nil
		},
		Loads:  func() []router.EngineLoad { return nil },
		Failed: func(err error) { failed <- err },
		Logger: slog.New(slog.DiscardHandler),
	}, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	durable := func() (controller.Durable, fleet.Snapshot) { return controller.Durable{Seq: seq.Load()}, f.Snapshot() }
	go func() { w.Run(ctx, durable); close(done) }()

	seq.Store(3)
	w.Kick()
	if got := <-written; got.Controller.Seq != 3 || len(got.Engines) != 2 {
		t.Fatalf("written after the kick: seq %d, %d engines", got.Controller.Seq, len(got.Engines))
	}
	fail.Store(true)
	w.Kick()
	if err := <-failed; !errors.Is(err, refuse) {
		t.Fatalf("Failed got %v", err)
	}
	fail.Store(false)
	seq.Store(4)
	cancel()
	if got := <-written; got.Controller.Seq != 4 {
		t.Fatalf("the last write has seq %d, want 4", got.Controller.Seq)
	}
	<-done
	counts := map[string]float64{}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range fams {
		if mf.GetName() == "narwhal_state_writes_total" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["ok"] != 2 || counts["error"] != 1 {
		t.Fatalf("narwhal_state_writes_total %v; want ok 2, error 1", counts)
	}
}
