package controller

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// View is the router's projection as the controller reads it (router.Router implements it):
// one projection serves placement and pricing.
type View interface {
	Price(now time.Time, q router.Query) (ps []router.Pricing, waiting bool)
	Snapshot(now time.Time) router.Snapshot
	FirstTokenTimeoutAt() (time.Time, bool)
}

var _ View = (*router.Router)(nil)

// Directions of a move (the decision log's).
const (
	ToPrefill = decisionlog.ToPrefill
	ToDecode  = decisionlog.ToDecode
)

// Controller is the role controller's deterministic core (docs/role-control.md): regular and
// urgent evaluations priced with the router's projection, every gate on a move, the
// arrival-evidence window, and a decision record for every evaluation. It owns no goroutine,
// reads no clock and changes nothing outside itself: Tick proposes a decision, the caller
// applies what it can of its moves to the fleet and acknowledges the decision as applied
// (Applied), and only then does the controller count the move (confirmations, cooldown,
// evidence window) — as raft's Ready and Advance. It is not safe for concurrent use.
type Controller struct {
	cfg      config.Controller
	slo      config.SLO
	profiles map[string]config.Profile
	epoch    time.Time
	now      float64

	nextPass     float64                    // when the next regular pass is due
	nextMonitor  float64                    // when the next floor-repair pass is due
	lifecycles   map[string]fleet.Lifecycle // each engine's lifecycle at the last monitor pass
	repaired     bool                       // the monitor pass under way has evaluated its floor repair
	conf         decisionlog.Confirmed
	lastToDecode float64 // when the last move toward decode was made (cooldown)
	win          window
	urgent       *pending
	seq          uint64
	proposed     uint64 // the decision Tick proposed and Applied has not acknowledged; 0: none
}

// window is the arrival-evidence window (docs/role-control.md, section 7).
type window struct {
	openedAt float64
	base     uint64 // admitted offers when it opened
	carried  uint64 // arrivals counted before a restart (Restore)
	arrivals uint64
	closed   bool
}

// pending is the coalesced urgent evaluation waiting for its time.
type pending struct {
	due    float64
	tr     router.Trigger
	joined int
}

// New returns a controller for a validated config, started at start (the window opens then).
func New(cfg *config.Config, start time.Time) *Controller {
	return &Controller{
		cfg: cfg.Controller, slo: cfg.SLO, profiles: cfg.Profiles, epoch: start,
		nextPass:     cfg.Controller.Reactive.StepS,
		lastToDecode: math.Inf(-1),
		lifecycles:   map[string]fleet.Lifecycle{},
	}
}

// at converts a time to seconds since the start; time never goes back.
func (c *Controller) at(now time.Time) float64 {
	if t := now.Sub(c.epoch).Seconds(); t > c.now {
		c.now = t
	}
	return c.now
}

// Trigger asks for an urgent evaluation (the router raised it: an admitted offer's projected
// TTFT exceeds slo.ttft_s). The first trigger schedules one evaluation at its time plus
// controller.reactive.urgent_delay_s; later ones join it.
func (c *Controller) Trigger(tr router.Trigger) {
	if c.urgent != nil {
		c.urgent.joined++
		return
	}
	c.urgent = &pending{due: tr.AtS + c.cfg.Reactive.UrgentDelayS, tr: tr}
}

// NextDeadline is when Tick has an evaluation due.
func (c *Controller) NextDeadline() time.Time {
	next := min(c.nextPass, c.nextMonitor)
	if c.urgent != nil {
		next = min(next, c.urgent.due)
	}
	return config.TimeAt(c.epoch, next)
}

// Tick runs the evaluation due at now, if any, on the fleet fl and the router's projection v,
// and returns its record (ok false when nothing was due): a proposal, which the caller applies
// and acknowledges with Applied before it calls Tick again (Tick panics otherwise). At most one
// evaluation runs per call — floor repair and readmission first, then an urgent one, then a
// regular pass — so that the caller applies its moves before the next: call Tick again while
// NextDeadline is not after now.
func (c *Controller) Tick(now time.Time, fl fleet.Snapshot, v View) (decisionlog.Decision, bool) {
	if c.proposed != 0 {
		panic(fmt.Sprintf("controller: Tick before decision %d was acknowledged (Applied)", c.proposed))
	}
	d, ok := c.tick(now, fl, v)
	if ok {
		c.proposed = d.Seq
	}
	return d, ok
}

func (c *Controller) tick(now time.Time, fl fleet.Snapshot, v View) (decisionlog.Decision, bool) {
	t := c.at(now)
	s := newState(c, now, t, fl, v)
	c.observeWindow(t, &s)
	if t >= c.nextMonitor {
		if d, ok := c.evaluateMonitor(&s); ok {
			return c.record(d), true
		}
		c.nextMonitor, c.repaired = t+c.cfg.Monitor.IntervalS, false
		c.noteLifecycles(fl)
	}
	switch {
	case c.urgent != nil && t >= c.urgent.due:
		u := *c.urgent
		c.urgent = nil
		return c.record(c.evaluateUrgent(&s, u)), true
	case t >= c.nextPass:
		c.nextPass = t + c.cfg.Reactive.StepS
		return c.record(c.evaluateRegular(&s)), true
	}
	return decisionlog.Decision{}, false
}

// record numbers a decision. Its effects on the controller's own state wait for Applied.
func (c *Controller) record(d decisionlog.Decision) decisionlog.Decision {
	c.seq++
	d.Kind, d.Seq, d.Advisory = decisionlog.KindDecision, c.seq, c.cfg.Advisory
	if d.Moves == nil {
		d.Moves = []decisionlog.Move{}
	}
	if d.Gates == nil {
		d.Gates = []decisionlog.Gate{}
	}
	if d.Candidates == nil {
		d.Candidates = []decisionlog.Priced{}
	}
	return d
}

// Applied acknowledges the decision Tick proposed, as the caller applied it: the edge may have
// made fewer of its moves or none (a move it could not persist, one the fleet refused), and
// records that in d (Outcome blocked, fewer Moves). Only a decision that moved counts: it resets
// the confirmations, and a move toward decode starts the cooldown and restarts the evidence
// window. A decision that moved nothing leaves all three as they were.
func (c *Controller) Applied(d decisionlog.Decision) {
	if d.Seq != c.proposed {
		panic(fmt.Sprintf("controller: Applied(decision %d), but decision %d is the one proposed", d.Seq, c.proposed))
	}
	c.proposed = 0
	c.acknowledge(d)
}

// acknowledge makes an applied decision's effects on the controller's own state.
func (c *Controller) acknowledge(d decisionlog.Decision) {
	if d.Outcome != decisionlog.OutcomeMoved {
		return
	}
	c.conf = decisionlog.Confirmed{} // the passes before priced another split: motives count anew
	if d.Direction == ToDecode {     // repairs and readmissions too
		c.lastToDecode = d.TimeS
		c.restartWindow(d.TimeS, c.win.base+c.win.arrivals) // a decode-recovery move
	}
}

// DurableAfter is the durable state once d is applied as proposed: what the caller persists
// before it applies d's moves (a move that then does not happen is corrected by the next
// decision's state).
func (c *Controller) DurableAfter(d decisionlog.Decision) Durable {
	after := *c
	after.acknowledge(d)
	return after.Durable()
}

// state is what one evaluation reads: the fleet, the router's loads, demand.
type state struct {
	c     *Controller
	now   time.Time
	t     float64
	fleet fleet.Snapshot
	view  View
	snap  router.Snapshot
	loads map[string]*router.EngineLoad
	cur   router.Split
}

