package admin

import (
	"encoding/json"
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
)

// State is the JSON of GET /narwhal/state (contract.md). Parts that the router and controller
// own are reported as they stand: with no requests routed and no evaluation run yet, they are
// zero, and the shape is already the contract's.
type State struct {
	Time           string            `json:"time"`
	Advisory       bool              `json:"advisory"`
	FleetVersion   uint64            `json:"fleet_version"`
	Split          Split             `json:"split"`
	Engines        []EngineState     `json:"engines"`
	Demand         Demand            `json:"demand"`
	Retained       Retained          `json:"retained"`
	Counters       Counters          `json:"counters"`
	EvidenceWindow EvidenceWindow    `json:"evidence_window"`
	Decisions      []json.RawMessage `json:"decisions"`
}

// Split counts the live engines of each role.
type Split struct {
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
}

// EngineState is one engine in the state.
type EngineState struct {
	ID               string     `json:"id"`
	Address          string     `json:"address"`    // IP:port placements use
	Configured       string     `json:"configured"` // the address as configured
	Role             string     `json:"role"`
	Lifecycle        string     `json:"lifecycle"`
	Pinned           bool       `json:"pinned"`
	Drained          bool       `json:"drained"` // held draining by an operator
	RoleSince        string     `json:"role_since"`
	LifecycleSince   string     `json:"lifecycle_since"`
	PrefillResidents int        `json:"prefill_residents"`
	DecodeResidents  int        `json:"decode_residents"`
	BusyUntilS       float64    `json:"busy_until_s"`
	Correction       Correction `json:"correction"`
}

// Correction is an engine's online profile correction factor per phase (1 = as profiled).
type Correction struct {
	Prefill float64 `json:"prefill"`
	Decode  float64 `json:"decode"`
}

// Rates is one demand estimate.
type Rates struct {
	ArrivalsPerS     float64 `json:"arrivals_per_s"`
	PromptTokensPerS float64 `json:"prompt_tokens_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
}

// Demand holds the short, long and priced demand estimates.
type Demand struct {
	Short  Rates `json:"short"`
	Long   Rates `json:"long"`
	Priced Rates `json:"priced"`
}

// Retained is the retained demand.
type Retained struct {
	Samples              int `json:"samples"`
	Waiting              int `json:"waiting"`
	WaitingTokens        int `json:"waiting_tokens"`
	Prefilling           int `json:"prefilling"`
	AwaitingOutputTokens int `json:"awaiting_output_tokens"`
	Decoding             int `json:"decoding"`
}

// Counters are the demand accounting counters.
type Counters struct {
	Offers             uint64     `json:"offers"`
	Invalid            uint64     `json:"invalid"`
	Admitted           uint64     `json:"admitted"`
	Overflow           Overflow   `json:"overflow"`
	Dispatched         Dispatched `json:"dispatched"`
	Completed          uint64     `json:"completed"`
	Failed             uint64     `json:"failed"`
	Cancelled          Cancelled  `json:"cancelled"`
	FirstTokenTimeouts uint64     `json:"first_token_timeouts"`
}

// Overflow counts offers turned away, by reason.
type Overflow struct {
	WaitingSetFull   uint64 `json:"waiting_set_full"`
	PredictedSLOMiss uint64 `json:"predicted_slo_miss"`
	FallbackBusy     uint64 `json:"fallback_busy"`
	NoCapacity       uint64 `json:"no_capacity"`
	WaitTimeout      uint64 `json:"wait_timeout"`
}

// Dispatched counts placements by kind.
type Dispatched struct {
	Disaggregated uint64 `json:"disaggregated"`
	Aggregate     uint64 `json:"aggregate"`
}

// Cancelled counts client cancels by where the request was.
type Cancelled struct {
	Waiting  uint64 `json:"waiting"`
	InFlight uint64 `json:"in_flight"`
}

// EvidenceWindow is the arrival-evidence window (role-control.md section 7).
type EvidenceWindow struct {
	Open     bool   `json:"open"`
	OpenedAt string `json:"opened_at"`
	Arrivals int    `json:"arrivals"`
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// fleetState fills the fleet's part of the state.
func fleetState(st *State, snap *fleet.Snapshot) {
	st.FleetVersion = snap.Version
	st.Split.Prefill, st.Split.Decode = snap.Split()
	st.Engines = make([]EngineState, 0, len(snap.Engines))
	for _, e := range snap.Engines {
		st.Engines = append(st.Engines, engineState(&e))
	}
}

func engineState(e *fleet.Engine) EngineState {
	return EngineState{
		ID: e.ID, Address: e.Addr, Configured: e.Address,
		Role: e.Role.String(), Lifecycle: e.Lifecycle.String(),
		Pinned: e.Pinned, Drained: e.Held,
		RoleSince: rfc3339(e.RoleSince), LifecycleSince: rfc3339(e.LifecycleSince),
		Correction: Correction{Prefill: 1, Decode: 1},
	}
}
