package main

// The generated scorecard (make bench-control-random, docs/benchmarks.md "The generated
// scorecard"): a seeded generator of scenarios too many and too varied to tune the controller
// to — load shapes from a stationary rate to thirty-minute phases, fleets of 4 to 64 engines
// starting anywhere from 1P to N−1P, four engine profiles, faults — each replayed under narwhal,
// static, static:best, threshold and oracle:split at the config's defaults, with its rate placed
// so that the best static split attains between 0.6 and 0.98.

import (
	"bytes"
	"cmp"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/internal/benchdoc"
	"github.com/narwhal-llm/narwhal/sim"
)

const (
	randomBegin = "<!-- bench-control-random:begin -->"
	randomEnd   = "<!-- bench-control-random:end -->"
	// maxRequests bounds a scenario's requests (its engines are slowed to fit a long shape).
	maxRequests = 30000
	// bandLo and bandHi are where static:best's attainment is placed: a scenario where every
	// policy attains 1.0 or 0.0 says nothing.
	bandLo, bandHi = 0.6, 0.98
	// calibrations is how many rates are tried to place a scenario in the band.
	calibrations = 6
)

// Shapes of load, the families the figures are given for.
var shapes = []string{"stationary", "step", "phases", "diurnal", "onoff", "storm", "daynight", "trace"}

// shifting are the families whose load changes shape or size over the scenario.
func isShifting(family string) bool { return family != "stationary" }

// engineProfile is one engine class of the generator, with the SLO it is served under.
type engineProfile struct {
	name string
	prof config.Profile
	slo  config.SLO
}

// profiles are the generator's engine classes: today's (the default config's measured profile),
// a quadratic prefill with few fast decode slots, a decode pool bound by its KV tokens, and one
// bound by the TPOT SLO.
func profiles() []engineProfile {
	return []engineProfile{
		{"default", config.DefaultProfile(), config.SLO{TTFTS: 0.5, TPOTS: 0.05}},
		{"quadratic", config.Profile{
			Prefill:            &config.PrefillCurve{BaseS: 0.05, PerTokenS: 1.5e-4, PerToken2S: 4e-8, MaxTokens: 32768},
			PrefillConcurrency: 4,
			Decode:             &config.DecodeCurve{BaseS: 0.012, PerStreamS: 4e-4, PerKVTokenS: 2e-8, MaxStreams: 24, MaxKVTokens: 196608},
			KVTransferS:        0.02,
		}, config.SLO{TTFTS: 10, TPOTS: 0.06}},
		{"kv-bound", config.Profile{
			Prefill:            &config.PrefillCurve{BaseS: 0.03, PerTokenS: 3e-5, PerToken2S: 8e-10, MaxTokens: 32768},
			PrefillConcurrency: 4,
			Decode:             &config.DecodeCurve{BaseS: 0.006, PerStreamS: 2e-5, PerKVTokenS: 2e-8, MaxStreams: 512, MaxKVTokens: 120000},
			KVTransferS:        0.01,
		}, config.SLO{TTFTS: 1, TPOTS: 0.05}},
		{"tpot-bound", config.Profile{
			Prefill:            &config.PrefillCurve{BaseS: 0.02, PerTokenS: 2e-5, PerToken2S: 5e-10, MaxTokens: 32768},
			PrefillConcurrency: 4,
			Decode:             &config.DecodeCurve{BaseS: 0.015, PerStreamS: 2.5e-4, PerKVTokenS: 1e-8, MaxStreams: 512, MaxKVTokens: 2000000},
			KVTransferS:        0.005,
		}, config.SLO{TTFTS: 0.5, TPOTS: 0.04}},
	}
}

// slowed is a profile whose every time is k times longer (a slower engine of the same kind),
// and its SLO k times looser.
func slowed(p engineProfile, k float64) engineProfile {
	pre, dec := *p.prof.Prefill, *p.prof.Decode
	pre.BaseS, pre.PerTokenS, pre.PerToken2S = pre.BaseS*k, pre.PerTokenS*k, pre.PerToken2S*k
	dec.BaseS, dec.PerStreamS, dec.PerKVTokenS = dec.BaseS*k, dec.PerStreamS*k, dec.PerKVTokenS*k
	p.prof.Prefill, p.prof.Decode = &pre, &dec
	p.prof.KVTransferS *= k
	p.slo = config.SLO{TTFTS: p.slo.TTFTS * k, TPOTS: p.slo.TPOTS * k}
	return p
}

