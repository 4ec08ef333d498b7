package sim

import (
	"bytes"
	"cmp"
	"maps"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// fork returns an independent copy of a replay in the same state: engines with their residents,
// queues and caches, the router with its waiting set and corrections, the fleet, the health
// core, pending events and every request's outcome so far. The copy and the original then run
// apart. Only replays without a controller or planner fork (oracle:greedy's).
func (s *run) fork() *run {
	if s.c != nil || s.planner != nil {
		panic("sim: only a replay without a controller or planner forks")
	}
	n := new(run)
	*n = *s // what is shared: the config, the trace, engine indices; the rest is copied below
	n.f, n.r, n.health = s.f.Clone(), s.r.Clone(), s.health.Clone()
	n.logBuf = bytes.Buffer{}
	n.log = decisionlog.New(&n.logBuf, Epoch, n.cfg, n.f.Snapshot())
	n.f.OnChange(n.fleetEvent)
	n.engines = make([]*simEngine, len(s.engines))
	for i, e := range s.engines {
		ne := &simEngine{id: e.id, idx: e.idx, up: e.up, next: e.next, ver: e.ver, prof: e.prof, owner: n}
		ne.m = e.m.Clone(ne)
		n.engines[i] = ne
	}
	n.events = eventHeap{items: slices.Clone(s.events.items), seq: s.events.seq}
	n.handles = maps.Clone(s.handles)
	n.taken = router.Output{}
	n.out = slices.Clone(s.out)
	n.moves = slices.Clone(s.moves)
	n.faults = slices.Clone(s.faults)
	return n
}

// greedy replays oracle:greedy (docs/sim.md): at every window boundary it forks the whole
// replay once per split 1…N−1 of the live engines, and, with share, once per pair of adjacent
// splits shared (one engine alternating between the roles every step_s; oracle:split goes
// without: one split held per window, the most a controller held by dwell could do), sets it on each fork (the moves free
// and instant; residents stay where they are, as in a real move), runs each through the window,
// and goes on from the fork whose window did best: judged a window later with its split kept (a
// second fork, thrown away), the fewest of the requests arrived by then that missed the SLO for
// certain (turned away, failed, a late first token, a slow stream that finished) or still wait
// for a prefill engine — so a backlog or a crowded decode pool handed to the next window counts
// against the split that left it. (Judging only the window's own arrivals, a move that served
// them by starving the decode pool looked best, and the oracle fell 6 points under static:best
// on a diurnal load at its peak.) Ties (under overload every split may
// miss every such request) go to the smaller backlog then — requests admitted and without a
// first token — and then to the split nearest the current one. A bound on what role control can reach, in practice: it knows the window's
// traffic, moves for free and at once, and carries every consequence forward.
func greedy(s *run, windowS float64, share bool, progress func(t float64)) (*run, *Fidelity, error) {
	window := config.Seconds(windowS)
	par := max(1, runtime.GOMAXPROCS(0))
	fid := &Fidelity{}
	for at := Epoch; ; at = at.Add(window) {
		next := at.Add(window)
		live := s.liveSplit()
		type trial struct {
			prefill int
			shared  bool // the split alternates between prefill and prefill+1 every step_s
			r       *run
			over    bool
			misses  int
			backlog int
			ttft    []float64
			tpot    []float64
			err     error
		}
		var trials []*trial
		if n := len(live.prefill) + len(live.decode); n >= 2 {
			for _, p := range oracleSplits(len(live.prefill), n) {
				trials = append(trials, &trial{prefill: p})
				if share && p+1 < n {
					trials = append(trials, &trial{prefill: p, shared: true})
				}
			}
		} else {
			trials = append(trials, &trial{prefill: len(live.prefill)})
		}
		// The projection's ranking of the fixed splits tried, from this same state: what the
		// controller's pricing would choose (fidelity, docs/sim.md).
		var priced []router.Pricing
		var pricedAt []int // trial index of each priced split
		if !share && len(trials) > 1 {
			var splits []router.Split
			for k, tr := range trials {
				splits = append(splits, s.splitFor(tr.prefill))
				pricedAt = append(pricedAt, k)
			}
			priced, _ = s.r.Price(s.now, controller.PricingQuery(s.cfg.Controller, splits...))
		}
		sem := make(chan struct{}, par)
		var wg sync.WaitGroup
		for _, tr := range trials {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				f := s.fork()
				if tr.over, tr.err = f.runSplit(tr.prefill, tr.shared, next); tr.err != nil {
					return
				}
				tr.r = f
				// Judged a window later, the split kept, on every request arrived by then:
				// what the window leaves behind (a crowded decode pool, a backlog) shows up in
				// the next window's requests.
				look := f.fork()
				if _, tr.err = look.runSplit(tr.prefill, tr.shared, next.Add(window)); tr.err == nil {
					tr.misses, tr.backlog = look.misses(look.next), look.backlog()
					if priced != nil {
						tr.ttft, tr.tpot = look.measured(at, at.Add(config.Seconds(2*s.cfg.Controller.Reactive.StepS)))
					}
				}
			}()
		}
		wg.Wait()
		cmpTrial := func(a, b *trial) int {
			if c := cmp.Compare(a.misses, b.misses); c != 0 {
				return c
			}
			if c := cmp.Compare(a.backlog, b.backlog); c != 0 {
				return c
			}
			if a.shared != b.shared { // a fixed split before a shared one
				if b.shared {
					return -1
				}
				return 1
			}
			return cmp.Compare(abs(a.prefill-len(live.prefill)), abs(b.prefill-len(live.prefill)))
		}
		best := slices.MinFunc(trials, cmpTrial)
		if best.err != nil {
			return nil, nil, best.err
		}
		if priced != nil && at.Before(s.end) {
			// The split the projection ranks first (lowest worst, then overload, then nearest
			// the current split), against the oracle's.
			pick := 0
			for k := 1; k < len(priced); k++ {
				a, b := priced[k], priced[pick]
				switch {
				case lower(a.Worst, a.Overload, b.Worst, b.Overload):
					pick = k
				case !lower(b.Worst, b.Overload, a.Worst, a.Overload) &&
					abs(trials[pricedAt[k]].prefill-len(live.prefill)) < abs(trials[pricedAt[pick]].prefill-len(live.prefill)):
					pick = k
				}
			}
			chosen := trials[pricedAt[pick]]
			w := FidelityWindow{StartS: at.Sub(Epoch).Seconds(), Oracle: best.prefill, Priced: chosen.prefill,
				RegretMisses: chosen.misses - best.misses}
			for k, tr := range trials {
				if tr == best {
					p := priced[k]
					w.ProjectedTTFT, w.ProjectedTPOT = decisionlog.Ratio(p.ProbeTTFT/s.cfg.SLO.TTFTS), decisionlog.Ratio(p.TPOTRatio)
					w.MeasuredTTFT, w.MeasuredTPOT = decisionlog.Ratio(median(tr.ttft)/s.cfg.SLO.TTFTS), decisionlog.Ratio(median(tr.tpot)/s.cfg.SLO.TPOTS)
				}
			}
			fid.Windows = append(fid.Windows, w)
		}
		s = best.r
		if progress != nil {
			progress(next.Sub(Epoch).Seconds())
		}
		if best.over {
			if share {
				fid = nil
			}
			return s, fid, nil
		}
	}
}

