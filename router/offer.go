package router

// Offers: admission of a request into the waiting set or its rejection, and the expected
// output length of requests that do not say.

import (
	"math"
	"time"
)

// Invalid counts an offer answered 400 or 413 (it goes no further).
func (r *Router) Invalid() {
	r.counters.Offers++
	r.counters.Invalid++
}

// Offer admits, queues or rejects one valid offer. An admitted offer is dispatched at once when
// the waiting set is empty and an engine has room (Status Dispatched); otherwise it waits
// (Status Waiting) and its placement or rejection comes later through Take.
func (r *Router) Offer(now time.Time, o Offer) Outcome {
	t := r.at(now)
	r.counters.Offers++
	r.decay(t)
	o.Prefix = o.Prefix[:min(len(o.Prefix), MaxPrefixBlocks)]
	prompt := int64(max(o.PromptTokens, 0))
	// The KV tokens it needs at least: its prompt and max_tokens, or one output token.
	if need := addSat(prompt, int64(max(o.MaxTokens, 1))); r.maxKV > 0 && need > r.maxKV {
		r.counters.Invalid++
		r.counters.ContextLengthExceeded++
		return Outcome{Status: Rejected, Code: ContextLengthExceeded, Need: need, Limit: r.maxKV}
	}
	if r.closed {
		r.counters.Admitted++
		return r.reject(ShuttingDown, 1)
	}
	fallback := r.fallback >= 0
	if !fallback && (r.livePrefill == 0 || len(r.decodePool) == 0) {
		return r.reject(NoCapacity, 0)
	}
	if r.nWaiting >= r.cfg.WaitingSet.Capacity {
		return r.reject(WaitingSetFull, 1)
	}
	var only subset
	if o.Subset != nil {
		if only = r.subsetOf(o.Subset); !r.canServe(only) {
			return r.reject(SubsetUnavailable, 1)
		}
	}
	out, explicit := int64(o.MaxTokens), o.MaxTokens > 0
	if !explicit { // an estimate never makes a request unplaceable
		out = max(1, min(r.expectedOutput(), r.maxKV-prompt))
	}
	need := prompt + out
	var (
		pl      plan
		atOnce  bool // placed at once
		tail    = -1
		tailDur float64
		ttft    float64
	)
	if r.nWaiting == 0 {
		pl, atOnce = r.plan(t, o.PromptTokens, need, o.Prefix, only)
	}
	if atOnce {
		ttft = pl.first - t
	} else {
		var done float64
		tail, tailDur, done = r.projectTail(t, o.PromptTokens, o.Prefix)
		ttft = done - t
		if !fallback {
			if d := r.bestDecode(need, false, nil); d >= 0 {
				ttft += r.engines[tail].prof.KVTransferS + r.engines[d].stepSeconds(r.engines[d].streams+1, r.engines[d].kv+need)
			}
		} else if r.fallbackPending > 0 && ttft > r.cfg.WaitingSet.MaxWaitS {
			return r.reject(FallbackBusy, retryAfter(ttft-r.cfg.WaitingSet.MaxWaitS))
		}
	}
	if rr := r.cfg.Admission.RejectRatio; rr > 0 && ttft > rr*r.slo.TTFTS {
		return r.reject(PredictedSLOMiss, retryAfter(ttft-r.slo.TTFTS))
	}

	r.counters.Admitted++
	r.demand.add(t, prompt, out, !explicit)
	slot := r.alloc()
	e := &r.slots[slot]
	*e = entry{gen: e.gen, phase: phaseAdmitted, prompt: prompt, output: out, explicit: explicit, nonStream: o.NonStreaming,
		arrival: t, id: o.ID, prefix: o.Prefix, prefill: -1, decode: -1, tailEngine: -1}
	h := makeHandle(slot, e.gen)
	r.awaitingOutput += out
	if !atOnce && ttft > r.slo.TTFTS && !r.urgent { // a request placed at once never triggers
		r.urgent = true
		r.trigger = Trigger{Request: o.ID, Handle: h, ProjectedTTFT: ttft, AtS: t}
	}
	if atOnce {
		return Outcome{Handle: h, Status: Dispatched, Placement: r.commit(t, slot, pl)}
	}
	r.enqueue(slot, h, tail, tailDur)
	if o.Subset != nil { // by address: resolved again at each placement attempt (engines come and go)
		if r.subsets == nil {
			r.subsets = map[int32][]string{}
		}
		r.subsets[slot] = o.Subset
	}
	return Outcome{Handle: h, Status: Waiting}
}

// addSat adds two non-negative counts, saturating instead of overflowing.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func retryAfter(s float64) int { return max(1, int(math.Ceil(s))) }

func (r *Router) reject(c Code, retry int) Outcome {
	r.counters.Overflow.Add(c)
	if c.Status() != 429 && c != ShuttingDown {
		retry = 0
	}
	return Outcome{Status: Rejected, Code: c, RetryAfterS: retry}
}

// expectedOutput is the expected output tokens of a request without max_tokens: the running
// mean of observed output lengths, else router.default_output_tokens (docs/role-control.md
// section 2). Observations are clamped (Complete), so the mean stays within engine limits.
func (r *Router) expectedOutput() int64 {
	o := &r.out
	if o.n <= 0 {
		return int64(r.cfg.DefaultOutputTokens)
	}
	tokens := o.tokens
	// The streams still decoding are counted too, at the tokens their age is worth (the
	// observed seconds per token): completions alone are the short outputs first — at the
	// start of a load, or of a longer mix, the mean of the finished read 130 tokens where the
	// load's was 210 — and the decode pool was priced as carrying far fewer streams than it
	// would (docs/role-control.md, section 2).
	if age := float64(r.nDecoding)*r.now - r.sumFirstAt; age > 0 && o.dur > 0 && o.tokens > 0 {
		tokens += age / (o.dur / o.tokens) / o.decay(r.now) // the sums are as of o.at
	}
	return min(max(1, int64(tokens/o.n)), max(r.maxKV, 1)) // no output outgrows the largest engine
}

// outputs are the observed output lengths, exponentially decayed (half-life outputHalfLifeS) so
// the estimate follows a changing mix: completions, their output tokens and their decode
// seconds (first token to the end), as of at.
type outputs struct {
	at, n, tokens, dur float64
}

// outputHalfLifeS is the half-life of the observed output lengths.
const outputHalfLifeS = 30.0

// decay is the factor that brings the sums from o.at to t (the sums' ratio does not change).
func (o *outputs) decay(t float64) float64 { return math.Exp2(-(t - o.at) / outputHalfLifeS) }

// add records one completion at t of tokens output tokens decoded over dur seconds.
func (o *outputs) add(t float64, tokens, dur float64) {
	f := o.decay(t)
	o.n, o.tokens, o.dur, o.at = o.n*f+1, o.tokens*f+tokens, o.dur*f+dur, t
}
