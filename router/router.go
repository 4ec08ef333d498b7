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

// The online profile correction (docs/role-control.md section 4): a ratio of sums, observed
// seconds over the curve's, each sample folded into both with weight correctionEWMA, the
// factor clamped to [minCorrection, maxCorrection].
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
	curveSum   [2]float64 // the curve seconds behind each factor, weighted as its samples (0: no sample yet)
	samples    [2]int
	prefilling int  // prefill residents: dispatched here, no first token yet
	both       int  // those of them that decode here too (aggregate or local): one request, counted once in its load
	inPlace    bool // it switches role in place (switch: sglang): a decode-mode server never prefills locally
	// Local prefill on a decode engine: the projected seconds of it placed lately, decayed over
	// a stream's expected life (localWork, as of localAt), and the projected end of the latest
	// (localUntil): its streams' steps were widened until then.
	localWork, localAt, localUntil float64
	queued                         float64 // projected prefill seconds of those residents
	busyUntil                      float64 // projected end of the prefill work dispatched here (prefill work only)
	drainAt                        float64 // projected end of its decode residents' work, while drainOK
	drainOK                        bool    // drainAt is current (reset whenever its residents change)
	waitWork                       float64 // projected prefill seconds of waiting requests the projection assigned here
	streams                        int     // streams placed with this decode engine, not finished (decoding or reserved)
	decoding                       int     // those of them decoding here now (first token seen); the rest still prefill elsewhere
	kv                             int64   // KV tokens they reserve
	prefillEnd                     float64 // when its last observed prefill ended (first token less the handoff)
	failStreak                     int     // upstream failures in a row of requests sent to this engine
	ejected                        bool    // passive health took it out of placement; cleared once the fleet agrees
	prepared                       bool    // a decode donor being prepared (Prepare): new streams go elsewhere when they fit
	foreign                        int     // streams its metrics report beyond this router's (a decode engine; Observe)
	obs                            obsState
	// gone: the engine left the fleet. Its slot stays while residents hold its index (they
	// finish where they are); a slot without residents takes the next engine that joins.
	gone bool
}

func (e *engine) prefillSeconds(tokens int) float64 {
	return e.prof.Prefill.Seconds(max(tokens, 1)) * e.corr[0]
}

// stepSeconds is the decode step with streams of this router's reserving kv KV tokens, beside
// the foreign streams its metrics report (Observe).
func (e *engine) stepSeconds(streams int, kv int64) float64 {
	return e.prof.Decode.StepSeconds(streams+e.foreign, int(kv+e.obs.foreignKV)) * e.corr[1]
}

func (e *engine) canPrefill() bool { return e.live && e.prof.Prefill != nil }

// fits reports whether one more stream reserving need KV tokens fits the engine: this router's
// streams against its capacity. Foreign streams (Observe) raise its step, they do not fill it.
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

	passNext int // where PassThrough's next round of the engines starts
	// subsets holds the subset hint of each waiting request that has one (Offer.Subset), by
	// slot, as addresses (an engine index may pass to another engine while it waits): the
	// requests without one cost nothing.
	subsets map[int32][]string

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
		e.role, e.live, e.addr, e.drainOK, e.inPlace = fe.Role, live, fe.Addr, false, fe.InPlace
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
			BusyUntilS: r.prefillFree(t, i) - t, DrainS: r.drainEnd(t, i) - t, Correction: Correction{Prefill: e.corr[0], Decode: e.corr[1], PrefillSamples: e.samples[0], DecodeSamples: e.samples[1]},
			Fallback: i == int(r.fallback), Prepared: e.prepared, Passive: Passive{ConsecutiveFailures: e.failStreak, Ejected: e.ejected},
		})
		if e.obs.ok {
			o := e.obs.last
			o.UnservedLegs = r.unservedLegs(e) // NoHandoff as the latest observation set it
			s.Engines[len(s.Engines)-1].Observed = &o
		}
	}
	if r.fallback >= 0 {
		s.Fallback = r.engines[r.fallback].id
	}
	return s
}
