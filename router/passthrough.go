package router

import "time"

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
// report), a prefill engine first for PassPrompt; ties go round the engines; with only (the
// gateway's subset hint, IP:port) among those. It is counted in Counters.PassedThrough, apart
// from the offers and the projection. ok is false when no engine is live (in the subset).
func (r *Router) PassThrough(now time.Time, kind PassKind, only []string) (addr string, ok bool) {
	r.at(now)
	var s subset
	if only != nil {
		s = r.subsetOf(only)
	}
	best := r.passPick(kind, s)
	if best < 0 {
		return "", false
	}
	r.passNext = best + 1
	r.counters.PassedThrough++
	return r.engines[best].addr, true
}
