package fleet

import (
	"fmt"
	"strconv"
	"time"
)

// Role is the phase an engine serves for new placements.
type Role uint8

// Roles. The zero Role is invalid so that a forgotten assignment is caught.
const (
	Prefill Role = iota + 1
	Decode
)

func (r Role) String() string {
	switch r {
	case Prefill:
		return "prefill"
	case Decode:
		return "decode"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// MarshalText writes the role's name (JSON, logs).
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a role as MarshalText writes it (ParseRole).
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	if err == nil {
		*r = v
	}
	return err
}

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	switch s {
	case "prefill":
		return Prefill, nil
	case "decode":
		return Decode, nil
	}
	return 0, fmt.Errorf("fleet: unknown role %q (want prefill or decode)", s)
}

// Lifecycle is an engine's standing in placement. Only Active engines take new placements;
// the others are held out ("lifecycle holds").
type Lifecycle uint8

// Lifecycles. The zero Lifecycle is invalid.
const (
	Active Lifecycle = iota + 1
	Draining
	Recovering
	Failed
	// Switching: an engine that switches role in place (switch: sglang) is held out of
	// placement while its residents finish and the engine is told (docs/role-control.md
	// section 11); it keeps its old role until the switch succeeds.
	Switching
)

func (l Lifecycle) String() string {
	switch l {
	case Active:
		return "active"
	case Draining:
		return "draining"
	case Recovering:
		return "recovering"
	case Failed:
		return "failed"
	case Switching:
		return "switching"
	}
	return fmt.Sprintf("Lifecycle(%d)", uint8(l))
}

// MarshalText writes the lifecycle's name (JSON, logs).
func (l Lifecycle) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads a lifecycle as MarshalText writes it (ParseLifecycle).
func (l *Lifecycle) UnmarshalText(b []byte) error {
	v, err := ParseLifecycle(string(b))
	if err == nil {
		*l = v
	}
	return err
}

// Lifecycles lists every lifecycle in a fixed order (metrics, reports).
var Lifecycles = [...]Lifecycle{Active, Draining, Recovering, Failed, Switching}

// ParseLifecycle reads a lifecycle's name.
func ParseLifecycle(s string) (Lifecycle, error) {
	for _, l := range Lifecycles {
		if l.String() == s {
			return l, nil
		}
	}
	return 0, fmt.Errorf("fleet: unknown lifecycle %q (want active, draining, recovering, failed or switching)", s)
}

// Roles lists every role in a fixed order.
var Roles = [...]Role{Prefill, Decode}

// transitions lists the lifecycle changes that exist. Drains come from operators, switches
// from the role controller (StartSwitch, FinishSwitch); the rest from the health monitor:
//
//	active     -> draining (drain), failed (probes failed), switching (a move in place)
//	draining   -> recovering (undrained, then healthy), failed (undrained, then probes failed)
//	recovering -> active (recover_s passed), failed (a probe failed), draining (drain)
//	failed     -> recovering (healthy again), draining (drain)
//	switching  -> active (switched), failed (the switch failed, or probes failed), draining (drain)
var transitions = map[Lifecycle][]Lifecycle{
	Active:     {Draining, Failed, Switching},
	Draining:   {Recovering, Failed},
	Recovering: {Active, Failed, Draining},
	Failed:     {Recovering, Draining},
	Switching:  {Active, Failed, Draining},
}

// CanBecome reports whether the lifecycle may change from l to to.
func (l Lifecycle) CanBecome(to Lifecycle) bool {
	for _, t := range transitions[l] {
		if t == to {
			return true
		}
	}
	return false
}

// Engine is one engine's state: a value, copied out of the fleet, never shared.
type Engine struct {
	ID      string
	Address string // as configured: host:port, the host may be a name
	// Addr is the address placements and xDS use: IP:port, the configured address resolved
	// (equal to Address until a resolution succeeds, or when Address is already an IP).
	Addr    string
	Profile string
	// InPlace: the engine must be told to change role (switch: sglang); a move makes it
	// Switching (StartSwitch) until the switch ends (FinishSwitch).
	InPlace   bool
	Role      Role
	Lifecycle Lifecycle
	Pinned    bool
	// Fixed: the engine can play its role only (engines[].roles): it is pinned, for good.
	Fixed bool
	// Held reports an operator drain: the health monitor leaves a held engine draining.
	Held bool
	// RoleSince is when the role last changed (the start time for engines never moved).
	RoleSince time.Time
	// Moved reports that the role has changed at least once (in this run or, restored, in an
	// earlier one): RoleSince is then that change, and dwell counts from it.
	Moved bool
	// LifecycleSince is when the lifecycle last changed.
	LifecycleSince time.Time
	// SwitchTo is the role an in-place switch under way goes to (zero when none) and SwitchBy
	// who started it: the role event that ends it says so.
	SwitchTo Role
	SwitchBy Mover
	// SwitchAsked: the engine has been asked (AskSwitch). Not durable: a restart asks again.
	SwitchAsked bool
	// Source is where the engine comes from: SourceConfig (the config's engines list) or the
	// source that added it at run time (Add: admin, file, kubernetes).
	Source string
	// RoleOpen: the engine joined without a role from its source; Role is provisional, and the
	// controller gives it the role pricing says is needed when it becomes active (readmission).
	RoleOpen bool
	// Sight is what the probes that readmitted the engine (Readmit) are known to see of it.
	// Cleared by its next lifecycle change; not durable.
	Sight Sight
}