// mixes scale a workload's prompt and output lengths.
var mixes = []struct {
	name           string
	prompt, output float64
}{{"chat", 1, 1}, {"code", 3, 0.5}, {"docs", 5, 0.3}, {"gen", 0.4, 2.5}}

// scenario is one generated workload on one fleet.
type scenario struct {
	idx     int
	family  string
	engines int
	start   int // prefill engines at the start
	profile engineProfile
	speed   float64 // the profile's slowdown
	mix     int
	load    float64 // the rate as a share of the best split's nominal capacity
	syn     sim.Synthetic
	trace   string  // family trace: the shared trace replayed
	window  float64 // family trace: the span of the original cut (seconds)
	fault   *[2]float64
	faulty  int // the engine that fails
	rate    float64
	nominal float64 // the nominal capacity (req/s) the rate is placed against
}

func (sc *scenario) name() string {
	n := fmt.Sprintf("#%03d %s %s %de %s×%g %dP", sc.idx, sc.family, mixes[sc.mix].name, sc.engines, sc.profile.name, sc.speed, sc.start)
	if sc.fault != nil {
		n += " fault"
	}
	return n
}

// generate draws the n scenarios of a seed: the same seed, the same scenarios.
func generate(seed int64, n int) []*scenario {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x72616e646f6d)) // "random"
	ps := profiles()
	var out []*scenario
	for i := 0; i < n; i++ {
		sc := &scenario{idx: i + 1, family: shapes[i%len(shapes)]}
		sc.engines = pick(rng, []int{4, 8, 16, 64}, []float64{0.3, 0.35, 0.25, 0.1})
		sc.start = 1 + rng.IntN(sc.engines-1)
		sc.profile = ps[rng.IntN(len(ps))]
		sc.mix = pick(rng, []int{0, 1, 2, 3}, []float64{0.4, 0.25, 0.15, 0.2})
		sc.speed = []float64{1, 2, 4, 8}[rng.IntN(4)]
		sc.load = 0.7 + 0.5*rng.Float64()
		var dur float64
		s := sim.Synthetic{Kind: "step", Factor: 1, PromptScale: mixes[sc.mix].prompt, OutputScale: mixes[sc.mix].output}
		switch sc.family {
		case "stationary":
			dur = 600 + 1200*rng.Float64()
		case "step":
			s.Factor = 1.5 + 1.5*rng.Float64()
			dur = 600 + 1200*rng.Float64()
			s.StepAtS, s.StepLenS = dur/3, dur/3
		case "phases":
			s.Kind = "phases"
			s.PhaseS = logUniform(rng, 20, 1800)
			dur = 3 * s.PhaseS
			s.PromptScale, s.OutputScale = 1, 1 // the phases bring their own mixes
		case "diurnal":
			s.Kind = "diurnal"
			s.PeriodS = logUniform(rng, 120, 1800)
			dur = s.PeriodS * (1 + rng.Float64())
		case "onoff":
			s.Kind = "onoff"
			s.OnS, s.OffS = logUniform(rng, 10, 120), logUniform(rng, 10, 120)
			s.Factor = 2 + 3*rng.Float64()
			dur = max(600, 4*(s.OnS+s.OffS))
		case "storm":
			s.Kind = "longprompt"
			s.StormEveryS = logUniform(rng, 60, 600)
			s.StormLenS = s.StormEveryS * (0.1 + 0.3*rng.Float64())
			dur = max(600, 3*s.StormEveryS)
		case "daynight":
			s.Kind = "daynight"
			s.PeriodS = logUniform(rng, 120, 1800)
			dur = 2 * s.PeriodS
			s.PromptScale, s.OutputScale = 1, 1
		case "trace":
			sc.trace = []string{"azure-2023-conv", "mooncake-fast25-conversation", "mooncake-fast25-synthetic"}[rng.IntN(3)]
			dur = 600 + 1200*rng.Float64()
			sc.window = dur * (1 + 9*rng.Float64()) // compressed 1× to 10×
			s.PromptScale, s.OutputScale = 1, 1
		}
		s.DurationS = math.Round(dur)
		s.Seed = int64(rng.Uint32())
		sc.syn = s
		if rng.Float64() < 0.15 {
			at := dur * (0.2 + 0.4*rng.Float64())
			sc.fault = &[2]float64{math.Round(at), math.Round(at + dur*(0.1+0.2*rng.Float64()))}
			sc.faulty = rng.IntN(sc.engines)
		}
		out = append(out, sc)
	}
	return out
}

