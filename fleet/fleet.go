// Package fleet is the one source of truth about engines: their roles, lifecycles, pins and
// addresses. Every change goes through an explicit transition method, bumps a monotonically
// increasing version, and wakes subscribers. It is safe for concurrent use; it does no I/O and
// reads no clock (callers pass the time of each change).
package fleet

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// Errors returned by transitions. Callers match them with errors.Is.
var (
	ErrUnknownEngine = errors.New("fleet: unknown engine")
	ErrTransition    = errors.New("fleet: invalid transition")
	// ErrFloor is a drain refused because it would leave the engine's role under its floor
	// (FloorError says which).
	ErrFloor = errors.New("fleet: below the floor")
)

// Snapshot is the fleet at one version. Engines are in configuration order; the slice is the
// caller's own.
type Snapshot struct {
	Version uint64
	Engines []Engine
}

// Split counts the live (active) engines of each role.
func (s *Snapshot) Split() (prefill, decode int) {
	for i := range s.Engines {
		if e := &s.Engines[i]; e.Live() {
			switch e.Role {
			case Prefill:
				prefill++
			case Decode:
				decode++
			}
		}
	}
	return prefill, decode
}

// IDs is the set of the snapshot's engine ids (to compare a membership with it).
func (s *Snapshot) IDs() map[string]struct{} {
	ids := make(map[string]struct{}, len(s.Engines))
	for i := range s.Engines {
		ids[s.Engines[i].ID] = struct{}{}
	}
	return ids
}

// Find returns the engine with the given id.
func (s *Snapshot) Find(id string) (Engine, bool) {
	for _, e := range s.Engines {
		if e.ID == id {
			return e, true
		}
	}
	return Engine{}, false
}

// Fleet holds the engines. The zero value is not usable; use New.
type Fleet struct {
	mu      sync.RWMutex
	version uint64
	engines []Engine
	index   map[string]int
	// observers see every event (OnChange) or are woken by it (Subscribe); the slice is
	// replaced, never changed in place, so that a delivery may range over the one it took.
	observers []observer
	nextObs   uint64
	// pending are the events committed and not yet delivered, in commit order. Events are
	// delivered after the lock is released (deliver), one delivery at a time.
	pending   []Event
	deliverMu sync.Mutex
}

// New builds the fleet of a validated config: every engine active in its configured role
// since now. The version starts at 1.
func New(cfg *config.Config, now time.Time) (*Fleet, error) {
	f := &Fleet{version: 1, index: make(map[string]int, len(cfg.Engines))}
	for i, ce := range cfg.Engines {
		role, err := ParseRole(ce.Role)
		if err != nil {
			return nil, fmt.Errorf("engines[%d]: %w", i, err)
		}
		if _, dup := f.index[ce.ID]; dup {
			return nil, fmt.Errorf("engines[%d]: duplicate engine id %q", i, ce.ID)
		}
		f.index[ce.ID] = len(f.engines)
		f.engines = append(f.engines, Engine{
			ID: ce.ID, Address: ce.Address, Addr: ce.Address, Profile: ce.Profile, InPlace: ce.SwitchesInPlace(),
			Role: role, Lifecycle: Active, Pinned: ce.Pinned || ce.OnlyRole() != "", Fixed: ce.OnlyRole() != "",
			RoleSince: now, LifecycleSince: now, Source: SourceConfig,
		})
	}
	return f, nil
}

// Clone returns an independent copy of the fleet in the same state and version, with no
// observers or subscribers (the simulator forks a replay with it).
func (f *Fleet) Clone() *Fleet {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &Fleet{version: f.version, engines: slices.Clone(f.engines), index: maps.Clone(f.index)}
}

// Version is the current version; every change (one call that changed something) increases
// it by one.
func (f *Fleet) Version() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.version
}

// Snapshot copies the fleet out.
func (f *Fleet) Snapshot() Snapshot {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return Snapshot{Version: f.version, Engines: append([]Engine(nil), f.engines...)}
}

// Engine returns one engine.
func (f *Fleet) Engine(id string) (Engine, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	i, ok := f.index[id]
	if !ok {
		return Engine{}, false
	}
	return f.engines[i], true
}

