package router

import (
	"math"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Split names the engines of each pool of a candidate split, by id.
type Split struct {
	Prefill, Decode []string
}

// Pricing is a candidate split priced through the FIFO completion projection
// (docs/role-control.md section 3). Ratios above an engine's stream capacity are +Inf.
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
	pool, dec, handoff := r.loadSplit(t, s)
	schedule := r.pricing.prefill.schedule
	worstTTFT := 0.0
	for i := 0; i < r.waiting.len(); i++ {
		e, _, err := r.lookup(r.waiting.at(i))
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		worstTTFT = max(worstTTFT, schedule(int(e.prompt), e.arrival)+handoff-e.arrival)
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
	probe := schedule(meanPrompt, probeAt) + handoff - probeAt
	worstTTFT = max(worstTTFT, probe)

	p := Pricing{TTFTRatio: worstTTFT / r.slo.TTFTS, TPOTRatio: r.priceDecode(dec, pool) / r.slo.TPOTS, ProbeTTFT: probe}
	p.Worst = max(p.TTFTRatio, p.TPOTRatio)
	return p
}

// loadSplit prepares the prefill scheduler for a split at t: its prefill engines, each free
// when freeAt says (whatever its role now). It returns the
// pools and the handoff every projected TTFT adds after the prefill: the KV transfer and one
// decode step on the fastest decode engine (+Inf without one).
func (r *Router) loadSplit(t float64, s Split) (pool, dec []int, handoff float64) {
	pool = r.indices(s.Prefill, func(e *engine) bool { return e.prof.Prefill != nil })
	dec = r.indices(s.Decode, func(e *engine) bool { return e.prof.Decode != nil })
	ps := &r.pricing.prefill
	ps.reset()
	for _, i := range pool {
		e := &r.engines[i]
		ps.add(e.prof.Prefill, e.corr[0], r.freeAt(t, i), i)
	}
	kv, step := math.Inf(1), math.Inf(1)
	if len(pool) > 0 {
		kv = r.engines[pool[0]].prof.KVTransferS
	}
	for _, i := range dec {
		e := &r.engines[i]
		step = min(step, e.stepSeconds(e.streams+1, e.kv))
	}
	return pool, dec, kv + step
}

// RequestTTFT is the projected TTFT of the waiting request h under split s at now: the
// waiting set ahead of it list-scheduled in FIFO order onto the split's prefill engines, then
// it, then the handoff (docs/role-control.md section 6 compares this for the current and the
// candidate split). prefill is its own prefill seconds alone on the fastest engine of the
// split. ok is false when h is not waiting.
func (r *Router) RequestTTFT(now time.Time, s Split, h Handle) (ttft, prefill float64, ok bool) {
	t := r.at(now)
	target, _, err := r.lookup(h)
	if err != nil || target.phase != phaseWaiting {
		return 0, 0, false
	}
	pool, _, handoff := r.loadSplit(t, s)
	prefill = math.Inf(1)
	for _, i := range pool {
		prefill = min(prefill, r.engines[i].prefillSeconds(int(target.prompt)))
	}
	for i := 0; i < r.waiting.len(); i++ {
		e, _, err := r.lookup(r.waiting.at(i))
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		done := r.pricing.prefill.schedule(int(e.prompt), e.arrival)
		if e == target {
			return done + handoff - e.arrival, prefill, true
		}
	}
	return 0, 0, false
}

// FirstTokenTimeoutAt is when the latest first-token timeout happened (false before any): the
// controller restarts its arrival-evidence window from it (docs/role-control.md section 7).
func (r *Router) FirstTokenTimeoutAt() (time.Time, bool) {
	if r.counters.FirstTokenTimeouts == 0 {
		return time.Time{}, false
	}
	return r.Time(r.lastTimeout), true
}

// priceDecode is the largest projected decode step over the split: the decode pool's engines
// with their residents plus the waiting requests' streams (each on the engine where it steps
// fastest), and the prefill pool's engines still holding decode residents.
func (r *Router) priceDecode(dec, prefill []int) float64 {
	if len(dec) == 0 {
		return math.Inf(1)
	}
	ds := &r.pricing.decode
	ds.reset(len(r.engines))
	for _, i := range dec {
		e := &r.engines[i]
		ds.add(e.prof.Decode, e.corr[1], e.streams, e.kv, i)
	}
	for i := 0; i < r.waiting.len(); i++ {
		e, _, err := r.lookup(r.waiting.at(i))
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		ds.place(e.prompt + e.output)
	}
	worst := 0.0
	for _, i := range dec {
		e := &r.engines[i]
		streams, kv := ds.streams[i], ds.kv[i]
		if streams > e.prof.Decode.MaxStreams || kv > int64(e.prof.Decode.MaxKVTokens) {
			return math.Inf(1)
		}
		if streams > 0 {
			worst = max(worst, e.stepSeconds(streams, kv))
		}
	}
	for _, i := range prefill { // donors keep their residents until they drain
		if e := &r.engines[i]; e.streams > 0 && e.prof.Decode != nil {
			worst = max(worst, e.stepSeconds(e.streams, e.kv))
		}
	}
	return worst
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

// Pricing list-schedules thousands of requests onto hundreds of engines, so each choice must
// not scan the pool. Engines with the same curve and correction factors within
// classWidth of each other form a class, priced with the factor of the class's first engine
// (an error under 1%): within a class the engine that is free first (prefill) or least loaded
// (decode) is the best, so a class is a heap, and one request costs O(classes + log pool).

// classWidth is the relative width of a pricing class's correction factors.
const classWidth = 0.01

func classOf(corr float64) int64 { return int64(math.Round(math.Log(corr) / math.Log1p(classWidth))) }

// pricing holds the schedulers' storage between calls (Price allocates nothing once grown).
type pricing struct {
	prefill prefillSched
	decode  decodeSched
}

// class is one pricing class: the engines of one curve whose correction factors are within
// classWidth, in a heap (by free time for prefill, by load for decode).
type class[C any] struct {
	curve *C
	class int64
	corr  float64 // the factor of its first engine, which prices them all
	heap  minHeap
}

// resetClasses empties a class list, keeping its storage.
func resetClasses[C any](cs *[]class[C]) {
	for i := range *cs {
		(*cs)[i].heap.reset()
	}
	*cs = (*cs)[:0]
}

// join adds an engine with its heap key to the class of its curve and factor.
func join[C any](cs *[]class[C], curve *C, corr, key float64, engine int) {
	k := classOf(corr)
	for i := range *cs {
		if c := &(*cs)[i]; c.curve == curve && c.class == k {
			c.heap.push(key, uint64(engine))
			return
		}
	}
	if len(*cs) < cap(*cs) {
		*cs = (*cs)[:len(*cs)+1]
	} else {
		*cs = append(*cs, class[C]{})
	}
	c := &(*cs)[len(*cs)-1]
	c.curve, c.class, c.corr = curve, k, corr
	c.heap.push(key, uint64(engine))
}

// prefillSched is the FIFO completion projection onto a prefill pool: each request goes to
// the engine on which it completes first (within a class, the one free first).
type prefillSched struct{ classes []class[config.PrefillCurve] }

func (p *prefillSched) reset() { resetClasses(&p.classes) }

func (p *prefillSched) add(curve *config.PrefillCurve, corr, free float64, engine int) {
	join(&p.classes, curve, corr, free, engine)
}

// schedule places one request of tokens arriving at arrival and returns when its prefill
// completes (+Inf with no engine).
func (p *prefillSched) schedule(tokens int, arrival float64) float64 {
	best, done := -1, math.Inf(1)
	for i := range p.classes {
		c := &p.classes[i]
		if end := max(c.heap.peek().key, arrival) + c.curve.Seconds(max(tokens, 1))*c.corr; end < done {
			best, done = i, end
		}
	}
	if best >= 0 {
		p.classes[best].heap.fix(done)
	}
	return done
}

// decodeSched spreads streams over a decode pool as placement does: each to the engine with
// the lowest step time for one more stream (within a class, the least loaded engine, by
// per_stream_s·streams + per_kv_token_s·kv).
type decodeSched struct {
	classes []class[config.DecodeCurve]
	streams []int   // by engine index
	kv      []int64 // by engine index
}

func (d *decodeSched) reset(engines int) {
	resetClasses(&d.classes)
	if len(d.streams) < engines {
		d.streams, d.kv = make([]int, engines), make([]int64, engines)
	}
}

func (d *decodeSched) add(curve *config.DecodeCurve, corr float64, streams int, kv int64, engine int) {
	d.streams[engine], d.kv[engine] = streams, kv
	join(&d.classes, curve, corr, curve.PerStreamS*float64(streams)+curve.PerKVTokenS*float64(kv), engine)
}

// place adds one stream reserving need KV tokens where it steps fastest.
func (d *decodeSched) place(need int64) {
	best, bestStep := -1, math.Inf(1)
	for i := range d.classes {
		c := &d.classes[i]
		load := c.heap.peek().key + c.curve.PerStreamS + c.curve.PerKVTokenS*float64(need)
		if s := (c.curve.BaseS + load) * c.corr; s < bestStep {
			best, bestStep = i, s
		}
	}
	if best < 0 {
		return
	}
	c := &d.classes[best]
	e := int(c.heap.peek().id)
	d.streams[e]++
	d.kv[e] += need
	c.heap.fix(c.curve.PerStreamS*float64(d.streams[e]) + c.curve.PerKVTokenS*float64(d.kv[e]))
}

// Fork copies the router into dst for pricing away from the live one (the controller prices a
// fork outside the live wrapper's lock, so that an evaluation never stalls placement), reusing
// dst's storage: pass the previous fork, or nil for a new one. The fork shares nothing the live
// router changes: engines, entries, the waiting set and the demand samples are copied; it has no
// prefix-affinity index, outbox, trigger or ejections. Only read-only calls (Price,
// RequestTTFT, Snapshot, Demand, FirstTokenTimeoutAt) are meant for it.
func (r *Router) Fork(dst *Router) *Router {
	if dst == nil {
		dst = &Router{}
	}
	keep := *dst
	*dst = *r
	dst.engines = append(keep.engines[:0], r.engines...)
	dst.slots = append(keep.slots[:0], r.slots...)
	dst.free = nil
	dst.waiting = ring{buf: append(keep.waiting.buf[:0], r.waiting.buf...), head: r.waiting.head, size: r.waiting.size}
	dst.inFlight, dst.unary = ring{}, minHeap{}
	dst.demand.ring = append(keep.demand.ring[:0], r.demand.ring...)
	dst.prefillPool = append(keep.prefillPool[:0], r.prefillPool...)
	dst.decodePool = append(keep.decodePool[:0], r.decodePool...)
	dst.aff, dst.outbox, dst.ejections, dst.urgent = nil, nil, nil, false
	dst.pricing = keep.pricing
	return dst
}
