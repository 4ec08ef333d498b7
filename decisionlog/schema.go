// Package decisionlog is the decision log's schema (docs/role-control.md, section 10): one
// type per kind of line, the same for the writer (Log, which the controller's live wrapper, serve
// and the simulator write through) and every reader (Read: narwhal audit, the simulator's page,
// the tests). A decision record is the controller's proposal as the edge applied it.
package decisionlog

import (
	"math"
	"strconv"
	"strings"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Kind is a line's kind: its "kind" field.
type Kind string

// Line kinds.
const (
	KindConfig   Kind = "config"
	KindFleet    Kind = "fleet"
	KindDecision Kind = "decision"
)

// Caller is who asked for an evaluation (a decision's "caller"), or, on a fleet role event,
// CallerOperator.
type Caller string

// Callers of an evaluation.
const (
	CallerRegular     Caller = "regular"
	CallerUrgent      Caller = "urgent"
	CallerRepair      Caller = "repair"
	CallerReadmission Caller = "readmission"
	CallerAPI         Caller = "api"
	// CallerOperator marks a role change an operator made at an engine's source (a relabelled
	// pod or endpoint): a fleet role event, not a decision of the controller.
	CallerOperator Caller = "operator"
)

// Callers lists the controller's callers (CallerOperator is not one).
var Callers = []Caller{CallerRegular, CallerUrgent, CallerRepair, CallerReadmission, CallerAPI}

// Outcome is what an evaluation came to.
type Outcome string

// Outcomes of an evaluation.
const (
	OutcomeMoved    Outcome = "moved"
	OutcomeRetained Outcome = "retained"
	OutcomeBlocked  Outcome = "blocked"
	OutcomeDropped  Outcome = "dropped"
	OutcomeAdvisory Outcome = "advisory"
)

// Outcomes lists every outcome.
var Outcomes = []Outcome{OutcomeMoved, OutcomeRetained, OutcomeBlocked, OutcomeDropped, OutcomeAdvisory}

// AdvisoryResult is what an advisory evaluation would have done: WouldMove, WouldRetain, or
// blocked by a gate (BlockedBy: "blocked:" and the gate's name in the log).
type AdvisoryResult string

// Advisory results.
const (
	WouldMove   AdvisoryResult = "would_move"
	WouldRetain AdvisoryResult = "retained"
)

const blockedPrefix = "blocked:"

// BlockedBy is the advisory result of a move the gate named blocks.
func BlockedBy(gate string) AdvisoryResult { return AdvisoryResult(blockedPrefix + gate) }

// Gate is the gate that blocked the move, for a result BlockedBy made (ok false otherwise).
func (a AdvisoryResult) Gate() (gate string, ok bool) {
	return strings.CutPrefix(string(a), blockedPrefix)
}

// Direction is the way a considered move goes.
type Direction string

// Directions of a move.
const (
	ToPrefill Direction = "to_prefill" // a decode engine becomes prefill: the split (P+1, D-1)
	ToDecode  Direction = "to_decode"  // a prefill engine becomes decode: the split (P-1, D+1)
)

// Gate names, as the decision log writes them.
const (
	GatePins                  = "pins"
	GateRoleFloors            = "role_floors"
	GateHealthExclusions      = "health_exclusions"
	GateDwell                 = "dwell"
	GateResidentOwnership     = "resident_ownership"
	GateProfileCoverage       = "profile_coverage"
	GateCooldown              = "cooldown"
	GateConfirmation          = "confirmation"
	GateConsolidationEvidence = "consolidation_evidence"
	GateDecodeStability       = "decode_stability"
	GateConsolidationTrend    = "consolidation_trend"
	GateDecodeCapacity        = "decode_capacity"
	GateFlipResidentGuard     = "flip_resident_guard"
)

// Gates lists every gate, in the reference's order.
var Gates = []string{GatePins, GateRoleFloors, GateHealthExclusions, GateDwell, GateResidentOwnership, GateProfileCoverage,
	GateCooldown, GateConfirmation, GateConsolidationEvidence, GateDecodeStability, GateConsolidationTrend, GateDecodeCapacity,
	GateFlipResidentGuard}

// Decision is one evaluation's record (the decision log's "decision" line): enough for a
// reader to re-check it without the code.
type Decision struct {
	Kind           Kind           `json:"kind"` // always KindDecision
	TimeS          float64        `json:"time_s"`
	Seq            uint64         `json:"seq"` // from 1
	Caller         Caller         `json:"caller"`
	Reason         string         `json:"reason"`
	Advisory       bool           `json:"advisory"`
	SplitBefore    Split          `json:"split_before"`
	SplitAfter     Split          `json:"split_after"`
	Inputs         Inputs         `json:"inputs"`
	Candidates     []Priced       `json:"candidates"`
	Gates          []Gate         `json:"gates"`
	Outcome        Outcome        `json:"outcome"`
	AdvisoryResult AdvisoryResult `json:"advisory_result,omitempty"`
	Moves          []Move         `json:"moves"`
	Direction      Direction      `json:"direction,omitempty"` // when a move was considered
	Switch         string         `json:"switch,omitempty"`    // how the moved engine changes role: routing
	// Prepare is the decode donor held out of new decode placements (while the other decode
	// engines have room) because flip_resident_guard alone blocked its move to prefill, so that
	// a later evaluation finds it light enough (docs/role-control.md, "Preparing a donor").
	Prepare       string     `json:"prepare,omitempty"`
	Confirmations *Confirmed `json:"confirmations,omitempty"`
	// NotPersisted: a replica could not make this decision durable (its store refused or did
	// not answer), so its moves were not applied and its number may be given again by the
	// replica that takes over (docs/ha.md).
	NotPersisted bool `json:"not_persisted,omitempty"`
}

// Split is a split's size.
type Split struct {
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
}

// Inputs are what the evaluation priced with.
type Inputs struct {
	Demand         router.Demand   `json:"demand"`
	EvidenceWindow WindowState     `json:"evidence_window"`
	Trigger        *TriggerRecord  `json:"trigger,omitempty"`
	FirstTokenAt   *float64        `json:"last_first_token_timeout_s,omitempty"`
	Retained       router.Retained `json:"retained"`
}

// WindowState is the arrival-evidence window at the evaluation.
type WindowState struct {
	Open      bool    `json:"open"`
	OpenedAtS float64 `json:"opened_at_s"`
	Arrivals  uint64  `json:"arrivals"`
}

// TriggerRecord is the request that triggered an urgent evaluation.
type TriggerRecord struct {
	RequestID      string  `json:"request_id"`
	ProjectedTTFTS Ratio   `json:"projected_ttft_s"` // seconds; "+Inf" with no prefill engine
	AtS            float64 `json:"at_s"`
	Joined         int     `json:"joined"`              // later triggers coalesced into this evaluation
	PrefillS       Ratio   `json:"prefill_s,omitempty"` // its own prefill alone on the fastest engine of the split; "+Inf" with none
}

// Priced is one candidate split with its ratios. For an urgent evaluation RequestTTFTS is the
// triggering request's projected TTFT under it.
type Priced struct {
	Prefill      int    `json:"prefill"`
	Decode       int    `json:"decode"`
	TTFTRatio    Ratio  `json:"ttft_ratio"`
	TPOTRatio    Ratio  `json:"tpot_ratio"`
	Worst        Ratio  `json:"worst"`
	Current      bool   `json:"current"`
	Move         string `json:"move,omitempty"` // the engine this candidate moves
	RequestTTFTS *Ratio `json:"request_ttft_s,omitempty"`
	// QueueWaitS is the mean wait of Poisson arrivals at the split's prefill pool, and the
	// backlog a shortfall of the pool builds over thresholds.dwell_s, that the probe's TTFT,
	// and so ttft_ratio, includes (docs/role-control.md section 3).
	QueueWaitS Ratio `json:"queue_wait_s"`
	// Settled counts the waiting requests projected the same under every split of the pass,
	// which ttft_ratio leaves out (docs/role-control.md section 3).
	Settled int `json:"settled,omitempty"`
	// Overload is the most a decode engine of the split holds against its stream or KV
	// capacity at the horizon: splits whose worst is +Inf compare on it.
	Overload Ratio `json:"overload"`
	// LocalShare is the prefill the split's decode pool offers through local prefill, in
	// engines (router.local_prefill: auto; docs/role-control.md section 3).
	LocalShare Ratio `json:"local_share,omitempty"`
	// Draining marks the split while Move, which switches in place, drains (in neither pool)
	// for DrainS seconds; InPlaceWorst is the worst the candidate moving it is judged by, that
	// drain weighed in (docs/role-control.md section 11).
	Draining     bool     `json:"draining,omitempty"`
	DrainS       *float64 `json:"drain_s,omitempty"`
	InPlaceWorst *Ratio   `json:"in_place_worst,omitempty"`
}

// Gate is one check on a move.
type Gate struct {
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	Detail string `json:"detail"`
}

// Move is one role change.
type Move struct {
	Engine string     `json:"engine"`
	From   fleet.Role `json:"from"`
	To     fleet.Role `json:"to"`
}

// Confirmed is the consecutive regular passes each motive held, for the confirmation rules.
type Confirmed struct {
	PrefillExpand      int `json:"prefill_expand"`
	PrefillConsolidate int `json:"prefill_consolidate"` // decode pool shrinkable: toward prefill
	DecodeExpand       int `json:"decode_expand"`
	DecodeConsolidate  int `json:"decode_consolidate"` // prefill pool shrinkable: toward decode
}

// Ratio is a projected SLO ratio; +Inf (beyond stream capacity) is written as "+Inf".
type Ratio float64

// MarshalJSON writes the ratio as a number, or "+Inf" (a NaN, which no projection should give,
// as null rather than invalid JSON).
func (r Ratio) MarshalJSON() ([]byte, error) {
	switch f := float64(r); {
	case math.IsInf(f, 1):
		return []byte(`"+Inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-Inf"`), nil
	case math.IsNaN(f):
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(r), 'g', 6, 64), nil
}

// UnmarshalJSON reads a number, "+Inf", "-Inf" or null (NaN).
func (r *Ratio) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"+Inf"`:
		*r = Ratio(math.Inf(1))
		return nil
	case `"-Inf"`:
		*r = Ratio(math.Inf(-1))
		return nil
	case "null":
		*r = Ratio(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	*r = Ratio(f)
	return err
}

// Config is the log's first line: the controller config and SLO it ran with, and the wall clock
// at time_s 0 (narwhal audit merges the logs of several replicas on it).
type Config struct {
	Kind       Kind              `json:"kind"` // always KindConfig
	TimeS      float64           `json:"time_s"`
	EpochUnixS *float64          `json:"epoch_unix_s"` // nil in a log that predates it
	Controller config.Controller `json:"controller"`
	SLO        config.SLO        `json:"slo"`
}

// Snapshot is the Event of a fleet line that lists every engine (Fleet.Engines) instead of
// one change: the log's start, and a replica's takeover.
const Snapshot fleet.EventKind = "snapshot"

// Fleet is a fleet line: one fleet event (fleet.Event, the address changes left out), or a
// Snapshot. Which fields an event has depends on its kind: a pin event has Pinned, a hold
// event Held, a switch event From, To and Result, an added engine its Address and Profile, a
// role change the Decision that made it or, made by an operator at the source, Caller
// CallerOperator.
type Fleet struct {
	Kind     Kind               `json:"kind"` // always KindFleet
	TimeS    float64            `json:"time_s"`
	Event    fleet.EventKind    `json:"event"`
	Engines  []Engine           `json:"engines,omitempty"` // a Snapshot
	Engine   string             `json:"engine,omitempty"`
	From     string             `json:"from,omitempty"`
	To       string             `json:"to,omitempty"`
	Pinned   *bool              `json:"pinned,omitempty"`
	Held     *bool              `json:"held,omitempty"`
	Result   fleet.SwitchResult `json:"result,omitempty"`
	Address  string             `json:"address,omitempty"`
	Profile  string             `json:"profile,omitempty"`
	Cause    string             `json:"cause,omitempty"`
	Caller   Caller             `json:"caller,omitempty"`
	Decision uint64             `json:"decision,omitempty"`
}

// Engine is one engine of a Snapshot.
type Engine struct {
	ID        string          `json:"id"`
	Role      fleet.Role      `json:"role"`
	Lifecycle fleet.Lifecycle `json:"lifecycle"`
	Pinned    bool            `json:"pinned"`
}