// OnChange calls fn with every later change, in the order changes apply, after the fleet's lock
// is released: a slow fn delays the change's caller (a change returns once its events are
// delivered) and the next changes' delivery, never a reader of the fleet, a change being made
// or a subscriber's wake. fn may read the fleet; it must not change it. The returned func stops
// the calls.
func (f *Fleet) OnChange(fn func(Event)) (stop func()) { return f.observe(observer{fn: fn}) }

// Subscribe returns a channel that receives a value after every change (coalesced: a slow
// reader sees one wake for many changes, then reads the Snapshot) and a cancel function. The
// wake is sent as the change commits, ahead of OnChange's deliveries, so that a slow observer
// does not hold up the fleet's followers (the router, the xDS server).
func (f *Fleet) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	return ch, f.observe(observer{wake: ch})
}

// observer is one OnChange fn or one Subscribe channel: the fleet's one list of observers.
type observer struct {
	id   uint64
	fn   func(Event)
	wake chan struct{}
}

// observe adds o to the observers and returns the func that removes it.
func (f *Fleet) observe(o observer) (stop func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextObs++
	o.id = f.nextObs
	f.observers = append(slices.Clip(f.observers), o)
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.observers = slices.DeleteFunc(slices.Clone(f.observers), func(x observer) bool { return x.id == o.id })
	}
}

// deliver hands the pending events to the OnChange observers, in commit order, outside the
// fleet's lock. One delivery runs at a time: a change's caller returns once its events are
// delivered, by itself or by the delivery that held the turn.
func (f *Fleet) deliver() {
	f.deliverMu.Lock()
	defer f.deliverMu.Unlock()
	for {
		f.mu.Lock()
		evs, obs := f.pending, f.observers
		f.pending = nil
		f.mu.Unlock()
		if len(evs) == 0 {
			return
		}
		for _, ev := range evs {
			for _, o := range obs {
				if o.fn != nil {
					o.fn(ev)
				}
			}
		}
	}
}

// Drain holds the engine out of placement on an operator's request: it becomes draining and
// stays so until Undrain, whatever its probes say. Draining a held engine changes nothing.
// Draining a live engine that would leave fewer live engines in its role than floors asks of
// that role is refused with ErrFloor, and nothing changes (zero Floors: no floor, a drain
// forced).
func (f *Fleet) Drain(id string, now time.Time, cause string, floors Floors) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		if e.Held {
			return nil, nil
		}
		if floor := floors.of(e.Role); e.Live() && floor > 0 {
			left := 0 // update holds f.mu: the others as they are
			for j := range f.engines {
				if o := &f.engines[j]; o.ID != e.ID && o.Live() && o.Role == e.Role {
					left++
				}
			}
			if left < floor {
				return nil, &FloorError{Engine: e.ID, Role: e.Role, Left: left, Floor: floor}
			}
		}
		var evs []Event
		if e.Lifecycle != Draining {
			ev, err := setLifecycle(e, Draining, now, cause)
			if err != nil {
				return nil, err
			}
			evs = append(evs, ev)
		}
		e.Held = true
		return append(evs, Event{Time: now, Kind: EventHold, Engine: e.ID, Held: true, Cause: cause}), nil
	})
}

// Floors are the least live engines each role keeps (controller.min_prefill, min_decode).
type Floors struct{ Prefill, Decode int }

func (fl Floors) of(r Role) int {
	switch r {
	case Prefill:
		return fl.Prefill
	case Decode:
		return fl.Decode
	}
	return 0
}

// FloorError is Drain's refusal: draining Engine would leave Left live engines in Role, under
// its Floor. It is ErrFloor.
type FloorError struct {
	Engine      string
	Role        Role
	Left, Floor int
}

func (e *FloorError) Error() string {
	return fmt.Sprintf("draining %s would leave %d live %s engines, under the floor of %d", e.Engine, e.Left, e.Role, e.Floor)
}

// Is makes a FloorError ErrFloor.
func (e *FloorError) Is(target error) bool { return target == ErrFloor }

// Undrain releases an operator drain. The engine stays draining until the health monitor sees
// it healthy (then recovering, then active) or failing (then failed).
func (f *Fleet) Undrain(id string, now time.Time, cause string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		if !e.Held {
			return nil, fmt.Errorf("%w: engine %s is %s, not drained", ErrTransition, e.ID, e.Lifecycle)
		}
		e.Held = false
		return []Event{{Time: now, Kind: EventHold, Engine: e.ID, Held: false, Cause: cause}}, nil
	})
}

