package router

import (
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
)

// PassKind says what a request Narwhal does not place asks of an engine.
type PassKind uint8

// Pass-through kinds.
const (
	// PassAny: any engine serves it (/v1/models, /health, /metrics...).
	PassAny PassKind = iota + 1
	// PassPrompt: it reads a prompt and generates nothing (/v1/embeddings, /tokenize...): an
	// engine that prefills serves it best.
	PassPrompt
)

// PassThrough picks the engine a request Narwhal does not place goes to — a path outside
// router.paths that Envoy still sends through Narwhal (behind a Gateway API Inference Extension
// gateway every request goes through the picker). It is the live engine with the least of this
// router's work on it (its prefill residents, its streams and the foreign requests its metrics
// report), a prefill engine first for PassPrompt; ties go round the engines. It is counted in
// Counters.PassedThrough, apart from the offers and the projection. ok is false when no engine
// is live.
func (r *Router) PassThrough(now time.Time, kind PassKind) (addr string, ok bool) {
	r.at(now)
	best, bestLoad, bestPrefill := -1, 0, false
	n := len(r.engines)
	for k := range n {
		i := (r.passNext + k) % n
		e := &r.engines[i]
		if !e.live || e.gone {
			continue
		}
		load := e.prefilling + e.streams + e.obs.last.Foreign
		prefill := kind == PassPrompt && e.role == fleet.Prefill && e.canPrefill()
		if best < 0 || prefill && !bestPrefill || prefill == bestPrefill && load < bestLoad {
			best, bestLoad, bestPrefill = i, load, prefill
		}
	}
	if best < 0 {
		return "", false
	}
	r.passNext = best + 1
	r.counters.PassedThrough++
	return r.engines[best].addr, true
}
