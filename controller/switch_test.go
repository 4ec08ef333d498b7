package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// residents is the router as a test plays it: each Await re-checks its condition whenever the
// test sets the residents, and, as router.Live following the fleet does, on every fleet change.
type residents struct {
	mu      sync.Mutex
	snap    router.Snapshot
	changed chan struct{}
}

func (r *residents) set(loads ...router.EngineLoad) {
	r.mu.Lock()
	r.snap = router.Snapshot{Engines: loads}
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// follow wakes the waiters on every change of f until ctx ends.
func (r *residents) follow(ctx context.Context, f *fleet.Fleet) {
	ch, cancel := f.Subscribe()
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			r.mu.Lock()
			close(r.changed)
			r.changed = make(chan struct{})
			r.mu.Unlock()
		}
	}
}

func (r *residents) Await(ctx context.Context, cond func(router.Snapshot) bool) error {
	for {
		r.mu.Lock()
		snap, ch := r.snap, r.changed
		r.mu.Unlock()
		if cond(snap) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// switchCalls records the switches asked of the engines.
type switchCalls struct {
	mu    sync.Mutex
	calls []string
	fail  bool
}

func (c *switchCalls) Switch(_ context.Context, addr string, to fleet.Role) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, addr+" "+to.String())
	if c.fail {
		return "", errors.New("rebuild failed")
	}
	return "switched", nil
}

// The Switcher: an engine held for a switch is asked once its residents are gone, and takes its
// role; a second switch of the same engine is carried too; one drained before it is asked is
// abandoned without a call; a failed call fails the engine.
func TestSwitcher(t *testing.T) {
	cfg := config.Default()
	for i, r := range []string{"prefill", "decode", "decode"} {
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i+1), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: r,
			Profile: config.DefaultProfileName, Switch: config.SwitchSGLang})
	}
	now := time.Now()
	f, err := fleet.New(cfg, now)
	if err != nil {
		t.Fatal(err)
	}
	rt := &residents{changed: make(chan struct{})}
	rt.set(router.EngineLoad{ID: "e2", DecodeResidents: 1})
	calls := &switchCalls{}
	ctx, cancel := context.WithCancel(context.Background())
	sw := &Switcher{Fleet: f, Router: rt, Client: calls, Timeout: time.Minute, Now: time.Now}
	var wg sync.WaitGroup
	wg.Go(func() { rt.follow(ctx, f) })
	wg.Go(func() { sw.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	ended := func(id string, want fleet.Lifecycle, role fleet.Role) {
		t.Helper()
		ch, unsub := f.Subscribe()
		defer unsub()
		deadline := time.After(10 * time.Second)
		for {
			if e, _ := f.Engine(id); e.SwitchTo == 0 && e.Lifecycle == want && e.Role == role {
				return
			}
			select {
			case <-ch:
			case <-deadline:
				e, _ := f.Engine(id)
				t.Fatalf("%s: %+v, want %s %s", id, e, role, want)
			}
		}
	}
	if _, err := f.StartSwitch("e2", fleet.Prefill, now, fleet.Mover{Decision: 1}); err != nil {
		t.Fatal(err)
	}
	rt.set(router.EngineLoad{ID: "e2", DecodeResidents: 1}) // still resident: no call
	calls.mu.Lock()
	if len(calls.calls) != 0 {
		t.Fatalf("asked while a stream decodes: %v", calls.calls)
	}
	calls.mu.Unlock()
	rt.set(router.EngineLoad{ID: "e2"})
	ended("e2", fleet.Active, fleet.Prefill)
	if _, err := f.StartSwitch("e2", fleet.Decode, now, fleet.Mover{Decision: 2}); err != nil { // the same engine again
		t.Fatal(err)
	}
	ended("e2", fleet.Active, fleet.Decode)
	// Drained before it is asked (its stream still decoding): abandoned, no call.
	rt.set(router.EngineLoad{ID: "e3", DecodeResidents: 1})
	if _, err := f.StartSwitch("e3", fleet.Prefill, now, fleet.Mover{Decision: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Drain("e3", now, "admin", fleet.Floors{}); err != nil {
		t.Fatal(err)
	}
	ended("e3", fleet.Draining, fleet.Decode)
	// A failed call: the engine is failed in its old role.
	calls.mu.Lock()
	calls.fail = true
	calls.mu.Unlock()
	if _, err := f.StartSwitch("e1", fleet.Decode, now, fleet.Mover{Decision: 4}); err != nil {
		t.Fatal(err)
	}
	ended("e1", fleet.Failed, fleet.Prefill)
	calls.mu.Lock()
	defer calls.mu.Unlock()
	if want := "10.0.0.2:8000 prefill,10.0.0.2:8000 decode,10.0.0.1:8000 decode"; strings.Join(calls.calls, ",") != want {
		t.Fatalf("calls %v, want %s", calls.calls, want)
	}
}

// SwitchSteps, the switcher's core: an engine held for its switch is asked once nothing is
// resident on it (an engine the router does not show has nothing), not while a prefill, a decode
// stream or a reserved stream is; an asked one waits for its answer; one that left switching
// unasked is abandoned, saying what it became; engines without a switch have no step.
func TestSwitchSteps(t *testing.T) {
	held := func(id string) fleet.Engine {
		return fleet.Engine{ID: id, InPlace: true, Role: fleet.Decode, Lifecycle: fleet.Switching, SwitchTo: fleet.Prefill}
	}
	asked := held("asked")
	asked.SwitchAsked = true
	drained := held("drained")
	drained.Lifecycle = fleet.Draining
	snap := fleet.Snapshot{Engines: []fleet.Engine{
		held("idle"), held("prefilling"), held("decoding"), held("reserved"), held("unseen"), asked, drained,
		{ID: "plain", Role: fleet.Decode, Lifecycle: fleet.Active},
	}}
	loads := []router.EngineLoad{{ID: "idle"}, {ID: "prefilling", PrefillResidents: 1}, {ID: "decoding", DecodeResidents: 2},
		{ID: "reserved", ReservedStreams: 1}, {ID: "asked"}, {ID: "drained", DecodeResidents: 1}, {ID: "plain"}}
	got := SwitchSteps(snap, loads)
	want := []SwitchStep{
		{Engine: "idle", Action: SwitchAsk},
		{Engine: "unseen", Action: SwitchAsk},
		{Engine: "drained", Action: SwitchAbandon, Detail: "it became draining before it was asked"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %+v, want %+v", got, want)
	}
}