func newState(c *Controller, now time.Time, t float64, fl fleet.Snapshot, v View) state {
	s := state{c: c, now: now, t: t, fleet: fl, view: v, snap: v.Snapshot(now), loads: map[string]*router.EngineLoad{}}
	for i := range s.snap.Engines {
		s.loads[s.snap.Engines[i].ID] = &s.snap.Engines[i]
	}
	for _, e := range fl.Engines {
		if e.Live() {
			if e.Role == fleet.Prefill {
				s.cur.Prefill = append(s.cur.Prefill, e.ID)
			} else {
				s.cur.Decode = append(s.cur.Decode, e.ID)
			}
		}
	}
	return s
}

// observeWindow restarts the window after a first-token timeout and closes it when it has
// enough evidence (span and arrivals) or has been open for the sparse-traffic maximum.
func (c *Controller) observeWindow(t float64, s *state) {
	if at, ok := s.view.FirstTokenTimeoutAt(); ok {
		if ts := at.Sub(c.epoch).Seconds(); ts > c.win.openedAt {
			c.restartWindow(ts, s.snap.Counters.Admitted)
		}
	}
	c.win.arrivals = c.win.carried + s.snap.Counters.Admitted - c.win.base
	r := c.cfg.Reactive
	open := t - c.win.openedAt
	if !c.win.closed && (open >= r.EvidenceSpanS && c.win.arrivals >= uint64(r.EvidenceMinArrivals) || open >= r.EvidenceMaxSpanS) {
		c.win.closed = true
	}
}

// restartWindow opens the window again at t, counting arrivals from admitted offers on.
func (c *Controller) restartWindow(t float64, admitted uint64) {
	c.win = window{openedAt: t, base: admitted}
}

// Durable is the controller state a restart must not lose (docs/durable-state.md): the
// decision sequence, the last move toward decode (cooldown), the confirmation counters and the
// arrival-evidence window. Times are wall-clock, so that a later run reads them against its own
// start.
type Durable struct {
	Seq           uint64                `json:"seq"`
	LastToDecode  *time.Time            `json:"last_to_decode,omitempty"` // nil: none yet
	Confirmations decisionlog.Confirmed `json:"confirmations"`
	Window        struct {
		OpenedAt time.Time `json:"opened_at"`
		Arrivals uint64    `json:"arrivals"`
		Closed   bool      `json:"closed"`
	} `json:"evidence_window"`
}

// Durable returns the state to save.
func (c *Controller) Durable() Durable {
	d := Durable{Seq: c.seq, Confirmations: c.conf}
	if !math.IsInf(c.lastToDecode, -1) {
		t := config.TimeAt(c.epoch, c.lastToDecode)
		d.LastToDecode = &t
	}
	d.Window.OpenedAt = config.TimeAt(c.epoch, c.win.openedAt)
	d.Window.Arrivals, d.Window.Closed = c.win.arrivals, c.win.closed
	return d
}

// Restore continues from a saved state, before the first evaluation: the next decision has
// sequence number d.Seq+1, cooldown counts from the saved move, and the evidence window keeps
// its opening time (before this start) and its arrivals.
func (c *Controller) Restore(d Durable) {
	c.seq, c.conf = d.Seq, d.Confirmations
	if d.LastToDecode != nil {
		c.lastToDecode = c.since(*d.LastToDecode)
	}
	c.win = window{openedAt: c.since(d.Window.OpenedAt), carried: d.Window.Arrivals, arrivals: d.Window.Arrivals, closed: d.Window.Closed}
}

func (c *Controller) windowState() decisionlog.WindowState {
	return decisionlog.WindowState{Open: !c.win.closed, OpenedAtS: c.win.openedAt, Arrivals: c.win.arrivals}
}

// PricingQuery is what every evaluation prices its splits with (docs/role-control.md section
// 3): the waiting set and the priced demand of the next reactive.step_s, and a prefill pool's
// shortfall held for thresholds.dwell_s (the least time a moved engine keeps its role). The
// simulator's fidelity figure prices with it too, so that it judges the controller's own
// ranking.
func PricingQuery(cfg config.Controller, splits ...router.Split) router.Query {
	return router.Query{Splits: splits, StepS: cfg.Reactive.StepS, SustainS: cfg.Thresholds.DwellS}
}

func withRequest(q router.Query, h router.Handle) router.Query { q.Request = h; return q }

func withOutputScale(q router.Query, k float64) router.Query { q.OutputScale = k; return q }

// candidate is an adjacent split: one engine moved in a direction.
type candidate struct {
	dir   decisionlog.Direction
	donor fleet.Engine
	split router.Split
	price router.Pricing
	// worst is what the move is judged by: price.Worst, or for a donor that switches in place
	// the drain-weighted worst (inPlaceWorst).
	worst float64
	// relief: chosen for the other pool's pressure, which it relieves (chooseRegular).
	relief bool
}

// inPlaceWorst weighs a move of a donor that switches in place (docs/role-control.md section
// 11): for drainS seconds its residents drain and it serves in neither pool (the transitional
// split, priced at trans); then, for the dwell it commits the engine to, the candidate split
// (target). The move is taken only if this beats the current split by more than min_gain: the
// gain over the dwell must outweigh the capacity lost while the donor drains.
func inPlaceWorst(trans, target, drainS, dwellS float64) float64 {
	if drainS <= 0 {
		return target
	}
	if math.IsInf(trans, 1) {
		return trans
	}
	h := max(dwellS, drainS)
	return (drainS*trans + h*target) / (drainS + h)
}

// evaluateRegular is a regular pass (docs/role-control.md, section 5).
func (c *Controller) evaluateRegular(s *state) decisionlog.Decision {
	d := c.base(s, decisionlog.CallerRegular)
	th := c.cfg.Thresholds
	rp := c.priceRegular(s)
	d.Candidates = append(d.Candidates, priced(s.cur, rp.current, true, ""))
	conf := c.countMotives(rp.current)
	d.Confirmations = &conf
	best, motives := c.chooseRegular(s, &d, rp, conf)
	p0 := rp.current
	switch {
	case len(motives) == 0:
		d.Outcome = decisionlog.OutcomeRetained
		d.Reason = fmt.Sprintf("no motive: prefill pressure %.3f, decode pressure %.3f (expand %.2f, shrink %.2f, %d passes)", p0.TTFTRatio, p0.TPOTRatio, th.Expand, th.Shrink, th.ConfirmPasses)
		return c.advise(d, nil)
	case best == nil:
		d.Outcome = decisionlog.OutcomeRetained
		d.Reason = fmt.Sprintf("motivated (%v) but no adjacent split strictly improves worst %.3f by more than %s", motives, p0.Worst, c.gains(rp))
		if donor, drain, ok := c.heldDonor(s, rp, motives); ok {
			d.Prepare = donor
			d.Reason += fmt.Sprintf("; %s still decodes for %.1fs: preparing %s", donor, drain, donor)
		}
		return c.advise(d, nil)
	}
	d.Direction = best.dir
	d.Reason = fmt.Sprintf("%s: worst %.3f -> %.3f", best.dir, p0.Worst, best.price.Worst)
	if math.IsInf(p0.Worst, 1) && math.IsInf(best.worst, 1) {
		d.Reason += fmt.Sprintf(" (decode overload %.3f -> %.3f)", p0.Overload, best.price.Overload)
	}
	switch {
	case best.relief && best.dir == ToDecode:
		d.Reason += fmt.Sprintf(" (prefill pressure relieved: ttft_ratio %.3f -> %.3f)", p0.TTFTRatio, best.price.TTFTRatio)
	case best.relief:
		d.Reason += fmt.Sprintf(" (decode pressure relieved: tpot_ratio %.3f -> %.3f)", p0.TPOTRatio, best.price.TPOTRatio)
	}
	if best.donor.InPlace {
		d.Reason += fmt.Sprintf(" (%.3f weighing the drain of %s, which switches in place)", best.worst, best.donor.ID)
	}
	d.Gates = c.gates(s, best, p0, decisionlog.CallerRegular)
	return c.decide(s, d, best)
}

