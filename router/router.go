// Package router is Narwhal's placement core: the bounded FIFO waiting set, predictive
// admission, dispatch gating by prefill concurrency, the FIFO completion projection, placement
// of disaggregated and aggregate (fallback) requests, the prefix-affinity index, demand
// estimates, online profile correction, and the demand accounting counters
// (docs/role-control.md sections 1-4 and 8; README).
//
// Router is a deterministic state machine: it takes events with the current time as an
// argument, owns no goroutines, does no I/O and reads no clock. It is not safe for concurrent
// use; a live wrapper serializes calls. The same code runs in real time and in virtual time.
package router

import (
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// The online profile correction (docs/role-control.md section 4): each sample is an observed/curve
// factor, folded in with weight correctionEWMA and clamped to [minCorrection, maxCorrection].
// Without samples a factor decays toward 1, halfway every correctionHalfLifeS (applied every
// decayEveryS), so that a factor that keeps its engine from getting traffic cannot starve it
// for long: from the bound 4 it is within 10% of 1 after about 5 half-lives.
const (
	minCorrection       = 0.25
	maxCorrection       = 4
	correctionEWMA      = 0.2
	correctionHalfLifeS = 30.0
	decayEveryS         = 1.0
)

type phase uint8

const (
	phaseFree     phase = iota
	phaseAdmitted       // inside Offer, before it is queued or dispatched
	phaseWaiting
	phasePrefilling
	phaseDecoding
)

// entry is one admitted request: its immutable facts and where it is. Small on purpose.
type entry struct {
	gen        uint32
	phase      phase
	aggregate  bool
	prefill    int16 // engine indices once dispatched
	decode     int16
	tailEngine int16 // the engine the waiting-set projection assigned, while waiting
	explicit   bool  // output is the request's own max_tokens
	mixed      bool  // its prefill engine still streamed decode residents at dispatch: no correction sample
	nonStream  bool  // Offer.NonStreaming
	timedOut   bool  // no first token within router.first_token_timeout_s
	prompt     int64
	output     int64 // expected output tokens
	seq        uint64
	arrival    float64
	dispatchAt float64
	firstAt    float64
	dur        float64 // projected prefill seconds on its prefill engine
	projFirst  float64 // projected first-token time
	handoff    float64 // projected seconds from prefill end to the first token: kv transfer + one decode step
	curveDur   float64 // the prefill curve's seconds for it, uncorrected
	curveStep  float64 // the decode curve's step seconds when dispatched, uncorrected
	tailDur    float64 // projected prefill seconds on tailEngine
	kv         int64   // KV tokens reserved on the decode engine
	id         string
	prefix     []uint64 // until dispatch
}

// engine is one engine's load as the router tracks it.
type engine struct {
	id, addr   string
	role       fleet.Role
	live       bool
	prof       config.Profile
	corr       [2]float64 // prefill, decode correction factors
	samples    [2]int
	prefilling int     // prefill residents: dispatched here, no first token yet
	queued     float64 // projected prefill seconds of those residents
	busyUntil  float64 // projected end of the prefill work dispatched here (prefill work only)
	drainAt    float64 // projected end of its decode residents' work, while drainOK
	drainOK    bool    // drainAt is current (reset whenever its residents change)
	waitWork   float64 // projected prefill seconds of waiting requests the projection assigned here
	streams    int     // streams placed with this decode engine, not finished (decoding or reserved)
	decoding   int     // those of them decoding here now (first token seen); the rest still prefill elsewhere
	kv         int64   // KV tokens they reserve
	prefillEnd float64 // when its last observed prefill ended (first token less the handoff)
	failStreak int     // upstream failures in a row of requests sent to this engine
	ejected    bool    // passive health took it out of placement; cleared once the fleet agrees
	prepared   bool    // a decode donor being prepared (Prepare): new streams go elsewhere when they fit
	// gone: the engine left the fleet. Its slot stays while residents hold its index (they
	// finish where they are); a slot without residents takes the next engine that joins.
	gone bool
}

func (e *engine) prefillSeconds(tokens int) float64 {
	return e.prof.Prefill.Seconds(max(tokens, 1)) * e.corr[0]
}

func (e *engine) stepSeconds(streams int, kv int64) float64 {
	return e.prof.Decode.StepSeconds(streams, int(kv)) * e.corr[1]
}

func (e *engine) canPrefill() bool { return e.live && e.prof.Prefill != nil }

// fits reports whether one more stream reserving need KV tokens fits the engine.
func (e *engine) fits(need int64) bool {
	d := e.prof.Decode
	return d != nil && e.streams+1 <= d.MaxStreams && e.kv+need <= int64(d.MaxKVTokens)
}

// Router places requests. Create it with New.
type Router struct {
	cfg      config.Router
	slo      config.SLO
	profiles map[string]config.Profile
	epoch    time.Time
	now      float64

	engines []engine
	byID    map[string]int16
	// prefillPool holds the engines that take prefill work now: the live prefill engines, or
	// the fallback engine; decodePool the live decode engines (not the fallback). Rebuilt on
	// every fleet change.
	prefillPool, decodePool []int16
	livePrefill             int

	slots    []entry
	free     []int32
	waiting  ring    // admitted offers in arrival order (lazy removal)
	inFlight ring    // dispatched streaming requests in dispatch order, for first-token timeouts
	unary    minHeap // dispatched non-streaming requests (handles) by projected prefill completion

	nWaiting, nPrefilling, nDecoding int
	waitingTokens, awaitingOutput    int64

	decayAt     float64 // when the correction factors next decay toward 1
	lastTimeout float64 // when the latest first-token timeout happened
	maxKV       int64   // the most KV tokens any engine holds: a request needing more can never be placed
	passive     int     // health.passive.consecutive_failures (0: off)
	closed      bool    // Shutdown ran: every offer is turned away

	counters  Counters
	demand    demand
	ejections []Ejection
	out       outputs // observed output lengths, for the expected output of a request without max_tokens
	// sumFirstAt is the sum of the first-token times of the decoding streams (their age:
	// nDecoding·now − sumFirstAt).
	sumFirstAt float64
	aff        *affinity

	fallback        int16 // the aggregate fallback engine, or -1
	fallbackSeq     uint64
	fallbackPending int // decode residents it had when chosen, not yet finished
	fallbackDrain   float64
	seq             uint64

	pricing pricing // Price's scratch space
	outbox  []Outcome
	trigger Trigger
	urgent  bool
}

// New returns a router for a validated config and the fleet's engines at now (the router's
// epoch). The engines, their roles, lifecycles and addresses then change through SetFleet.
func New(cfg *config.Config, snap fleet.Snapshot, now time.Time) *Router {
	r := &Router{
		cfg: cfg.Router, slo: cfg.SLO, epoch: now, profiles: cfg.Profiles,
		byID:     make(map[string]int16, len(snap.Engines)),
		demand:   newDemand(cfg.Router.Demand.ShortHorizonS, cfg.Router.Demand.LongHorizonS),
		fallback: -1, decayAt: decayEveryS,
	}
	r.passive = cfg.Health.Passive.ConsecutiveFailures
	if cfg.Router.PrefixAffinity.Enabled {
		r.aff = newAffinity(cfg.Router.PrefixAffinity.Entries, cfg.Router.PrefixAffinity.BlockTokens, len(snap.Engines))
	}
	r.SetFleet(now, snap)
	return r
}

// MaxEngines is the most engines a router tracks at once: the fleet's, and those that left
// it while requests still held them.
const MaxEngines = math.MaxInt16

// join gives an engine that joined the fleet a slot: one left by an engine that is gone and
// holds no request any more, else a new one. Its correction factors start at 1.
func (r *Router) join(fe *fleet.Engine) (int16, bool) {
	i := slices.IndexFunc(r.engines, func(e engine) bool {
		return e.gone && e.prefilling == 0 && e.streams == 0
	})
	if i < 0 {
		if len(r.engines) >= MaxEngines {
			return 0, false
		}
		i = len(r.engines)
		r.engines = append(r.engines, engine{})
		r.aff.grow(len(r.engines))
	} else {
		r.aff.forget(int16(i)) // the prefixes the engine gone held are not the new one's
		if i == int(r.fallback) {
			r.fallback = -1 // chosen afresh for the fleet as it is now (updateFallback)
		}
	}
	r.engines[i] = engine{id: fe.ID, prof: r.profiles[fe.Profile], corr: [2]float64{1, 1}}
	r.byID[fe.ID] = int16(i)
	return int16(i), true
}

// leave marks the engines the fleet no longer has gone: out of placement at once, their
// residents finishing where they are.
func (r *Router) leave(snap *fleet.Snapshot) {
	ids := snap.IDs()
	for id, i := range r.byID {
		if _, ok := ids[id]; ok {
			continue
		}
		e := &r.engines[i]
		e.gone, e.live, e.prepared, e.ejected, e.failStreak = true, false, false, false, 0
		delete(r.byID, id)
	}
}

// at converts a time to seconds since the epoch; time never goes back.
func (r *Router) at(now time.Time) float64 {
	if t := now.Sub(r.epoch).Seconds(); t > r.now {
		r.now = t
	}
	return r.now
}

// Time converts seconds since the router's epoch back to a time (config.TimeAt: a deadline
// handed back to Tick is reached).
func (r *Router) Time(s float64) time.Time { return config.TimeAt(r.epoch, s) }

// SetFleet applies the fleet's members, roles, lifecycles and addresses: an engine that joined
// gets a slot, one that left leaves placement at once. Residents stay where they are (resident
// ownership); the projection of the waiting set is recomputed for the new pools.
func (r *Router) SetFleet(now time.Time, snap fleet.Snapshot) {
	t := r.at(now)
	if len(r.byID) != len(snap.Engines) || r.membersChanged(&snap) {
		r.leave(&snap)
	}
	for k := range snap.Engines {
		fe := &snap.Engines[k]
		i, ok := r.byID[fe.ID]
		if !ok {
			if i, ok = r.join(fe); !ok {
				continue // MaxEngines: it takes no placements
			}
		}
		e := &r.engines[i]
		// Headers and envoy.lb metadata carry IP:port (ORIGINAL_DST needs an IP): an engine whose
		// host name is not resolved yet takes no placements.
		_, ipErr := netip.ParseAddrPort(fe.Addr)
		live := fe.Live() && ipErr == nil
		if e.ejected { // held out until the fleet shows the engine out of placement too
			if fe.Live() {
				live = false
			} else {
				e.ejected, e.failStreak = false, 0
			}
		}
		e.role, e.live, e.addr, e.drainOK = fe.Role, live, fe.Addr, false
		e.prepared = e.prepared && e.role == fleet.Decode && e.live
	}
	r.maxKV = 0
	for i := range r.engines {
		if d := r.engines[i].prof.Decode; d != nil && !r.engines[i].gone {
			r.maxKV = max(r.maxKV, int64(d.MaxKVTokens))
		}
	}
	r.updateFallback(t)
	r.rebuildPools()
	r.reproject(t)
	r.pump(t)
}

// membersChanged reports whether an engine the router tracks is not in snap (same count:
// one left as another joined).
func (r *Router) membersChanged(snap *fleet.Snapshot) bool {
	for i := range snap.Engines {
		if _, ok := r.byID[snap.Engines[i].ID]; !ok {
			return true
		}
	}
	return false
}

// Invalid counts an offer answered 400 or 413 (it goes no further).
func (r *Router) Invalid() {
	r.counters.Offers++
	r.counters.Invalid++
}

// Offer admits, queues or rejects one valid offer. An admitted offer is dispatched at once when
// the waiting set is empty and an engine has room (Status Dispatched); otherwise it waits
// (Status Waiting) and its placement or rejection comes later through Ready.
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
		pl, atOnce = r.plan(t, o.PromptTokens, need, o.Prefix)
	}
	if atOnce {
		ttft = pl.first - t
	} else {
		var done float64
		tail, tailDur, done = r.projectTail(t, o.PromptTokens, o.Prefix)
		ttft = done - t
		if !fallback {
			if d := r.bestDecode(need, false); d >= 0 {
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
	r.counters.Overflow.add(c)
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
// dispatched to it and, for a prefill engine that still streams decode residents (a donor just
// moved from decode), their remaining decode work too — the sum of the two.
func (r *Router) prefillFree(t float64, i int) float64 {
	if e := &r.engines[i]; e.role != fleet.Prefill {
		return max(t, e.busyUntil)
	}
	return r.freeAt(t, i)
}

// freeAt is prefillFree for any engine, whatever its role (Price asks it of a decode engine
// priced as prefill): its dispatched prefill work, plus its decode residents' remaining work.
func (r *Router) freeAt(t float64, i int) float64 {
	e := &r.engines[i]
	free := max(t, e.busyUntil)
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
func (r *Router) bestDecode(need int64, mustFit bool) int {
	best, bestTier := -1, -1
	step := math.Inf(1)
	for _, i16 := range r.decodePool {
		i := int(i16)
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
}

// plan picks the engines for one request if an engine has room: the prefill engine on which it
// completes first among those under prefill_concurrency (prefix blocks it holds are saved
// work), and the decode engine with the lowest projected seconds per token within capacity; or
// the fallback engine for both once it has drained.
func (r *Router) plan(t float64, prompt int, need int64, prefix []uint64) (plan, bool) {
	pl := plan{p: -1, d: -1, need: need}
	if r.fallback >= 0 {
		fb := &r.engines[r.fallback]
		if r.fallbackPending > 0 || fb.prefilling >= fb.prof.PrefillConcurrency || !fb.fits(need) {
			return pl, false // capacity holds on the fallback as everywhere (issue 8)
		}
		pl.p, pl.d = int(r.fallback), int(r.fallback)
		pl.dur, pl.start = fb.prefillSeconds(prompt), max(t, fb.busyUntil)
		pl.first = pl.start + pl.dur
		return pl, true
	}
	cached := r.matchPrefix(prefix)
	done := math.Inf(1)
	for _, i16 := range r.prefillPool {
		i := int(i16)
		c := &r.engines[i]
		if c.prefilling >= c.prof.PrefillConcurrency {
			continue
		}
		// An engine just moved to prefill may still hold decode streams whose KV is on its way
		// (their prefill ran elsewhere): an engine that runs prefill before decode would make
		// their first token wait behind every prefill placed on it. It takes prefill work once
		// they have their first token (docs/role-control.md, section 7).
		if c.streams > c.decoding {
			continue
		}
		dd := c.prefillSeconds(prompt - cached(i))
		if s := r.prefillFree(t, i); s+dd < done {
			pl.p, pl.dur, pl.start, done = i, dd, s, s+dd
		}
	}
	r.resetPrefix()
	if pl.p < 0 {
		return pl, false
	}
	if pl.d = r.bestDecode(need, true); pl.d < 0 {
		return pl, false
	}
	de := &r.engines[pl.d]
	pl.first = pl.start + pl.dur + r.engines[pl.p].prof.KVTransferS + de.stepSeconds(de.streams+1, de.kv+need)
	return pl, true
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
	e.mixed = pe.streams > 0 && pl.p != pl.d
	de.streams++
	de.kv += pl.need
	de.drainOK = false
	kind := Disaggregated
	if pl.p == pl.d {
		kind = Aggregate
		r.counters.Dispatched.Aggregate++
	} else {
		r.counters.Dispatched.Disaggregated++
	}
	e.phase, e.aggregate = phasePrefilling, kind == Aggregate
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
		ProjectedTTFT: e.projFirst - e.arrival,
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
		pl, ok := r.plan(t, int(e.prompt), e.prompt+e.output, e.prefix)
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

// Output is what the router raised since the last Advance for its edge to act on: the one
// value that leaves it besides the answers of its calls.
type Output struct {
	// Outcomes are the dispatches and rejections of waiting requests, in order.
	Outcomes []Outcome
	// Trigger is the urgent-wake trigger, when Urgent: the first admitted offer whose projected
	// TTFT exceeded slo.ttft_s (for the controller).
	Trigger Trigger
	Urgent  bool
	// Ejections are the engines passive health checking took out (for the fleet: failed).
	Ejections []Ejection
}

// Empty reports whether there is nothing to act on.
func (o Output) Empty() bool { return len(o.Outcomes) == 0 && !o.Urgent && len(o.Ejections) == 0 }

// Ready returns the output raised since the last Advance. Its slices are the router's own:
// take what is needed, then call Advance before any other call into the router.
func (r *Router) Ready() Output {
	return Output{Outcomes: r.outbox, Trigger: r.trigger, Urgent: r.urgent, Ejections: r.ejections}
}

// Advance acknowledges the output Ready returned: the router forgets it (and reuses its
// storage).
func (r *Router) Advance() {
	r.outbox, r.ejections, r.urgent = r.outbox[:0], r.ejections[:0], false
}

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

// endPrefill moves a prefilling entry to decoding.
func (r *Router) endPrefill(t float64, e *entry, observed bool) {
	p := &r.engines[e.prefill]
	p.prefilling--
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
		end := t - e.handoff
		if e.curveDur > 0 && !e.mixed {
			r.correct(p, 0, (end-max(e.dispatchAt, p.prefillEnd))/e.curveDur)
		}
		p.prefillEnd = max(p.prefillEnd, end)
	}
	e.phase, e.firstAt = phaseDecoding, t
	r.sumFirstAt += t
	r.engines[e.decode].decoding++
	r.engines[e.decode].drainOK = false
	r.nPrefilling--
	r.nDecoding++
	r.awaitingOutput -= e.output
}

// correct folds one observed/curve factor into an engine's correction for a phase.
func (r *Router) correct(e *engine, ph int, factor float64) {
	if math.IsNaN(factor) || math.IsInf(factor, 0) {
		return
	}
	factor = min(max(factor, minCorrection), maxCorrection)
	c := (1-correctionEWMA)*e.corr[ph] + correctionEWMA*factor
	e.corr[ph] = min(max(c, minCorrection), maxCorrection)
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
	if e.phase == phaseDecoding && !e.timedOut && !e.nonStream && out >= 2 && e.curveStep > 0 {
		r.correct(&r.engines[e.decode], 1, (t-e.firstAt)/float64(out-1)/e.curveStep)
	}
	r.engines[r.destination(e)].failStreak = 0
	r.counters.Completed++
	r.finish(t, e, slot)
	return nil
}

// Fail records a dispatched request that failed. An upstream failure counts against the
// engine the request was sent to: health.passive.consecutive_failures of them in a row eject
// it from placement at once (Ready reports it for the fleet).
func (r *Router) Fail(now time.Time, h Handle, why Failure) error {
	t := r.at(now)
	e, slot, err := r.dispatched(h)
	if err != nil {
		return err
	}
	r.counters.Failed++
	if why == FailUpstream {
		r.failUpstream(t, r.destination(e))
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
// (ShuttingDown, through Ready) and so is every later offer. Dispatched requests keep their
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
	r.counters.Overflow.add(c)
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

// Tick applies time: waiting requests past router.waiting_set.max_wait_s are rejected
// (wait_timeout, through Ready), dispatched requests with no first token after
// router.first_token_timeout_s are counted, and the waiting set is pumped.
func (r *Router) Tick(now time.Time) {
	t := r.at(now)
	r.demand.expire(t)
	r.decay(t)
	for r.waiting.len() > 0 {
		h, _ := r.waiting.peek()
		e, slot, err := r.lookup(h)
		if err != nil || e.phase != phaseWaiting {
			r.waiting.pop()
			continue
		}
		if e.arrival+r.cfg.WaitingSet.MaxWaitS > t {
			break
		}
		r.waiting.pop()
		r.turnAway(h, e, slot, WaitTimeout)
	}
	for r.inFlight.len() > 0 {
		h, _ := r.inFlight.peek()
		e, _, err := r.lookup(h)
		if err == nil && e.phase == phasePrefilling {
			if e.dispatchAt+r.cfg.FirstTokenTimeoutS > t {
				break
			}
			// The prefill engine stops holding a slot for it: the request counts as decoding
			// (its stream and KV reservation stay on its decode engine until it ends), and it
			// gives no correction samples.
			r.counters.FirstTokenTimeouts++
			r.lastTimeout = e.dispatchAt + r.cfg.FirstTokenTimeoutS
			e.timedOut = true
			r.endPrefill(t, e, false)
		}
		r.inFlight.pop()
	}
	for r.unary.len() > 0 { // non-streaming requests leave prefill at its projected end
		d := r.unary.peek()
		if e, _, err := r.lookup(Handle(d.id)); err == nil && e.phase == phasePrefilling {
			if d.key > t {
				break
			}
			r.endPrefill(t, e, false)
		}
		r.unary.pop()
	}
	r.pump(t)
}

// NextDeadline is the earliest time at which Tick has work: the oldest waiting request's wait
// limit, the oldest prefilling request's first-token limit, or the earliest projected prefill
// end of a non-streaming request. It drops requests that already left those phases from the
// heads of its queues on the way.
func (r *Router) NextDeadline() (time.Time, bool) {
	next := math.Inf(1)
	for r.waiting.len() > 0 {
		h, _ := r.waiting.peek()
		if e, _, err := r.lookup(h); err == nil && e.phase == phaseWaiting {
			next = e.arrival + r.cfg.WaitingSet.MaxWaitS
			break
		}
		r.waiting.pop()
	}
	for r.inFlight.len() > 0 {
		h, _ := r.inFlight.peek()
		if e, _, err := r.lookup(h); err == nil && e.phase == phasePrefilling {
			next = min(next, e.dispatchAt+r.cfg.FirstTokenTimeoutS)
			break
		}
		r.inFlight.pop()
	}
	for r.unary.len() > 0 {
		d := r.unary.peek()
		if e, _, err := r.lookup(Handle(d.id)); err == nil && e.phase == phasePrefilling {
			next = min(next, d.key)
			break
		}
		r.unary.pop()
	}
	if math.IsInf(next, 1) {
		return time.Time{}, false
	}
	return r.Time(next), true
}

// updateFallback keeps the aggregate fallback (docs/role-control.md section 8): with no live prefill
// engine, the lightest live decode engine that can prefill becomes the fallback; it takes new
// work only after the decode residents it had drain. Fallback ends when a prefill engine is live.
func (r *Router) updateFallback(t float64) {
	if r.countLivePrefill() > 0 {
		r.fallback = -1
		return
	}
	if r.fallback >= 0 {
		if fb := &r.engines[r.fallback]; fb.live && fb.role == fleet.Decode {
			return
		}
	}
	r.fallback = -1
	best := -1
	for i := range r.engines {
		e := &r.engines[i]
		if e.role == fleet.Decode && e.canPrefill() && e.prof.Decode != nil && (best < 0 || e.streams < r.engines[best].streams) {
			best = i
		}
	}
	if best < 0 {
		return
	}
	fb := &r.engines[best]
	r.fallback, r.fallbackSeq, r.fallbackPending = int16(best), r.seq, fb.streams
	// Projected drain: every resident decodes its expected output at the current step time.
	step := fb.stepSeconds(fb.streams, fb.kv)
	r.fallbackDrain = t
	for i := range r.slots {
		e := &r.slots[i]
		if (e.phase == phasePrefilling || e.phase == phaseDecoding) && int(e.decode) == best {
			begin := e.projFirst
			if e.phase == phaseDecoding {
				begin = e.firstAt
			}
			r.fallbackDrain = max(r.fallbackDrain, begin+float64(e.output)*step)
		}
	}
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

// Snapshot reports the router's counters, retained demand, demand estimates and engine loads.
func (r *Router) Snapshot(now time.Time) Snapshot {
	t := r.at(now)
	s := Snapshot{
		Counters: r.counters,
		Retained: Retained{
			Waiting: r.nWaiting, WaitingTokens: r.waitingTokens, Prefilling: r.nPrefilling,
			AwaitingOutputTokens: r.awaitingOutput, Decoding: r.nDecoding,
		},
		Demand:  r.demand.estimate(t, r.expectedOutput()),
		Engines: make([]EngineLoad, 0, len(r.byID)),
	}
	s.Retained.Samples = r.demand.long.n
	r.refreshDrains(t)
	for i := range r.engines {
		e := &r.engines[i]
		if e.gone {
			continue
		}
		s.Engines = append(s.Engines, EngineLoad{
			ID: e.id, PrefillResidents: e.prefilling, DecodeResidents: e.decoding, ReservedStreams: e.streams - e.decoding,
			BusyUntilS: r.prefillFree(t, i) - t, DrainS: r.freeAt(t, i) - t, Correction: Correction{Prefill: e.corr[0], Decode: e.corr[1], PrefillSamples: e.samples[0], DecodeSamples: e.samples[1]},
			Fallback: i == int(r.fallback), Prepared: e.prepared, Passive: Passive{ConsecutiveFailures: e.failStreak, Ejected: e.ejected},
		})
	}
	if r.fallback >= 0 {
		s.Fallback = r.engines[r.fallback].id
	}
	return s
}