// SetPinned pins (the engine keeps its role, always) or unpins an engine.
func (f *Fleet) SetPinned(id string, pinned bool, now time.Time, cause string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		if e.Pinned == pinned {
			return nil, nil
		}
		if e.Fixed {
			return nil, fmt.Errorf("%w: engine %s can play %s only (engines[].roles): it stays pinned", ErrTransition, e.ID, e.Role)
		}
		e.Pinned = pinned
		return []Event{{Time: now, Kind: EventPin, Engine: e.ID, Pinned: pinned, Cause: cause}}, nil
	})
}

// SetLifecycle moves an engine to another lifecycle; only the transitions of CanBecome exist,
// a held (operator-drained) engine leaves draining only through Undrain, and only the
// switches (StartSwitch, FinishSwitch) enter switching or end it well.
func (f *Fleet) SetLifecycle(id string, to Lifecycle, now time.Time, cause string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		switch {
		case e.Held:
			return nil, fmt.Errorf("%w: engine %s is drained by an operator", ErrTransition, e.ID)
		case to == Switching || e.Lifecycle == Switching && to == Active:
			return nil, fmt.Errorf("%w: engine %s: %s -> %s is a switch's (StartSwitch, FinishSwitch)", ErrTransition, e.ID, e.Lifecycle, to)
		}
		ev, err := setLifecycle(e, to, now, cause)
		if err != nil {
			return nil, err
		}
		return []Event{ev}, nil
	})
}

// Eject marks an engine failed by passive health checking: failures upstream failures in a row on
// the data path took it out of placement (router.Ejection); the health probes readmit it. The
// live server and the simulator both apply ejections this way.
func (f *Fleet) Eject(id string, failures int, now time.Time) (Engine, error) {
	return f.SetLifecycle(id, Failed, now, fmt.Sprintf("passive: %d upstream failures in a row", failures))
}

// Readmit makes a recovering engine active on its probes, which see it as sight says
// (Engine.Sight).
func (f *Fleet) Readmit(id string, now time.Time, cause string, sight Sight) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		if e.Lifecycle != Recovering {
			return nil, fmt.Errorf("%w: engine %s: %s -> active is not a readmission", ErrTransition, e.ID, e.Lifecycle)
		}
		ev, err := setLifecycle(e, Active, now, cause)
		e.Sight = sight
		return []Event{ev}, err
	})
}

// SetRole moves an engine to another role. Pinned engines keep theirs. The role-since time
// restarts (dwell counts from it).
func (f *Fleet) SetRole(id string, to Role, now time.Time, cause string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) { return setRole(e, to, now, cause, Mover{}) })
}

// setRole moves e to role to; by is the mover when a decision or an operator moves it (cause
// is then by.Cause()), zero for the others.
func setRole(e *Engine, to Role, now time.Time, cause string, by Mover) ([]Event, error) {
	if err := canMove(e, to); err != nil {
		return nil, err
	}
	ev := Event{Time: now, Kind: EventRole, Engine: e.ID, From: e.Role.String(), To: to.String(), Cause: cause, Decision: by.Decision, Operator: by.Operator != ""}
	e.Role, e.RoleSince, e.Moved, e.RoleOpen = to, now, true, false
	return []Event{ev}, nil
}

// Move makes decision's role move the way the engine changes role: StartSwitch for one that
// switches in place (InPlace), SetRole for the others; the events carry the decision's number.
func (f *Fleet) Move(id string, to Role, now time.Time, decision uint64) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) { return move(e, to, now, Mover{Decision: decision}) })
}

// Relabel makes an operator's role move, made at source (a relabel), as Move makes a decision's:
// its events say an operator made it (Event.Operator), so that the source is not written back.
func (f *Fleet) Relabel(id string, to Role, now time.Time, source string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) { return move(e, to, now, Mover{Operator: source}) })
}

func move(e *Engine, to Role, now time.Time, by Mover) ([]Event, error) {
	if e.InPlace {
		return startSwitch(e, to, now, by)
	}
	return setRole(e, to, now, by.Cause(), by)
}