// heldDonor is the donor to prepare when prefill pressure motivates a move toward prefill that
// no candidate improves because the donor's residents hold it: it prefills only once they are
// done, and their drain outlasts the horizon the projection prices (step_s), so until then the
// candidate prices no better than the current split — and, while placement keeps giving it new
// streams, never will (a slow decoder's streams last minutes). Preparing it, which only steers
// new streams away, lets it drain; a later pass then finds the move improving. Only when the
// decode pool without it carries the demand (the candidate's tpot_ratio and overload within
// expand: else the prepared engine still takes streams, for want of room elsewhere, and never
// drains), and never for a donor that switches in place (its drain is weighed instead) or when
// advisory. An engine already prepared that still drains stays the one (docs/role-control.md
// section 7, "A donor held by its residents").
func (c *Controller) heldDonor(s *state, rp regularPrices, motives []decisionlog.Direction) (string, float64, bool) {
	if c.cfg.Advisory || c.conf.PrefillExpand < 1 || !slices.Contains(motives, ToPrefill) {
		return "", 0, false
	}
	expand := c.cfg.Thresholds.Expand
	for _, cand := range rp.cands {
		l := s.loads[cand.donor.ID]
		if cand.dir != ToPrefill || cand.donor.InPlace || l == nil || cand.price.TPOTRatio > expand || cand.price.Overload > expand {
			continue
		}
		if l.DrainS <= c.cfg.Reactive.StepS {
			return "", 0, false
		}
		// The engine already prepared stays so while it drains: a lighter donor each pass
		// would restart the drain on every engine in turn.
		for i := range s.snap.Engines {
			if p := &s.snap.Engines[i]; p.Prepared && p.DrainS > c.cfg.Reactive.StepS && slices.Contains(s.cur.Decode, p.ID) {
				return p.ID, p.DrainS, true
			}
		}
		return cand.donor.ID, l.DrainS, true
	}
	return "", 0, false
}

// regularPrices is what a regular pass priced: the current split, each adjacent candidate and,
// for a donor that switches in place, the split without it while it drains.
type regularPrices struct {
	current router.Pricing
	cands   []candidate // price set
	// trans[i] is the transitional split's price of candidate i, when its donor switches in
	// place (hasTrans[i]).
	trans    [2]router.Pricing
	hasTrans [2]bool
}

// priceRegular prices the current split and both adjacent ones together (one projection), and
// the transitional split of each in-place donor.
func (c *Controller) priceRegular(s *state) regularPrices {
	var cands []candidate
	splits := []router.Split{s.cur}
	for _, dir := range []decisionlog.Direction{ToPrefill, ToDecode} {
		if cand, ok := c.adjacent(s, dir); ok {
			cands = append(cands, cand)
			splits = append(splits, cand.split)
		}
	}
	var transAt [2]int // candidate → its transitional split's index in splits (0: none)
	for i, cand := range cands {
		if cand.donor.InPlace {
			transAt[i] = len(splits)
			splits = append(splits, withoutEngine(s.cur, cand.donor.ID))
		}
	}
	ps, _ := s.view.Price(s.now, PricingQuery(c.cfg, splits...))
	rp := regularPrices{current: ps[0], cands: cands}
	for i := range rp.cands {
		rp.cands[i].price = ps[i+1]
		rp.cands[i].worst = ps[i+1].Worst
		if k := transAt[i]; k > 0 {
			rp.trans[i], rp.hasTrans[i] = ps[k], true
		}
	}
	return rp
}

// countMotives counts the motives over consecutive passes against the current split's price and
// returns the counters after this pass. While the evidence window is open, decode expansion and
// prefill shrinking use the open-window thresholds.
func (c *Controller) countMotives(p0 router.Pricing) decisionlog.Confirmed {
	th := c.cfg.Thresholds
	dExpand, dShrink := th.Expand, th.Shrink
	if !c.win.closed {
		dExpand, dShrink = th.OpenWindow.Expand, th.OpenWindow.Shrink
	}
	count := func(n *int, cond bool) {
		if cond {
			*n++
		} else {
			*n = 0
		}
	}
	count(&c.conf.PrefillExpand, p0.TTFTRatio >= th.Expand)
	count(&c.conf.PrefillConsolidate, p0.TPOTRatio <= th.Shrink)
	count(&c.conf.DecodeExpand, p0.TPOTRatio >= dExpand)
	count(&c.conf.DecodeConsolidate, p0.TTFTRatio <= dShrink)
	return c.conf
}

// chooseRegular records every candidate in d (an in-place donor's with its drain weighed in) and
// returns the best motivated candidate that strictly improves on the current split (nil for
// none) and the directions that were motivated.
//
// Consolidation serves a pool that needs the capacity: while the current split's worst is at or
// under shrink, every projection is comfortably within the SLO and there is nothing to
// consolidate for (docs/role-control.md section 5). Without this, a fleet between bursts traded
// engines for gains of a few milliseconds on ratios far under the SLO, and met the next burst
// with a lopsided split (narwhal sim --synthetic onoff).
//
// A pressure also motivates the move the other way when that move's split lowers the pressed
// ratio: decode engines prefill locally (router.local_prefill), and a decode pool short of KV
// room holds handoffs, so one more decode engine can bring first tokens sooner than one more
// prefill engine (a 2P/2D fleet whose decode pool could not hold a step in load, priced 1P/3D at
// half 2P/2D's TTFT ratio and never moved: to_decode was not motivated). It is chosen only when
// no candidate its own motives move to improves, so it never displaces the usual move, and a
// move toward decode so made is confirmed over confirm_passes passes of the prefill pressure, as
// any move toward decode is (docs/role-control.md section 5, "Relieved the other way").
func (c *Controller) chooseRegular(s *state, d *decisionlog.Decision, rp regularPrices, conf decisionlog.Confirmed) (best *candidate, motives []decisionlog.Direction) {
	var relief *candidate // motivated the other way only (below)
	th := c.cfg.Thresholds
	p0, n := rp.current, th.ConfirmPasses
	consolidate := p0.Worst > th.Shrink
	for i := range rp.cands {
		cand := &rp.cands[i]
		dir := cand.dir
		pc := priced(cand.split, cand.price, false, cand.donor.ID)
		if rp.hasTrans[i] {
			tpr := rp.trans[i]
			drain := 0.0
			if l := s.loads[cand.donor.ID]; l != nil {
				drain = l.DrainS
			}
			cand.worst = inPlaceWorst(tpr.Worst, cand.price.Worst, drain, th.DwellS)
			tp := priced(withoutEngine(s.cur, cand.donor.ID), tpr, false, cand.donor.ID)
			tp.DrainS, tp.Draining = &drain, true
			ew := decisionlog.Ratio(cand.worst)
			pc.InPlaceWorst = &ew
			d.Candidates = append(d.Candidates, tp)
		}
		d.Candidates = append(d.Candidates, pc)
		improves := lower(cand.worst, cand.price.Overload, p0.Worst, p0.Overload, c.gainFor(cand, p0))
		var own, other bool // motivated by its own direction's pressures, or by the other pool's
		if dir == ToPrefill {
			own = conf.PrefillExpand >= 1 || consolidate && conf.PrefillConsolidate >= n && improves
			other = conf.DecodeExpand >= n && cand.price.TPOTRatio < p0.TPOTRatio
		} else {
			own = conf.DecodeExpand >= n || consolidate && conf.DecodeConsolidate >= n && improves
			other = conf.PrefillExpand >= 1 && cand.price.TTFTRatio < p0.TTFTRatio
		}
		if own || other {
			motives = append(motives, dir)
		}
		switch {
		case !improves:
		case own && (best == nil || lower(cand.worst, cand.price.Overload, best.worst, best.price.Overload, 0)):
			best = cand
		case !own && other:
			relief = cand // one candidate a direction: none to compare it with
		}
	}
	if best == nil && relief != nil {
		best, relief.relief = relief, true
	}
	return best, motives
}