func pick[T any](rng *rand.Rand, xs []T, weights []float64) T {
	u := rng.Float64()
	for i, w := range weights {
		if u -= w; u < 0 {
			return xs[i]
		}
	}
	return xs[len(xs)-1]
}

func logUniform(rng *rand.Rand, lo, hi float64) float64 {
	return math.Round(lo * math.Exp(rng.Float64()*math.Log(hi/lo)))
}

// traces are the shared traces, loaded once.
type traces map[string][]sim.Request

func loadTraces(root string) traces {
	ts := traces{}
	for _, name := range []string{"azure-2023-conv", "mooncake-fast25-conversation", "mooncake-fast25-synthetic"} {
		reqs, err := sim.LoadTrace(filepath.Join(root, "sim/testdata", name+".csv.gz"), 0)
		if err != nil {
			log.Fatal(err)
		}
		if name == "mooncake-fast25-conversation" {
			reqs = sim.Spread(reqs, 3, 1)
		}
		ts[name] = reqs
	}
	return ts
}

// workload draws the scenario's requests at rate (req/s, the shape's base rate), each prompt
// cut to the longest the profile prefills alone in half the TTFT SLO (a deployment is not
// sized for prompts no split can serve in time).
func (sc *scenario) workload(ts traces, rate float64) ([]sim.Request, []sim.Change) {
	reqs, changes := sc.draw(ts, rate)
	limit := maxPrompt(sc.profile)
	for i := range reqs {
		reqs[i].InputTokens = min(reqs[i].InputTokens, limit)
		if n := (limit + sim.TraceBlockTokens - 1) / sim.TraceBlockTokens; len(reqs[i].PrefixBlocks) > n {
			reqs[i].PrefixBlocks = reqs[i].PrefixBlocks[:n]
		}
	}
	return reqs, changes
}

// maxPrompt is the longest prompt the profile prefills alone within half its TTFT SLO.
func maxPrompt(p engineProfile) int {
	n := 1
	for n < p.prof.Prefill.MaxTokens && p.prof.Prefill.Seconds(2*n) <= p.slo.TTFTS/2 {
		n *= 2
	}
	for step := n / 2; step >= 1; step /= 2 {
		if n+step <= p.prof.Prefill.MaxTokens && p.prof.Prefill.Seconds(n+step) <= p.slo.TTFTS/2 {
			n += step
		}
	}
	return n
}

