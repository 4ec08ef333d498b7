package router

// Observations: what the engines' own metrics say of them (docs/engine-metrics.md). The router
// tracks only the work it placed; an engine's scheduler also runs what reached it another way
// (a client addressing it directly, another router, work placed before a restart). What an
// engine reports beyond this router's residents on it is foreign load, and the projection
// counts it: as queued prefill work on an engine that prefills, as streams (and their KV) on a
// decode engine. The observations also check a disaggregated handoff from the prefill side: a
// prefill engine whose finished count does not grow while the requests it prefilled get their
// first tokens is not serving the legs (the decode engines do the whole request themselves).

import (
	"math"
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
)

// Observation is one reading of an engine's metrics.
type Observation struct {
	// Running and Waiting are the requests the engine's scheduler runs and queues.
	Running, Waiting float64
	// KVUsage is the share of its KV cache in use (0..1), when HasKVUsage.
	KVUsage    float64
	HasKVUsage bool
	// Finished is its count of finished requests: an engine that reports none (vLLM's counter
	// has no series before its first request) has finished none. PromptTokens is its count of
	// prefilled prompt tokens, when HasPromptTokens.
	Finished, PromptTokens float64
	HasPromptTokens        bool
}

// Observed is an engine's latest observation as the router used it (EngineLoad.Observed).
type Observed struct {
	AtS        float64 `json:"at_s"` // when, seconds since the router started
	Running    float64 `json:"running"`
	Waiting    float64 `json:"waiting"`
	KVUsage    float64 `json:"kv_usage"`
	HasKVUsage bool    `json:"-"`
	// Foreign is the requests the engine reports beyond this router's on it: counted as
	// ForeignPrefillS seconds of prefill work on an engine that prefills, as streams on a decode
	// engine.
	Foreign         int     `json:"foreign"`
	ForeignPrefillS float64 `json:"foreign_prefill_s"`
	// UnservedLegs (a prefill engine) is the prefill legs it was named for whose first tokens
	// came while its finished count did not grow: the decode engines did not ask it for them.
	UnservedLegs int `json:"unserved_legs,omitempty"`
	// NoHandoff (a decode engine) is set once handoffsUnproven of its disaggregated requests in
	// a row named a prefill engine that served no leg: it does the whole request itself (no P/D
	// sidecar or KV connector in front of it).
	NoHandoff bool `json:"no_handoff,omitempty"`
}

const (
	// legsUnserved first tokens of prefill legs named to a prefill engine while its finished
	// count stays flat mark it as not serving them (a handful: the count is read every few
	// seconds, and a leg is finished on the prefill engine before its first token comes).
	legsUnserved = 8
	// handoffsUnproven disaggregated requests in a row whose prefill engine was marked so mark
	// their decode engine.
	handoffsUnproven = 4
	// maxForeign bounds the requests one reading may report (a gauge that never comes down,
	// an address that sums many engines).
	maxForeign = 1 << 16
	// promptEWMA weighs each observation's mean prompt (prompt tokens / finished requests since
	// the last) into an engine's.
	promptEWMA = 0.3
)

// obsState is the router's observation state of one engine.
type obsState struct {
	ok           bool
	last         Observed
	foreignKV    int64
	foreignUntil float64 // end of the foreign prefill work, projected at the observation
	finished     float64 // counters at the previous observation
	prompts      float64
	meanPrompt   float64 // mean prompt tokens of what the engine finished (its counters), 0 unknown
	legs         int     // first tokens of disaggregated requests it prefilled, ever
	legsBase     int     // legs when its finished count last grew
	unserved     bool    // at its latest observation: legsUnserved legs or more since legsBase
	unproven     int     // (decode engine) handoffs in a row whose prefill engine was unserved
}