// gains says the gain that counts for a regular pass's candidates: one figure when they share
// it (min_gain on a small fleet), else each direction's.
func (c *Controller) gains(rp regularPrices) string {
	switch {
	case len(rp.cands) == 0:
		return fmt.Sprintf("%.3g", c.cfg.Thresholds.MinGain)
	case len(rp.cands) == 1:
		return fmt.Sprintf("%.3g", c.gainFor(&rp.cands[0], rp.current))
	}
	a, b := c.gainFor(&rp.cands[0], rp.current), c.gainFor(&rp.cands[1], rp.current)
	if a == b {
		return fmt.Sprintf("%.3g", a)
	}
	return fmt.Sprintf("its gain (%s %.3g, %s %.3g)", rp.cands[0].dir, a, rp.cands[1].dir, b)
}

// gainFor is the improvement that counts for cand against the current split's price p0, whose
// worst — or, on two +Inf, overload — is v. Into a pool under pressure (at or above expand) of n
// engines after the move: min_gain in units of the SLO, but never more than v/2n, half of what
// one engine can give (it raises the pool's capacity by 1/n, and lowers a ratio of v by about
// v/n; on a 64-engine fleet that is under min_gain at any pressure a backlog reaches, and a
// fixed min_gain held a 37P/27D fleet whose backlog grew to a 130-s TTFT). Into a pool not under
// pressure — consolidation, a pool giving up an engine it can spare — min_gain itself: scaled
// down, a 64-engine fleet traded its prefill engines one a pass, through a diurnal trough, for
// decode steps 1% shorter, and met the next peak with a third of them gone (docs/role-control.md
// section 3).
func (c *Controller) gainFor(cand *candidate, p0 router.Pricing) float64 {
	th := c.cfg.Thresholds
	pressure, n := p0.TTFTRatio, len(cand.split.Prefill)
	if cand.dir == ToDecode {
		pressure, n = p0.TPOTRatio, len(cand.split.Decode)
	}
	if pressure < th.Expand {
		return th.MinGain
	}
	v := p0.Worst
	if math.IsInf(v, 1) {
		v = p0.Overload
	}
	return min(th.MinGain, v/float64(2*max(n, 1)))
}

// lower reports whether a split priced (worst, overload) prices lower than another by more
// than gain: on worst, or, when both are +Inf (their decode pools over capacity), on the
// overload, so that a move that relieves an overloaded pool still ranks (docs/role-control.md,
// sections 3 and 12).
func lower(worst, overload, thanWorst, thanOverload, gain float64) bool {
	if math.IsInf(worst, 1) && math.IsInf(thanWorst, 1) {
		return overload < thanOverload-gain
	}
	return worst < thanWorst-gain
}

// evaluateUrgent is the coalesced urgent evaluation (docs/role-control.md, section 6).
func (c *Controller) evaluateUrgent(s *state, u pending) decisionlog.Decision {
	d := c.base(s, decisionlog.CallerUrgent)
	d.Inputs.Trigger = &decisionlog.TriggerRecord{RequestID: u.tr.Request, ProjectedTTFTS: decisionlog.Ratio(u.tr.ProjectedTTFT), AtS: u.tr.AtS, Joined: u.joined}
	if s.snap.Retained.Waiting == 0 {
		d.Outcome, d.Reason = decisionlog.OutcomeDropped, "the waiting set drained before the evaluation"
		return d
	}
	// The current split and (P+1, D-1), priced together with the request's projected TTFT.
	cand, movable := c.adjacent(s, ToPrefill)
	splits := []router.Split{s.cur}
	if movable {
		splits = append(splits, cand.split)
	}
	ps, waiting := s.view.Price(s.now, withRequest(PricingQuery(c.cfg, splits...), u.tr.Handle))
	if !waiting {
		d.Outcome, d.Reason = decisionlog.OutcomeDropped, "the triggering request is no longer waiting"
		return d
	}
	p0 := ps[0]
	curTTFT := p0.RequestTTFT
	cur := priced(s.cur, p0, true, "")
	r := decisionlog.Ratio(curTTFT)
	cur.RequestTTFTS = &r
	d.Candidates = append(d.Candidates, cur)
	if !movable {
		d.Outcome, d.Reason = decisionlog.OutcomeRetained, "no decode engine to move"
		return c.advise(d, nil)
	}
	cand.price = ps[1]
	candTTFT, own := cand.price.RequestTTFT, cand.price.RequestPrefill
	d.Inputs.Trigger.PrefillS = decisionlog.Ratio(own)
	pc := priced(cand.split, cand.price, false, cand.donor.ID)
	rc := decisionlog.Ratio(candTTFT)
	pc.RequestTTFTS = &rc
	d.Candidates = append(d.Candidates, pc)
	// The improvement that counts: the triggering request's projection improves (the seed's
	// test) and so does the split's, by more than the gain that counts (gainFor) — a move that
	// gains a rounding for one request at the tail while the split as a whole prices no better
	// (its decode pool soon over capacity) is no improvement (docs/role-control.md section 6).
	splitGain := lower(cand.price.Worst, cand.price.Overload, p0.Worst, p0.Overload, c.gainFor(&cand, p0))
	switch {
	case candTTFT < curTTFT && splitGain:
		d.Direction = ToPrefill
		d.Reason = fmt.Sprintf("request %s: projected TTFT %.3f s -> %.3f s", u.tr.Request, curTTFT, candTTFT)
		d.Gates = c.gates(s, &cand, p0, decisionlog.CallerUrgent)
		return c.decide(s, d, &cand)
	case own > c.slo.TTFTS: // no split can help it: its own prefill (inputs.trigger.prefill_s) exceeds the SLO
		d.Outcome, d.Reason = decisionlog.OutcomeRetained, "prefill_exceeds_slo"
	case candTTFT < curTTFT:
		d.Outcome = decisionlog.OutcomeRetained
		d.Reason = fmt.Sprintf("request %s: projected TTFT %.3f s -> %.3f s, but the candidate split's worst %s does not improve on %s by more than %.3g", u.tr.Request, curTTFT, candTTFT, ratio(cand.price.Worst), ratio(p0.Worst), c.gainFor(&cand, p0))
	default:
		d.Outcome = decisionlog.OutcomeRetained
		d.Reason = fmt.Sprintf("request %s: the candidate split does not improve its projected TTFT (%.3f s)", u.tr.Request, curTTFT)
	}
	return c.advise(d, nil)
}

// base starts a record with the inputs every evaluation shares.
func (c *Controller) base(s *state, caller decisionlog.Caller) decisionlog.Decision {
	d := decisionlog.Decision{TimeS: s.t, Caller: caller}
	d.SplitBefore = decisionlog.Split{Prefill: len(s.cur.Prefill), Decode: len(s.cur.Decode)}
	d.SplitAfter = d.SplitBefore
	d.Inputs = decisionlog.Inputs{Demand: s.snap.Demand, EvidenceWindow: c.windowState(), Retained: s.snap.Retained}
	if at, ok := s.view.FirstTokenTimeoutAt(); ok {
		ts := at.Sub(c.epoch).Seconds()
		d.Inputs.FirstTokenAt = &ts
	}
	return d
}

