package sim

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/narwhal-llm/narwhal/audit"
	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/history"
)

// Options configure Simulate.
type Options struct {
	Policies []Policy
	Seed     int64
	// WindowS is the width of the report's time windows (oracle:greedy's, the plot), seconds.
	WindowS float64
	// DurationS cuts the trace's arrivals at this many seconds (0: the whole trace).
	DurationS float64
	// Progress, when set, hears each replay's virtual time once a virtual minute.
	Progress func(policy string, virtualS float64)
	// Parallel bounds the replays run at once (0: one per policy).
	Parallel int
	// Trace names the trace in the report.
	Trace string
	// Changes are the times (seconds) the workload's mix changes and the direction that
	// answers each (synthetic workloads know them), for time to adapt.
	Changes []Change
	// Notes are said in the report (how the workload was prepared).
	Notes []string
}

// Change is a change of the workload's mix at AtS seconds that a move in Direction answers
// ("to_prefill" or "to_decode").
type Change struct {
	AtS       float64 `json:"at_s"`
	Direction string  `json:"direction"`
}

// Report is the JSON report of one invocation (docs/sim.md).
type Report struct {
	Trace     string         `json:"trace"`
	Requests  int            `json:"requests"`
	SpanS     float64        `json:"span_s"`
	Engines   int            `json:"engines"`
	Seed      int64          `json:"seed"`
	SLO       config.SLO     `json:"slo"`
	WindowS   float64        `json:"window_s"`
	Notes     []string       `json:"notes"`
	Policies  []PolicyReport `json:"policies"`
	Changes   []Change       `json:"changes,omitempty"`
	runs      map[string]*run
	logs      map[string][]byte
	sums      map[string]PolicyReport
	policyFor map[string]Policy
}

// PolicyReport is one policy's figures.
type PolicyReport struct {
	Policy        string  `json:"policy"`
	Split         string  `json:"split,omitempty"` // static:best: the split it chose
	Requests      int     `json:"requests"`
	Completed     int     `json:"completed"`
	Rejected      int     `json:"rejected"`
	Failed        int     `json:"failed"`
	SLOAttainment float64 `json:"slo_attainment"`
	GoodputRPS    float64 `json:"goodput_rps"` // requests meeting the SLO per second of the span
	// TTFTS and TPOTS are the completed requests' percentiles (TPOT over those with two tokens
	// or more), null when there are none.
	TTFTS *history.Quantiles `json:"ttft_s"`
	TPOTS *history.Quantiles `json:"tpot_s"`
	// TTFTShortS is TTFTS over the prompts under ShortPromptTokens: a chat turn, whose first
	// token a KV handoff and a second queue delay most for the least work.
	TTFTShortS         *history.Quantiles `json:"ttft_short_s"`
	RoleChanges        int                `json:"role_changes"`
	RoleChangesPerHour float64            `json:"role_changes_per_hour"`
	ReversalsPerHour   float64            `json:"reversals_per_hour"`
	TimeToAdaptS       *float64           `json:"time_to_adapt_s"`
	DamagedRequests    int                `json:"damaged_requests"`
	GuardViolations    int                `json:"guard_violations"`
	// PrefixHitShare is the share of prefilled prompt tokens the engines' prefix caches
	// served (null when no cache was modelled).
	PrefixHitShare *float64 `json:"prefix_hit_share"`
	Windows        []Window `json:"windows"`
	WallS          float64  `json:"wall_s"`
	// Fidelity (oracle:split only) is how the projection ranked the splits the oracle tried.
	Fidelity *Fidelity `json:"fidelity,omitempty"`
}

// Fidelity is how well the projection ranks splits (docs/sim.md, "Fidelity"): at every window
// boundary of an oracle:split replay, the splits the oracle tries are also priced from the same
// state with the controller's pricing (router.Price), and the split it ranks first is compared
// with the one the oracle found best in hindsight.
type Fidelity struct {
	Windows []FidelityWindow `json:"windows"`
	// Requests is the replay's number of requests (Regret's denominator).
	Requests int `json:"requests"`
}

