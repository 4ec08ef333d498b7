package router

// Residents: what happens to a dispatched request to its end (first token, completion,
// failure, cancellation), the online profile correction it feeds, and shutdown.

import (
	"math"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// Waiting reports whether the request is still in the waiting set.
func (r *Router) Waiting(h Handle) bool {
	e, _, err := r.lookup(h)
	return err == nil && e.phase == phaseWaiting
}

// FirstToken records a dispatched request's first token: it leaves prefill residency (its
// prefill engine gets room) and becomes a decode resident. The observation corrects the prefill
// engine's profile.
func (r *Router) FirstToken(now time.Time, h Handle) error {
	t := r.at(now)
	e, _, err := r.lookup(h)
	if err != nil {
		return err
	}
	if e.phase != phasePrefilling {
		return ErrPhase
	}
	r.endPrefill(t, e, !e.nonStream)
	r.engines[r.destination(e)].failStreak = 0
	r.pump(t)
	return nil
}

// destination is the engine Envoy sends a placed request to (router.handoff), the one whose
// failures passive health checking counts.
func (r *Router) destination(e *entry) int16 {
	if r.cfg.Handoff == config.HandoffPrefill {
		return e.prefill
	}
	return e.decode
}

// blamed is the engine a bodiless upstream failure counts against (FailUpstreamNoBody): the
// prefill engine of a disaggregated request sent to its decode engine, whose P/D sidecar
// reports a prefill leg it could not run that way; else the destination. One engine's death
// must not fail the engines that relay its failures.
func (r *Router) blamed(e *entry) int16 {
	if r.cfg.Handoff == config.HandoffDecode && !e.aggregate && e.prefill >= 0 && e.prefill != e.decode {
		return e.prefill
	}
	return r.destination(e)
}

// endPrefill moves a prefilling entry to decoding.
func (r *Router) endPrefill(t float64, e *entry, observed bool) {
	p := &r.engines[e.prefill]
	p.prefilling--
	if e.prefill == e.decode {
		p.both--
	}
	p.queued = max(0, p.queued-e.dur)
	if p.prefilling == 0 {
		p.queued = 0
		p.busyUntil = min(p.busyUntil, t)
	} else {
		p.busyUntil = t + p.queued
	}
	if observed {
		// Like with like: the prefill ran from when the engine was free of the prefill before
		// it (an engine prefills in FIFO order) or its dispatch, to its first token less the
		// handoff; the waiting on the engine is not prefill time.
		// Foreign prefill work on the engine (Observe) is not this one's either; nor is a
		// first token its decode engine gave from a step widened by a local prefill's chunk
		// (the handoff prices a plain step, and the decode correction skips such streams too).
		// A handed-off request joins its decode engine's batch at the next step boundary, half
		// a step on average after its KV lands: that wait is not prefill time either.
		end, sample := t-e.handoff, e.curveDur > 0 && !e.mixed && p.obs.foreignUntil <= e.dispatchAt
		handed := !e.aggregate && e.prefill != e.decode
		if handed {
			d := &r.engines[e.decode]
			end -= 0.5 * e.curveStep * d.corr[1]
			sample = sample && d.localUntil <= end
		}
		if sample {
			r.correct(p, 0, end-max(e.dispatchAt, p.prefillEnd), e.curveDur)
		}
		p.prefillEnd = max(p.prefillEnd, end)
		if handed {
			r.handedOff(p, &r.engines[e.decode])
		}
	}
	e.phase, e.firstAt = phaseDecoding, t
	r.sumFirstAt += t
	r.engines[e.decode].decoding++
	r.engines[e.decode].drainOK = false
	r.nPrefilling--
	r.nDecoding++
	r.awaitingOutput -= e.output
}

// correct folds one sample, observed seconds against the curve's, into an engine's correction
// for a phase: the factor is the ratio of their sums, each an EWMA of correctionEWMA per sample
// (the first sample after a start or a restore takes the factor as its prior, at its own
// weight). A ratio of sums, not a mean of ratios: each sample weighs as the curve seconds it
// covers, so the factor prices the engine's time (a long prompt holds it longer than a short
// one), and a short prompt, whose observed prefill is mostly the noise of when its first token
// came (the decode step it waited for), moves it little (docs/role-control.md section 4).
func (r *Router) correct(e *engine, ph int, observed, curve float64) {
	factor := observed / curve
	if math.IsNaN(factor) || math.IsInf(factor, 0) || curve <= 0 {
		return
	}
	observed = curve * min(max(factor, minCorrection), maxCorrection)
	if e.curveSum[ph] <= 0 {
		e.curveSum[ph] = curve
	}
	sum := (1-correctionEWMA)*e.curveSum[ph] + correctionEWMA*curve
	c := ((1-correctionEWMA)*e.corr[ph]*e.curveSum[ph] + correctionEWMA*observed) / sum
	e.corr[ph], e.curveSum[ph] = min(max(c, minCorrection), maxCorrection), sum
	e.samples[ph]++
}

// decay moves every correction factor toward 1 for the time since the last decay; it runs at
// most every decayEveryS.
func (r *Router) decay(t float64) {
	if t < r.decayAt {
		return
	}
	k := math.Exp2(-(t - r.decayAt + decayEveryS) / correctionHalfLifeS)
	r.decayAt = t + decayEveryS
	for i := range r.engines {
		for ph := range r.engines[i].corr {
			c := &r.engines[i].corr[ph]
			*c = 1 + (*c-1)*k
		}
	}
}

// Complete records the end of a dispatched request with outputTokens generated (0 when
// unknown). A request that ends without a first token seen (a non-streaming response) leaves
// prefill residency now. The count comes from the engine and is not trusted: it is clamped to
// what the request could have generated (its max_tokens, else the KV room the largest engine
// leaves after its prompt) before it feeds the mean output length and the decode correction.
func (r *Router) Complete(now time.Time, h Handle, outputTokens int) error {
	t := r.at(now)
	e, slot, err := r.dispatched(h)
	if err != nil {
		return err
	}
	limit := r.maxKV - e.prompt
	if e.explicit {
		limit = e.output
	}
	out := min(int64(max(outputTokens, 0)), max(limit, 1))
	if out > 0 {
		dur := 0.0
		if e.phase == phaseDecoding && !e.nonStream {
			dur = t - e.firstAt
		}
		r.out.add(t, float64(out), dur)
	}
	// A stream whose engine prefilled locally while it decoded had its steps widened by that
	// work, which local placement prices itself (localStep): it is no sample of the decode curve.
	if d := &r.engines[e.decode]; e.phase == phaseDecoding && !e.timedOut && !e.nonStream && out >= 2 && e.curveStep > 0 && d.localUntil <= e.firstAt {
		r.correct(d, 1, (t-e.firstAt)/float64(out-1), e.curveStep)
	}
	r.engines[r.destination(e)].failStreak = 0
	r.counters.Completed++
	r.finish(t, e, slot)
	return nil
}

// Fail records a dispatched request that failed. An upstream failure counts against the
// engine the request was sent to: health.passive.consecutive_failures of them in a row eject
// it from placement at once (Take reports it for the fleet).
func (r *Router) Fail(now time.Time, h Handle, why Failure) error {
	t := r.at(now)
	e, slot, err := r.dispatched(h)
	if err != nil {
		return err
	}
	r.counters.Failed++
	switch why {
	case FailUpstream:
		r.failUpstream(t, r.destination(e))
	case FailUpstreamNoBody:
		r.failUpstream(t, r.blamed(e))
	}
	r.finish(t, e, slot)
	return nil
}

// failUpstream counts one upstream failure of an engine and ejects it at the threshold.
func (r *Router) failUpstream(t float64, i int16) {
	d := &r.engines[i]
	d.failStreak++
	if r.passive == 0 || d.failStreak < r.passive || d.ejected || !d.live {
		return
	}
	d.ejected, d.live = true, false
	r.counters.Ejections++
	r.ejections = append(r.ejections, Ejection{Engine: d.id, Failures: d.failStreak, AtS: t})
	r.updateFallback(t)
	r.rebuildPools()
	r.reproject(t)
}

// Shutdown turns the router away from new work: every request still waiting is rejected
// (ShuttingDown, through Take) and so is every later offer. Dispatched requests keep their
// residency until they end.
func (r *Router) Shutdown(now time.Time) {
	r.at(now)
	r.closed = true
	for r.waiting.len() > 0 {
		h, _ := r.waiting.peek()
		r.waiting.pop()
		e, slot, err := r.lookup(h)
		if err != nil || e.phase != phaseWaiting {
			continue
		}
		r.turnAway(h, e, slot, ShuttingDown)
	}
}

// unwait takes a waiting request out of the waiting set and frees it.
func (r *Router) unwait(e *entry, slot int32) {
	r.unqueue(e)
	r.awaitingOutput -= e.output
	r.release(slot)
}

// turnAway rejects a waiting request (WaitTimeout, ShuttingDown) through the outbox.
func (r *Router) turnAway(h Handle, e *entry, slot int32, c Code) {
	r.unwait(e, slot)
	r.counters.Overflow.Add(c)
	o := Outcome{Handle: h, Status: Rejected, Code: c}
	if c == ShuttingDown {
		o.RetryAfterS = 1
	}
	r.outbox = append(r.outbox, o)
}

// Cancel records a client cancel: a waiting request leaves the waiting set, an in-flight one
// releases what it held.
func (r *Router) Cancel(now time.Time, h Handle) error {
	t := r.at(now)
	e, slot, err := r.lookup(h)
	if err != nil {
		return err
	}
	if e.phase == phaseWaiting {
		r.unwait(e, slot)
		r.counters.Cancelled.Waiting++
		r.pump(t)
		return nil
	}
	r.counters.Cancelled.InFlight++
	r.finish(t, e, slot)
	return nil
}

// finish releases an in-flight request's residency and frees it.
func (r *Router) finish(t float64, e *entry, slot int32) {
	if e.phase == phasePrefilling {
		r.endPrefill(t, e, false)
	}
	d := &r.engines[e.decode]
	d.streams--
	d.decoding--
	d.kv -= e.kv
	d.drainOK = false
	r.nDecoding--
	r.sumFirstAt -= e.firstAt
	if r.nDecoding == 0 {
		r.sumFirstAt = 0 // no rounding left behind
	}
	if e.decode == r.fallback && e.seq < r.fallbackSeq && r.fallbackPending > 0 {
		r.fallbackPending--
	}
	r.release(slot)
	r.pump(t)
}

// RestoreCorrections puts back each engine's online profile correction from an earlier run
// (factors clamped to their bounds, sample counts as saved), by engine id; ids the router does
// not know are ignored. Call it before placing anything.
func (r *Router) RestoreCorrections(saved map[string]Correction) {
	for id, c := range saved {
		i, ok := r.byID[id]
		if !ok {
			continue
		}
		e := &r.engines[i]
		for ph, f := range [2]float64{c.Prefill, c.Decode} {
			if !math.IsNaN(f) && f > 0 {
				e.corr[ph] = min(max(f, minCorrection), maxCorrection)
			}
		}
		e.samples = [2]int{max(c.PrefillSamples, 0), max(c.DecodeSamples, 0)}
	}
}