func (sc *scenario) draw(ts traces, rate float64) ([]sim.Request, []sim.Change) {
	if sc.family == "trace" {
		// A window of the trace from a seeded offset, compressed into the scenario's span, then
		// superposed with copies of itself circularly shifted along the span and thinned
		// (seeded) to the rate: the trace's sizes and burstiness at another rate and pace.
		src := ts[sc.trace]
		span := src[len(src)-1].ArrivalS
		win := min(sc.window, span)
		rng := rand.New(rand.NewPCG(uint64(sc.syn.Seed), 0x7472616365)) // "trace"
		off := rng.Float64() * math.Max(span-win, 0)
		d := sc.syn.DurationS
		var cut []sim.Request
		for _, q := range src {
			if q.ArrivalS >= off && q.ArrivalS < off+win {
				q.ArrivalS = (q.ArrivalS - off) * d / win
				cut = append(cut, q)
			}
		}
		copies := max(1, int(math.Ceil(rate*d/float64(max(len(cut), 1)))))
		keep := rate * d / float64(max(len(cut), 1)*copies)
		var out []sim.Request
		for c := 0; c < copies; c++ {
			shift := float64(c) * d / float64(copies)
			for _, q := range cut {
				if rng.Float64() < keep {
					q.ArrivalS = math.Round(math.Mod(q.ArrivalS+shift, d)*1000) / 1000
					out = append(out, q)
				}
			}
		}
		slices.SortStableFunc(out, func(a, b sim.Request) int { return cmp.Compare(a.ArrivalS, b.ArrivalS) })
		return out, nil
	}
	s := sc.syn
	switch s.Kind {
	case "onoff", "step":
		s.RatePerS = rate / s.Factor
	case "diurnal":
		s.RatePerS = rate / 1.8
	case "longprompt":
		s.RatePerS = 0.8 * rate
		s.StormRatePerS = 0.2 * rate
	default:
		s.RatePerS = rate
	}
	reqs, changes, err := s.Generate()
	if err != nil {
		log.Fatal(err)
	}
	return reqs, changes
}

// nominal is the best split's capacity for the requests' sizes (req/s): a prefill engine
// serves 1/E[prefill seconds] requests a second; a decode engine the most streams whose step
// stays under 0.8 × the TPOT SLO within its stream and KV capacity, each for the mean output;
// the split that balances the two pools serves the smaller of them.
func nominal(p engineProfile, engines int, reqs []sim.Request) float64 {
	if len(reqs) == 0 {
		return 1
	}
	var pre, out, kv float64
	for _, q := range reqs {
		pre += p.prof.Prefill.Seconds(q.InputTokens)
		out += float64(q.OutputTokens)
		kv += float64(q.InputTokens) + float64(q.OutputTokens)/2
	}
	n := float64(len(reqs))
	pre, out, kv = pre/n, out/n, kv/n
	d := p.prof.Decode
	b := 1
	for b < d.MaxStreams && float64(b+1)*kv <= float64(d.MaxKVTokens) && d.StepSeconds(b+1, int(float64(b+1)*kv)) <= 0.8*p.slo.TPOTS {
		b++
	}
	perDecode := float64(b) / (out * d.StepSeconds(b, int(float64(b)*kv)))
	perPrefill := 1 / pre
	best := 0.0
	for k := 1; k < engines; k++ {
		best = max(best, min(float64(k)*perPrefill, float64(engines-k)*perDecode))
	}
	return best
}

// config is the scenario's fleet: engines of its profile, the first start of them prefill, its
// SLO and its fault.
func (sc *scenario) config(base *config.Config) *config.Config {
	c := *base
	c.SLO = sc.profile.slo
	// What an operator sets with the SLO: a first token later than twice the SLO after
	// dispatch is a timeout, a request may wait three SLOs (the defaults, 10 s and 30 s, are
	// for the default profile's half-second SLO).
	c.Router.FirstTokenTimeoutS = max(c.Router.FirstTokenTimeoutS, 2*c.SLO.TTFTS)
	c.Router.WaitingSet.MaxWaitS = max(c.Router.WaitingSet.MaxWaitS, 3*c.SLO.TTFTS)
	c.Profiles = map[string]config.Profile{sc.profile.name: sc.profile.prof}
	c.Engines = nil
	for i := 0; i < sc.engines; i++ {
		role := config.RoleDecode
		if i < sc.start {
			role = config.RolePrefill
		}
		c.Engines = append(c.Engines, config.Engine{ID: "e" + strconv.Itoa(i+1), Address: fmt.Sprintf("127.0.0.1:%d", 8001+i), Role: role,
			Profile: sc.profile.name, Switch: config.SwitchRouting})
	}
	c.Sim.Faults = nil
	if sc.fault != nil {
		id := "e" + strconv.Itoa(sc.faulty+1)
		c.Sim.Faults = []config.Fault{{AtS: sc.fault[0], Engine: id, Kind: "fail"}, {AtS: sc.fault[1], Engine: id, Kind: "recover"}}
	}
	return &c
}