// FidelityWindow is one window of it: the prefill pool size the oracle chose and the one the
// pricing ranked first; the requests the pricing's choice missed beyond the oracle's (judged as
// the oracle judges); and, for the oracle's split, the probe's projected TTFT and the projected
// decode step (tpot_ratio), each over its SLO, against the median TTFT of the requests arriving
// in the window's first two steps and the median seconds per output token of those of them
// that finished, over the SLO.
type FidelityWindow struct {
	StartS        float64           `json:"start_s"`
	Oracle        int               `json:"oracle_prefill"`
	Priced        int               `json:"priced_prefill"`
	RegretMisses  int               `json:"regret_misses"`
	ProjectedTTFT decisionlog.Ratio `json:"projected_ttft_ratio"`
	MeasuredTTFT  decisionlog.Ratio `json:"measured_ttft_ratio"`
	ProjectedTPOT decisionlog.Ratio `json:"projected_tpot_ratio"`
	MeasuredTPOT  decisionlog.Ratio `json:"measured_tpot_ratio"`
}

// Agree is the share of windows in which the pricing ranked the oracle's split first, and Near
// the share in which its first was within one engine of it.
func (f *Fidelity) Agree() (agree, near float64) {
	if len(f.Windows) == 0 {
		return math.NaN(), math.NaN()
	}
	a, n := 0, 0
	for _, w := range f.Windows {
		if w.Priced == w.Oracle || w.RegretMisses == 0 {
			a++
		}
		if abs(w.Priced-w.Oracle) <= 1 || w.RegretMisses == 0 {
			n++
		}
	}
	return float64(a) / float64(len(f.Windows)), float64(n) / float64(len(f.Windows))
}

// Regret is the attainment following the pricing's choice in every window would have lost
// against the oracle's: the requests its choices missed beyond the oracle's, over the replay's.
func (f *Fidelity) Regret() float64 {
	n := 0
	for _, w := range f.Windows {
		n += w.RegretMisses
	}
	return float64(n) / float64(max(f.Requests, 1))
}

// Bias is the median over windows of log(projected / measured) for TTFT and for TPOT
// (0: unbiased; 0.69: the projection reads twice the measure), over windows where both are
// finite and positive.
func (f *Fidelity) Bias() (ttft, tpot float64) {
	var a, b []float64
	for _, w := range f.Windows {
		if x := math.Log(float64(w.ProjectedTTFT) / float64(w.MeasuredTTFT)); !math.IsNaN(x) && !math.IsInf(x, 0) {
			a = append(a, x)
		}
		if x := math.Log(float64(w.ProjectedTPOT) / float64(w.MeasuredTPOT)); !math.IsNaN(x) && !math.IsInf(x, 0) {
			b = append(b, x)
		}
	}
	return median(a), median(b)
}

// Window is one time window of a policy's replay: requests arriving in it, those of them that
// met the SLO, their TTFT p99, and the split at its end.
type Window struct {
	StartS  float64  `json:"start_s"`
	Offered int      `json:"offered"`
	Met     int      `json:"met"`
	TTFTP99 *float64 `json:"ttft_p99_s"`
	Prefill int      `json:"prefill"`
	Decode  int      `json:"decode"`
	Changes int      `json:"role_changes"`
}

