package router

import (
	"slices"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// subset is the engines a request's destination must be among (the Gateway API Inference
// Extension's subset hint, Offer.Subset), by index, sorted; nil for any engine.
type subset []int16

// has reports whether engine i is in the subset (any engine when there is none).
func (s subset) has(i int16) bool {
	if s == nil {
		return true
	}
	_, ok := slices.BinarySearch(s, i)
	return ok
}

// subsetOf resolves a subset hint's IP:port addresses to the engines at them now, live or not
// (an address no engine has is dropped). Never nil: an empty hint allows none.
func (r *Router) subsetOf(addrs []string) subset {
	s := make(subset, 0, len(addrs))
	for i := range r.engines {
		if e := &r.engines[i]; !e.gone && e.addr != "" && slices.Contains(addrs, e.addr) {
			s = append(s, int16(i))
		}
	}
	return s
}

// canServe reports whether a request whose destination must be in s can be placed at all: a
// live engine of the subset can be its destination — its decode engine (router.handoff
// decode), its prefill engine (prefill), or the aggregate fallback.
func (r *Router) canServe(s subset) bool {
	if r.fallback >= 0 {
		return s.has(r.fallback)
	}
	pool := r.decodePool
	if r.cfg.Handoff == config.HandoffPrefill {
		pool = r.prefillPool
	}
	for _, i := range pool {
		if s.has(i) {
			return true
		}
	}
	return false
}

// passPick is PassThrough's choice among the live engines of s.
func (r *Router) passPick(kind PassKind, s subset) int {
	best, bestLoad, bestPrefill := -1, 0, false
	n := len(r.engines)
	for k := range n {
		i := (r.passNext + k) % n
		e := &r.engines[i]
		if !e.live || e.gone || !s.has(int16(i)) {
			continue
		}
		load := e.prefilling + e.streams + e.obs.last.Foreign
		prefill := kind == PassPrompt && e.role == fleet.Prefill && e.canPrefill()
		if best < 0 || prefill && !bestPrefill || prefill == bestPrefill && load < bestLoad {
			best, bestLoad, bestPrefill = i, load, prefill
		}
	}
	return best
}