// Move previews Fleet.Move on the snapshot (the caller's own copy): the engine as the fleet
// would have it after the move, by the same transition. A move the fleet would refuse is an
// error and changes nothing.
func (s *Snapshot) Move(id string, to Role, now time.Time, decision uint64) error {
	for i := range s.Engines {
		if s.Engines[i].ID != id {
			continue
		}
		e := s.Engines[i]
		if _, err := move(&e, to, now, Mover{Decision: decision}); err != nil {
			return err
		}
		s.Engines[i] = e
		return nil
	}
	return fmt.Errorf("%w %q", ErrUnknownEngine, id)
}

// canMove checks that e may take role to: a valid role, not its own, and e not pinned.
func canMove(e *Engine, to Role) error {
	switch {
	case to != Prefill && to != Decode:
		return fmt.Errorf("%w: engine %s: invalid role %v", ErrTransition, e.ID, to)
	case e.Role == to:
		return fmt.Errorf("%w: engine %s is already %s", ErrTransition, e.ID, to)
	case e.Pinned:
		return fmt.Errorf("%w: engine %s is pinned to %s", ErrTransition, e.ID, e.Role)
	}
	return nil
}

// StartSwitch begins an in-place role switch of an engine that needs one (InPlace): it leaves
// placement (switching) and keeps its role until FinishSwitch. by says who asked (Move and
// Relabel start one for an engine that switches in place).
func (f *Fleet) StartSwitch(id string, to Role, now time.Time, by Mover) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) { return startSwitch(e, to, now, by) })
}

func startSwitch(e *Engine, to Role, now time.Time, by Mover) ([]Event, error) {
	if err := canMove(e, to); err != nil {
		return nil, err
	}
	switch {
	case !e.InPlace:
		return nil, fmt.Errorf("%w: engine %s changes role by routing (switch: routing)", ErrTransition, e.ID)
	case e.SwitchTo != 0:
		return nil, fmt.Errorf("%w: engine %s is already switching to %s", ErrTransition, e.ID, e.SwitchTo)
	case e.Lifecycle != Active:
		return nil, fmt.Errorf("%w: engine %s is %s, not active", ErrTransition, e.ID, e.Lifecycle)
	}
	ev, err := setLifecycle(e, Switching, now, by.Cause())
	if err != nil {
		return nil, err
	}
	ev.Decision = by.Decision
	e.SwitchTo, e.SwitchBy = to, by
	return []Event{ev}, nil
}

// AskSwitch records that a switching engine is being asked to switch (its residents finished),
// once.
func (f *Fleet) AskSwitch(id string, now time.Time, detail string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		switch {
		case e.SwitchTo == 0 || e.Lifecycle != Switching:
			return nil, fmt.Errorf("%w: engine %s is not switching", ErrTransition, e.ID)
		case e.SwitchAsked:
			return nil, fmt.Errorf("%w: engine %s has been asked already", ErrTransition, e.ID)
		}
		e.SwitchAsked = true
		return []Event{{Time: now, Kind: EventSwitch, Engine: e.ID, From: e.Role.String(), To: e.SwitchTo.String(), Cause: detail, Result: SwitchAsked}}, nil
	})
}

// FinishSwitch ends the switch under way: succeeded, the engine takes its new role (a role
// event naming the decision that started the switch) and, if still switching, becomes active;
// failed, a switching engine becomes failed (the floors are then repaired); abandoned (it left
// switching before it was asked), nothing but the end is recorded. detail says why; every end
// is a switch event.
func (f *Fleet) FinishSwitch(id string, result SwitchResult, now time.Time, detail string) (Engine, error) {
	return f.update(id, func(e *Engine) ([]Event, error) {
		if e.SwitchTo == 0 {
			return nil, fmt.Errorf("%w: engine %s has no switch under way", ErrTransition, e.ID)
		}
		evs := []Event{{Time: now, Kind: EventSwitch, Engine: e.ID, From: e.Role.String(), To: e.SwitchTo.String(), Cause: detail, Result: result}}
		switching := e.Lifecycle == Switching
		switch result {
		case SwitchSucceeded:
			evs = append(evs, Event{Time: now, Kind: EventRole, Engine: e.ID, From: e.Role.String(), To: e.SwitchTo.String(),
				Cause: e.SwitchBy.Cause(), Decision: e.SwitchBy.Decision, Operator: e.SwitchBy.Operator != ""})
			e.Role, e.RoleSince, e.Moved, e.RoleOpen = e.SwitchTo, now, true, false
			if switching {
				ev, _ := setLifecycle(e, Active, now, "switch")
				evs = append(evs, ev)
			}
		case SwitchFailed:
			if switching {
				ev, _ := setLifecycle(e, Failed, now, "switch failed: "+detail)
				evs = append(evs, ev)
			}
		case SwitchAbandoned:
			if e.SwitchAsked {
				return nil, fmt.Errorf("%w: engine %s has been asked: its switch ends with the engine's answer", ErrTransition, e.ID)
			}
		default:
			return nil, fmt.Errorf("%w: engine %s: unknown switch result %q", ErrTransition, e.ID, result)
		}
		e.SwitchTo, e.SwitchBy, e.SwitchAsked = 0, Mover{}, false
		return evs, nil
	})
}