// Simulate replays reqs under each policy of o and reports them side by side.
func Simulate(cfg *config.Config, reqs []Request, o Options) (*Report, error) {
	if len(o.Policies) == 0 {
		return nil, fmt.Errorf("sim: no policy")
	}
	if o.WindowS <= 0 {
		o.WindowS = 60
	}
	if o.DurationS > 0 {
		cut := sort.Search(len(reqs), func(i int) bool { return reqs[i].ArrivalS > o.DurationS })
		reqs = reqs[:cut]
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("sim: the trace has no requests (within --duration-s)")
	}
	span := reqs[len(reqs)-1].ArrivalS
	end := Epoch.Add(config.Seconds(span))
	rep := &Report{Trace: o.Trace, Requests: len(reqs), SpanS: span, Engines: len(cfg.Engines), Seed: o.Seed, SLO: cfg.SLO,
		WindowS: o.WindowS, Changes: o.Changes, Notes: append([]string(nil), o.Notes...), runs: map[string]*run{}, logs: map[string][]byte{}, sums: map[string]PolicyReport{}, policyFor: map[string]Policy{}}
	switch bt := prefixBlockTokens(cfg); {
	case !slices.ContainsFunc(reqs, func(q Request) bool { return len(q.PrefixBlocks) > 0 }):
		rep.Notes = append(rep.Notes, "the trace has no prefix_blocks: prefix affinity had nothing to act on")
	case bt == 0:
		rep.Notes = append(rep.Notes, fmt.Sprintf("router.prefix_affinity.block_tokens (%d) does not divide the trace's %d-token prefix blocks: prefix caches not modelled, affinity had nothing to act on", cfg.Router.PrefixAffinity.BlockTokens, TraceBlockTokens))
	default:
		rep.Notes = append(rep.Notes, fmt.Sprintf("prefix caches modelled: each engine keeps an LRU of max_kv_tokens/%d prefix blocks of %d tokens, and a prompt whose leading blocks it holds prefills only the rest", bt, bt))
	}
	todo := replays(o.Policies, len(cfg.Engines))
	par := o.Parallel
	if par <= 0 {
		par = len(todo)
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := make([]error, len(todo))
	walls := map[string]float64{}
	fids := map[string]*Fidelity{}
	for k, p := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			begin := time.Now()
			s, err := newRun(cfg, p, reqs, o.Seed, end)
			if err != nil {
				errs[k] = err
				return
			}
			var progress func(float64)
			var fid *Fidelity
			if o.Progress != nil {
				progress = func(t float64) { o.Progress(p.Name, t) }
			}
			switch p.Kind {
			case PolicyOracleGreedy, PolicyOracleSplit:
				if s, fid, err = greedy(s, o.WindowS, p.Kind == PolicyOracleGreedy, progress); fid != nil {
					fid.Requests = len(reqs)
				}
			default:
				err = s.loop(progress)
			}
			if err != nil {
				errs[k] = err
				return
			}
			mu.Lock()
			rep.runs[p.Name], rep.logs[p.Name], walls[p.Name] = s, s.logBuf.Bytes(), time.Since(begin).Seconds()
			if fid != nil {
				fids[p.Name] = fid
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for _, p := range o.Policies {
		rep.policyFor[p.Name] = p
		var pr PolicyReport
		switch p.Kind {
		case PolicyStaticBest:
			pr = rep.staticBest(cfg)
		default:
			var err error
			if pr, err = rep.summary(cfg, p.Name); err != nil {
				return nil, err
			}
			pr.WallS = walls[p.Name]
			pr.Fidelity = fids[p.Name]
		}
		pr.Policy = p.Name
		rep.Policies = append(rep.Policies, pr)
	}
	return rep, nil
}

// statics are the static replays of every split, in split order.
func (rep *Report) statics(cfg *config.Config) []string {
	var names []string
	for n := 1; n < len(cfg.Engines); n++ {
		names = append(names, fmt.Sprintf("static:%d", n))
	}
	return names
}

// staticBest is the static split with the highest attainment (ties: the fewer prefill engines).
func (rep *Report) staticBest(cfg *config.Config) PolicyReport {
	var best PolicyReport
	found := false
	for _, name := range rep.statics(cfg) {
		pr, _ := rep.summary(cfg, name)
		if !found || pr.SLOAttainment > best.SLOAttainment {
			best, found = pr, true
			best.Split = name
		}
	}
	return best
}

// summary is a replay's figures, computed once (static:best reads every static replay's).
func (rep *Report) summary(cfg *config.Config, name string) (PolicyReport, error) {
	if pr, ok := rep.sums[name]; ok {
		return pr, nil
	}
	pr, err := rep.summarize(cfg, name, rep.runs[name])
	if err == nil {
		rep.sums[name] = pr
	}
	return pr, err
}

// summarize computes one replay's figures.
func (rep *Report) summarize(cfg *config.Config, name string, s *run) (PolicyReport, error) {
	pr := PolicyReport{Policy: name, Requests: len(s.out)}
	slo := cfg.SLO
	var ttfts, tpots, short []float64
	nw := int(rep.SpanS/rep.WindowS) + 1
	pr.Windows = make([]Window, nw)
	winTTFT := make([][]float64, nw)
	met := 0
	for i := range s.out {
		o := &s.out[i]
		w := min(int(s.reqs[i].ArrivalS/rep.WindowS), nw-1)
		pr.Windows[w].Offered++
		switch {
		case o.rejected:
			pr.Rejected++
			continue
		case o.failed:
			pr.Failed++
			continue
		case o.done.IsZero():
			continue
		}
		pr.Completed++
		ttft := o.first.Sub(o.arrival).Seconds()
		tpot := 0.0
		if o.generated > 1 {
			tpot = o.done.Sub(o.first).Seconds() / float64(o.generated-1)
			tpots = append(tpots, tpot)
		}
		ttfts = append(ttfts, ttft)
		if s.reqs[i].InputTokens < ShortPromptTokens {
			short = append(short, ttft)
		}
		winTTFT[w] = append(winTTFT[w], ttft)
		if ttft <= slo.TTFTS && tpot <= slo.TPOTS {
			met++
			pr.Windows[w].Met++
		}
	}
	pr.SLOAttainment = float64(met) / float64(max(len(s.out), 1))
	pr.GoodputRPS = float64(met) / math.Max(rep.SpanS, 1)
	pr.TTFTS, pr.TPOTS, pr.TTFTShortS = PercentilesOf(ttfts), PercentilesOf(tpots), PercentilesOf(short)
	for w := range pr.Windows {
		pr.Windows[w].StartS = float64(w) * rep.WindowS
		pr.Windows[w].TTFTP99 = PercentilesOf(winTTFT[w]).At(99)
	}
	// The split at each window's end, role changes in each.
	p, d := initialSplit(s)
	k := 0
	for w := range pr.Windows {
		limit := Epoch.Add(config.Seconds(float64(w+1) * rep.WindowS))
		for ; k < len(s.moves) && s.moves[k].at.Before(limit); k++ {
			if s.moves[k].to == fleet.Prefill {
				p, d = p+1, d-1
			} else {
				p, d = p-1, d+1
			}
			pr.Windows[w].Changes++
		}
		pr.Windows[w].Prefill, pr.Windows[w].Decode = p, d
	}
	hours := math.Max(rep.SpanS, 1) / 3600
	pr.RoleChanges = len(s.moves)
	pr.RoleChangesPerHour = float64(len(s.moves)) / hours
	reversals := 0
	for i := 1; i < len(s.moves); i++ {
		if s.moves[i].to != s.moves[i-1].to {
			reversals++
		}
	}
	pr.ReversalsPerHour = float64(reversals) / hours
	for _, m := range s.moves {
		pr.DamagedRequests += m.residents
	}
	pr.TimeToAdaptS = timeToAdapt(rep.Changes, s.moves)
	var hit, prompt uint64
	for _, e := range s.engines {
		h, p := e.m.PrefixHits()
		hit, prompt = hit+h, prompt+p
	}
	if prompt > 0 && s.blockTokens > 0 && slices.ContainsFunc(s.reqs, func(q Request) bool { return len(q.PrefixBlocks) > 0 }) {
		share := float64(hit) / float64(prompt)
		pr.PrefixHitShare = &share
	}
	if s.c != nil {
		res, err := audit.Audit(bytes.NewReader(s.logBuf.Bytes()), nil)
		if err != nil {
			return pr, fmt.Errorf("sim: auditing the %s decision log: %w", name, err)
		}
		pr.GuardViolations = len(res.Violations)
	}
	return pr, nil
}

// RoleChange is one engine's role change in a replay.
type RoleChange struct {
	AtS    float64
	Engine string
	To     string
	// Reversal: its direction is the opposite of the fleet's previous role change.
	Reversal bool
}

// RoleChanges lists a replayed policy's role changes in time order (nil for static:best).
func (rep *Report) RoleChanges(policy string) []RoleChange {
	s := rep.runs[policy]
	if s == nil {
		return nil
	}
	out := make([]RoleChange, len(s.moves))
	for i, m := range s.moves {
		out[i] = RoleChange{AtS: m.at.Sub(Epoch).Seconds(), Engine: m.engine, To: m.to.String(), Reversal: i > 0 && m.to != s.moves[i-1].to}
	}
	return out
}

// initialSplit is a replay's split at its start.
func initialSplit(s *run) (p, d int) {
	for _, e := range s.cfg.Engines {
		if e.Role == fleet.Prefill.String() {
			p++
		} else {
			d++
		}
	}
	return p, d
}

// timeToAdapt is the median lag from each change of the workload's mix to the first role
// change after it in the direction that answers it (nil without changes or answers).
func timeToAdapt(changes []Change, moves []roleChange) *float64 {
	var lags []float64
	for k, c := range changes {
		until := math.Inf(1)
		if k+1 < len(changes) {
			until = changes[k+1].AtS
		}
		want := fleet.Prefill
		if c.Direction == "to_decode" {
			want = fleet.Decode
		}
		for _, m := range moves {
			t := m.at.Sub(Epoch).Seconds()
			if t >= c.AtS && t < until && m.to == want {
				lags = append(lags, t-c.AtS)
				break
			}
		}
	}
	if len(lags) == 0 {
		return nil
	}
	sort.Float64s(lags)
	v := lags[len(lags)/2]
	return &v
}

// ShortPromptTokens bounds the prompts of a report's TTFTShortS.
const ShortPromptTokens = 1024

// PercentilesOf is the nearest-rank p50, p90 and p99 of xs, sorting xs in place; nil when xs is
// empty, so that a report writes null rather than zeros for a distribution without samples.
func PercentilesOf(xs []float64) *history.Quantiles {
	if len(xs) == 0 {
		return nil
	}
	sort.Float64s(xs)
	at := func(q float64) float64 { return xs[min(len(xs)-1, int(q*float64(len(xs))))] }
	return &history.Quantiles{P50: at(0.5), P90: at(0.9), P99: at(0.99)}
}

// WriteDecisions writes the decision logs of the replays that have one (the narwhal policy),
// every line with its "policy".
func (rep *Report) WriteDecisions(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, p := range rep.Policies {
		s := rep.runs[p.Policy]
		if s == nil || s.c == nil {
			continue
		}
		err := decisionlog.Read(bytes.NewReader(rep.logs[p.Policy]), func(l decisionlog.Line) error {
			_, err := fmt.Fprintf(bw, "{\"policy\":%q,%s\n", p.Policy, l.Raw[1:])
			return err
		})
		if err != nil {
			return err
		}
	}
	return bw.Flush()
}

// SweepRow is one rate scale of a sweep: each policy's attainment there.
type SweepRow struct {
	RateScale  float64            `json:"rate_scale"`
	RatePerS   float64            `json:"rate_per_s"`
	Attainment map[string]float64 `json:"slo_attainment"`
}

// Sweep is a rate sweep: the attainment of every policy at each rate scale, and each policy's
// goodput — the largest rate (requests/s, and per engine) at which its attainment stays at or
// above GoodputAttainment.
type Sweep struct {
	Rows      []SweepRow         `json:"rows"`
	Goodput   map[string]float64 `json:"goodput_rps"`
	PerEngine map[string]float64 `json:"goodput_rps_per_engine"`
}

// GoodputAttainment is the attainment goodput is measured at.
const GoodputAttainment = 0.9

// RunSweep replays reqs (their arrivals divided by each scale) under o's policies at every
// scale, in order, and stops early once every policy's attainment is under half of
// GoodputAttainment (heavier rates have nothing left to find).
func RunSweep(cfg *config.Config, reqs []Request, o Options, scales []float64) (*Sweep, error) {
	sw := &Sweep{Goodput: map[string]float64{}, PerEngine: map[string]float64{}}
	for _, k := range scales {
		if n := len(sw.Rows); n > 0 {
			done := true
			for _, a := range sw.Rows[n-1].Attainment {
				done = done && a < GoodputAttainment/2
			}
			if done {
				break
			}
		}
		scaled, _ := ScaleRate(reqs, nil, k)
		oo := o
		oo.DurationS = 0
		oo.Changes = nil
		rep, err := Simulate(cfg, scaled, oo)
		if err != nil {
			return nil, err
		}
		row := SweepRow{RateScale: k, RatePerS: float64(rep.Requests) / math.Max(rep.SpanS, 1), Attainment: map[string]float64{}}
		for _, p := range rep.Policies {
			row.Attainment[p.Policy] = p.SLOAttainment
			if p.SLOAttainment >= GoodputAttainment && row.RatePerS > sw.Goodput[p.Policy] {
				sw.Goodput[p.Policy] = row.RatePerS
				sw.PerEngine[p.Policy] = row.RatePerS / float64(len(cfg.Engines))
			}
		}
		sw.Rows = append(sw.Rows, row)
	}
	return sw, nil
}

// WriteTable prints a sweep as a text table: one row per rate scale, one column per policy,
// then each policy's goodput.
func (sw *Sweep) WriteTable(w io.Writer, policies []Policy) {
	fmt.Fprintf(w, "%-10s %-10s", "rate_scale", "req/s")
	for _, p := range policies {
		fmt.Fprintf(w, " %14s", p.Name)
	}
	fmt.Fprintln(w)
	for _, r := range sw.Rows {
		fmt.Fprintf(w, "%-10g %-10.1f", r.RateScale, r.RatePerS)
		for _, p := range policies {
			fmt.Fprintf(w, " %14.3f", r.Attainment[p.Name])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-21s", "goodput req/s")
	for _, p := range policies {
		fmt.Fprintf(w, " %14.1f", sw.Goodput[p.Name])
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-21s", "goodput/engine")
	for _, p := range policies {
		fmt.Fprintf(w, " %14.2f", sw.PerEngine[p.Name])
	}
	fmt.Fprintln(w)
}

// ParseSweep reads A:B:STEP into the scales A, A+STEP, …, B.
func ParseSweep(s string) ([]float64, error) {
	var a, b, step float64
	if _, err := fmt.Sscanf(s, "%g:%g:%g", &a, &b, &step); err != nil || a <= 0 || b < a || step <= 0 || (b-a)/step > 1000 {
		return nil, fmt.Errorf("--sweep-rate %q: want A:B:STEP with 0 < A <= B and at most 1,000 steps", s)
	}
	var out []float64
	for k := 0; a+float64(k)*step <= b*(1+1e-9); k++ {
		out = append(out, math.Round((a+float64(k)*step)*1e6)/1e6)
	}
	return out, nil
}

// WriteTable prints the report as a small text table, a row per policy: attainment, goodput
// (requests meeting the SLO per second of the span), TTFT and TPOT p99, role changes (per hour),
// reversals per hour, damaged requests and guard violations; then the notes.
func (r *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "%s: %d requests over %.0f s, %d engines, SLO TTFT %g s, TPOT %g s\n", r.Trace, r.Requests, r.SpanS, r.Engines, r.SLO.TTFTS, r.SLO.TPOTS)
	fmt.Fprintln(tw, "policy\tattainment\tgoodput req/s\tTTFT p99\tTPOT p99\tchanges (per h)\treversals/h\tdamaged\tviolations\t")
	for _, p := range r.Policies {
		name := p.Policy
		if p.Split != "" {
			name += " (" + p.Split + ")"
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%.1f\t%s\t%s\t%d (%.0f)\t%.1f\t%d\t%d\n", name, p.SLOAttainment, p.GoodputRPS,
			SecondsText(p.TTFTS.At(99)), SecondsText(p.TPOTS.At(99)), p.RoleChanges, p.RoleChangesPerHour, p.ReversalsPerHour, p.DamagedRequests, p.GuardViolations)
	}
	tw.Flush()
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// SecondsText is a percentile in seconds for a table or a line ("—" without samples).
func SecondsText(s *float64) string {
	switch {
	case s == nil:
		return "—"
	case *s < 1:
		return fmt.Sprintf("%.0f ms", *s*1000)
	}
	return fmt.Sprintf("%.2f s", *s)
}
