package controller

import (
	"math"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Issue 11: a restart continues the guards. A move made 20 s before the restart is still in its
// dwell after it (dwell_s 120), and passes it 100 s later; the cooldown of a move toward decode
// and the evidence window carry over, with times before the new start; the sequence continues.
// Before, a role_since before the start read as "never moved", and dwell let the engine go.
func TestRestoredGuardsHold(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	cfg, err := config.LoadDefault() // e1, e2 prefill; e3, e4 decode
	if err != nil {
		t.Fatal(err)
	}
	f1, err := fleet.New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	c1 := New(cfg, t0)
	movedAt := t0.Add(10 * time.Second)
	if _, err := f1.SetRole("e3", fleet.Prefill, movedAt, "decision 5"); err != nil {
		t.Fatal(err)
	}
	c1.seq, c1.lastToDecode = 5, 8
	c1.win = window{openedAt: 2, arrivals: 300, closed: true}
	saved := c1.Durable()

	restart := t0.Add(30 * time.Second)
	f2, err := fleet.New(cfg, restart)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f2.Restore(f1.Snapshot().Engines); err != nil {
		t.Fatal(err)
	}
	c2 := New(cfg, restart)
	c2.Restore(saved)
	e3, _ := f2.Engine("e3")
	if g := c2.dwellGate(0, e3); g.Passed {
		t.Fatalf("right after the restart: %+v; want dwell to hold (moved 20 s before)", g)
	}
	if g := c2.dwellGate(100, e3); !g.Passed {
		t.Fatalf("120 s after the move: %+v", g)
	}
	if fresh, _ := fleet.New(cfg, restart); fresh != nil {
		e, _ := fresh.Engine("e3")
		if g := c2.dwellGate(0, e); !g.Passed {
			t.Fatalf("an engine that never moved is not held: %+v", g)
		}
	}
	if math.Abs(c2.lastToDecode-(-22)) > 1e-6 || c2.seq != 5 {
		t.Fatalf("cooldown from %v s, seq %d; want -22 s and 5", c2.lastToDecode, c2.seq)
	}
	if w := c2.windowState(); w.Open || w.Arrivals != 300 || math.Abs(w.OpenedAtS-(-28)) > 1e-6 {
		t.Fatalf("window %+v; want closed, 300 arrivals, opened at -28 s", w)
	}
}