// decide turns gated candidate into an outcome: moved, blocked, or advisory. A move to prefill
// that only flip_resident_guard or consolidation_evidence block prepares its donor
// (Decision.Prepare), unless advisory.
func (c *Controller) decide(s *state, d decisionlog.Decision, cand *candidate) decisionlog.Decision {
	var failed []decisionlog.Gate
	for _, g := range d.Gates {
		if !g.Passed {
			failed = append(failed, g)
		}
	}
	if len(failed) > 0 {
		d.Outcome = decisionlog.OutcomeBlocked
		d.Reason += "; blocked by " + failed[0].Name
		if prepares(failed) && !c.cfg.Advisory {
			d.Prepare = cand.donor.ID
			d.Reason += "; preparing " + d.Prepare
		}
		return c.advise(d, &failed[0])
	}
	d.Switch = switchMethod(cand.donor)
	from, to := cand.donor.Role, fleet.Prefill
	if cand.dir == ToDecode {
		to = fleet.Decode
	}
	d.SplitAfter = decisionlog.Split{Prefill: len(cand.split.Prefill), Decode: len(cand.split.Decode)}
	if c.cfg.Advisory {
		d.Outcome, d.AdvisoryResult = decisionlog.OutcomeAdvisory, decisionlog.WouldMove
		return d
	}
	d.Outcome = decisionlog.OutcomeMoved
	d.Moves = []decisionlog.Move{{Engine: cand.donor.ID, From: from, To: to}}
	// Still short of prefill after this move, with a decode pool that could spare one more
	// engine (its TPOT ratio, spread over one engine fewer, within expand): the next donor is
	// prepared now, so that its streams drain while the next evaluation comes (section 7,
	// "Preparing a donor").
	th := c.cfg.Thresholds
	if dd := len(cand.split.Decode); cand.dir == ToPrefill && cand.price.TTFTRatio >= th.Expand && dd > 1 &&
		cand.price.TPOTRatio*float64(dd)/float64(dd-1) <= th.Expand {
		rs := c.ranks(s, ToPrefill)
		slices.SortFunc(rs, cmpRank)
		for _, r := range rs {
			if !r.ineligible && r.e.ID != cand.donor.ID {
				d.Prepare = r.e.ID
				d.Reason += fmt.Sprintf("; still short of prefill (ttft_ratio %.3f after the move): preparing %s", cand.price.TTFTRatio, d.Prepare)
				break
			}
		}
	}
	return d
}

// prepares reports whether a move toward prefill blocked by failed prepares its donor: when
// only the donor's residents (flip_resident_guard) and the arrival evidence still open
// (consolidation_evidence) stand in its way — both pass with time, and preparing, which only
// steers new streams away from the donor, lets its streams drain meanwhile (section 7).
func prepares(failed []decisionlog.Gate) bool {
	for _, g := range failed {
		if g.Name != decisionlog.GateFlipResidentGuard && g.Name != decisionlog.GateConsolidationEvidence {
			return false
		}
	}
	return len(failed) > 0
}

// advise marks a record of an advisory controller: the outcome it would have had.
func (c *Controller) advise(d decisionlog.Decision, failed *decisionlog.Gate) decisionlog.Decision {
	if !c.cfg.Advisory {
		return d
	}
	switch {
	case failed != nil:
		d.AdvisoryResult = decisionlog.BlockedBy(failed.Name)
	case d.Outcome == decisionlog.OutcomeDropped:
		return d
	default:
		d.AdvisoryResult = decisionlog.WouldRetain
	}
	d.Outcome = decisionlog.OutcomeAdvisory
	return d
}

// adjacent is the candidate moving one engine in dir from the current split: toward prefill the
// lightest eligible decode engine (fewest streams decoding on it, then fewest reserved on it
// by requests still prefilling elsewhere), toward decode the eligible
// prefill engine with the least projected prefill work left; ties by id. When no engine is
// eligible, the best of the others is taken so that the gates say why.
// The caller prices it.
func (c *Controller) adjacent(s *state, dir decisionlog.Direction) (candidate, bool) {
	rs := c.ranks(s, dir)
	if len(rs) == 0 {
		return candidate{}, false
	}
	donor := *slices.MinFunc(rs, cmpRank).e
	return candidate{dir: dir, donor: donor, split: moveEngine(s.cur, donor.ID, dir)}, true
}

func (c *Controller) since(t time.Time) float64 { return t.Sub(c.epoch).Seconds() }

// dwelt is the dwell rule: an engine whose role changed less than dwell_s ago keeps it; one
// that has kept its role since the start never moved, so dwell does not hold it. A move
// restored from an earlier run (fleet.Engine.Moved) counts from its time, before this start.
func (c *Controller) dwelt(t float64, e fleet.Engine) bool {
	return !e.Moved || t-c.since(e.RoleSince) >= c.cfg.Thresholds.DwellS
}

func (c *Controller) dwellGate(t float64, e fleet.Engine) decisionlog.Gate {
	g := decisionlog.Gate{Name: decisionlog.GateDwell, Passed: c.dwelt(t, e)}
	if !e.Moved {
		g.Detail = e.ID + " has kept its role since the start"
	} else {
		g.Detail = fmt.Sprintf("%s role_since %.1fs, dwell %gs", e.ID, c.since(e.RoleSince), c.cfg.Thresholds.DwellS)
	}
	return g
}

func (c *Controller) hasCurve(e fleet.Engine, dir decisionlog.Direction) bool {
	p := c.profiles[e.Profile]
	if dir == ToPrefill {
		return p.Prefill != nil
	}
	return p.Decode != nil
}