// lower reports whether a split priced (worst, overload) ranks before another: a lower worst,
// or, both +Inf, a lower overload (the controller's order, docs/role-control.md section 3).
func lower(worst, overload, thanWorst, thanOverload float64) bool {
	if math.IsInf(worst, 1) && math.IsInf(thanWorst, 1) {
		return overload < thanOverload
	}
	return worst < thanWorst
}

// maxOracleSplits is how many fixed splits an oracle window tries at most; a larger fleet's
// oracle tries the splits at distances 0, 1, 2, 4, 8, … from the current one (both ways).
const maxOracleSplits = 15

// oracleSplits are the prefill pool sizes an oracle window tries from a split of cur prefill
// engines out of n: every split 1…n−1, or on a fleet too large for that, the current one and
// those at distances 1, 2, 4, 8, … from it.
func oracleSplits(cur, n int) []int {
	if n-1 <= maxOracleSplits {
		out := make([]int, 0, n-1)
		for p := 1; p < n; p++ {
			out = append(out, p)
		}
		return out
	}
	out := []int{min(max(cur, 1), n-1)}
	for d := 1; d < n; d *= 2 {
		for _, p := range []int{cur - d, cur + d} {
			if p >= 1 && p < n && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// measured is what the replay measured of the requests arriving in [from, to): their TTFTs
// (one still without a first token counts its wait so far) and the seconds per output token of
// those that finished with two tokens or more.
func (s *run) measured(from, to time.Time) (ttft, tpot []float64) {
	for i := 0; i < s.next; i++ {
		o := &s.out[i]
		if o.arrival.IsZero() || o.arrival.Before(from) || !o.arrival.Before(to) || o.rejected || o.failed {
			continue
		}
		if o.first.IsZero() {
			ttft = append(ttft, s.now.Sub(o.arrival).Seconds())
			continue
		}
		ttft = append(ttft, o.first.Sub(o.arrival).Seconds())
		if !o.done.IsZero() && o.generated > 1 {
			tpot = append(tpot, o.done.Sub(o.first).Seconds()/float64(o.generated-1))
		}
	}
	return ttft, tpot
}

// median of xs (sorting them); NaN for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func abs(x int) int { return max(x, -x) }

// runSplit runs the replay until until with prefill prefill engines, or, shared, with one
// engine alternating between the roles every controller.reactive.step_s (prefill, then
// prefill+1, …): the time-sharing a controller that moves every pass can do, which a split held
// for a window cannot (an overloaded fleet served 0.84 by flipping an engine every few seconds
// where any fixed split served 0.6).
func (s *run) runSplit(prefill int, shared bool, until time.Time) (over bool, err error) {
	if !shared {
		s.setSplit(prefill)
		return s.runUntil(until, nil)
	}
	step := config.Seconds(s.cfg.Controller.Reactive.StepS)
	for k := 0; s.now.Before(until); k++ {
		s.setSplit(prefill + k%2)
		end := s.now.Add(step)
		if end.After(until) {
			end = until
		}
		if over, err = s.runUntil(end, nil); over || err != nil {
			return over, err
		}
	}
	return false, nil
}

// pools are the live engines of each role, by id.
type pools struct{ prefill, decode []string }

func (s *run) liveSplit() pools {
	var p pools
	for _, e := range s.f.Snapshot().Engines {
		switch {
		case !e.Live():
		case e.Role == fleet.Prefill:
			p.prefill = append(p.prefill, e.ID)
		default:
			p.decode = append(p.decode, e.ID)
		}
	}
	return p
}

// splitFor is the split setSplit makes of the live engines for prefill prefill engines: the
// decode engines holding the fewest requests move to prefill, or the prefill engines holding
// the fewest to decode, then by id.
func (s *run) splitFor(prefill int) router.Split {
	live := s.liveSplit()
	from, n := live.decode, prefill-len(live.prefill)
	if n < 0 {
		from, n = live.prefill, -n
	}
	slices.SortStableFunc(from, func(a, b string) int {
		return cmp.Compare(s.engines[s.byID[a]].m.Residents(), s.engines[s.byID[b]].m.Residents())
	})
	moving := from[:min(n, len(from))]
	var sp router.Split
	for _, id := range live.prefill {
		if prefill >= len(live.prefill) || !slices.Contains(moving, id) {
			sp.Prefill = append(sp.Prefill, id)
		}
	}
	for _, id := range live.decode {
		if prefill <= len(live.prefill) || !slices.Contains(moving, id) {
			sp.Decode = append(sp.Decode, id)
		}
	}
	if prefill > len(live.prefill) {
		sp.Prefill = append(sp.Prefill, moving...)
	} else {
		sp.Decode = append(sp.Decode, moving...)
	}
	return sp
}

// setSplit moves live engines until prefill of them are prefill engines (splitFor's choice).
func (s *run) setSplit(prefill int) {
	sp := s.splitFor(prefill)
	moved := false
	for _, id := range sp.Prefill {
		if e, _ := s.f.Engine(id); e.Role != fleet.Prefill {
			if _, err := s.f.SetRole(id, fleet.Prefill, s.now, "oracle:greedy"); err == nil {
				moved = true
			}
		}
	}
	for _, id := range sp.Decode {
		if e, _ := s.f.Engine(id); e.Role != fleet.Decode {
			if _, err := s.f.SetRole(id, fleet.Decode, s.now, "oracle:greedy"); err == nil {
				moved = true
			}
		}
	}
	if moved {
		s.syncFleet()
		s.settle()
	}
}

// misses counts the first n requests of the trace that missed the SLO for certain by now, or
// still wait for a prefill engine.
func (s *run) misses(n int) int {
	slo := s.cfg.SLO
	missed := 0
	for i := 0; i < min(n, s.next); i++ {
		o := &s.out[i]
		switch {
		case o.arrival.IsZero(): // skipped: it came after the replay's end
		case o.rejected, o.failed:
			missed++
		case o.left.IsZero(): // waiting
			missed++
		case !o.first.IsZero() && o.first.Sub(o.arrival).Seconds() > slo.TTFTS:
			missed++
		case o.first.IsZero() && s.now.Sub(o.arrival).Seconds() > slo.TTFTS:
			missed++
		case !o.done.IsZero() && o.generated > 1 && o.done.Sub(o.first).Seconds()/float64(o.generated-1) > slo.TPOTS:
			missed++
		}
	}
	return missed
}

// backlog counts the requests admitted and without a first token yet.
func (s *run) backlog() int {
	n := 0
	for i := 0; i < s.next; i++ {
		if o := &s.out[i]; !o.arrival.IsZero() && !o.rejected && !o.failed && o.first.IsZero() {
			n++
		}
	}
	return n
}