// Restore puts back the durable state of a previous run (docs/durable-state.md): for each
// engine of saved that the fleet has, its role, role-since time and whether it ever moved, its
// lifecycle and lifecycle-since time, its operator hold, and its pin (a pin the config sets
// holds whatever was saved). Addresses and profiles stay as configured. An engine added at
// run time (Source other than config) comes back whole, address and profile included (its
// source, if it has one, reconciles it later), and one that saved does not have goes (a
// standby following its leader's state sees the leader's membership). It returns the ids of saved config engines that
// the fleet does not have (removed from the config since), and produces one new version, with
// one EventRestored (no time: nothing changed in the world, the fleet remembers). Call it before
// anything reads the fleet.
func (f *Fleet) Restore(saved []Engine) (unknown []string, err error) {
	defer f.deliver()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range saved { // all checked before any is applied: nothing half restored
		if (s.Role != Prefill && s.Role != Decode) || s.Lifecycle < Active || s.Lifecycle > Switching || s.SwitchTo > Decode {
			return nil, fmt.Errorf("%w: engine %s: saved role %v, lifecycle %v", ErrTransition, s.ID, s.Role, s.Lifecycle)
		}
	}
	for _, s := range saved {
		i, ok := f.index[s.ID]
		switch {
		case !ok && (s.Source == "" || s.Source == SourceConfig):
			unknown = append(unknown, s.ID)
			continue
		case !ok:
			s.Addr, s.SwitchAsked = s.Address, false
			i = len(f.engines)
			f.index[s.ID] = i
			f.engines = append(f.engines, s)
			continue
		}
		e := &f.engines[i]
		if e.Fixed && s.Role != e.Role { // saved before its roles were limited: it keeps the one it can play
			s.Role, s.SwitchTo = e.Role, 0
		}
		e.Role, e.RoleSince, e.Moved = s.Role, s.RoleSince, s.Moved
		e.Lifecycle, e.LifecycleSince, e.Held = s.Lifecycle, s.LifecycleSince, s.Held
		e.SwitchTo, e.SwitchBy = s.SwitchTo, s.SwitchBy
		e.Pinned = e.Pinned || s.Pinned
	}
	// Engines added at run time that saved does not have left in the meantime (a standby
	// following its leader's state).
	f.engines = slices.DeleteFunc(f.engines, func(e Engine) bool {
		return e.Source != SourceConfig && !slices.ContainsFunc(saved, func(s Engine) bool { return s.ID == e.ID })
	})
	clear(f.index)
	for i, e := range f.engines {
		f.index[e.ID] = i
	}
	f.commit(Event{Kind: EventRestored, Cause: "restore"}) // followers (the router, the xDS server) see the restored fleet
	return unknown, nil
}