// gates checks a move (docs/role-control.md, section 7): the common gates, then those of its
// direction; an urgent evaluation checks exactly the urgent list.
func (c *Controller) gates(s *state, cand *candidate, p0 router.Pricing, caller decisionlog.Caller) []decisionlog.Gate {
	th := c.cfg.Thresholds
	e := cand.donor
	l := s.loads[e.ID]
	if l == nil {
		l = &router.EngineLoad{}
	}
	var gs []decisionlog.Gate
	add := func(name string, passed bool, format string, args ...any) {
		gs = append(gs, decisionlog.Gate{Name: name, Passed: passed, Detail: fmt.Sprintf(format, args...)})
	}
	p, d := len(cand.split.Prefill), len(cand.split.Decode)
	add(decisionlog.GatePins, !e.Pinned, "%s pinned=%t", e.ID, e.Pinned)
	gs = append(gs, c.floorsGate(p, d))
	add(decisionlog.GateHealthExclusions, e.Lifecycle == fleet.Active, "%s is %s", e.ID, e.Lifecycle)
	gs = append(gs, c.dwellGate(s.t, e))
	add(decisionlog.GateResidentOwnership, true, "%s keeps %d decode and %d prefill residents until they finish", e.ID, l.DecodeResidents+l.ReservedStreams, l.PrefillResidents)
	c.coverage(s, cand, l, add)
	if cand.dir == ToDecode {
		since := s.t - c.lastToDecode
		add(decisionlog.GateCooldown, since >= th.CooldownS, "last move toward decode %s ago, cooldown %gs", seconds(since), th.CooldownS)
		if caller == decisionlog.CallerRegular {
			n := max(c.conf.DecodeExpand, c.conf.DecodeConsolidate)
			if cand.relief { // chosen for the prefill pressure: its passes confirm it
				n = max(n, c.conf.PrefillExpand)
			}
			add(decisionlog.GateConfirmation, n >= th.ConfirmPasses, "%d consecutive passes, need %d", n, th.ConfirmPasses)
		}
		return gs
	}
	w := c.windowState()
	need := EvidenceNeed(c.cfg.Reactive.EvidenceMinArrivals, p0.TTFTRatio)
	enough := !w.Open || s.t-w.OpenedAtS >= c.cfg.Reactive.EvidenceSpanS && w.Arrivals >= need
	add(decisionlog.GateConsolidationEvidence, enough, "window opened at %.1fs, %d arrivals, open=%t (span %gs, min %d arrivals, max %gs; %d arrivals at prefill pressure %s)",
		w.OpenedAtS, w.Arrivals, w.Open, c.cfg.Reactive.EvidenceSpanS, c.cfg.Reactive.EvidenceMinArrivals, c.cfg.Reactive.EvidenceMaxSpanS, need, ratio(p0.TTFTRatio))
	if caller != decisionlog.CallerUrgent {
		timeout := false // the timeout that restarted the window is its start, not one since
		if at, ok := s.view.FirstTokenTimeoutAt(); ok {
			timeout = at.Sub(c.epoch).Seconds() > w.OpenedAtS
		}
		add(decisionlog.GateDecodeStability, cand.price.TPOTRatio <= th.Expand && !timeout,
			"candidate tpot_ratio %s (expand %g), first-token timeout since the window opened: %t", ratio(cand.price.TPOTRatio), th.Expand, timeout)
	}
	// The trend: decode demand is not rising, or the candidate's decode pool carries the rise
	// continued for one more short horizon within expand (docs/role-control.md, section 2).
	dem := s.snap.Demand
	short, long := dem.Short.OutputTokensPerS, dem.Long.OutputTokensPerS
	trend := short <= long*(1+th.TrendTolerance)
	detail := fmt.Sprintf("short output %.1f tok/s, long %.1f tok/s, tolerance %g", short, long, th.TrendTolerance)
	if !trend && dem.Priced.OutputTokensPerS > 0 {
		raised := short + max(0, short-long)
		ps, _ := s.view.Price(s.now, withOutputScale(PricingQuery(c.cfg, cand.split), raised/dem.Priced.OutputTokensPerS))
		trend = ps[0].TPOTRatio <= th.Expand
		detail += fmt.Sprintf("; rising, and with output demand raised to %.1f tok/s the candidate's tpot_ratio is %s (expand %g)", raised, ratio(ps[0].TPOTRatio), th.Expand)
	}
	add(decisionlog.GateConsolidationTrend, trend, "%s", detail)
	add(decisionlog.GateDecodeCapacity, cand.price.TPOTRatio <= th.Expand,
		"the %d remaining decode engines must carry every stream within capacity and the TPOT SLO: candidate tpot_ratio %s (expand %g)", d, ratio(cand.price.TPOTRatio), th.Expand)
	add(decisionlog.GateFlipResidentGuard, l.DecodeResidents <= th.FlipResidentGuard,
		"%s decodes %d streams, guard %d", e.ID, l.DecodeResidents, th.FlipResidentGuard)
	return gs
}

// EvidenceNeed is how many arrivals since the evidence window opened a move toward prefill needs
// when the current split's prefill pressure is ttftRatio (docs/role-control.md section 7): the
// arrival rate estimated from n arrivals is uncertain by about 1/√n of itself, so the evidence
// suffices once two of those are within the pressure's margin over the SLO — n ≥ 4/(ratio−1)²
// — and never more than evidence_min_arrivals (a pressure at 1.5× the SLO needs 16 arrivals,
// one at 1.01× the whole minimum).
func EvidenceNeed(minArrivals int, ttftRatio float64) uint64 {
	need := uint64(max(minArrivals, 0))
	if gap := ttftRatio - 1; gap > 0 {
		need = min(need, uint64(math.Ceil(4/(gap*gap))))
	}
	return need
}

// floorsGate is role_floors for a split of p prefill and d decode live engines: neither pool
// below its floor, whenever the live engines can hold both floors.
func (c *Controller) floorsGate(p, d int) decisionlog.Gate {
	minP, minD := c.cfg.MinPrefill, c.cfg.MinDecode
	g := decisionlog.Gate{Name: decisionlog.GateRoleFloors, Passed: p >= minP && d >= minD,
		Detail: fmt.Sprintf("after the move prefill %d (min %d), decode %d (min %d)", p, minP, d, minD)}
	if !g.Passed && p+d < minP+minD {
		g.Passed = true
		g.Detail += fmt.Sprintf("; %d live engines cannot hold both floors", p+d)
	}
	return g
}

// coverage is the profile_coverage gate: the donor's profile has the new role's curve, the
// operating point the move needs lies in its profiled range, and its correction for that phase
// is either unused (the offline profile as measured) or estimated from at least
// controller.profile.min_samples observations.
func (c *Controller) coverage(s *state, cand *candidate, l *router.EngineLoad, add func(string, bool, string, ...any)) {
	e := cand.donor
	prof := c.profiles[e.Profile]
	minSamples := c.cfg.Profile.MinSamples
	if cand.dir == ToPrefill {
		if prof.Prefill == nil {
			add(decisionlog.GateProfileCoverage, false, "%s: profile %s has no prefill curve", e.ID, e.Profile)
			return
		}
		dem := s.snap.Demand.Priced
		mean := 0.0
		if dem.ArrivalsPerS > 0 {
			mean = dem.PromptTokensPerS / dem.ArrivalsPerS
		}
		n := l.Correction.PrefillSamples
		ok := mean <= float64(prof.Prefill.MaxTokens) && (n == 0 || n >= minSamples)
		add(decisionlog.GateProfileCoverage, ok, "%s: mean prompt %.0f tokens (profiled to %d), prefill correction from %d samples (min %d)",
			e.ID, mean, prof.Prefill.MaxTokens, n, minSamples)
		return
	}
	if prof.Decode == nil {
		add(decisionlog.GateProfileCoverage, false, "%s: profile %s has no decode curve", e.ID, e.Profile)
		return
	}
	// The streams per decode engine after the move may lie outside the profiled range only as
	// far as the current split's already do: a move that brings an overloaded pool back toward
	// its profiled range is never blocked by coverage (docs/role-control.md, section 4).
	streams := float64(s.snap.Retained.Decoding + s.snap.Retained.Prefilling + s.snap.Retained.Waiting)
	per, now := streams/float64(len(cand.split.Decode)), streams/float64(max(len(s.cur.Decode), 1))
	n := l.Correction.DecodeSamples
	ok := (per <= float64(prof.Decode.MaxStreams) || per <= now) && (n == 0 || n >= minSamples)
	add(decisionlog.GateProfileCoverage, ok, "%s: %.1f streams per decode engine after the move, %.1f now (profiled to %d), decode correction from %d samples (min %d)",
		e.ID, per, now, prof.Decode.MaxStreams, n, minSamples)
}

func priced(s router.Split, p router.Pricing, current bool, move string) decisionlog.Priced {
	return decisionlog.Priced{Prefill: len(s.Prefill), Decode: len(s.Decode), TTFTRatio: decisionlog.Ratio(p.TTFTRatio), TPOTRatio: decisionlog.Ratio(p.TPOTRatio),
		Worst: decisionlog.Ratio(p.Worst), Current: current, Move: move, QueueWaitS: decisionlog.Ratio(p.QueueWaitS), Settled: p.Settled, Overload: decisionlog.Ratio(p.Overload), LocalShare: decisionlog.Ratio(p.LocalShare)}
}

func ratio(r float64) string {
	if math.IsInf(r, 1) {
		return "+Inf"
	}
	return fmt.Sprintf("%.3f", r)
}

func seconds(s float64) string {
	if math.IsInf(s, 1) {
		return "never (+Inf)"
	}
	return fmt.Sprintf("%.1fs", s)
}