// Observe applies one observation of an engine (by fleet id) at now; a nil o clears the
// engine's (its metrics could not be read: no foreign load is assumed). It reports the engine's
// observed state after it, false for an unknown engine.
func (r *Router) Observe(now time.Time, id string, o *Observation) (Observed, bool) {
	t := r.at(now)
	i, ok := r.byID[id]
	if !ok {
		return Observed{}, false
	}
	e := &r.engines[i]
	s := &e.obs
	// What the projection sees of the engine before the reading: only a change of it calls for
	// recomputing the waiting set's projection (foreign prefill work) or trying the head again.
	wasForeign, wasKV, wasPrefill := e.foreign, s.foreignKV, e.foreignPrefillLeft(t)
	defer func() {
		if e.foreignPrefillLeft(t) != wasPrefill {
			r.reproject(t)
		}
		if e.foreign != wasForeign || s.foreignKV != wasKV || e.foreignPrefillLeft(t) != wasPrefill {
			e.drainOK = false
			r.pump(t)
		}
	}()
	if o == nil {
		s.ok, s.last, s.foreignKV, s.foreignUntil, s.unserved = false, Observed{}, 0, 0, false
		e.foreign = 0
		return Observed{}, true
	}
	if o.HasPromptTokens && s.ok && o.Finished > s.finished && o.PromptTokens >= s.prompts {
		m := (o.PromptTokens - s.prompts) / (o.Finished - s.finished)
		if s.meanPrompt == 0 {
			s.meanPrompt = m
		} else {
			s.meanPrompt = (1-promptEWMA)*s.meanPrompt + promptEWMA*m
		}
	}
	// The mark is set at an observation only: between two readings the legs' first tokens come
	// while the count they moved is not read yet.
	if !s.ok || o.Finished != s.finished {
		s.legsBase = s.legs // the count moved (or is first seen): the legs so far are accounted for
	}
	s.unserved = s.legs-s.legsBase >= legsUnserved
	s.finished, s.prompts = o.Finished, o.PromptTokens

	// Foreign load: what the engine runs and queues beyond this router's on it. This router's
	// own requests reach the engine after it places them and leave it before their completion
	// is seen, so its own work reads as no more than its residents: its prefill residents and
	// its streams, each request once (an aggregate or local request is both).
	own := e.prefilling + e.streams - e.both
	reported := min(max(o.Running+o.Waiting, 0), maxForeign) // a gauge gone wild is bounded
	n := max(0, int(math.Round(reported))-own)
	usage := min(max(o.KVUsage, 0), 1)
	s.ok = true
	s.last = Observed{AtS: t, Running: o.Running, Waiting: o.Waiting, KVUsage: usage, HasKVUsage: o.HasKVUsage, Foreign: n}
	e.foreign, s.foreignKV = 0, 0
	s.foreignUntil = min(s.foreignUntil, t) // the reading replaces what the last one projected
	switch {
	case n == 0:
	case e.role == fleet.Decode && int16(i) != r.fallback:
		// Foreign streams raise the step a stream here gets; they never fill the engine for
		// placement (its own scheduler admits what it can): at most its max_streams are counted.
		if d := e.prof.Decode; d != nil {
			e.foreign = min(n, d.MaxStreams)
			if o.HasKVUsage && reported > 0 {
				s.foreignKV = int64(usage * float64(d.MaxKVTokens) * float64(e.foreign) / reported)
			} else if e.streams > 0 {
				s.foreignKV = e.kv / int64(e.streams) * int64(e.foreign)
			}
		}
	case e.prof.Prefill != nil:
		// Bounded by the longest wait the waiting set allows: a reading that says more is
		// counted as that much, and the next reading replaces it.
		s.last.ForeignPrefillS = min(float64(n)*e.prefillSeconds(int(r.meanPrompt(s, t))), r.cfg.WaitingSet.MaxWaitS)
		s.foreignUntil = t + s.last.ForeignPrefillS
	}
	s.last.UnservedLegs = r.unservedLegs(e)
	s.last.NoHandoff = s.unproven >= handoffsUnproven
	return s.last, true
}

// meanPrompt is the prompt size foreign requests are priced at: the engine's own counters'
// mean when they have moved, else the demand estimate's, else 0 (the prefill curve's
// per-request cost alone).
func (r *Router) meanPrompt(s *obsState, t float64) float64 {
	if s.meanPrompt > 0 {
		return s.meanPrompt
	}
	if l := r.demand.estimate(t, r.expectedOutput()).Long; l.ArrivalsPerS > 0 {
		return l.PromptTokensPerS / l.ArrivalsPerS
	}
	return 0
}

// unservedLegs is the prefill legs a prefill engine was named for since its finished count
// last moved, once its latest observation found them legsUnserved or more (else 0).
func (r *Router) unservedLegs(e *engine) int {
	if !e.obs.ok || !e.obs.unserved {
		return 0
	}
	return e.obs.legs - e.obs.legsBase
}

// handedOff records the first token of a disaggregated request prefilled on p and decoded on
// d: a leg p should have served, and evidence for or against d's handoff.
func (r *Router) handedOff(p, d *engine) {
	p.obs.legs++
	switch {
	case !p.obs.ok || !d.obs.ok:
	case r.unservedLegs(p) > 0:
		d.obs.unproven++
	default:
		d.obs.unproven = 0
	}
}

// foreignPrefillLeft is the foreign prefill work an engine still has at t, seconds.
func (e *engine) foreignPrefillLeft(t float64) float64 {
	return max(0, e.obs.foreignUntil-t)
}