// outcome is one scenario's figures.
type outcome struct {
	sc                                 *scenario
	requests                           int
	narwhal, static, best, thr, oracle float64
	bestSplit                          int
	damaged                            int
	violations                         int
	changes                            int
	fid                                *sim.Fidelity
	gates                              string
	calibrated                         bool // static:best landed in the band
	wall                               float64
	report                             *sim.Report // kept when asked (-reports)
}

// statics replays static splits and returns each one's attainment: every split on a fleet of
// up to 16 engines, else a grid refined around its best (attainment over splits has one peak).
func statics(cfg *config.Config, reqs []sim.Request, o sim.Options) (map[int]float64, error) {
	n := len(cfg.Engines)
	got := map[int]float64{}
	run := func(ps []int) error {
		var names []string
		for _, p := range ps {
			if _, ok := got[p]; !ok && p >= 1 && p < n {
				names = append(names, "static:"+strconv.Itoa(p))
			}
		}
		if len(names) == 0 {
			return nil
		}
		pol, err := sim.ParsePolicies(strings.Join(names, ","), n)
		if err != nil {
			return err
		}
		oo := o
		oo.Policies = pol
		rep, err := sim.Simulate(cfg, reqs, oo)
		if err != nil {
			return err
		}
		for _, pr := range rep.Policies {
			p, _ := strconv.Atoi(strings.TrimPrefix(pr.Policy, "static:"))
			got[p] = pr.SLOAttainment
		}
		return nil
	}
	if n <= 17 {
		var all []int
		for p := 1; p < n; p++ {
			all = append(all, p)
		}
		return got, run(all)
	}
	var grid []int
	for p := n / 8; p < n; p += n / 8 {
		grid = append(grid, p)
	}
	if err := run(grid); err != nil {
		return nil, err
	}
	for step := n / 16; step >= 1; step /= 2 {
		b := bestOf(got)
		if err := run([]int{b - step, b + step}); err != nil {
			return nil, err
		}
	}
	return got, nil
}

// bestOf is the split with the highest attainment (ties: fewer prefill engines).
func bestOf(got map[int]float64) int {
	best := -1
	for p, a := range got {
		if best < 0 || a > got[best] || a == got[best] && p < best {
			best = p
		}
	}
	return best
}

// play calibrates a scenario's rate into the band and replays it under every policy; at fixed
// (above 0) it replays at that rate instead (-rates: another run's rates, docs/benchmarks.md).
func play(base *config.Config, ts traces, sc *scenario, keep bool, fixed float64) (*outcome, error) {
	t0 := time.Now()
	// The nominal capacity at the shape's sizes, then the engines slowed (and the SLO loosened)
	// until the scenario's requests fit the budget.
	reqs, _ := sc.workload(ts, 10)
	sc.nominal = nominal(sc.profile, sc.engines, reqs)
	rate := sc.load * sc.nominal / sc.speed
	if need := rate * sc.syn.DurationS / maxRequests; need > 1 {
		sc.speed *= math.Ceil(need)
		rate = sc.load * sc.nominal / sc.speed
	}
	sc.profile = slowed(sc.profile, sc.speed)
	cfg := sc.config(base)
	o := sim.Options{Seed: 1, WindowS: windowS, Parallel: 2, Trace: sc.name()}
	var got map[int]float64
	var changes []sim.Change
	calibrated := false
	// Bracket the rate: below lo static:best attains more than the band, above hi less.
	lo, hi := 0.0, math.Inf(1)
	tries := calibrations
	if fixed > 0 {
		rate, tries = fixed, 1
	}
	for k := 0; k < tries; k++ {
		sc.rate = rate
		reqs, changes = sc.workload(ts, rate)
		var err error
		if got, err = statics(cfg, reqs, o); err != nil {
			return nil, err
		}
		a := got[bestOf(got)]
		if a >= bandLo && a <= bandHi {
			calibrated = true
			break
		}
		if a > bandHi {
			lo = rate
		} else {
			hi = rate
		}
		switch {
		case lo > 0 && !math.IsInf(hi, 1):
			rate = math.Sqrt(lo * hi)
		case a > bandHi:
			rate *= 1 + math.Min(1, 4*(a-bandHi)+0.15)
		default:
			rate /= 1 + math.Min(1, 2*(bandLo-a)+0.15)
		}
	}
	pol, err := sim.ParsePolicies("narwhal,threshold,oracle:split", sc.engines)
	if err != nil {
		return nil, err
	}
	o.Policies, o.Changes = pol, changes
	rep, err := sim.Simulate(cfg, reqs, o)
	if err != nil {
		return nil, err
	}
	out := &outcome{sc: sc, requests: len(reqs), calibrated: calibrated, static: got[sc.start], bestSplit: bestOf(got)}
	out.best = got[out.bestSplit]
	for _, pr := range rep.Policies {
		switch pr.Policy {
		case "narwhal":
			out.narwhal, out.damaged, out.violations, out.changes = pr.SLOAttainment, pr.DamagedRequests, pr.GuardViolations, pr.RoleChanges
		case "threshold":
			out.thr = pr.SLOAttainment
		case "oracle:split":
			out.oracle, out.fid = pr.SLOAttainment, pr.Fidelity
		}
	}
	var buf bytes.Buffer
	if err := rep.WriteDecisions(&buf); err != nil {
		return nil, err
	}
	out.gates = tally(buf.Bytes())
	if keep {
		out.report = rep
	}
	out.wall = time.Since(t0).Seconds()
	return out, nil
}

