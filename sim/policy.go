package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// PolicyKind is how a replay's roles move.
type PolicyKind uint8

// Policy kinds. StaticBest is not a replay of its own: it is read off the static runs of
// every split.
const (
	PolicyNarwhal      PolicyKind = iota + 1 // the controller, as serve runs it
	PolicyStatic                             // fixed roles: the config's, or Prefill prefill engines
	PolicyThreshold                          // the threshold planner baseline
	PolicyStaticBest                         // the best static split, chosen after the fact
	PolicyOracleGreedy                       // per window, the best split of a forked world, carried on
	PolicyOracleSplit                        // oracle:greedy without shared splits: one split held per window
)

// Policy is one column of a replay's report.
type Policy struct {
	Name    string // as given: narwhal, static, static:P, static:best, threshold, oracle:greedy, oracle:split
	Kind    PolicyKind
	Prefill int // static:P: the first P engines of the config prefill, the rest decode (-1: the config's roles)
}

// ParsePolicies reads a comma-separated list of policies.
func ParsePolicies(list string, engines int) ([]Policy, error) {
	var out []Policy
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		p := Policy{Name: name, Prefill: -1}
		switch {
		case name == "narwhal":
			p.Kind = PolicyNarwhal
		case name == "static":
			p.Kind = PolicyStatic
		case name == "static:best":
			p.Kind = PolicyStaticBest
		case name == "threshold":
			p.Kind = PolicyThreshold
		case name == "oracle:greedy":
			p.Kind = PolicyOracleGreedy
		case name == "oracle:split":
			p.Kind = PolicyOracleSplit
		case strings.HasPrefix(name, "static:"):
			n, err := strconv.Atoi(strings.TrimPrefix(name, "static:"))
			if err != nil || n < 1 || n >= engines {
				return nil, fmt.Errorf("policy %q: want static:P with 1 <= P <= %d (the fleet has %d engines)", name, engines-1, engines)
			}
			p.Kind, p.Prefill = PolicyStatic, n
		default:
			return nil, fmt.Errorf("policy %q: want narwhal, static, static:P, static:best, threshold, oracle:greedy or oracle:split", name)
		}
		if slices.ContainsFunc(out, func(q Policy) bool { return q.Name == p.Name }) {
			return nil, fmt.Errorf("policy %q given twice", name)
		}
		out = append(out, p)
	}
	return out, nil
}

// replays are the replays a list of policies needs: each narwhal, static and threshold policy,
// and every static split once when static:best asks for them.
func replays(ps []Policy, engines int) []Policy {
	var out []Policy
	add := func(p Policy) {
		if !slices.ContainsFunc(out, func(q Policy) bool { return q.Name == p.Name }) {
			out = append(out, p)
		}
	}
	for _, p := range ps {
		switch p.Kind {
		case PolicyStaticBest:
			for n := 1; n < engines; n++ {
				add(Policy{Name: "static:" + strconv.Itoa(n), Kind: PolicyStatic, Prefill: n})
			}
		default:
			add(p)
		}
	}
	return out
}

// configure is the config a replay of p runs: static:P's roles; the controller only for
// narwhal (the others run the router alone).
func (p Policy) configure(cfg *config.Config) *config.Config {
	c := *cfg
	c.Engines = slices.Clone(cfg.Engines)
	if p.Kind == PolicyStatic && p.Prefill >= 0 {
		for i := range c.Engines {
			c.Engines[i].Role = fleet.Decode.String()
			if i < p.Prefill {
				c.Engines[i].Role = fleet.Prefill.String()
			}
		}
	}
	return &c
}

// planner is the threshold baseline (docs/sim.md): the rule of a well-known open-source planner,
// each pool scaled on its own. Every controller.reactive.step_s it moves one engine into a pool
// all of whose engines project an SLO miss, and moves a borrowed engine back once the pool that
// borrowed it could shrink by one with its load × N/(N−1) still under 0.8 × the SLO.
type planner struct {
	cfg      *config.Config
	next     time.Time
	borrowed map[string]fleet.Role // engine → the pool it was moved into
}

func newPlanner(cfg *config.Config) *planner {
	return &planner{cfg: cfg, next: Epoch.Add(config.Seconds(cfg.Controller.Reactive.StepS)), borrowed: map[string]fleet.Role{}}
}

