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

// evaluate is one planner pass at now: the load measure, then the move rule.
func (p *planner) evaluate(now time.Time, r *router.Router, fl fleet.Snapshot, engines []*simEngine) []plannerMove {
	p.next = now.Add(config.Seconds(p.cfg.Controller.Reactive.StepS))
	pre, dec := p.measure(now, r, fl, engines)
	return p.decide(pre, dec)
}

// plannerPool is one pool's live engines and each one's load against its SLO (1: at the SLO).
type plannerPool struct {
	ids   []string
	loads []float64
}

// measure is the planner's load measure: a prefill engine's projected TTFT for a request of the
// mean prompt arriving now, behind its dispatched work and its share of the waiting set, over
// slo.ttft_s; a decode engine's step time with one more stream than it decodes now, over
// slo.tpot_s.
func (p *planner) measure(now time.Time, r *router.Router, fl fleet.Snapshot, engines []*simEngine) (pre, dec plannerPool) {
	snap := r.Snapshot(now)
	loads := map[string]router.EngineLoad{}
	for _, l := range snap.Engines {
		loads[l.ID] = l
	}
	meanPrompt := float64(router.ProbePromptTokens)
	if d := snap.Demand.Priced; d.ArrivalsPerS > 0 {
		meanPrompt = d.PromptTokensPerS / d.ArrivalsPerS
	}
	prefillEngines := 0
	for _, e := range fl.Engines {
		if e.Live() && e.Role == fleet.Prefill {
			prefillEngines++
		}
	}
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
			pre.ids, pre.loads = append(pre.ids, e.ID), append(pre.loads, ttft/p.cfg.SLO.TTFTS)
		case fleet.Decode:
			if prof.Decode == nil {
				continue
			}
			streams, kv := byID[e.ID].m.Decoding()
			dec.ids, dec.loads = append(dec.ids, e.ID), append(dec.loads, prof.Decode.StepSeconds(streams+1, kv)/p.cfg.SLO.TPOTS)
		}
	}
	return pre, dec
}

// overloaded reports whether every engine of the pool (and there is one) is over its SLO.
func (pl plannerPool) overloaded() bool {
	for _, x := range pl.loads {
		if x <= 1 {
			return false
		}
	}
	return len(pl.loads) > 0
}

// canShrink reports whether the pool could lose an engine with its mean load × N/(N−1) still
// under 0.8 × the SLO.
func (pl plannerPool) canShrink() bool {
	n := float64(len(pl.loads))
	if len(pl.loads) < 2 {
		return false
	}
	sum := 0.0
	for _, x := range pl.loads {
		sum += x
	}
	return sum/n*n/(n-1) < 0.8
}

// lightest is the engine with the lowest load (the first id on a tie).
func (pl plannerPool) lightest() string {
	best := -1
	for i := range pl.ids {
		if best < 0 || pl.loads[i] < pl.loads[best] || pl.loads[i] == pl.loads[best] && pl.ids[i] < pl.ids[best] {
			best = i
		}
	}
	return pl.ids[best]
}

// decide is the planner's move rule on measured pools: an engine into a pool all of whose
// engines are over the SLO, the lightest of the other pool, above its floor; else a borrowed
// engine back from a pool that can shrink, above its floor.
func (p *planner) decide(pre, dec plannerPool) []plannerMove {
	minP, minD := max(p.cfg.Controller.MinPrefill, 1), max(p.cfg.Controller.MinDecode, 1)
	switch {
	case pre.overloaded() && len(dec.ids) > minD:
		id := dec.lightest()
		p.borrow(id, fleet.Prefill)
		return []plannerMove{{id, fleet.Prefill}}
	case dec.overloaded() && len(pre.ids) > minP:
		id := pre.lightest()
		p.borrow(id, fleet.Decode)
		return []plannerMove{{id, fleet.Decode}}
	}
	for _, pool := range []struct {
		role fleet.Role
		plannerPool
		min int
	}{{fleet.Prefill, pre, minP}, {fleet.Decode, dec, minD}} {
		if len(pool.ids) <= pool.min || !pool.canShrink() {
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
