package router

// The FIFO completion projection: the request store, the engines' pools, when each engine is
// free, the prefix-affinity match, the plan and commit of a placement, and the pump that
// dispatches the head of the waiting set.

import (
	"math"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

func (r *Router) alloc() int32 {
	if n := len(r.free); n > 0 {
		s := r.free[n-1]
		r.free = r.free[:n-1]
		return s
	}
	r.slots = append(r.slots, entry{})
	return int32(len(r.slots) - 1)
}

// release frees a slot; its handle goes stale.
func (r *Router) release(slot int32) {
	e := &r.slots[slot]
	*e = entry{gen: e.gen + 1}
	r.free = append(r.free, slot)
	if len(r.subsets) > 0 {
		delete(r.subsets, slot)
	}
}

func (r *Router) lookup(h Handle) (*entry, int32, error) {
	s := h.slot()
	if h == 0 || s < 0 || int(s) >= len(r.slots) {
		return nil, 0, ErrUnknownRequest
	}
	e := &r.slots[s]
	if e.gen != h.gen() || e.phase == phaseFree {
		return nil, 0, ErrUnknownRequest
	}
	return e, s, nil
}

// dispatched looks up a request that must be in flight (prefilling or decoding).
func (r *Router) dispatched(h Handle) (*entry, int32, error) {
	e, slot, err := r.lookup(h)
	if err == nil && e.phase != phasePrefilling && e.phase != phaseDecoding {
		err = ErrPhase
	}
	return e, slot, err
}

func (r *Router) countLivePrefill() (n int) {
	for i := range r.engines {
		if e := &r.engines[i]; e.role == fleet.Prefill && e.canPrefill() {
			n++
		}
	}
	return n
}

// rebuildPools recomputes the prefill and decode pools after a fleet or fallback change.
func (r *Router) rebuildPools() {
	r.prefillPool, r.decodePool = r.prefillPool[:0], r.decodePool[:0]
	r.livePrefill = 0
	for i := range r.engines {
		e := &r.engines[i]
		switch {
		case e.role == fleet.Prefill && e.canPrefill():
			r.livePrefill++
			if r.fallback < 0 {
				r.prefillPool = append(r.prefillPool, int16(i))
			}
		case e.role == fleet.Decode && e.live && e.prof.Decode != nil && i != int(r.fallback):
			r.decodePool = append(r.decodePool, int16(i))
		}
	}
	if r.fallback >= 0 {
		r.prefillPool = append(r.prefillPool, r.fallback)
	}
}

// projectTail is the FIFO completion projection of one more request at the tail of the waiting
// set: the candidate engine on which it completes first, its prefill seconds there, and the
// completion time. Prefix blocks an engine holds count as saved prefill work.
func (r *Router) projectTail(t float64, tokens int, prefix []uint64) (best int, dur, done float64) {
	cached := r.matchPrefix(prefix)
	best, done = -1, math.Inf(1)
	for _, i16 := range r.prefillPool {
		i := int(i16)
		e := &r.engines[i]
		d := e.prefillSeconds(tokens - cached(i))
		free := r.prefillFree(t, i)
		if i == int(r.fallback) && r.fallbackPending > 0 {
			free = max(free, r.fallbackDrain, t+e.stepSeconds(e.streams, e.kv))
		}
		if c := free + e.waitWork + d; c < done {
			best, dur, done = i, d, c
		}
	}
	r.resetPrefix()
	return best, dur, done
}

// prefillFree is when engine i can start new prefill work (docs/role-control.md section 3, one
// projection for placement, admission, the urgent trigger and Price): after the prefill work
// dispatched to it and the foreign prefill work its metrics report (Observe) and, for a prefill
// engine that still streams decode residents (a donor just moved from decode), their remaining
// decode work too — the sum of them.
func (r *Router) prefillFree(t float64, i int) float64 {
	if e := &r.engines[i]; e.role != fleet.Prefill {
		return max(t, e.busyUntil) + e.foreignPrefillLeft(t)
	}
	return r.freeAt(t, i)
}

// freeAt is prefillFree for any engine, whatever its role (Price asks it of a decode engine
// priced as prefill): its dispatched prefill work, plus its decode residents' remaining work —
// with local prefill only the part their spare time does not cover: it prefills beside them
// at the share of its time they spare (localShare with no output asked of it: no new stream
// comes to it, and its streams may slow to the limit).
func (r *Router) freeAt(t float64, i int) float64 {
	end := r.drainEnd(t, i)
	e := &r.engines[i]
	if e.streams == 0 {
		return end
	}
	if share := r.localShare(e, e.streams, e.kv, 0); share > 0 {
		free := max(t, e.busyUntil) + e.foreignPrefillLeft(t)
		return free + (end-free)*(1-share)
	}
	return end
}

// drainEnd is when everything on engine i is done: its dispatched prefill work, then its decode
// residents' remaining output (what /narwhal/state's drain_s says).
func (r *Router) drainEnd(t float64, i int) float64 {
	e := &r.engines[i]
	free := max(t, e.busyUntil) + e.foreignPrefillLeft(t)
	if e.streams == 0 {
		return free
	}
	if !e.drainOK { // projected when its residents last changed
		e.drainAt, e.drainOK = t, true
		for k := range r.slots {
			if s := &r.slots[k]; int(s.decode) == i {
				e.drainAt = max(e.drainAt, r.residentEnd(t, s))
			}
		}
	}
	return free + max(0, e.drainAt-t)
}

// refreshDrains brings every engine's projected drain (freeAt's drainAt) up to date in one walk
// of the entries: Snapshot reads every engine's, and freeAt alone walks them once an engine.
func (r *Router) refreshDrains(t float64) {
	stale := false
	for i := range r.engines {
		if e := &r.engines[i]; e.streams > 0 && !e.drainOK {
			e.drainAt, stale = t, true
		}
	}
	if !stale {
		return
	}
	for k := range r.slots {
		s := &r.slots[k]
		if d := int(s.decode); d >= 0 && d < len(r.engines) {
			if e := &r.engines[d]; e.streams > 0 && !e.drainOK {
				e.drainAt = max(e.drainAt, r.residentEnd(t, s))
			}
		}
	}
	for i := range r.engines {
		if e := &r.engines[i]; e.streams > 0 {
			e.drainOK = true
		}
	}
}

// residentEnd projects when a dispatched request finishes decoding on its decode engine: its
// expected output tokens (less those already produced) at the engine's current step time.
// Other entries give t.
func (r *Router) residentEnd(t float64, e *entry) float64 {
	if e.phase != phasePrefilling && e.phase != phaseDecoding {
		return t
	}
	d := &r.engines[e.decode]
	step := d.stepSeconds(d.streams, d.kv)
	begin, left := max(e.projFirst, t), float64(e.output)
	if e.phase == phaseDecoding {
		begin, left = t, max(1, left-(t-e.firstAt)/step)
	}
	return begin + left*step
}

// matchPrefix looks the prefix up in the affinity index and returns the cached tokens per engine.
func (r *Router) matchPrefix(prefix []uint64) func(int) int {
	if r.aff == nil || len(prefix) == 0 {
		return noCache
	}
	r.aff.match(prefix)
	return r.aff.cachedTokens
}

func noCache(int) int { return 0 }

func (r *Router) resetPrefix() {
	if r.aff != nil {
		r.aff.reset()
	}
}

// bestDecode is the live decode engine with the lowest projected seconds per token for one
// more stream reserving need KV tokens, among those within stream and KV capacity; a prepared
// donor (Prepare) only when no other fits. With mustFit false and none within capacity it
// returns the lowest of all (for projections); -1 when none.
func (r *Router) bestDecode(need int64, mustFit bool, only subset) int {
	best, bestTier := -1, -1
	step := math.Inf(1)
	for _, i16 := range r.decodePool {
		i := int(i16)
		if !only.has(i16) {
			continue
		}
		e := &r.engines[i]
		tier := 0 // 2: fits; 1: fits but prepared; 0: beyond capacity
		if e.fits(need) {
			tier = 1
			if !e.prepared {
				tier = 2
			}
		}
		if mustFit && tier == 0 {
			continue
		}
		s := e.stepSeconds(e.streams+1, e.kv+need)
		if tier > bestTier || (tier == bestTier && s < step) {
			best, bestTier, step = i, tier, s
		}
	}
	return best
}

// Prepare marks the decode engine id as a donor being prepared for a move to prefill (the
// controller's decision names it, docs/role-control.md, "Preparing a donor"): new streams go to
// the other decode engines whenever one of them has room, so its residents drain below
// controller.thresholds.flip_resident_guard. At most one engine is prepared; "" (or an engine
// that is not a live decode engine) prepares none. Placement only: pricing, pools and residents
// are unchanged.
func (r *Router) Prepare(id string) {
	for i := range r.engines {
		e := &r.engines[i]
		e.prepared = e.id == id && e.role == fleet.Decode && e.live
	}
}

// enqueue puts an admitted offer at the tail of the waiting set with its projected engine.
func (r *Router) enqueue(slot int32, h Handle, tail int, tailDur float64) {
	e := &r.slots[slot]
	e.phase = phaseWaiting
	e.tailEngine, e.tailDur = int16(tail), tailDur
	if tail >= 0 {
		r.engines[tail].waitWork += tailDur
	}
	r.waiting.push(h)
	r.nWaiting++
	r.waitingTokens += e.prompt
}

// unqueue takes a waiting entry out of the waiting-set accounting (the ring skips it later).
func (r *Router) unqueue(e *entry) {
	if e.tailEngine >= 0 {
		w := &r.engines[e.tailEngine]
		w.waitWork = max(0, w.waitWork-e.tailDur)
	}
	e.tailEngine = -1
	r.nWaiting--
	r.waitingTokens -= e.prompt
}

// reproject recomputes the waiting-set projection from scratch (a pool changed).
func (r *Router) reproject(t float64) {
	for i := range r.engines {
		r.engines[i].waitWork = 0
	}
	for h := range r.waiting.all() {
		e, _, err := r.lookup(h)
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		tail, dur, _ := r.projectTail(t, int(e.prompt), e.prefix)
		e.tailEngine, e.tailDur = int16(tail), dur
		if tail >= 0 {
			r.engines[tail].waitWork += dur
		}
	}
}

// plan is a placement decided but not yet applied.
type plan struct {
	p, d       int
	start, dur float64
	first      float64 // projected first-token time
	need       int64
	why        Why
	other      float64 // the other path's projected first-token time, 0 when not priced
	work       float64 // local: the prefill seconds its chunks add to the decode engine's steps
	cost       float64 // local: the part of work the engine's streams need back (localCost)
}

// plan picks the engines for one request if an engine has room: the fallback engine for both
// phases once it has drained; else the disaggregated path (planDisaggregated) or the local one
// (planLocal), as router.local_prefill says. With auto, each request takes the path whose first
// token is projected sooner, local only when sooner by more than its cost to the decode
// engine's streams (localCost) and when they keep their TPOT and their room
// (docs/role-control.md section 3). A request no prefill engine has room for now goes local
// when that is sooner than where the projection starts it on a prefill engine, and waits
// otherwise.
func (r *Router) plan(t float64, prompt int, need int64, prefix []uint64, only subset) (plan, bool) {
	if r.fallback >= 0 {
		pl := plan{p: -1, d: -1, need: need}
		fb := &r.engines[r.fallback]
		if r.fallbackPending > 0 || fb.prefilling >= fb.prof.PrefillConcurrency || !fb.fits(need) || !only.has(r.fallback) {
			return pl, false // capacity holds on the fallback as everywhere (issue 8)
		}
		pl.p, pl.d = int(r.fallback), int(r.fallback)
		pl.dur, pl.start = fb.prefillSeconds(prompt), max(t, fb.busyUntil)+fb.foreignPrefillLeft(t)
		pl.first = pl.start + pl.dur
		return pl, true
	}
	mode := r.cfg.LocalPrefill
	local := mode != config.LocalPrefillOff && mode != ""
	cached := r.matchPrefix(prefix) // one match for both paths
	pl, ok, later := r.planDisaggregated(t, prompt, need, cached, only, local)
	if !local {
		r.resetPrefix()
		return pl, ok
	}
	lp, why := r.planLocal(t, prompt, need, cached, only, mode == config.LocalPrefillAuto)
	r.resetPrefix()
	if lp.p < 0 {
		pl.why = why
		return pl, ok
	}
	switch {
	case mode == config.LocalPrefillAlways:
		lp.why = WhyAlways
	case ok && pl.first <= lp.first+lp.cost:
		pl.why, pl.other = WhySooner, lp.first
		if pl.first > lp.first {
			pl.why = WhyCost
		}
		return pl, true
	case ok:
		lp.why = WhySooner
	case later > 0 && later <= lp.first+lp.cost:
		return pl, false // it waits for a prefill engine
	default:
		lp.why = WhyQueued
	}
	if ok {
		lp.other = pl.first
	} else {
		lp.other = later
	}
	return lp, true
}

// planDisaggregated picks the prefill engine on which the request completes first among those
// under prefill_concurrency (prefix blocks it holds are saved work), and the decode engine with
// the lowest projected seconds per token within capacity. When no prefill engine has room now
// and project is set, later is the first token the projection gives it on the prefill engine
// that frees first (0 when none).
func (r *Router) planDisaggregated(t float64, prompt int, need int64, cached func(int) int, only subset, project bool) (pl plan, ok bool, later float64) {
	pl = plan{p: -1, d: -1, need: need}
	done, anyDone, anyEngine := math.Inf(1), math.Inf(1), -1
	for _, i16 := range r.prefillPool {
		i := int(i16)
		c := &r.engines[i]
		if r.cfg.Handoff == config.HandoffPrefill && !only.has(i16) {
			continue
		}
		full := c.prefilling >= c.prof.PrefillConcurrency
		if full && !project {
			continue
		}
		dd := c.prefillSeconds(prompt - cached(i))
		s := r.prefillFree(t, i)
		if s+dd < anyDone {
			anyDone, anyEngine = s+dd, i
		}
		// An engine just moved to prefill may still hold decode streams whose KV is on its way
		// (their prefill ran elsewhere): an engine that runs prefill before decode would make
		// their first token wait behind every prefill placed on it. It takes prefill work once
		// they have their first token (docs/role-control.md, section 7).
		if full || c.streams > c.decoding {
			continue
		}
		if s+dd < done {
			pl.p, pl.dur, pl.start, done = i, dd, s, s+dd
		}
	}
	decodeOnly := only
	if r.cfg.Handoff == config.HandoffPrefill {
		decodeOnly = nil // the destination is the prefill engine
	}
	if pl.p < 0 {
		if project && anyEngine >= 0 {
			if d := r.bestDecode(need, false, decodeOnly); d >= 0 {
				de := &r.engines[d]
				later = anyDone + r.engines[anyEngine].prof.KVTransferS + de.stepSeconds(de.streams+1, de.kv+need)
			}
		}
		return pl, false, later
	}
	if pl.d = r.bestDecode(need, true, decodeOnly); pl.d < 0 {
		return pl, false, 0
	}
	de := &r.engines[pl.d]
	pl.first = pl.start + pl.dur + r.engines[pl.p].prof.KVTransferS + de.stepSeconds(de.streams+1, de.kv+need)
	return pl, true, 0
}

// planLocal picks the decode engine that would give the request its first token soonest by
// prefilling it itself, counting its cost (localCost: the lowest first token plus cost): one
// that can prefill (a profile with a prefill curve, and no in-place switch: an SGLang
// decode-mode server cannot), is not a donor being prepared, has room for the stream and for
// another prefill (prefill_concurrency), and holds at most router.local_prefill_max_tokens of
// its prompt uncached. Its prefill starts after the local prefill work already there and runs
// chunked beside the decode batch (localSeconds). With guard, the engine's streams must keep
// their step within localLimit: the step with one more stream, stretched by the local prefill
// placed there lately (decayed, localWorkAt) and this one's, at most half the TPOT SLO and the
// step that leaves them the share of its time they need (busyShare) (docs/role-control.md
// section 3). When none qualifies, p is -1 and why says what stopped the closest candidate.
func (r *Router) planLocal(t float64, prompt int, need int64, cached func(int) int, only subset, guard bool) (plan, Why) {
	pl := plan{p: -1, d: -1, need: need}
	why := WhyNoRoom
	var out, rate float64
	if guard {
		out = float64(r.expectedOutput())
		// The output the demand asks of each decode engine, as placement spreads it.
		rate = r.demand.estimate(t, int64(out)).Priced.OutputTokensPerS / float64(max(len(r.decodePool), 1))
	}
	for _, i16 := range r.decodePool {
		i := int(i16)
		e := &r.engines[i]
		if !only.has(i16) || e.inPlace || e.prof.Prefill == nil || e.prepared || !e.fits(need) || e.prefilling >= e.prof.PrefillConcurrency {
			continue
		}
		n := prompt - cached(i)
		if n > r.cfg.LocalPrefillMaxTokens {
			why = max(why, WhyTooLong)
			continue
		}
		start := max(t, e.busyUntil) + e.foreignPrefillLeft(t)
		work := e.prefillSeconds(n)
		var cost float64
		if guard {
			lately := e.localWorkAt(t, out)
			step := e.stepSeconds(e.streams+1, e.kv+need)
			busy := e.busyShare(max(rate, e.outputRate(lately, out)), e.streams+1, e.kv+need)
			if e.streams > 0 && localStep(step, lately+work, out) > r.localLimit(step, busy) {
				why = WhyTPOT
				continue
			}
			cost = localCost(work, busy)
		}
		dur := e.localSeconds(n)
		if first := start + dur; pl.p < 0 || first+cost < pl.first+pl.cost {
			pl.p, pl.d, pl.start, pl.dur, pl.first, pl.work, pl.cost = i, i, start, dur, first, work, cost
		}
	}
	return pl, why
}

// localStep is the seconds per token a stream of an engine is projected while it prefills
// locally: its step (with one more stream), stretched by the share of a stream's life (out
// tokens at that step) that work seconds of local prefill take — the prefill the chunks add to
// its steps, of the local prefill placed on it lately and this one's (+Inf when they fill the
// life).
func localStep(step, work, out float64) float64 {
	if share := work / (out * step); share < 1 {
		return step / (1 - share)
	}
	return math.Inf(1)
}

// localWorkAt is the prefill seconds of the local prefill placed on e lately, as of t: decayed
// with the time constant of a stream's expected life there (out tokens at its step), the span
// its streams' steps feel it over.
func (e *engine) localWorkAt(t, out float64) float64 {
	if e.localWork == 0 {
		return 0
	}
	return e.localWork * math.Exp(-(t-e.localAt)/(out*e.stepSeconds(max(e.streams, 1), e.kv)))
}

// outputRate is the output tokens a second e's streams make: their step, stretched by work
// seconds of local prefill placed on e lately (localWorkAt, out tokens a stream).
func (e *engine) outputRate(work, out float64) float64 {
	if e.streams == 0 {
		return 0
	}
	step := e.stepSeconds(e.streams, e.kv)
	return float64(e.streams) * max(0, 1-work/(out*step)) / step
}

// localLimit is the most a stream's step may stretch to by local prefill, when it is step on an
// engine whose streams need busy of its time (busyShare: the output asked of it, the demand's
// share or what its streams make now when more): localTPOTShare of the TPOT SLO, and the step
// that leaves the engine's streams the share of its time they need. They live
// longer in proportion to their step while the output asked of the engine holds (Little's law),
// and its step grows with them: it carries at most the tokens a second of its fullest batch, so
// local prefill may take no more of its time than 1 − busyShare (docs/role-control.md section
// 3). The stretched step step/(1 − share) at that share is step/busy.
func (r *Router) localLimit(step, busy float64) float64 {
	if busy >= 1 {
		return step
	}
	return min(r.slo.TPOTS*localTPOTShare, step/busy) // an idle engine (busy 0) spares all
}

// busyShare is the share of e's time rate output tokens a second take at its fullest batch
// (fullBatch of streams streams reserving kv tokens; 1 or more: it cannot carry them).
func (e *engine) busyShare(rate float64, streams int, kv int64) float64 {
	full, perKV := e.fullBatch(streams, kv)
	if full < 1 {
		return 1
	}
	return rate * e.stepSeconds(int(full), int64(full*perKV)) / full
}

// fullBatch is the most streams e decodes at once at the KV per stream of streams streams
// reserving kv tokens (max_streams, or fewer when its KV cache fills first), and that KV per
// stream.
func (e *engine) fullBatch(streams int, kv int64) (full, perKV float64) {
	d := e.prof.Decode
	full = float64(d.MaxStreams)
	perKV = float64(kv) / float64(max(streams, 1))
	if perKV > 0 && float64(d.MaxKVTokens) < full*perKV {
		full = float64(d.MaxKVTokens) / perKV
	}
	return full, perKV
}

// localCost is what a local prefill of work prefill seconds costs an engine whose streams need
// busy of its time (busyShare): the part of work they would have used. Local must bring the
// first token sooner than the disaggregated path by at least that: on an idle engine any gain
// does, on one its streams need whole the gain must repay all the decode time it takes — the
// prefill engines' time costs no stream a step (docs/role-control.md section 3).
func localCost(work, busy float64) float64 {
	switch { // branches, not the float min and max: this runs for every decode engine of a placement
	case busy <= 0:
		return 0
	case busy >= 1:
		return work
	}
	return work * busy
}

// localTPOTShare is the share of the TPOT SLO a stream's mean step may reach by local prefill.
// The SLO holds for each request, not for the mean: the local prefill a short stream meets
// varies, and at the SLO itself half of them would miss it (measured, docs/role-control.md
// section 3: `phases` 300 s, from 1 down to 0.5, 0.944 → 0.978).
const localTPOTShare = 0.5

// localSeconds projects a local prefill of tokens uncached prompt tokens on a decode engine, to
// its first token: its prefill curve, and, chunked (profiles.X.chunked_prefill), the decode
// steps its chunks ride on — as many as the budget left by the batch's tokens takes to carry
// the prompt. Unchunked, the batch waits while the prompt is prefilled in one step.
func (e *engine) localSeconds(tokens int) float64 {
	d := e.prefillSeconds(tokens)
	b := e.prof.ChunkedPrefill.BudgetTokens
	if b <= 0 || e.streams == 0 {
		return d
	}
	room := max(b-e.streams-e.foreign, 1)
	chunks := (max(tokens, 1) + room - 1) / room
	return d + float64(chunks)*e.stepSeconds(e.streams, e.kv)
}

// commit applies a plan to an admitted or waiting request.
func (r *Router) commit(t float64, slot int32, pl plan) Placement {
	e := &r.slots[slot]
	if e.phase == phaseWaiting {
		r.unqueue(e)
	}
	pe, de := &r.engines[pl.p], &r.engines[pl.d]
	pe.prefilling++
	pe.queued += pl.dur
	pe.busyUntil = max(t, pe.busyUntil) + pl.dur
	kind := Disaggregated
	switch {
	case pl.p != pl.d:
		r.counters.Dispatched.Disaggregated++
	case pl.p == int(r.fallback):
		kind = Aggregate
		r.counters.Dispatched.Aggregate++
	default:
		kind = Local
		r.counters.Dispatched.Aggregate++ // both phases on one engine (docs: the contract's two kinds)
		r.counters.Dispatched.Local++
		r.counters.LocalPromptTokens += uint64(e.prompt)
		pe.localWork = pe.localWorkAt(t, float64(r.expectedOutput())) + pl.work
		pe.localAt, pe.localUntil = t, max(pe.localUntil, pl.start+pl.dur)
	}
	// A prefill beside decode residents of another request is not like with like for the
	// correction (a prefill engine's donor residents); nor is a local prefill, chunked beside a
	// batch that comes and goes: an engine's prefill samples are its prefill role's (the
	// controller's profile-coverage gate counts them).
	e.mixed = pe.streams > 0 && kind == Disaggregated || kind == Local
	if pl.p == pl.d {
		pe.both++
	}
	de.streams++
	de.kv += pl.need
	de.drainOK = false
	e.phase, e.aggregate = phasePrefilling, pl.p == pl.d
	e.prefill, e.decode = int16(pl.p), int16(pl.d)
	e.dispatchAt, e.dur, e.kv, e.projFirst = t, pl.dur, pl.need, pl.first
	step := de.stepSeconds(de.streams, de.kv)
	e.handoff = pl.first - pl.start - pl.dur
	e.curveDur, e.curveStep = pl.dur/pe.corr[0], step/de.corr[1]
	e.seq = r.seq
	r.seq++
	r.nPrefilling++
	if r.aff != nil && len(e.prefix) > 0 {
		r.aff.record(e.prefix, int16(pl.p))
	}
	e.prefix = nil
	if e.nonStream {
		r.unary.push(pl.start+pl.dur, uint64(makeHandle(slot, e.gen)))
	} else {
		r.inFlight.push(makeHandle(slot, e.gen))
	}
	return Placement{
		Kind: kind, Prefill: pe.id, Decode: de.id, PrefillAddr: pe.addr, DecodeAddr: de.addr,
		ProjectedTTFT: e.projFirst - e.arrival, Why: pl.why, OtherTTFT: max(0, pl.other-e.arrival),
	}
}

// pump dispatches from the head of the waiting set, in strict FIFO order, while engines have
// room; each dispatch goes to the outbox.
func (r *Router) pump(t float64) {
	for r.nWaiting > 0 {
		h, _ := r.waiting.peek()
		e, slot, err := r.lookup(h)
		if err != nil || e.phase != phaseWaiting {
			r.waiting.pop()
			continue
		}
		var only subset
		if hint, ok := r.subsets[slot]; ok {
			only = r.subsetOf(hint)
		}
		pl, ok := r.plan(t, int(e.prompt), e.prompt+e.output, e.prefix, only)
		if !ok {
			return
		}
		r.waiting.pop()
		r.outbox = append(r.outbox, Outcome{Handle: h, Status: Dispatched, Placement: r.commit(t, slot, pl)})
	}
	for r.waiting.len() > 0 { // drop stale handles left at the head
		h, _ := r.waiting.peek()
		if e, _, err := r.lookup(h); err == nil && e.phase == phaseWaiting {
			return
		}
		r.waiting.pop()
	}
}