// plannerMove is one move of the threshold planner.
type plannerMove struct {
	Engine string
	to     fleet.Role
}

// evaluate is one planner pass at now.
func (p *planner) evaluate(now time.Time, r *router.Router, fl fleet.Snapshot, engines []*simEngine) []plannerMove {
	p.next = now.Add(config.Seconds(p.cfg.Controller.Reactive.StepS))
	snap := r.Snapshot(now)
	loads := map[string]router.EngineLoad{}
	for _, l := range snap.Engines {
		loads[l.ID] = l
	}
	meanPrompt := float64(router.ProbePromptTokens)
	if d := snap.Demand.Priced; d.ArrivalsPerS > 0 {
		meanPrompt = d.PromptTokensPerS / d.ArrivalsPerS
	}
	// Each engine's load against its SLO: a prefill engine's projected TTFT for a request of
	// the mean prompt arriving now, behind its dispatched work and its share of the waiting
	// set; a decode engine's step time with its residents now.
	prefillEngines := 0
	for _, e := range fl.Engines {
		if e.Live() && e.Role == fleet.Prefill {
			prefillEngines++
		}
	}
	var pre, dec []float64
	var preIDs, decIDs []string
	byID := map[string]*simEngine{}
	for _, e := range engines {
		byID[e.id] = e
	}
	for _, e := range fl.Engines {
		if !e.Live() {
			continue
		}
		prof := p.cfg.Profiles[e.Profile]
		switch e.Role {
		case fleet.Prefill:
			if prof.Prefill == nil {
				continue
			}
			one := prof.Prefill.Seconds(int(meanPrompt))
			share := float64(snap.Retained.Waiting) * one / float64(max(prefillEngines, 1))
			ttft := loads[e.ID].BusyUntilS + share + one + prof.KVTransferS
			pre, preIDs = append(pre, ttft/p.cfg.SLO.TTFTS), append(preIDs, e.ID)
		case fleet.Decode:
			if prof.Decode == nil {
				continue
			}
			streams, kv := byID[e.ID].m.Decoding()
			dec, decIDs = append(dec, prof.Decode.StepSeconds(streams+1, kv)/p.cfg.SLO.TPOTS), append(decIDs, e.ID)
		}
	}
	all := func(xs []float64) bool {
		for _, x := range xs {
			if x <= 1 {
				return false
			}
		}
		return len(xs) > 0
	}
	canShrink := func(xs []float64) bool {
		n := float64(len(xs))
		if len(xs) < 2 {
			return false
		}
		sum := 0.0
		for _, x := range xs {
			sum += x
		}
		return sum/n*n/(n-1) < 0.8
	}
	lightest := func(ids []string, xs []float64) string {
		best := -1
		for i := range ids {
			if best < 0 || xs[i] < xs[best] || xs[i] == xs[best] && ids[i] < ids[best] {
				best = i
			}
		}
		return ids[best]
	}
	minP, minD := max(p.cfg.Controller.MinPrefill, 1), max(p.cfg.Controller.MinDecode, 1)
	switch {
	case all(pre) && len(dec) > minD:
		id := lightest(decIDs, dec)
		p.borrow(id, fleet.Prefill)
		return []plannerMove{{id, fleet.Prefill}}
	case all(dec) && len(pre) > minP:
		id := lightest(preIDs, pre)
		p.borrow(id, fleet.Decode)
		return []plannerMove{{id, fleet.Decode}}
	}
	// Give back a borrowed engine once the pool holding it can shrink.
	for _, pool := range []struct {
		role fleet.Role
		ids  []string
		xs   []float64
		min  int
	}{{fleet.Prefill, preIDs, pre, minP}, {fleet.Decode, decIDs, dec, minD}} {
		if len(pool.ids) <= pool.min || !canShrink(pool.xs) {
			continue
		}
		for _, id := range pool.ids {
			if p.borrowed[id] == pool.role {
				delete(p.borrowed, id)
				back := fleet.Decode
				if pool.role == fleet.Decode {
					back = fleet.Prefill
				}
				return []plannerMove{{id, back}}
			}
		}
	}
	return nil
}

func (p *planner) borrow(id string, into fleet.Role) {
	if p.borrowed[id] != 0 && p.borrowed[id] != into {
		delete(p.borrowed, id) // moving back where it came from: no longer borrowed
		return
	}
	p.borrowed[id] = into
}
