package admin

import (
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/discovery"
	"github.com/narwhal-llm/narwhal/envoy"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// State is the JSON of GET /narwhal/state (README). Parts that the router and controller
// own are reported as they stand: with no requests routed and no evaluation run yet, they are
// zero, and the shape is already the contract's.
type State struct {
	Time           string                     `json:"time"`
	Advisory       bool                       `json:"advisory"`
	FleetVersion   uint64                     `json:"fleet_version"`
	Split          Split                      `json:"split"`
	Engines        []EngineState              `json:"engines"`
	Fallback       string                     `json:"fallback,omitempty"` // the aggregate fallback engine, when one serves
	Demand         router.Demand              `json:"demand"`
	Retained       router.Retained            `json:"retained"`
	Counters       router.Counters            `json:"counters"`
	Sizing         []SizingState              `json:"sizing"`
	XDS            *envoy.Stats               `json:"xds,omitempty"`       // connected Envoys, pushes, NACKs
	HA             *HAState                   `json:"ha,omitempty"`        // replicas on etcd; absent for a single instance
	Discovery      *DiscoveryState            `json:"discovery,omitempty"` // engines from sources at run time; absent without any
	TLS            map[string]tlsfiles.Status `json:"tls,omitempty"`       // the certificate each TLS listener serves, by listener
	EvidenceWindow EvidenceWindow             `json:"evidence_window"`
	Decisions      []decisionlog.Decision     `json:"decisions"` // the last records, oldest first
}

// HAState is this replica's standing among replicas on etcd (docs/ha.md).
type HAState struct {
	Role     string `json:"role"`     // leader or standby
	ID       string `json:"id"`       // this replica
	Leader   string `json:"leader"`   // the leader's id ("" while there is none)
	Revision int64  `json:"revision"` // the etcd revision of the state this replica last wrote or read
	// StateError is why the last state write failed (etcd unreachable, say), "" after a good one:
	// while it is set the leader keeps routing with the roles it has and applies no role move.
	StateError string `json:"state_error,omitempty"`
}

// DiscoveryState is what the sources of engines at run time report (docs/discovery.md).
type DiscoveryState struct {
	File       *discovery.FileStatus       `json:"file,omitempty"`
	Kubernetes *discovery.KubernetesStatus `json:"kubernetes,omitempty"`
}

// SizingState is the running error of local prompt sizing for one model, measured against the
// engines' usage.prompt_tokens.
type SizingState struct {
	Model         string  `json:"model"`
	Samples       int64   `json:"samples"`
	MAPE          float64 `json:"mean_abs_pct_error"`
	Bias          float64 `json:"mean_pct_error"`
	BytesPerToken float64 `json:"bytes_per_token,omitempty"`
}

// Split counts the live engines of each role.
type Split struct {
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
}

// EngineState is one engine in the state.
type EngineState struct {
	ID               string            `json:"id"`
	Address          string            `json:"address"`    // IP:port placements use
	Configured       string            `json:"configured"` // the address as configured
	Role             string            `json:"role"`
	Lifecycle        string            `json:"lifecycle"`
	Pinned           bool              `json:"pinned"`
	Roles            []string          `json:"roles,omitempty"` // the one role it can play (engines[].roles), when limited
	Drained          bool              `json:"drained"`         // held draining by an operator
	RoleSince        string            `json:"role_since"`
	LifecycleSince   string            `json:"lifecycle_since"`
	PrefillResidents int               `json:"prefill_residents"`
	DecodeResidents  int               `json:"decode_residents"` // streams decoding on it now
	ReservedStreams  int               `json:"reserved_streams"` // streams placed on it still prefilling elsewhere
	BusyUntilS       float64           `json:"busy_until_s"`
	DrainS           float64           `json:"drain_s"` // projected time until everything on it is done
	Correction       router.Correction `json:"correction"`
	Passive          router.Passive    `json:"passive"` // passive health: upstream failures in a row, ejected
	// Prepared marks the decode donor the controller is preparing for a move to prefill: no new
	// decode streams while another decode engine has room (docs/role-control.md, section 7).
	Prepared bool `json:"prepared"`
	// Switch is how the engine changes role (routing or sglang); SwitchTo the role an in-place
	// switch under way goes to (lifecycle switching), and SwitchAsked whether the engine has
	// been asked (its residents finished).
	Switch      string `json:"switch"`
	SwitchTo    string `json:"switch_to,omitempty"`
	SwitchAsked bool   `json:"switch_asked,omitempty"`
	// Source is where the engine comes from: config, admin, file or kubernetes.
	Source string `json:"source"`
	// Profile is the engine's profile.
	Profile string `json:"profile"`
	// Sight is what the probes that last readmitted the engine are known to see of it:
	// unconfirmed (the data path failed it and no probe failed until they readmitted it) or
	// blind (the data path failed it again, still with no failed probe: its readmission kept
	// its role); absent when confirmed.
	Sight string `json:"sight,omitempty"`
	// Observed is what the engine's own metrics said at their latest reading (health.metrics):
	// absent while they are not read or cannot be.
	Observed *router.Observed `json:"observed,omitempty"`
}

// EvidenceWindow is the arrival-evidence window (docs/role-control.md section 7).
type EvidenceWindow struct {
	Open     bool   `json:"open"`
	OpenedAt string `json:"opened_at"`
	Arrivals int    `json:"arrivals"`
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// fleetState fills the fleet's part of the state, with each engine's load from the router.
func fleetState(st *State, snap *fleet.Snapshot, loads []router.EngineLoad) {
	st.FleetVersion = snap.Version
	st.Split.Prefill, st.Split.Decode = snap.Split()
	byID := make(map[string]*router.EngineLoad, len(loads))
	for i := range loads {
		byID[loads[i].ID] = &loads[i]
	}
	st.Engines = make([]EngineState, 0, len(snap.Engines))
	for _, e := range snap.Engines {
		es := engineState(&e)
		if l := byID[e.ID]; l != nil {
			es.PrefillResidents, es.DecodeResidents, es.ReservedStreams = l.PrefillResidents, l.DecodeResidents, l.ReservedStreams
			es.BusyUntilS, es.DrainS, es.Correction, es.Passive, es.Prepared = l.BusyUntilS, l.DrainS, l.Correction, l.Passive, l.Prepared
			es.Observed = l.Observed
		}
		st.Engines = append(st.Engines, es)
	}
}

func engineState(e *fleet.Engine) EngineState {
	es := EngineState{
		ID: e.ID, Address: e.Addr, Configured: e.Address,
		Role: e.Role.String(), Lifecycle: e.Lifecycle.String(),
		Pinned: e.Pinned, Drained: e.Held,
		RoleSince: rfc3339(e.RoleSince), LifecycleSince: rfc3339(e.LifecycleSince),
		Correction: router.Correction{Prefill: 1, Decode: 1},
		Switch:     config.SwitchRouting, SwitchAsked: e.SwitchAsked,
		Source: e.Source, Profile: e.Profile, Sight: sight(e.Sight),
	}
	if e.InPlace {
		es.Switch = config.SwitchSGLang
	}
	if e.Fixed {
		es.Roles = []string{e.Role.String()}
	}
	if e.SwitchTo != 0 {
		es.SwitchTo = e.SwitchTo.String()
	}
	return es
}

// sight is an engine's probe sight as /narwhal/state says it: "" when confirmed.
func sight(s fleet.Sight) string {
	if s == fleet.SightConfirmed {
		return ""
	}
	return s.String()
}
