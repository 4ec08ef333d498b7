package router

import (
	"math"
	"slices"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Split names the engines of each pool of a candidate split, by id.
type Split struct {
	Prefill, Decode []string
}

// Pricing is a candidate split priced through the FIFO completion projection
// (docs/role-control.md section 3). Ratios above an engine's stream capacity are +Inf. The
// TTFT ratio is over the waiting requests that are not settled, the injected demand and the
// probe.
type Pricing struct {
	TTFTRatio float64 // largest projected TTFT (waiting set and the probe) / slo.ttft_s
	TPOTRatio float64 // largest projected seconds per output token / slo.tpot_s
	Worst     float64 // max of the two
	// ProbeTTFT is the projected TTFT of a request of mean size arriving after stepS, behind
	// the waiting set and the priced demand of that horizon, plus QueueWaitS, the mean wait of
	// Poisson arrivals of the priced demand at the split's prefill pool and the backlog a
	// shortfall of that pool builds over Query.SustainS (docs/role-control.md section 3).
	ProbeTTFT, QueueWaitS float64
	// RequestTTFT is the projected TTFT of Query.Request under the split: the waiting set
	// ahead of it list-scheduled in FIFO order, then it, then the handoff (docs/role-control.md
	// section 6 compares it for the current and the candidate split). RequestPrefill is its own
	// prefill alone on the fastest prefill engine of the split. Both are zero when the query
	// names no waiting request.
	RequestTTFT, RequestPrefill float64
	// Settled counts the waiting requests projected the same under every split of the query
	// (with two splits or more): worst leaves them out (docs/role-control.md, section 3).
	Settled int
	// Overload is the most any decode engine of the split holds at the horizon against its
	// stream or KV capacity (above 1: over it, and tpot_ratio is +Inf): splits that all
	// overload their decode pool still rank by how much (docs/role-control.md section 3).
	Overload float64
	// LocalShare is the prefill its decode pool offers through local prefill, in engines: the
	// sum of the shares of their time its decode engines are priced to give it.
	LocalShare float64
}

// Query is what one Price call prices: its splits together, in one walk of the waiting set
// (a regular pass prices the current split and both adjacent ones), under the priced demand
// of the next StepS seconds; with Request set, each split also projects that waiting
// request's TTFT.
type Query struct {
	Splits []Split
	StepS  float64
	// SustainS, when positive, is how long a split is held: a prefill pool whose rate falls
	// short of the priced arrivals builds a backlog over it, which the probe waits
	// (docs/role-control.md section 3, "A shortfall held").
	SustainS float64
	Request  Handle
	// OutputScale, when positive, multiplies the priced demand's output tokens per request
	// (the consolidation trend prices a rise in output demand continued, docs/role-control.md
	// section 2).
	OutputScale float64
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
func (r *Router) Demand(now time.Time) Demand {
	return r.demand.estimate(r.at(now), r.expectedOutput())
}

// Price prices each split of q at now, in q's order: the waiting set and the priced demand of
// the next q.StepS seconds are list-scheduled in FIFO order onto the split's prefill engines
// (each starting free when its dispatched prefill work and, for an engine leaving decode, its
// decode residents are done); the decode pool carries the current decode residents plus the
// streams of the waiting requests, spread as placement spreads them, while residents stay
// where they are. waiting reports whether q.Request is waiting (false without one). The
// splits share one walk of the waiting set: each waiting request is looked up once and
// scheduled onto every split.
func (r *Router) Price(now time.Time, q Query) (ps []Pricing, waiting bool) {
	t := r.at(now)
	var target *entry
	if q.Request != 0 {
		if e, _, err := r.lookup(q.Request); err == nil && e.phase == phaseWaiting {
			target = e
		}
	}
	// The decode pool is priced at the horizon, when the probe arrives: a waiting request's
	// output work lands on it when its first token appears (its projected prefill end and the
	// handoff) and leaves after its output at the pool's step, so those decoding then are
	// counted there (alive); so are the residents (and the streams reserved by requests
	// prefilling) still decoding then.
	horizon := t + q.StepS
	d := r.demand.estimate(t, r.expectedOutput()).Priced
	ss := r.pricing.load(r, t, horizon, q.Splits, d)
	settled := 0
	for h := range r.waiting.all() {
		e, _, err := r.lookup(h)
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		prompt, need := int(e.prompt), e.prompt+e.output
		lo, hi := math.Inf(1), math.Inf(-1)
		for k := range ss {
			sp := &ss[k]
			ttft := sp.prefill.schedule(prompt, e.arrival) + sp.handoff - e.arrival
			sp.ttft = ttft
			lo, hi = min(lo, ttft), max(hi, ttft)
			if e == target {
				sp.requestTTFT = ttft
			}
			if sp.alive(e.arrival+ttft, float64(e.output), horizon) {
				sp.decode.place(need)
			}
		}
		// A request projected the same under every split priced is settled: it cannot tell
		// them apart, and as the maximum (the head of a draining backlog) it would hide every
		// difference between them. worst is taken over the others (docs/role-control.md,
		// section 3).
		if len(ss) > 1 && hi-lo <= settledS {
			settled++
			continue
		}
		for k := range ss {
			ss[k].worstTTFT = max(ss[k].worstTTFT, ss[k].ttft)
		}
	}
	meanPrompt, meanOutput := ProbePromptTokens, 0.0
	if d.ArrivalsPerS > 0 {
		meanPrompt = max(1, int(d.PromptTokensPerS/d.ArrivalsPerS))
		meanOutput = d.OutputTokensPerS / d.ArrivalsPerS
		if q.OutputScale > 0 {
			meanOutput *= q.OutputScale
		}
	}
	probeAt := t + q.StepS
	ps = make([]Pricing, len(ss))
	for k := range ss {
		sp := &ss[k]
		if d.ArrivalsPerS > 0 {
			// The priced demand of the next stepS seconds, in expectation: a request of the
			// mean prompt every 1/λ, then the fractional rest as one request of that fraction
			// of the mean prompt (1.9 req/s over 0.5 s injects 0.95 of a request, not none).
			expected := d.ArrivalsPerS * q.StepS
			gap := 1 / d.ArrivalsPerS
			// Their streams count on the decode pool as the waiting set's do: those decoding
			// at the horizon. Without them pricing saw the demand's prefill work but not the
			// decode work it becomes, and in a silence after a burst every decode→prefill
			// move looked like a gain.
			j, alive := 0, 0.0
			for ; float64(j+1) <= expected; j++ {
				if sp.alive(sp.prefill.schedule(meanPrompt, t+float64(j)*gap)+sp.handoff, meanOutput, horizon) {
					alive++
				}
			}
			if frac := expected - float64(j); frac > 0 {
				if sp.alive(sp.prefill.schedule(max(1, int(frac*float64(meanPrompt))), t+float64(j)*gap)+sp.handoff, meanOutput, horizon) {
					alive += frac
				}
			}
			need := int64(meanPrompt) + int64(math.Ceil(meanOutput))
			for n := int(math.Round(alive)); n > 0; n-- {
				sp.decode.place(need)
			}
		}
		// The probe's stream: the decode step a request arriving at the horizon would get.
		sp.decode.place(int64(meanPrompt) + int64(math.Ceil(meanOutput)))
		probe := sp.prefill.schedule(meanPrompt, probeAt) + sp.handoff - probeAt
		// Arrivals come in Poisson clumps, not every 1/λ: the probe also waits the mean wait of
		// the priced demand at the split's prefill pool taken as a queue (its engines as
		// servers of the pool's mean prefill time of the mean prompt, their total rate kept).
		// A pool short of the arrivals falls behind by their difference for as long as the
		// split is held: a shortfall of a few percent builds no queue the step can see, and a
		// split that local prefill brings near the arrival rate looked as good as one that
		// serves it (docs/role-control.md section 3, "A shortfall held").
		var queue float64
		if n := sp.servers; d.ArrivalsPerS > 0 && n > 0 {
			mu := sp.prefill.rate(meanPrompt)
			queue = poissonWait(n, d.ArrivalsPerS, float64(n)/mu)
			if mu < d.ArrivalsPerS {
				queue += (d.ArrivalsPerS - mu) * q.SustainS / mu
			}
			probe += queue
		}
		step, overload := r.priceDecode(sp)
		p := Pricing{TTFTRatio: max(sp.worstTTFT, probe) / r.slo.TTFTS, TPOTRatio: step / r.slo.TPOTS, ProbeTTFT: probe, QueueWaitS: queue, Settled: settled, Overload: overload, LocalShare: sp.localShare}
		p.Worst = max(p.TTFTRatio, p.TPOTRatio)
		if target != nil {
			p.RequestTTFT = sp.requestTTFT
			p.RequestPrefill = math.Inf(1)
			for _, i := range sp.pool {
				p.RequestPrefill = min(p.RequestPrefill, r.engines[i].prefillSeconds(int(target.prompt)))
			}
		}
		ps[k] = p
	}
	return ps, target != nil
}

// alive reports whether a stream whose first token comes at first, with output tokens to
// generate at the split's decode step, is decoding at the horizon.
func (sp *splitSched) alive(first, output, horizon float64) bool {
	return first <= horizon && first+output*sp.step > horizon
}

// load prepares one scheduler per split at t: its prefill engines, each free when freeAt
// says (whatever its role now), its decode engines with their residents decoding at the
// horizon (residents), and the handoff every projected TTFT adds after the prefill: the KV
// transfer and one decode step on the fastest decode engine (+Inf without one). d is the priced
// demand: its output spread over each split's decode pool, and its mean request's KV, price the
// decode engines' local prefill as placement does.
func (p *pricing) load(r *Router, t, horizon float64, splits []Split, d Rates) []splitSched {
	p.residents(r, t, horizon)
	for len(p.splits) < len(splits) {
		p.splits = append(p.splits, splitSched{})
	}
	ss := p.splits[:len(splits)]
	out := float64(r.expectedOutput())
	need := int64(ProbePromptTokens) + int64(out)
	if d.ArrivalsPerS > 0 {
		need = int64((d.PromptTokensPerS + d.OutputTokensPerS) / d.ArrivalsPerS)
	}
	streams, kvs := 0, int64(0)
	for i := range r.engines {
		streams, kvs = streams+r.engines[i].streams, kvs+r.engines[i].kv
	}
	for k, s := range splits {
		sp := &ss[k]
		sp.worstTTFT, sp.requestTTFT = 0, 0
		sp.pool = r.indices(sp.pool[:0], s.Prefill, func(e *engine) bool { return e.prof.Prefill != nil })
		sp.dec = r.indices(sp.dec[:0], s.Decode, func(e *engine) bool { return e.prof.Decode != nil })
		sp.prefill.reset()
		for _, i := range sp.pool {
			e := &r.engines[i]
			sp.prefill.add(e.prof.Prefill, e.corr[0], 1, r.freeAt(t, i), i)
		}
		sp.decode.reset(len(r.engines))
		kv, step := math.Inf(1), math.Inf(1)
		if len(sp.pool) > 0 {
			kv = r.engines[sp.pool[0]].prof.KVTransferS
		}
		// The step a stream of the split's decode pool takes: the streams resident now spread
		// over the pool (a split with fewer decode engines steps slower, and its streams live
		// longer, than the engines' load now says).
		perStreams, perKV := 0, int64(0)
		if n := len(sp.dec); n > 0 {
			perStreams, perKV = (streams+n-1)/n, kvs/int64(n)
		}
		sp.servers, sp.localShare = len(sp.pool), 0
		for _, i := range sp.dec {
			e := &r.engines[i]
			sp.decode.add(e.prof.Decode, e.corr[1], p.streams[i], p.kv[i], i)
			streams, kvs := max(e.streams, perStreams)+1, max(e.kv, perKV)
			s := e.stepSeconds(streams, kvs)
			step = min(step, s)
			// Its local share, as placement prices it for a request of the mean size: the step
			// with its stream's KV too.
			rate := max(d.OutputTokensPerS/float64(len(sp.dec)), e.outputRate(e.localWorkAt(t, out), out))
			if share := r.localShare(e, streams, kvs+need, rate); share > 0 {
				// A decode engine that prefills locally is a prefill server of the split, at the
				// share of its time its streams can spare (docs/role-control.md section 3).
				sp.prefill.add(e.prof.Prefill, e.corr[0], 1/share, max(t, e.busyUntil), i)
				sp.servers++
				sp.localShare += share
			}
		}
		sp.handoff, sp.step = kv+step, step
	}
	return ss
}

// localShare is the share of its time decode engine e gives local prefill, priced
// (router.local_prefill: auto), when it decodes streams streams reserving kv KV tokens and the
// demand asks rate output tokens a second of it: at the steady state that output leads to when
// local prefill takes all that placement lets it (docs/role-control.md section 3). Its streams'
// step stretches to the limit (localTPOTShare of the TPOT SLO), so by Little's law it carries
// rate · limit streams (its fullest batch at most, its streams now at least); local prefill may
// take what neither the stretch to the limit nor that output at their step leaves:
// 1 − max(step/limit, rate · step/streams). Priced at the streams now, it was priced above its
// steady state while they built up (the step grows with them). 0 for an engine that never
// prefills locally, or below minLocalShare.
func (r *Router) localShare(e *engine, streams int, kv int64, rate float64) float64 {
	if r.cfg.LocalPrefill != config.LocalPrefillAuto || e.inPlace || e.prof.Prefill == nil || !e.live {
		return 0
	}
	limit := r.slo.TPOTS * localTPOTShare
	full, perKV := e.fullBatch(streams, kv)
	n := max(float64(streams), min(rate*limit, full), 1)
	step := e.stepSeconds(int(n), int64(n*perKV))
	if share := math.Floor((1-max(step/limit, rate*step/n))/minLocalShare) * minLocalShare; share >= minLocalShare {
		return share // in steps of minLocalShare: engines of one curve share a few classes
	}
	return 0
}

// minLocalShare is the least share of a decode engine's time that pricing counts as a local
// prefill server.
const minLocalShare = 0.05

// FirstTokenTimeoutAt is when the latest first-token timeout happened (false before any): the
// controller restarts its arrival-evidence window from it (docs/role-control.md section 7).
func (r *Router) FirstTokenTimeoutAt() (time.Time, bool) {
	if r.counters.FirstTokenTimeouts == 0 {
		return time.Time{}, false
	}
	return r.Time(r.lastTimeout), true
}

// priceDecode is the projected decode step a stream gets on a split's decode pool at the
// horizon, with the streams this pricing placed (the waiting set's, the priced demand's and the
// probe's, each on the engine where it steps fastest) beside the residents still decoding then:
// the mean of the engines' steps weighted by their streams. Not the largest: the engine whose
// residents step slowest steps the same under every split (resident ownership: they finish
// where they are), and as the maximum it hid every difference between them; nor only the
// engines that took a placed stream: over a horizon of seconds an engine added to the pool
// takes them all, and its empty step priced one engine more as a pool relieved
// (docs/role-control.md section 3).
func (r *Router) priceDecode(sp *splitSched) (worst, overload float64) {
	if len(sp.dec) == 0 {
		return math.Inf(1), math.Inf(1)
	}
	var sum float64 // Σ streams × step
	var n int       // Σ streams
	full := false
	for _, i := range sp.dec {
		e := &r.engines[i]
		streams, kv := sp.decode.streams[i], sp.decode.kv[i]
		d := e.prof.Decode
		overload = max(overload, float64(streams)/float64(d.MaxStreams), float64(kv)/float64(d.MaxKVTokens))
		if streams > d.MaxStreams || kv > int64(d.MaxKVTokens) {
			full = true
		} else if streams > 0 {
			sum += float64(streams) * e.stepSeconds(streams, kv)
			n += streams
		}
	}
	switch {
	case full:
		return math.Inf(1), overload
	case n == 0:
		return 0, overload
	}
	return sum / float64(n), overload
}

// indices appends to dst the indices of engine ids, skipping unknown ones and engines whose
// profile lacks the pool's curve.
func (r *Router) indices(dst []int, ids []string, can func(*engine) bool) []int {
	for _, id := range ids {
		if i, ok := r.byID[id]; ok && can(&r.engines[i]) {
			dst = append(dst, int(i))
		}
	}
	return dst
}

// Pricing list-schedules thousands of requests onto hundreds of engines, so each choice must
// not scan the pool. Engines with the same curve and correction factors within
// classWidth of each other form a class, priced with the factor of the class's first engine
// (an error under 1%): within a class the engine that is free first (prefill) or least loaded
// (decode) is the best, so a class is a heap, and one request costs O(classes + log pool).

// classWidth is the relative width of a pricing class's correction factors.
const classWidth = 0.01

func classOf(corr float64) int64 { return int64(math.Round(math.Log(corr) / math.Log1p(classWidth))) }

// pricing holds the schedulers' storage between calls (Price allocates only its result once
// grown): one splitSched per split of a query.
type pricing struct {
	splits []splitSched
	// streams and kv are each engine's resident streams (decoding, or reserved by a request
	// still prefilling) that are decoding at the horizon, and the KV tokens they reserve.
	streams []int
	kv      []int64
}

// residents counts, per decode engine, the dispatched streams decoding at the horizon: those
// whose first token has come or comes by then and whose projected end (residentEnd) is later.
func (p *pricing) residents(r *Router, t, horizon float64) {
	n := len(r.engines)
	if len(p.streams) < n {
		p.streams, p.kv = make([]int, n), make([]int64, n)
	}
	p.streams, p.kv = p.streams[:n], p.kv[:n]
	clear(p.streams)
	clear(p.kv)
	for i := range r.slots {
		e := &r.slots[i]
		if (e.phase != phasePrefilling && e.phase != phaseDecoding) || e.decode < 0 {
			continue
		}
		if e.phase == phasePrefilling && e.projFirst > horizon {
			continue
		}
		if r.residentEnd(t, e) > horizon {
			p.streams[e.decode]++
			p.kv[e.decode] += e.kv
		}
	}
}

// splitSched prices one split of a query: its pools, its schedulers and what the walk of the
// waiting set found.
type splitSched struct {
	pool, dec              []int   // engine indices
	servers                int     // prefill servers: the prefill pool, and the decode engines that prefill locally
	localShare             float64 // the decode engines' shares as local prefill servers, summed
	handoff, step          float64 // step: one decode step on the fastest decode engine
	prefill                prefillSched
	decode                 decodeSched
	worstTTFT, requestTTFT float64
	ttft                   float64 // the projected TTFT of the waiting request being walked
}

// settledS is how close (seconds) a waiting request's projected TTFTs under every split of a
// query must be for it to be settled.
const settledS = 1e-6

// class is one pricing class: the engines of one curve whose correction factors are within
// classWidth, in a heap (by free time for prefill, by load for decode).
type class[C any] struct {
	curve *C
	class int64
	corr  float64 // the factor of its first engine, which prices them all
	// hold (prefill) is how long a request holds an engine of the class, per second of its
	// prefill: 1, or for a decode engine's local prefill 1/share (its streams keep the rest).
	hold float64
	heap minHeap
}

// resetClasses empties a class list, keeping its storage.
func resetClasses[C any](cs *[]class[C]) {
	for i := range *cs {
		(*cs)[i].heap.reset()
	}
	*cs = (*cs)[:0]
}

// join adds an engine with its heap key to the class of its curve, factor and hold.
func join[C any](cs *[]class[C], curve *C, corr, hold, key float64, engine int) {
	k := classOf(corr)
	for i := range *cs {
		if c := &(*cs)[i]; c.curve == curve && c.class == k && c.hold == hold {
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
	c.curve, c.class, c.corr, c.hold = curve, k, corr, hold
	c.heap.push(key, uint64(engine))
}

// prefillSched is the FIFO completion projection onto a prefill pool: each request goes to
// the engine on which it completes first (within a class, the one free first).
type prefillSched struct{ classes []class[config.PrefillCurve] }

func (p *prefillSched) reset() { resetClasses(&p.classes) }

func (p *prefillSched) add(curve *config.PrefillCurve, corr, hold, free float64, engine int) {
	join(&p.classes, curve, corr, hold, free, engine)
}

// schedule places one request of tokens arriving at arrival and returns when its prefill
// completes (+Inf with no engine). A local prefill server (hold above 1) gives the request
// its prefill at full speed, and takes the next one hold times as late.
func (p *prefillSched) schedule(tokens int, arrival float64) float64 {
	best, done, free := -1, math.Inf(1), 0.0
	for i := range p.classes {
		c := &p.classes[i]
		start := max(c.heap.top(), arrival)
		d := c.curve.Seconds(max(tokens, 1)) * c.corr
		if end := start + d; end < done {
			best, done, free = i, end, start+d*c.hold
		}
	}
	if best >= 0 {
		p.classes[best].heap.fix(free)
	}
	return done
}

// rate is how many prompts of tokens the pool prefills per second, its engines together (each
// class priced with its first engine's factor, as schedule prices it).
func (p *prefillSched) rate(tokens int) float64 {
	r := 0.0
	for i := range p.classes {
		c := &p.classes[i]
		r += float64(c.heap.len()) / (c.curve.Seconds(max(tokens, 1)) * c.corr * c.hold)
	}
	return r
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
	join(&d.classes, curve, corr, 1, curve.PerStreamS*float64(streams)+curve.PerKVTokenS*float64(kv), engine)
}

// place adds one stream reserving need KV tokens where it steps fastest.
func (d *decodeSched) place(need int64) {
	best, bestStep, bestLoad := -1, math.Inf(1), 0.0
	for i := range d.classes {
		c := &d.classes[i]
		load := c.heap.top() + c.curve.PerStreamS + c.curve.PerKVTokenS*float64(need)
		if s := (c.curve.BaseS + load) * c.corr; s < bestStep {
			best, bestStep, bestLoad = i, s, load
		}
	}
	if best < 0 {
		return
	}
	c := &d.classes[best]
	e := int(c.heap.ids[0])
	d.streams[e]++
	d.kv[e] += need
	c.heap.fix(bestLoad)
}

// Fork copies the router into dst for pricing away from the live one (the controller prices a
// fork outside the live wrapper's lock, so that an evaluation never stalls placement), reusing
// dst's storage: pass the previous fork, or nil for a new one. The fork shares nothing the live
// router changes: engines, entries, the waiting set and the demand samples are copied; it has no
// prefix-affinity index, outbox, trigger or ejections. Only read-only calls (Price,
// Snapshot, Demand, FirstTokenTimeoutAt) are meant for it.
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

// Clone returns a whole, independent copy of the router in the same state: unlike a Fork,
// every call works on it, and it and the original then run apart (the simulator forks a
// replay with it: oracle:greedy, docs/sim.md). Profiles, the config and prefix hashes, which
// nothing changes, are shared.
func (r *Router) Clone() *Router {
	c := r.Fork(nil)
	c.free = slices.Clone(r.free)
	c.inFlight = ring{buf: slices.Clone(r.inFlight.buf), head: r.inFlight.head, size: r.inFlight.size}
	c.unary = minHeap{keys: slices.Clone(r.unary.keys), ids: slices.Clone(r.unary.ids)}
	c.aff = r.aff.clone()
	c.outbox, c.ejections, c.urgent = slices.Clone(r.outbox), slices.Clone(r.ejections), r.urgent
	return c
}

// poissonWait is the mean wait of Poisson arrivals at lambda per second at c servers of mean
// service s seconds: an M/D/c queue, approximated as half the M/M/c wait (Erlang C; the
// Allen–Cunneen approximation with deterministic service), at most s, and s when the servers
// are saturated: beyond that the queue is a backlog, which the list-scheduled projection prices
// (docs/role-control.md section 3).
func poissonWait(c int, lambda, s float64) float64 {
	a := lambda * s // offered load, in servers
	switch {
	case c <= 0 || a <= 0:
		return 0
	case a >= float64(c):
		return s
	}
	b := 1.0 // Erlang B, by its recursion
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	rho := a / float64(c)
	wait := b / (1 - rho + rho*b) // Erlang C: the chance an arrival waits
	return min(s, 0.5*wait*s/(float64(c)-a))
}