// noteLifecycles records each engine's lifecycle at a monitor pass (readmission compares with
// it) and forgets the engines that left the fleet. An engine that joined at run time in its
// source's role is not noted until it is active: it is not readmitted, it starts in that role;
// one that joined without a role (RoleOpen) is, and readmission gives it one.
func (c *Controller) noteLifecycles(fl fleet.Snapshot) {
	held := 0 // entries for engines of fl: fewer than the map holds means some have left
	for _, e := range fl.Engines {
		_, seen := c.lifecycles[e.ID]
		switch {
		case seen || e.Source == fleet.SourceConfig:
			c.lifecycles[e.ID] = e.Lifecycle
		case e.RoleOpen:
			c.lifecycles[e.ID] = fleet.Recovering // readmitted once active, even if it is already
		case e.Live():
			c.lifecycles[e.ID] = e.Lifecycle
		default:
			continue
		}
		held++
	}
	if held < len(c.lifecycles) {
		ids := fl.IDs()
		for id := range c.lifecycles {
			if _, ok := ids[id]; !ok {
				delete(c.lifecycles, id)
			}
		}
	}
}

// evaluateMonitor is a monitor pass (docs/role-control.md, section 8): floor repair, then the
// readmission of an engine that became active again since the last pass. It reports false
// when neither has anything to evaluate. One call evaluates one thing; Tick calls it again
// (the pass stays due) until it has nothing left.
func (c *Controller) evaluateMonitor(s *state) (decisionlog.Decision, bool) {
	p, d := len(s.cur.Prefill), len(s.cur.Decode)
	// An engine switching in place toward a pool is on its way there: a floor it will restore
	// needs no second engine (if its switch fails it is failed, and the next pass repairs).
	toP, toD := 0, 0
	for _, e := range s.fleet.Engines {
		switch {
		case e.Lifecycle != fleet.Switching:
		case e.SwitchTo == fleet.Prefill:
			toP++
		case e.SwitchTo == fleet.Decode:
			toD++
		}
	}
	if !c.repaired { // one repair evaluation a pass
		c.repaired = true
		switch {
		case d+toD < c.cfg.MinDecode && p > c.cfg.MinPrefill:
			return c.repair(s, ToDecode, 1), true
		case p+toP < c.cfg.MinPrefill && d > c.cfg.MinDecode:
			return c.repair(s, ToPrefill, min(c.cfg.MinPrefill-p-toP, d-c.cfg.MinDecode)), true
		}
	}
	for _, e := range s.fleet.Engines {
		if was, seen := c.lifecycles[e.ID]; seen && was != fleet.Active && e.Live() {
			c.lifecycles[e.ID] = e.Lifecycle
			return c.readmit(s, e), true
		}
	}
	return decisionlog.Decision{}, false
}

// repair restores a floor: toward decode one engine a pass (decode-floor repair), toward
// prefill as many as the floor needs in one move (prefill-floor restoration). Pins, health and
// dwell hold; the evidence window, thresholds, cooldown and confirmation do not.
func (c *Controller) repair(s *state, dir decisionlog.Direction, n int) decisionlog.Decision {
	d := c.base(s, decisionlog.CallerRepair)
	d.Direction = dir
	floor, pool := "decode", fleet.Prefill
	if dir == ToPrefill {
		floor, pool = "prefill", fleet.Decode
	}
	d.Reason = fmt.Sprintf("the live %s pool (%d prefill, %d decode) is below its floor (min_prefill %d, min_decode %d)",
		floor, len(s.cur.Prefill), len(s.cur.Decode), c.cfg.MinPrefill, c.cfg.MinDecode)
	var moved []fleet.Engine
	var blocked []decisionlog.Gate
	for _, e := range c.ranked(s, dir) {
		if len(moved) == n {
			break
		}
		gs := []decisionlog.Gate{
			{Name: decisionlog.GatePins, Passed: !e.Pinned, Detail: fmt.Sprintf("%s pinned=%t", e.ID, e.Pinned)},
			{Name: decisionlog.GateHealthExclusions, Passed: e.Live() && e.Role == pool, Detail: fmt.Sprintf("%s is %s", e.ID, e.Lifecycle)},
			c.dwellGate(s.t, e),
			{Name: decisionlog.GateProfileCoverage, Passed: c.hasCurve(e, dir), Detail: fmt.Sprintf("%s: profile %s has the curve of the %s role: %t", e.ID, e.Profile, floor, c.hasCurve(e, dir))},
		}
		ok := true
		for _, g := range gs {
			ok = ok && g.Passed
		}
		if ok {
			moved = append(moved, e)
			d.Gates = append(d.Gates, gs...)
		} else if blocked == nil {
			blocked = gs
		}
	}
	if len(moved) == 0 {
		d.Gates = blocked
		d.Outcome = decisionlog.OutcomeBlocked
		d.Reason += "; no engine may move"
		for _, g := range blocked {
			if !g.Passed {
				d.Reason += " (" + g.Name + ")"
				return c.advise(d, &g)
			}
		}
		return c.advise(d, nil)
	}
	after := decisionlog.Split{Prefill: len(s.cur.Prefill) - len(moved), Decode: len(s.cur.Decode) + len(moved)}
	if dir == ToPrefill {
		after = decisionlog.Split{Prefill: len(s.cur.Prefill) + len(moved), Decode: len(s.cur.Decode) - len(moved)}
	}
	d.SplitAfter = after
	d.Switch = switchMethod(moved...)
	if c.cfg.Advisory {
		d.Outcome, d.AdvisoryResult, d.SplitAfter = decisionlog.OutcomeAdvisory, decisionlog.WouldMove, after
		return d
	}
	d.Outcome = decisionlog.OutcomeMoved
	for _, e := range moved {
		to := fleet.Decode
		if dir == ToPrefill {
			to = fleet.Prefill
		}
		d.Moves = append(d.Moves, decisionlog.Move{Engine: e.ID, From: e.Role, To: to})
	}
	return d
}

// ranked orders the live engines that could move in dir by the donor rules: eligible ones
// (unpinned, past their dwell, with the new role's curve) first; toward prefill the lightest
// decode engines (fewest streams decoding, then fewest reserved), toward decode the prefill
// engines with the least projected prefill work; ties by id.
func (c *Controller) ranked(s *state, dir decisionlog.Direction) []fleet.Engine {
	rs := c.ranks(s, dir)
	slices.SortFunc(rs, cmpRank)
	pool := make([]fleet.Engine, len(rs))
	for i := range rs {
		pool[i] = *rs[i].e
	}
	return pool
}

// rank is an engine's place in the donor order of a direction.
type rank struct {
	ineligible bool
	work, more float64 // toward prefill streams decoding and reserved; toward decode prefill work
	e          *fleet.Engine
}

// ranks are the live engines that could move in dir, unordered.
func (c *Controller) ranks(s *state, dir decisionlog.Direction) []rank {
	from := fleet.Decode
	if dir == ToDecode {
		from = fleet.Prefill
	}
	var rs []rank
	for i := range s.fleet.Engines {
		e := &s.fleet.Engines[i]
		if !e.Live() || e.Role != from {
			continue
		}
		r := rank{ineligible: e.Pinned || !c.dwelt(s.t, *e) || !c.hasCurve(*e, dir), e: e}
		switch l := s.loads[e.ID]; {
		case l == nil:
		case dir == ToPrefill:
			r.work, r.more = float64(l.DecodeResidents), float64(l.ReservedStreams)
		default:
			r.work = l.BusyUntilS
		}
		rs = append(rs, r)
	}
	return rs
}

// cmpRank orders donors: eligible first, then the least work, then id (a total order).
func cmpRank(a, b rank) int {
	switch {
	case a.ineligible != b.ineligible:
		if a.ineligible {
			return 1
		}
		return -1
	case a.work != b.work:
		return cmp.Compare(a.work, b.work)
	case a.more != b.more:
		return cmp.Compare(a.more, b.more)
	}
	return strings.Compare(a.e.ID, b.e.ID)
}