// tally summarises a decision log: moves by caller and direction, and blocked evaluations by
// the first gate that failed.
func tally(b []byte) string {
	moved := map[string]int{}
	blocked := map[string]int{}
	_ = decisionlog.Read(bytes.NewReader(b), func(l decisionlog.Line) error {
		d := l.Decision
		if d == nil {
			return nil
		}
		switch d.Outcome {
		case decisionlog.OutcomeMoved:
			for _, m := range d.Moves {
				moved[fmt.Sprintf("%s→%s", d.Caller, m.To)]++
			}
		case decisionlog.OutcomeBlocked:
			for _, g := range d.Gates {
				if !g.Passed {
					blocked[fmt.Sprintf("%s %s", d.Caller, g.Name)]++
					break
				}
			}
		}
		return nil
	})
	return "moved " + counts(moved) + "; blocked " + counts(blocked)
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// randomScorecard generates n scenarios from seed, plays them, prints the figures and (write)
// puts them into docs/benchmarks.md. A scenario rates names is replayed at that rate, not
// calibrated.
func randomScorecard(root string, base *config.Config, seed int64, n int, only string, write bool, reportsDir string, rates map[int]float64) {
	started := time.Now()
	ts := loadTraces(root)
	scs := generate(seed, n)
	var outs []*outcome
	for _, sc := range scs {
		if only != "" && !slices.Contains(strings.Split(only, ","), strconv.Itoa(sc.idx)) {
			continue
		}
		out, err := play(base, ts, sc, reportsDir != "", rates[sc.idx])
		if err != nil {
			log.Fatalf("%s: %v", sc.name(), err)
		}
		if reportsDir != "" {
			if err := writeReport(filepath.Join(reportsDir, fmt.Sprintf("scenario-%03d", sc.idx)), out.report); err != nil {
				log.Fatal(err)
			}
		}
		outs = append(outs, out)
		log.Printf("%s: %.1f req/s, %d requests, %.0f s wall; narwhal %.3f static %.3f static:best(%dP) %.3f threshold %.3f oracle:split %.3f%s",
			sc.name(), sc.rate, out.requests, out.wall, out.narwhal, out.static, out.bestSplit, out.best, out.thr, out.oracle, map[bool]string{false: " (out of band)", true: ""}[out.calibrated])
	}
	text := randomReport(outs, seed, time.Since(started))
	if !write || only != "" {
		fmt.Print(text)
		return
	}
	if err := benchdoc.Replace(filepath.Join(root, "docs/benchmarks.md"), randomBegin, randomEnd, text); err != nil {
		log.Fatal(err)
	}
	fmt.Print(text)
}

// randomReport is the generated scorecard's section of docs/benchmarks.md.
func randomReport(outs []*outcome, seed int64, wall time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", randomBegin)
	fmt.Fprintf(&b, "Generated by `make bench-control-random` (%s, generator seed %d): %d scenarios at the config's defaults, one set for every\n",
		time.Now().UTC().Format("2006-01-02"), seed, len(outs))
	fmt.Fprintf(&b, "scenario. Differences are in attainment (fractions of requests meeting the SLO). `headroom closed` is (narwhal − static:best) /\n")
	fmt.Fprintf(&b, "(oracle:split − static:best) on shifting scenarios where oracle:split beats static:best by 0.05 or more. Fidelity: at each\n")
	fmt.Fprintf(&b, "oracle:split window, the split the projection ranks first against the oracle's (`agree`: the same or as good; `±1`: within\n")
	fmt.Fprintf(&b, "an engine), the attainment following the projection's ranking would lose (`regret`), and the median log(projected/measured)\n")
	fmt.Fprintf(&b, "of the probe's TTFT and of the decode step against the window's median (docs/sim.md, \"Fidelity\").\n\n")

	type agg struct {
		name                                      string
		n, okStatic, okBest, damagedOK, headroomN int
		headroomOK                                int
		dStatic, dBest, closed                    []float64
		agree, near, regret, biasTTFT, biasTPOT   []float64
	}
	groups := map[string]*agg{}
	order := append([]string{"all"}, shapes...)
	for _, name := range order {
		groups[name] = &agg{name: name}
	}
	for _, o := range outs {
		for _, g := range []*agg{groups["all"], groups[o.sc.family]} {
			g.n++
			g.dStatic = append(g.dStatic, o.narwhal-o.static)
			g.dBest = append(g.dBest, o.narwhal-o.best)
			if o.narwhal >= o.static-0.01 {
				g.okStatic++
			}
			if o.narwhal >= o.best-0.02 {
				g.okBest++
			}
			if float64(o.damaged) <= 0.005*float64(o.requests) {
				g.damagedOK++
			}
			if isShifting(o.sc.family) && o.oracle-o.best >= 0.05 {
				g.headroomN++
				c := (o.narwhal - o.best) / (o.oracle - o.best)
				g.closed = append(g.closed, c)
				if c >= 0.5 {
					g.headroomOK++
				}
			}
			if o.fid != nil && len(o.fid.Windows) > 0 {
				a, n := o.fid.Agree()
				t, p := o.fid.Bias()
				g.agree, g.near, g.regret = append(g.agree, a), append(g.near, n), append(g.regret, o.fid.Regret())
				if !math.IsNaN(t) {
					g.biasTTFT = append(g.biasTTFT, t)
				}
				if !math.IsNaN(p) {
					g.biasTPOT = append(g.biasTPOT, p)
				}
			}
		}
	}
	fmt.Fprintln(&b, "| family | scenarios | ≥ static − 0.01 | ≥ static:best − 0.02 | narwhal − static p10 / median | narwhal − static:best p10 / median | headroom ≥ 0.05: closed ≥ ½ | damaged ≤ 0.5% | agree / ±1 | regret | bias TTFT / TPOT |")
	fmt.Fprintln(&b, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, name := range order {
		g := groups[name]
		if g.n == 0 {
			continue
		}
		pct := func(k, n int) string {
			if n == 0 {
				return "—"
			}
			return fmt.Sprintf("%.0f%% (%d/%d)", 100*float64(k)/float64(n), k, n)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %+.3f / %+.3f | %+.3f / %+.3f | %s | %s | %.2f / %.2f | %.3f | %+.2f / %+.2f |\n", name, g.n,
			pct(g.okStatic, g.n), pct(g.okBest, g.n), quantile(g.dStatic, 0.1), quantile(g.dStatic, 0.5), quantile(g.dBest, 0.1), quantile(g.dBest, 0.5),
			pct(g.headroomOK, g.headroomN), pct(g.damagedOK, g.n), mean(g.agree), mean(g.near), mean(g.regret), quantile(g.biasTTFT, 0.5), quantile(g.biasTPOT, 0.5))
	}
	all := groups["all"]
	fmt.Fprintf(&b, "\nTargets (issue 31, at one set of defaults): narwhal ≥ static − 0.01 in ≥ 99%% of scenarios: %s; ≥ static:best − 0.02 in ≥ 90%%: %s;\n",
		verdict(all.okStatic, all.n, 0.99), verdict(all.okBest, all.n, 0.90))
	fmt.Fprintf(&b, "median narwhal − static:best ≥ 0: %+.3f, %s; headroom closed ≥ ½ in ≥ 75%% of the %d scenarios with headroom: %s; damaged ≤ 0.5%% in every scenario: %s.\n",
		quantile(all.dBest, 0.5), metText(quantile(all.dBest, 0.5) >= 0), all.headroomN, verdict(all.headroomOK, all.headroomN, 0.75), verdict(all.damagedOK, all.n, 1))
	inBand := 0
	for _, o := range outs {
		if o.calibrated {
			inBand++
		}
	}
	fmt.Fprintf(&b, "static:best in [%.2f, %.2f] after calibration: %d of %d. (%.0f s wall.)\n\n", bandLo, bandHi, inBand, len(outs), wall.Seconds())

	worst := slices.Clone(outs)
	slices.SortStableFunc(worst, func(a, b *outcome) int { return cmp.Compare(a.narwhal-a.best, b.narwhal-b.best) })
	fmt.Fprintln(&b, "The ten worst scenarios against static:best, with their decision logs' tally (moves by caller and direction; blocked evaluations by the first gate that failed):")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| scenario | req/s | narwhal | static | static:best | threshold | oracle:split | changes | gates |")
	fmt.Fprintln(&b, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, o := range worst[:min(10, len(worst))] {
		fmt.Fprintf(&b, "| %s | %.2f | %.3f | %.3f | %.3f (%dP) | %.3f | %.3f | %d | %s |\n", o.sc.name(), o.sc.rate, o.narwhal, o.static, o.best, o.bestSplit, o.thr, o.oracle, o.changes, o.gates)
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "<details><summary>Every scenario</summary>")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| scenario | req/s | requests | narwhal | static | static:best | threshold | oracle:split | changes | damaged | agree | regret |")
	fmt.Fprintln(&b, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, o := range outs {
		a, r := math.NaN(), math.NaN()
		if o.fid != nil && len(o.fid.Windows) > 0 {
			a, _ = o.fid.Agree()
			r = o.fid.Regret()
		}
		band := ""
		if !o.calibrated {
			band = " †"
		}
		fmt.Fprintf(&b, "| %s | %.2f | %d | %.3f | %.3f | %.3f (%dP)%s | %.3f | %.3f | %d | %d | %.2f | %.3f |\n", o.sc.name(), o.sc.rate, o.requests,
			o.narwhal, o.static, o.best, o.bestSplit, band, o.thr, o.oracle, o.changes, o.damaged, a, r)
	}
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "† static:best outside the band after calibration.")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "</details>")
	fmt.Fprintf(&b, "%s\n", randomEnd)
	return b.String()
}

func verdict(k, n int, share float64) string {
	if n == 0 {
		return "no scenario"
	}
	got := float64(k) / float64(n)
	return fmt.Sprintf("%.1f%% (%d of %d), %s", 100*got, k, n, metText(got >= share))
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// quantile is the nearest-rank q-quantile of xs (NaN for none).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}

// readRates reads the rate of each scenario from the table of every scenario of another run of
// the generated scorecard (docs/benchmarks.md of another commit: `| #NNN ... | req/s | ...`).
func readRates(path string) (map[int]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rates := map[int]float64{}
	for _, m := range regexp.MustCompile(`(?m)^\| #(\d+) [^|]*\| ([0-9.]+) \| \d+ \|`).FindAllStringSubmatch(string(b), -1) {
		idx, _ := strconv.Atoi(m[1])
		rates[idx], _ = strconv.ParseFloat(m[2], 64)
	}
	if len(rates) == 0 {
		return nil, fmt.Errorf("%s: no table of every scenario (| #NNN ... | req/s | requests | ...)", path)
	}
	return rates, nil
}