// Sight says what an engine's probes are known to see of it, as its last readmission found
// (docs/role-control.md section 8).
type Sight uint8

const (
	// SightConfirmed: the probes failed it, or one failed after the data path did.
	SightConfirmed Sight = iota
	// SightUnconfirmed: the data path (passive health) failed it and none of its probes failed
	// until they readmitted it: a short outage, another engine's failures counted against it,
	// or probes that do not reach the engine itself. Said in /narwhal/state; it moves no role.
	SightUnconfirmed
	// SightBlind: the data path failed it again after such a readmission, and still no probe
	// failed: the probes do not see what the data path sees (llm-d's P/D sidecar answers its
	// own /health for a dead engine). Its readmission keeps its role.
	SightBlind
)

func (s Sight) String() string {
	switch s {
	case SightConfirmed:
		return "confirmed"
	case SightUnconfirmed:
		return "unconfirmed"
	case SightBlind:
		return "blind"
	}
	return fmt.Sprintf("Sight(%d)", uint8(s))
}

// MarshalText writes the sight's name.
func (s Sight) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// SourceConfig is the Source of the config's engines.
const SourceConfig = "config"

// Live reports whether the engine takes new placements.
func (e *Engine) Live() bool { return e.Lifecycle == Active }

// EventKind names what a fleet change changed.
type EventKind string

// Event kinds; the names are the decision log's `fleet` event names.
const (
	EventLifecycle EventKind = "lifecycle"
	EventRole      EventKind = "role"
	EventPin       EventKind = "pin"
	EventHold      EventKind = "hold"
	EventAddress   EventKind = "address"
	EventSwitch    EventKind = "switch" // the end of an in-place switch: Result says how
	// EventAdded: an engine joined the fleet at run time (Add), recovering, in role To, at
	// Address; EventRemoved: it left (Remove), in role From.
	EventAdded   EventKind = "added"
	EventRemoved EventKind = "removed"
	// EventRestored: the fleet took back a saved state (Restore) — at start, or a standby
	// following its leader; no engine, no time. Not in the decision log.
	EventRestored EventKind = "restored"
)

// SwitchResult is how an in-place switch ended.
type SwitchResult string

// Switch results.
const (
	SwitchAsked     SwitchResult = "asked"     // its residents finished: the engine is being asked
	SwitchSucceeded SwitchResult = "succeeded" // the engine switched: it takes its new role
	SwitchFailed    SwitchResult = "failed"    // the engine refused or failed: it is failed
	SwitchAbandoned SwitchResult = "abandoned" // never asked (it left switching first): its role stays
)

// Event is one change to the fleet, in the order the fleet applied it.
type Event struct {
	Version uint64 // the fleet version this change produced
	Time    time.Time
	Kind    EventKind
	Engine  string
	From    string // previous lifecycle, role or address (empty for pin and hold)
	To      string // new lifecycle, role or address
	Pinned  bool   // for EventPin
	Held    bool   // for EventHold
	Cause   string // who asked: "admin", "health", DecisionCause(n)...
	// Decision is the decision that made a role change (EventRole; 0 for the others and for
	// changes no decision made), and that started a switch (EventLifecycle to switching).
	Decision uint64
	// Operator: an operator made the role change at its source (EventRole; Relabel).
	Operator bool
	// Result is how a switch ended (EventSwitch; From and To are its roles, Cause the detail).
	Result SwitchResult
	// Address is an added engine's configured address and Profile its profile (EventAdded).
	Address, Profile string
}

// DecisionCause is the cause of a change that decision seq made (Move).
func DecisionCause(seq uint64) string { return "decision " + strconv.FormatUint(seq, 10) }

// Mover is who makes a role move (Move, Relabel): a decision of the controller, by its number, or
// an operator at a source (a relabel in Kubernetes, a file's role), by the source's name.
type Mover struct {
	Decision uint64
	Operator string
}

// Cause is the move's cause as events and logs say it: DecisionCause(n), or "operator (source)".
func (m Mover) Cause() string {
	if m.Operator != "" {
		return "operator (" + m.Operator + ")"
	}
	return DecisionCause(m.Decision)
}