// readmit gives an engine that became active again the role whose pool the pricing says needs
// it more: it changes role only when the split with it in the other role strictly improves on
// the split with it in its own (lower worst by more than min_gain, as a regular move); on a
// tie it keeps its role. A pinned engine keeps its role, and so does one readmitted blind
// (fleet.SightBlind): its role is not moved on the word of probes that do not see it.
func (c *Controller) readmit(s *state, e fleet.Engine) decisionlog.Decision {
	d := c.base(s, decisionlog.CallerReadmission)
	asPrefill, asDecode := moveEngine(s.cur, e.ID, ToPrefill), moveEngine(s.cur, e.ID, ToDecode)
	ps, _ := s.view.Price(s.now, PricingQuery(c.cfg, asPrefill, asDecode))
	pp, pd := ps[0], ps[1]
	d.Candidates = []decisionlog.Priced{priced(asPrefill, pp, e.Role == fleet.Prefill, e.ID), priced(asDecode, pd, e.Role == fleet.Decode, e.ID)}
	gain := c.cfg.Thresholds.MinGain
	want, dir := e.Role, ToPrefill
	switch {
	case e.Role == fleet.Decode && lower(pp.Worst, pp.Overload, pd.Worst, pd.Overload, gain):
		want = fleet.Prefill
	case e.Role == fleet.Prefill && lower(pd.Worst, pd.Overload, pp.Worst, pp.Overload, gain):
		want, dir = fleet.Decode, ToDecode
	}
	if want == e.Role || e.Sight == fleet.SightBlind {
		d.Outcome = decisionlog.OutcomeRetained
		d.Reason = fmt.Sprintf("%s readmitted as %s: worst %.3f as prefill, %.3f as decode", e.ID, e.Role, pp.Worst, pd.Worst)
		if want != e.Role {
			d.Reason = fmt.Sprintf("%s readmitted as %s; %s would price lower (worst %.3f as prefill, %.3f as decode), but the data path failed it again while its probes passed: they do not see the engine (behind a sidecar, set engines[].health), and its role is not moved on their word",
				e.ID, e.Role, want, pp.Worst, pd.Worst)
		}
		return c.advise(d, nil)
	}
	after := asPrefill
	if want == fleet.Decode {
		after = asDecode
	}
	d.Gates = []decisionlog.Gate{
		{Name: decisionlog.GatePins, Passed: !e.Pinned, Detail: fmt.Sprintf("%s pinned=%t", e.ID, e.Pinned)},
		c.floorsGate(len(after.Prefill), len(after.Decode)),
		c.dwellGate(s.t, e),
		{Name: decisionlog.GateProfileCoverage, Passed: c.hasCurve(e, dir), Detail: fmt.Sprintf("%s: profile %s has a %s curve: %t", e.ID, e.Profile, want, c.hasCurve(e, dir))},
	}
	for i := range d.Gates {
		if !d.Gates[i].Passed {
			d.Outcome = decisionlog.OutcomeBlocked
			d.Reason = fmt.Sprintf("%s readmitted as %s; %s would price lower; blocked by %s", e.ID, e.Role, want, d.Gates[i].Name)
			return c.advise(d, &d.Gates[i])
		}
	}
	d.Direction = dir
	d.Reason = fmt.Sprintf("%s readmitted as %s: worst %.3f as prefill, %.3f as decode", e.ID, want, pp.Worst, pd.Worst)
	d.SplitAfter = decisionlog.Split{Prefill: len(asPrefill.Prefill), Decode: len(asPrefill.Decode)}
	if want == fleet.Decode {
		d.SplitAfter = decisionlog.Split{Prefill: len(asDecode.Prefill), Decode: len(asDecode.Decode)}
	}
	if c.cfg.Advisory {
		d.Outcome, d.AdvisoryResult = decisionlog.OutcomeAdvisory, decisionlog.WouldMove
		return d
	}
	d.Outcome, d.Switch = decisionlog.OutcomeMoved, switchMethod(e)
	d.Moves = []decisionlog.Move{{Engine: e.ID, From: e.Role, To: want}}
	return d
}

// switchMethod is how the engines moved change role: config.SwitchSGLang when any of them
// switches in place (docs/role-control.md section 11), else config.SwitchRouting.
func switchMethod(es ...fleet.Engine) string {
	for _, e := range es {
		if e.InPlace {
			return config.SwitchSGLang
		}
	}
	return config.SwitchRouting
}

// ErrProposal is a proposed split Advise cannot evaluate.
var ErrProposal = errors.New("controller: bad proposed split")

// Advise evaluates a proposed split as an advisory decision (POST /narwhal/advise, caller
// api): the moves that reach it from the current split by the donor rules, priced, with the
// gates of its direction checked on each moved engine (confirmation aside: an operator's
// proposal needs none). Nothing moves, whatever controller.advisory says.
func (c *Controller) Advise(now time.Time, fl fleet.Snapshot, v View, prefill, decode int, reason string) (decisionlog.Decision, error) {
	t := c.at(now)
	s := newState(c, now, t, fl, v)
	c.observeWindow(t, &s)
	p, d := len(s.cur.Prefill), len(s.cur.Decode)
	if prefill < 0 || decode < 0 || prefill+decode != p+d {
		return decisionlog.Decision{}, fmt.Errorf("%w: %d prefill + %d decode; the live engines are %d (%d prefill, %d decode)", ErrProposal, prefill, decode, p+d, p, d)
	}
	rec := c.base(&s, decisionlog.CallerAPI)
	rec.Reason = reason
	rec.Outcome, rec.AdvisoryResult = decisionlog.OutcomeAdvisory, decisionlog.WouldRetain
	dir, n := ToPrefill, prefill-p
	if n < 0 {
		dir, n = ToDecode, -n
	}
	donors := c.ranked(&s, dir)[:n]
	cand := candidate{dir: dir, split: s.cur}
	for _, e := range donors {
		cand.donor = e
		cand.split = moveEngine(cand.split, e.ID, dir)
	}
	splits := []router.Split{s.cur}
	if n > 0 {
		splits = append(splits, cand.split)
	}
	ps, _ := v.Price(now, PricingQuery(c.cfg, splits...))
	p0 := ps[0]
	rec.Candidates = append(rec.Candidates, priced(s.cur, p0, true, ""))
	if n == 0 {
		return c.record(rec), nil
	}
	rec.Direction = dir
	cand.price = ps[1]
	pc := priced(cand.split, cand.price, false, cand.donor.ID)
	rec.Candidates = append(rec.Candidates, pc)
	rec.SplitAfter = decisionlog.Split{Prefill: len(cand.split.Prefill), Decode: len(cand.split.Decode)}
	for _, e := range donors {
		cand.donor = e
		for _, g := range c.gates(&s, &cand, p0, decisionlog.CallerAPI) {
			rec.Gates = append(rec.Gates, g)
			if _, blocked := rec.AdvisoryResult.Gate(); !g.Passed && !blocked {
				rec.AdvisoryResult = decisionlog.BlockedBy(g.Name)
			}
		}
	}
	if rec.AdvisoryResult == decisionlog.WouldRetain {
		rec.AdvisoryResult = decisionlog.WouldMove
	}
	return c.record(rec), nil
}

// moveEngine returns s with engine id moved to the pool of dir.
// withoutEngine is s without engine id in either pool.
func withoutEngine(s router.Split, id string) router.Split {
	var out router.Split
	for _, e := range s.Prefill {
		if e != id {
			out.Prefill = append(out.Prefill, e)
		}
	}
	for _, e := range s.Decode {
		if e != id {
			out.Decode = append(out.Decode, e)
		}
	}
	return out
}

func moveEngine(s router.Split, id string, dir decisionlog.Direction) router.Split {
	out := withoutEngine(s, id)
	if dir == ToPrefill {
		out.Prefill = append(out.Prefill, id)
	} else {
		out.Decode = append(out.Decode, id)
	}
	return out
}
