package controller

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// RoleSwitcher tells an engine to change role in place (engineclient.SGLangSwitch does, over
// HTTP).
type RoleSwitcher interface {
	Switch(ctx context.Context, addr string, to fleet.Role) (string, error)
}

// Residents is the router as the switcher reads it (router.Live implements it): the engines'
// residents, and a wait until they satisfy a condition.
type Residents interface {
	Await(ctx context.Context, cond func(router.Snapshot) bool) error
}

var _ Residents = (*router.Live)(nil)

// Switcher carries out in-place role switches (docs/role-control.md section 11). For each
// engine the fleet has switching it waits until the router shows nothing resident on it (no
// prefill, no decode stream, no stream reserved by a request still prefilling elsewhere), asks
// the engine to switch, once, and ends the switch in the fleet with the engine's answer: the
// new role and active, or failed. An engine that leaves switching before it is asked (an
// operator drain, failed probes) is not asked: its switch is abandoned. Each step is a fleet
// event, and so a decision-log line.
//
// The rule of each step is SwitchSteps, the switcher's core; the simulator applies the same
// steps in virtual time.
type Switcher struct {
	Fleet   *fleet.Fleet
	Router  Residents
	Client  RoleSwitcher
	Timeout time.Duration    // bound on one switch call (controller.switch_timeout_s)
	Now     func() time.Time // the clock of the fleet events
	Logger  *slog.Logger

	mu     sync.Mutex
	active map[string]bool // engines with a switch being carried
}

// Run carries every switch the fleet starts until ctx ends.
func (s *Switcher) Run(ctx context.Context) {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	s.active = map[string]bool{}
	ch, cancel := s.Fleet.Subscribe()
	defer cancel()
	again := make(chan struct{}, 1) // a carry ended: look again (a next switch of its engine)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		for _, e := range s.Fleet.Snapshot().Engines {
			s.mu.Lock()
			start := e.SwitchTo != 0 && !s.active[e.ID]
			if start {
				s.active[e.ID] = true
			}
			s.mu.Unlock()
			if start {
				wg.Go(func() {
					s.carry(ctx, e.ID)
					s.mu.Lock()
					delete(s.active, e.ID)
					s.mu.Unlock()
					select {
					case again <- struct{}{}:
					default:
					}
				})
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-again:
		}
	}
}

// SwitchAction is what the switcher does next with an in-place switch.
type SwitchAction uint8

// Switch actions.
const (
	SwitchAsk     SwitchAction = iota + 1 // ask the engine to switch (fleet.AskSwitch, then the engine's answer)
	SwitchAbandon                         // end the switch unasked: the engine left switching first
)

// SwitchStep is one action due on one engine's switch.
type SwitchStep struct {
	Engine string
	Action SwitchAction
	Detail string // an abandoned switch: why
}

// SwitchSteps is the switcher's core (docs/role-control.md section 11): for every engine with a
// switch under way and not yet asked, the step due now, if any. An engine held for its switch is
// asked once the router shows nothing resident on it (no prefill, no decode stream, no stream
// reserved by a request still prefilling elsewhere); one that left switching before it was asked
// (an operator drain, failed probes) has its switch abandoned. loads are the router's; an engine
// it does not show has nothing resident. It reads no clock and does no I/O: the live Switcher
// and the simulator apply its steps.
func SwitchSteps(snap fleet.Snapshot, loads []router.EngineLoad) []SwitchStep {
	var steps []SwitchStep
	for _, e := range snap.Engines {
		if st, ok := switchStep(e, loads); ok {
			steps = append(steps, st)
		}
	}
	return steps
}

// switchStep is the step due on e's switch (false: none now).
func switchStep(e fleet.Engine, loads []router.EngineLoad) (SwitchStep, bool) {
	switch {
	case e.SwitchTo == 0 || e.SwitchAsked:
		return SwitchStep{}, false
	case e.Lifecycle != fleet.Switching:
		return SwitchStep{Engine: e.ID, Action: SwitchAbandon, Detail: fmt.Sprintf("it became %s before it was asked", e.Lifecycle)}, true
	}
	for _, l := range loads {
		if l.ID == e.ID && l.PrefillResidents+l.DecodeResidents+l.ReservedStreams > 0 {
			return SwitchStep{}, false
		}
	}
	return SwitchStep{Engine: e.ID, Action: SwitchAsk}, true
}

// carry takes one engine's switch to its end.
func (s *Switcher) carry(ctx context.Context, id string) {
	var step SwitchStep
	err := s.Router.Await(ctx, func(snap router.Snapshot) bool {
		e, ok := s.Fleet.Engine(id)
		if !ok || e.SwitchTo == 0 || e.SwitchAsked {
			step = SwitchStep{} // gone, ended, or asked already: nothing to carry
			return true
		}
		var due bool
		step, due = switchStep(e, snap.Engines)
		return due
	})
	if err != nil {
		return // shutting down: the durable state keeps the switch, a restart resumes it
	}
	switch step.Action {
	case SwitchAbandon:
		s.finish(id, fleet.SwitchAbandoned, step.Detail)
		return
	case SwitchAsk:
	default:
		return
	}
	e, err := s.Fleet.AskSwitch(id, s.Now(), "its residents finished")
	if err != nil {
		s.Logger.Warn("switch: not asked", "engine", id, "err", err)
		return
	}
	s.Logger.Info("switch: asking the engine", "engine", id, "to", e.SwitchTo, "addr", e.Addr)
	cctx, cancel := context.WithTimeout(ctx, s.Timeout)
	msg, err := s.Client.Switch(cctx, e.Addr, e.SwitchTo)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down
		}
		s.finish(id, fleet.SwitchFailed, err.Error())
		return
	}
	s.finish(id, fleet.SwitchSucceeded, msg)
}

func (s *Switcher) finish(id string, r fleet.SwitchResult, detail string) {
	e, err := s.Fleet.FinishSwitch(id, r, s.Now(), detail)
	if err != nil {
		s.Logger.Warn("switch: could not end", "engine", id, "result", r, "err", err)
		return
	}
	level := slog.LevelInfo
	if r != fleet.SwitchSucceeded {
		level = slog.LevelWarn
	}
	s.Logger.Log(context.Background(), level, "switch: ended", "engine", id, "result", r, "role", e.Role, "lifecycle", e.Lifecycle, "detail", detail)
}