// Add puts an engine into the fleet at run time (docs/discovery.md), from source (admin, file,
// kubernetes): recovering, so that it takes placements only once the health monitor has seen
// it healthy for health.recover_s; in ce.Role, or, when ce.Role is empty, provisionally decode
// and RoleOpen (the controller readmits it in the role pricing says is needed). ce must be a
// checked member (config.CheckMember); an id or an address the fleet already has is refused.
func (f *Fleet) Add(ce config.Engine, source string, now time.Time) (Engine, error) {
	if ce.Role == "" { // an engine that can play one role has it
		ce.Role = ce.OnlyRole()
	}
	role, open := Decode, ce.Role == ""
	if !open {
		r, err := ParseRole(ce.Role)
		if err != nil {
			return Engine{}, err
		}
		role = r
	}
	defer f.deliver()
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.index[ce.ID]; dup {
		return Engine{}, fmt.Errorf("%w: engine %s is in the fleet already", ErrTransition, ce.ID)
	}
	for _, o := range f.engines {
		if o.Address == ce.Address {
			return Engine{}, fmt.Errorf("%w: engine %s: address %s is engine %s's (from %s)", ErrTransition, ce.ID, ce.Address, o.ID, o.Source)
		}
	}
	e := Engine{
		ID: ce.ID, Address: ce.Address, Addr: ce.Address, Profile: ce.Profile, InPlace: ce.SwitchesInPlace(),
		Role: role, RoleOpen: open, Lifecycle: Recovering, Pinned: ce.Pinned || ce.OnlyRole() != "", Fixed: ce.OnlyRole() != "",
		RoleSince: now, LifecycleSince: now, Source: source,
	}
	f.index[e.ID] = len(f.engines)
	f.engines = append(f.engines, e)
	f.commit(Event{Time: now, Kind: EventAdded, Engine: e.ID, To: role.String(), Cause: source, Address: e.Address, Profile: e.Profile})
	return e, nil
}

// Remove takes an engine out of the fleet at once, whatever its lifecycle (its residents
// finish where they are: the router keeps them, Envoy holds their connections). cause says
// who asked.
func (f *Fleet) Remove(id string, now time.Time, cause string) (Engine, error) {
	defer f.deliver()
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.index[id]
	if !ok {
		return Engine{}, fmt.Errorf("%w %q", ErrUnknownEngine, id)
	}
	e := f.engines[i]
	f.engines = slices.Delete(f.engines, i, i+1)
	delete(f.index, id)
	for j := i; j < len(f.engines); j++ {
		f.index[f.engines[j].ID] = j
	}
	f.commit(Event{Time: now, Kind: EventRemoved, Engine: id, From: e.Role.String(), Cause: cause})
	return e, nil
}

// SetAddr records the resolved IP:port of an engine. The same address changes nothing.
func (f *Fleet) SetAddr(id string, addr netip.AddrPort, now time.Time) (Engine, error) {
	s := addr.String()
	return f.update(id, func(e *Engine) ([]Event, error) {
		if !addr.IsValid() {
			return nil, fmt.Errorf("%w: engine %s: invalid address", ErrTransition, e.ID)
		}
		if e.Addr == s {
			return nil, nil
		}
		ev := Event{Time: now, Kind: EventAddress, Engine: e.ID, From: e.Addr, To: s, Cause: "resolve"}
		e.Addr = s
		return []Event{ev}, nil
	})
}

func setLifecycle(e *Engine, to Lifecycle, now time.Time, cause string) (Event, error) {
	if !e.Lifecycle.CanBecome(to) {
		return Event{}, fmt.Errorf("%w: engine %s: %s -> %s", ErrTransition, e.ID, e.Lifecycle, to)
	}
	ev := Event{Time: now, Kind: EventLifecycle, Engine: e.ID, From: e.Lifecycle.String(), To: to.String(), Cause: cause}
	e.Lifecycle, e.LifecycleSince, e.Sight = to, now, SightConfirmed
	return ev, nil
}

// update applies fn to a copy of one engine and commits it as one new version, only when fn
// succeeds and changed something.
func (f *Fleet) update(id string, fn func(*Engine) ([]Event, error)) (Engine, error) {
	defer f.deliver()
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.index[id]
	if !ok {
		return Engine{}, fmt.Errorf("%w %q", ErrUnknownEngine, id)
	}
	e := f.engines[i]
	evs, err := fn(&e)
	if err != nil || len(evs) == 0 {
		return f.engines[i], err
	}
	f.engines[i] = e
	f.commit(evs...)
	return e, nil
}

// commit makes one new version of the changes evs describe (already applied), queues them for
// the observers (deliver, once the lock is released) and wakes the subscribers; f.mu is held.
func (f *Fleet) commit(evs ...Event) {
	f.version++
	for j := range evs {
		evs[j].Version = f.version
	}
	queue := false
	for _, o := range f.observers {
		if o.wake == nil {
			queue = true
			continue
		}
		select { // a pending wake is enough
		case o.wake <- struct{}{}:
		default:
		}
	}
	if queue {
		f.pending = append(f.pending, evs...)
	}
}
