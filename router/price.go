package router

import (
	"math"
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
)

// Split names the engines of each pool of a candidate split, by id.
type Split struct {
	Prefill, Decode []string
}

// Pricing is a candidate split priced through the FIFO completion projection
// (role-control.md section 3). Ratios above an engine's stream capacity are +Inf.
type Pricing struct {
	TTFTRatio float64 // largest projected TTFT (waiting set and the probe) / slo.ttft_s
	TPOTRatio float64 // largest projected seconds per output token / slo.tpot_s
	Worst     float64 // max of the two
	// ProbeTTFT is the projected TTFT of a request of mean size arriving after stepS, behind
	// the waiting set and the priced demand of that horizon.
	ProbeTTFT float64
}

// ProbePromptTokens sizes the probe request of Price when no demand has been seen yet (a
// typical chat prompt); otherwise the probe has the mean prompt of the priced demand.
const ProbePromptTokens = 512

// CurrentSplit is the live split: live prefill engines and live decode engines, in fleet order.
func (r *Router) CurrentSplit() Split {
	var s Split
	for i := range r.engines {
		e := &r.engines[i]
		switch {
		case !e.live:
		case e.role == fleet.Prefill:
			s.Prefill = append(s.Prefill, e.id)
		case e.role == fleet.Decode:
			s.Decode = append(s.Decode, e.id)
		}
	}
	return s
}

// Demand is the short, long and priced demand at now.
func (r *Router) Demand(now time.Time) Demand { return r.demand.estimate(r.at(now)) }

// Price prices a split at now: the waiting set and the priced demand of the next stepS seconds
// are list-scheduled in FIFO order onto the split's prefill engines (each starting free when
// its dispatched prefill work and, for an engine leaving decode, its decode residents are done);
// the decode pool carries the current decode residents plus the streams of the waiting
// requests, spread as placement spreads them, while residents stay where they are.
func (r *Router) Price(now time.Time, s Split, stepS float64) Pricing {
	t := r.at(now)
	pool := r.indices(s.Prefill, func(e *engine) bool { return e.prof.Prefill != nil })
	dec := r.indices(s.Decode, func(e *engine) bool { return e.prof.Decode != nil })
	free := make([]float64, len(pool))
	drain := r.drainTimes(t)
	for k, i := range pool { // as prefillFree, for any engine of the candidate pool
		free[k] = max(t, r.engines[i].busyUntil) + max(0, drain[i]-t)
	}
	kv, step := math.Inf(1), math.Inf(1)
	if len(pool) > 0 {
		kv = r.engines[pool[0]].prof.KVTransferS
	}
	for _, i := range dec {
		e := &r.engines[i]
		step = min(step, e.stepSeconds(e.streams+1, e.kv))
	}
	if len(dec) == 0 {
		step = math.Inf(1)
	}

	// schedule one request: the engine on which it completes first.
	schedule := func(tokens int, arrival float64) float64 {
		best, done := -1, math.Inf(1)
		for k, i := range pool {
			if c := max(free[k], arrival) + r.engines[i].prefillSeconds(tokens); c < done {
				best, done = k, c
			}
		}
		if best < 0 {
			return math.Inf(1)
		}
		free[best] = done
		return done
	}
	worstTTFT := 0.0
	for i := 0; i < r.waiting.len(); i++ {
		e, _, err := r.lookup(r.waiting.at(i))
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		worstTTFT = max(worstTTFT, schedule(int(e.prompt), e.arrival)+kv+step-e.arrival)
	}
	d := r.demand.estimate(t).Priced
	meanPrompt := ProbePromptTokens
	if d.ArrivalsPerS > 0 {
		// The priced demand of the next stepS seconds, in expectation: a request of the mean
		// prompt every 1/λ, then the fractional rest as one request of that fraction of the
		// mean prompt (1.9 req/s over 0.5 s injects 0.95 of a request, not none).
		meanPrompt = max(1, int(d.PromptTokensPerS/d.ArrivalsPerS))
		expected := d.ArrivalsPerS * stepS
		gap := 1 / d.ArrivalsPerS
		k := 0
		for ; float64(k+1) <= expected; k++ {
			schedule(meanPrompt, t+float64(k)*gap)
		}
		if frac := expected - float64(k); frac > 0 {
			schedule(max(1, int(frac*float64(meanPrompt))), t+float64(k)*gap)
		}
	}
	probeAt := t + stepS
	probe := schedule(meanPrompt, probeAt) + kv + step - probeAt
	worstTTFT = max(worstTTFT, probe)

	p := Pricing{TTFTRatio: worstTTFT / r.slo.TTFTS, TPOTRatio: r.priceDecode(dec, pool) / r.slo.TPOTS, ProbeTTFT: probe}
	p.Worst = max(p.TTFTRatio, p.TPOTRatio)
	return p
}

// priceDecode is the largest projected decode step over the split: the decode pool's engines
// with their residents plus the waiting requests' streams (each on the engine where it steps
// fastest), and the prefill pool's engines still holding decode residents.
func (r *Router) priceDecode(dec, prefill []int) float64 {
	if len(dec) == 0 {
		return math.Inf(1)
	}
	streams := make([]int, len(dec))
	kvs := make([]int64, len(dec))
	for k, i := range dec {
		streams[k], kvs[k] = r.engines[i].streams, r.engines[i].kv
	}
	for i := 0; i < r.waiting.len(); i++ {
		e, _, err := r.lookup(r.waiting.at(i))
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		need := int64(e.prompt) + int64(e.output)
		best, bestStep := 0, math.Inf(1)
		for k, j := range dec {
			if s := r.engines[j].stepSeconds(streams[k]+1, kvs[k]+need); s < bestStep {
				best, bestStep = k, s
			}
		}
		streams[best]++
		kvs[best] += need
	}
	worst := 0.0
	for k, i := range dec {
		e := &r.engines[i]
		if streams[k] > e.prof.Decode.MaxStreams || kvs[k] > int64(e.prof.Decode.MaxKVTokens) {
			return math.Inf(1)
		}
		if streams[k] > 0 {
			worst = max(worst, e.stepSeconds(streams[k], kvs[k]))
		}
	}
	for _, i := range prefill { // donors keep their residents until they drain
		if e := &r.engines[i]; e.streams > 0 && e.prof.Decode != nil {
			worst = max(worst, e.stepSeconds(e.streams, e.kv))
		}
	}
	return worst
}

// drainTimes projects, per engine, when its decode residents finish: each decodes its expected
// output tokens (less those already produced) at the engine's current step time.
func (r *Router) drainTimes(t float64) []float64 {
	drain := make([]float64, len(r.engines))
	for i := range r.slots {
		if e := &r.slots[i]; e.phase == phasePrefilling || e.phase == phaseDecoding {
			drain[e.decode] = max(drain[e.decode], r.residentEnd(t, e))
		}
	}
	return drain
}

// indices resolves engine ids to indices, skipping unknown ones and engines whose profile
// lacks the pool's curve.
func (r *Router) indices(ids []string, can func(*engine) bool) []int {
	out := make([]int, 0, len(ids))
	for _, id := range ids {
		if i, ok := r.byID[id]; ok && can(&r.engines[i]) {
			out = append(out, int(i))
		}
	}
	return out
}

// Pressures prices the current split: prefill pressure is its TTFT ratio, decode pressure its
// TPOT ratio.
func (r *Router) Pressures(now time.Time, stepS float64) (prefill, decode float64) {
	p := r.Price(now, r.CurrentSplit(), stepS)
	return p.TTFTRatio, p.TPOTRatio
}
