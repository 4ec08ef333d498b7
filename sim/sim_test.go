package sim

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/narwhal-llm/narwhal/audit"
	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// fleetConfig is the default config with n engines of the default profile, the first p prefill.
func fleetConfig(t *testing.T, n, p int) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Engines = nil
	for i := 0; i < n; i++ {
		role := config.RoleDecode
		if i < p {
			role = config.RolePrefill
		}
		cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i+1), Address: fmt.Sprintf("127.0.0.1:%d", 9001+i), Role: role, Profile: config.DefaultProfileName})
	}
	return cfg
}

func synthetic(t *testing.T, s Synthetic) ([]Request, []Change) {
	t.Helper()
	reqs, changes, err := s.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return reqs, changes
}

func simulate(t *testing.T, cfg *config.Config, reqs []Request, policies string, changes []Change) *Report {
	t.Helper()
	ps, err := ParsePolicies(policies, len(cfg.Engines))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Simulate(cfg, reqs, Options{Policies: ps, Seed: 7, Changes: changes})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func policy(t *testing.T, rep *Report, name string) PolicyReport {
	t.Helper()
	for _, p := range rep.Policies {
		if p.Policy == name {
			return p
		}
	}
	t.Fatalf("no policy %s in the report", name)
	return PolicyReport{}
}

// reportBytes is the report's JSON with wall_s zeroed, and the decision log.
func reportBytes(t *testing.T, rep *Report) []byte {
	t.Helper()
	for i := range rep.Policies {
		rep.Policies[i].WallS = 0
	}
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(rep); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteDecisions(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Same inputs and seed give the same bytes, though the replays run in parallel.
func TestSameInputsSameBytes(t *testing.T) {
	reqs, changes := synthetic(t, Synthetic{Kind: "phases", RatePerS: 20, DurationS: 150, PhaseS: 50, Seed: 3})
	cfg := fleetConfig(t, 4, 2)
	a := reportBytes(t, simulate(t, cfg, reqs, "narwhal,threshold,static:best,oracle:greedy", changes))
	b := reportBytes(t, simulate(t, cfg, reqs, "narwhal,threshold,static:best,oracle:greedy", changes))
	if !bytes.Equal(a, b) {
		t.Fatalf("two runs differ:\n%s\n---\n%s", a, b)
	}
	if !bytes.Contains(a, []byte(`"policy":"narwhal","kind":"decision"`)) {
		t.Fatalf("the decision log has no narwhal decision:\n%.2000s", a)
	}
}

// static:P holds P prefill engines all along; static holds the config's split.
func TestStaticPoliciesHoldTheirSplit(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "step", RatePerS: 10, DurationS: 180, StepAtS: 60, StepLenS: 60, Seed: 1})
	cfg := fleetConfig(t, 4, 2)
	rep := simulate(t, cfg, reqs, "static,static:1,static:3", nil)
	for name, want := range map[string]int{"static": 2, "static:1": 1, "static:3": 3} {
		p := policy(t, rep, name)
		if p.RoleChanges != 0 || p.Completed == 0 {
			t.Errorf("%s: %d role changes, %d completed", name, p.RoleChanges, p.Completed)
		}
		for _, w := range p.Windows {
			if w.Prefill != want || w.Decode != 4-want {
				t.Errorf("%s: window at %v s has split %d/%d, want %d/%d", name, w.StartS, w.Prefill, w.Decode, want, 4-want)
			}
		}
	}
}

// static:best is the best static split; oracle:greedy, which may change the split at every
// window, is at least as good, and so is oracle:split, which holds one split through each window.
func TestStaticBestAndOracle(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "phases", RatePerS: 30, DurationS: 240, PhaseS: 80, Seed: 2})
	cfg := fleetConfig(t, 4, 2)
	rep := simulate(t, cfg, reqs, "static:1,static:2,static:3,static:best,oracle:greedy,oracle:split", nil)
	best := policy(t, rep, "static:best")
	for _, name := range []string{"static:1", "static:2", "static:3"} {
		if p := policy(t, rep, name); p.SLOAttainment > best.SLOAttainment {
			t.Errorf("%s attains %.3f, above static:best's %.3f", name, p.SLOAttainment, best.SLOAttainment)
		}
	}
	if best.Split == "" || policy(t, rep, best.Split).SLOAttainment != best.SLOAttainment {
		t.Errorf("static:best names split %q with attainment %.3f", best.Split, best.SLOAttainment)
	}
	oracle := policy(t, rep, "oracle:greedy")
	if oracle.SLOAttainment < best.SLOAttainment {
		t.Errorf("oracle:greedy %.3f below static:best %.3f", oracle.SLOAttainment, best.SLOAttainment)
	}
	splits := map[int]bool{}
	for _, w := range oracle.Windows {
		splits[w.Prefill] = true
	}
	if len(splits) < 2 || oracle.RoleChanges == 0 {
		t.Errorf("oracle:greedy kept one split through phases that want two: %v", oracle.Windows)
	}
	split := policy(t, rep, "oracle:split")
	if split.SLOAttainment < best.SLOAttainment {
		t.Errorf("oracle:split %.3f below static:best %.3f", split.SLOAttainment, best.SLOAttainment)
	}
	// One split per window: the only changes are the moves from the last window's split.
	prev := 2
	for _, w := range split.Windows {
		if d := max(w.Prefill-prev, prev-w.Prefill); w.Changes != d {
			t.Errorf("oracle:split window at %v s: %d role changes to go from %dP to %dP", w.StartS, w.Changes, prev, w.Prefill)
		}
		prev = w.Prefill
	}
	if split.RoleChanges == 0 {
		t.Errorf("oracle:split kept one split through phases that want two: %v", split.Windows)
	}
	// Fidelity: a window each, the oracle's choice the split its window reports, the pricing's
	// choice a split of the fleet, and no regret where the two agree.
	fid := split.Fidelity
	if fid == nil || len(fid.Windows) != len(split.Windows) || fid.Requests != len(reqs) {
		t.Fatalf("oracle:split fidelity %+v, want one window per report window (%d) over %d requests", fid, len(split.Windows), len(reqs))
	}
	for i, w := range fid.Windows {
		if w.Oracle != split.Windows[i].Prefill || w.Priced < 1 || w.Priced > 3 {
			t.Errorf("fidelity window %d: oracle %dP (the replay's window %dP), priced %dP", i, w.Oracle, split.Windows[i].Prefill, w.Priced)
		}
		if w.RegretMisses < 0 || w.Priced == w.Oracle && w.RegretMisses != 0 {
			t.Errorf("fidelity window %d: regret %d with oracle %dP and priced %dP", i, w.RegretMisses, w.Oracle, w.Priced)
		}
	}
	if a, n := fid.Agree(); a > n || n > 1 || a < 0 {
		t.Errorf("agree %.2f, within one %.2f", a, n)
	}
	if oracle.Fidelity != nil {
		t.Errorf("oracle:greedy reports a fidelity (its shared splits are not priced)")
	}
}

// A large fleet's oracle tries the current split and those at doubling distances from it; a
// small one every split.
func TestOracleSplits(t *testing.T) {
	if got := oracleSplits(3, 8); !slices.Equal(got, []int{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("8 engines: %v", got)
	}
	if got := oracleSplits(20, 64); !slices.Equal(got, []int{4, 12, 16, 18, 19, 20, 21, 22, 24, 28, 36, 52}) {
		t.Errorf("64 engines from 20P: %v", got)
	}
	if got := oracleSplits(63, 64); got[len(got)-1] != 63 || got[0] != 31 {
		t.Errorf("64 engines from 63P: %v", got)
	}
}

// A forked replay runs apart from its original: both, run to the end, give exactly what the
// replay gives unforked, though the fork's split was changed and changed back on the way —
// with noise, prefix caches, faults and the health core in play.
func TestForkRunsApart(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "longprompt", RatePerS: 25, DurationS: 240, StormEveryS: 80, StormLenS: 20, Seed: 4})
	for i := range reqs { // shared prefixes: a few conversations' blocks
		conv := i % 7
		for b := 0; b < reqs[i].InputTokens/TraceBlockTokens; b++ {
			reqs[i].PrefixBlocks = append(reqs[i].PrefixBlocks, conv*1000+b)
		}
	}
	cfg := fleetConfig(t, 4, 2)
	cfg.Sim.NoiseSigma = 0.2
	cfg.Sim.Faults = []config.Fault{{AtS: 50, Engine: "e3", Kind: "fail"}, {AtS: 90, Engine: "e3", Kind: "recover"}}
	end := Epoch.Add(config.Seconds(reqs[len(reqs)-1].ArrivalS))
	p := Policy{Name: "static", Kind: PolicyStatic, Prefill: -1}
	whole, err := newRun(cfg, p, reqs, 7, end)
	if err != nil {
		t.Fatal(err)
	}
	if err := whole.loop(nil); err != nil {
		t.Fatal(err)
	}
	a, _ := newRun(cfg, p, reqs, 7, end)
	for _, at := range []float64{40, 70} { // before the fault, and while e3 is down
		if _, err := a.runUntil(Epoch.Add(config.Seconds(at)), nil); err != nil {
			t.Fatal(err)
		}
		b := a.fork()
		b.setSplit(3)
		if _, err := b.runUntil(Epoch.Add(config.Seconds(at+5)), nil); err != nil {
			t.Fatal(err)
		}
		b.setSplit(1)
		if err := b.loop(nil); err != nil {
			t.Fatal(err)
		}
		if b.misses(len(b.out)) == 0 || len(b.moves) < 2 {
			t.Fatalf("the fork at %v s: %d misses, %d moves: not a changed world", at, b.misses(len(b.out)), len(b.moves))
		}
	}
	if err := a.loop(nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.out, whole.out) || len(a.moves) != len(whole.moves) {
		t.Fatal("the original replay, forked on the way, differs from the replay never forked")
	}
	c, _ := newRun(cfg, p, reqs, 7, end)
	if _, err := c.runUntil(Epoch.Add(config.Seconds(120)), nil); err != nil {
		t.Fatal(err)
	}
	d := c.fork()
	if err := d.loop(nil); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.out, whole.out) {
		t.Fatal("a fork left alone differs from the replay never forked")
	}
	cached, _ := whole.engines[0].m.PrefixHits()
	if cached == 0 {
		t.Fatal("no prefix cache hits: the caches were not exercised")
	}
}

// The narwhal policy runs the real controller: a mix moving decode-heavy → prefill-heavy →
// decode-heavy makes it move engines, its log audits clean, and time to adapt is measured.
func TestNarwhalPolicyMovesAndAuditsClean(t *testing.T) {
	reqs, changes := synthetic(t, Synthetic{Kind: "phases", RatePerS: 30, DurationS: 600, PhaseS: 200, Seed: 4})
	cfg := fleetConfig(t, 4, 2)
	rep := simulate(t, cfg, reqs, "narwhal", changes)
	p := policy(t, rep, "narwhal")
	if p.RoleChanges == 0 {
		t.Fatalf("no role change over a moving mix: %+v", p)
	}
	if p.GuardViolations != 0 {
		t.Fatalf("%d guard violations", p.GuardViolations)
	}
	var log bytes.Buffer
	if err := rep.WriteDecisions(&log); err != nil {
		t.Fatal(err)
	}
	res, err := audit.Audit(&log, nil)
	if err != nil || len(res.Violations) > 0 || res.RoleChanges != p.RoleChanges {
		t.Fatalf("audit: %v %+v (report: %d role changes)", err, res, p.RoleChanges)
	}
	if p.TimeToAdaptS == nil {
		t.Errorf("no time to adapt measured over %d mix changes", len(changes))
	}
}

// The same moving mix on engines that switch in place (switch: sglang): each move holds its
// engine until its residents finish, then it switches; the log audits clean (the switch rules
// included) and no engine is left held at the end.
func TestNarwhalPolicyWithInPlaceSwitches(t *testing.T) {
	reqs, changes := synthetic(t, Synthetic{Kind: "phases", RatePerS: 30, DurationS: 600, PhaseS: 200, Seed: 4})
	cfg := fleetConfig(t, 4, 2)
	for i := range cfg.Engines {
		cfg.Engines[i].Switch = config.SwitchSGLang
	}
	rep := simulate(t, cfg, reqs, "narwhal", changes)
	p := policy(t, rep, "narwhal")
	var log bytes.Buffer
	if err := rep.WriteDecisions(&log); err != nil {
		t.Fatal(err)
	}
	res, err := audit.Audit(bytes.NewReader(log.Bytes()), nil)
	if err != nil || len(res.Violations) > 0 || p.RoleChanges == 0 || res.RoleChanges != p.RoleChanges || p.GuardViolations != 0 {
		t.Fatalf("audit: %v %+v (report: %d role changes, %d guard violations)", err, res, p.RoleChanges, p.GuardViolations)
	}
	var asked, succeeded int
	readLog(t, rep, func(l decisionlog.Line) {
		if ev := l.Fleet; ev != nil && ev.Result == fleet.SwitchAsked {
			asked++
		} else if ev != nil && ev.Result == fleet.SwitchSucceeded {
			succeeded++
		}
	})
	if asked == 0 || asked != succeeded || succeeded != p.RoleChanges {
		t.Fatalf("switches asked %d, succeeded %d, role changes %d", asked, succeeded, p.RoleChanges)
	}
}

// The threshold planner moves an engine into a pool all of whose engines project a miss: a
// prefill-heavy load on one prefill engine.
func TestThresholdPlannerExpandsAMissingPool(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "phases", RatePerS: 12, DurationS: 240, PhaseS: 400, Seed: 5})
	for i := range reqs { // every request prefill-heavy
		reqs[i].InputTokens, reqs[i].OutputTokens = 6000, 20
	}
	cfg := fleetConfig(t, 4, 1)
	cfg.Router.LocalPrefill = config.LocalPrefillOff // the missing pool is not carried locally
	rep := simulate(t, cfg, reqs, "threshold,static", nil)
	th, st := policy(t, rep, "threshold"), policy(t, rep, "static")
	if th.RoleChanges == 0 {
		t.Fatalf("the planner moved nothing: %+v", th)
	}
	if last := th.Windows[len(th.Windows)-1]; last.Prefill < 2 {
		t.Errorf("split at the end %d/%d, want more prefill engines", last.Prefill, last.Decode)
	}
	if th.SLOAttainment <= st.SLOAttainment {
		t.Errorf("threshold %.3f does not beat the static 1/3 split's %.3f on a prefill-heavy load", th.SLOAttainment, st.SLOAttainment)
	}
}

// A fault schedule that fails every prefill engine: placement falls back to aggregate on a
// decode engine, and disaggregation resumes once they recover and the health probes readmit
// them. Requests on the failed engines fail; none is lost.
func TestFaultsEmptyThePrefillPool(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "step", RatePerS: 8, DurationS: 180, StepAtS: 1000, Seed: 6})
	cfg := fleetConfig(t, 4, 2)
	cfg.Sim.Faults = []config.Fault{{AtS: 100, Engine: "e1", Kind: "recover"}, {AtS: 40, Engine: "e1", Kind: "fail"},
		{AtS: 40, Engine: "e2", Kind: "fail"}, {AtS: 100, Engine: "e2", Kind: "recover"}} // in any order
	p, _ := ParsePolicies("static", 4)
	s, err := newRun(cfg, p[0], reqs, 1, Epoch.Add(config.Seconds(180)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.loop(nil); err != nil {
		t.Fatal(err)
	}
	var before, during, after, aggregate, failed, unaccounted int
	for i, o := range s.out {
		at := reqs[i].ArrivalS
		switch {
		case o.failed:
			failed++
			continue
		case o.rejected:
			continue
		case o.done.IsZero():
			unaccounted++
			continue
		}
		switch {
		case at < 39 && o.kind == router.Disaggregated:
			before++
		case at > 50 && at < 95 && o.kind == router.Aggregate:
			during++
		case at > 130 && o.kind == router.Disaggregated:
			after++
		}
		if o.kind == router.Aggregate {
			aggregate++
		}
	}
	if unaccounted > 0 {
		t.Fatalf("%d requests neither finished, failed nor rejected", unaccounted)
	}
	if before == 0 || during == 0 || after == 0 {
		t.Fatalf("disaggregated before %d, aggregate during the outage %d, disaggregated after %d (aggregate in all %d, failed %d)", before, during, after, aggregate, failed)
	}
	var log strings.Builder
	log.Write(s.logBuf.Bytes())
	if !strings.Contains(log.String(), `"to":"failed"`) || !strings.Contains(log.String(), `"to":"active"`) {
		t.Errorf("the fleet log lacks the failure or the recovery:\n%.3000s", log.String())
	}
}

// Bad policies and workloads are clear errors.
func TestBadPoliciesAndWorkloads(t *testing.T) {
	for _, bad := range []string{"", "static:0", "static:4", "static:x", "oracle", "narwhal,narwhal"} {
		if _, err := ParsePolicies(bad, 4); err == nil {
			t.Errorf("accepted policy list %q", bad)
		}
	}
	if _, _, err := (Synthetic{Kind: "sawtooth"}).Generate(); err == nil || !strings.Contains(err.Error(), "onoff") {
		t.Errorf("unknown kind: %v", err)
	}
	if _, _, err := (Synthetic{Kind: "onoff", RatePerS: -1}).Generate(); err == nil {
		t.Error("accepted a negative rate")
	}
	if _, err := Simulate(fleetConfig(t, 4, 2), nil, Options{Policies: []Policy{{Name: "static", Kind: PolicyStatic, Prefill: -1}}}); err == nil {
		t.Error("accepted an empty trace")
	}
}

// Every synthetic kind draws a seeded, arrival-ordered workload of its shape.
func TestSyntheticKinds(t *testing.T) {
	for _, kind := range SyntheticKinds {
		a, _ := synthetic(t, Synthetic{Kind: kind, Seed: 9, DurationS: 1200})
		b, _ := synthetic(t, Synthetic{Kind: kind, Seed: 9, DurationS: 1200})
		if len(a) == 0 || len(a) != len(b) || a[len(a)/2].ArrivalS != b[len(b)/2].ArrivalS || a[len(a)/2].InputTokens != b[len(b)/2].InputTokens {
			t.Fatalf("%s: not seeded: %d and %d requests", kind, len(a), len(b))
		}
		for i := 1; i < len(a); i++ {
			if a[i].ArrivalS < a[i-1].ArrivalS {
				t.Fatalf("%s: arrivals out of order at %d", kind, i)
			}
		}
	}
	on, _ := synthetic(t, Synthetic{Kind: "onoff", Seed: 1, DurationS: 240, OnS: 60, OffS: 60, RatePerS: 10, Factor: 2})
	for _, q := range on {
		if phase := int(q.ArrivalS) % 120; phase >= 60 {
			t.Fatalf("onoff: an arrival at %v s, in a silence", q.ArrivalS)
		}
	}
	storm, changes := synthetic(t, Synthetic{Kind: "longprompt", Seed: 1, DurationS: 1200})
	long := 0
	for _, q := range storm {
		if q.InputTokens >= 8192 {
			long++
		}
	}
	if long == 0 || len(changes) != 4 {
		t.Fatalf("longprompt: %d long prompts, %d changes", long, len(changes))
	}
}

// A rate sweep finds each policy's goodput: the largest rate at 90% attainment, where a
// heavier rate falls under it.
func TestSweepFindsGoodput(t *testing.T) {
	if _, err := ParseSweep("2:1:1"); err == nil {
		t.Error("accepted a sweep that goes down")
	}
	scales, err := ParseSweep("1:9:4")
	if err != nil || len(scales) != 3 || scales[2] != 9 {
		t.Fatalf("scales %v, %v", scales, err)
	}
	reqs, _ := synthetic(t, Synthetic{Kind: "step", RatePerS: 8, DurationS: 120, StepAtS: 1000, Seed: 8})
	cfg := fleetConfig(t, 2, 1)
	ps, _ := ParsePolicies("static", 2)
	sw, err := RunSweep(cfg, reqs, Options{Policies: ps, Seed: 1}, scales)
	if err != nil {
		t.Fatal(err)
	}
	top := sw.Rows[len(sw.Rows)-1]
	first, last := sw.Rows[0].Attainment["static"], top.Attainment["static"]
	if first < GoodputAttainment || last >= GoodputAttainment {
		t.Fatalf("attainment %.3f at ×1 and %.3f at ×%g: the sweep does not bracket goodput", first, last, top.RateScale)
	}
	if g := sw.Goodput["static"]; g < sw.Rows[0].RatePerS || g >= top.RatePerS || sw.PerEngine["static"] != g/2 {
		t.Fatalf("goodput %v (per engine %v) outside the bracket %v–%v", g, sw.PerEngine["static"], sw.Rows[0].RatePerS, top.RatePerS)
	}
	var b bytes.Buffer
	sw.WriteTable(&b, ps)
	if !strings.Contains(b.String(), "goodput req/s") {
		t.Fatalf("table:\n%s", b.String())
	}
}

// The plot is one well-formed SVG with a row per policy, labelled y scales and a mark per role
// change.
func TestPlotIsWellFormed(t *testing.T) {
	reqs, changes := synthetic(t, Synthetic{Kind: "phases", RatePerS: 30, DurationS: 600, PhaseS: 200, Seed: 4})
	rep := simulate(t, fleetConfig(t, 4, 2), reqs, "narwhal,static", changes)
	var b bytes.Buffer
	rep.WritePlot(&b)
	svg := b.String()
	// Every panel has a y scale: the rate's peak, TTFT decades around the SLO, the split's 0…N.
	for _, label := range []string{">100 ms<", ">1 s<", ">0<", ">2<", ">4<", ">0 s<", ">600 s<"} {
		if !strings.Contains(svg, label) {
			t.Errorf("no axis label %s in the plot", label)
		}
	}
	dec := xml.NewDecoder(&b)
	rows, marks := 0, 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "title" {
			marks++
		}
		if cd, ok := tok.(xml.CharData); ok && strings.Contains(string(cd), "attainment") {
			rows++
		}
	}
	if rows != 2 || marks != policy(t, rep, "narwhal").RoleChanges || marks == 0 {
		t.Fatalf("%d policy rows, %d role-change marks (narwhal made %d)", rows, marks, policy(t, rep, "narwhal").RoleChanges)
	}
}

// Where the trace has prefix blocks, the engines cache them and prefix affinity has something
// to act on: with it, requests sharing a prefix land where it is cached more often than
// without it.
func TestPrefixAffinityActsOnModelledCaches(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "step", RatePerS: 10, DurationS: 300, StepAtS: 1000, Seed: 11})
	for i := range reqs { // 16 conversations, each a 4-block (2,048-token) shared prefix
		c := i % 16
		reqs[i].InputTokens = 2048 + 256
		reqs[i].PrefixBlocks = []int{4 * c, 4*c + 1, 4*c + 2, 4*c + 3}
	}
	with := fleetConfig(t, 6, 4)
	without := fleetConfig(t, 6, 4)
	without.Router.PrefixAffinity.Enabled = false
	a, b := simulate(t, with, reqs, "static", nil), simulate(t, without, reqs, "static", nil)
	if !strings.Contains(strings.Join(a.Notes, " "), "prefix caches modelled") {
		t.Fatalf("notes %v", a.Notes)
	}
	ha, hb := policy(t, a, "static").PrefixHitShare, policy(t, b, "static").PrefixHitShare
	if ha == nil || hb == nil || *ha <= *hb || *ha < 0.5 {
		t.Fatalf("prefix hit share with affinity %v, without %v", deref(ha), deref(hb))
	}
}

func deref(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// A trace quantised to a grid is spread within its slots: counts kept, each request within its
// slot, in arrival order, the same for the same seed.
func TestSpreadWithinSlots(t *testing.T) {
	var reqs []Request
	for slot := 0; slot < 5; slot++ {
		for k := 0; k < 10; k++ {
			reqs = append(reqs, Request{ArrivalS: float64(3 * slot), InputTokens: 100*slot + k, OutputTokens: 1})
		}
	}
	a, b := Spread(reqs, 3, 1), Spread(reqs, 3, 1)
	if len(a) != len(reqs) {
		t.Fatalf("%d requests, want %d", len(a), len(reqs))
	}
	for i, q := range a {
		slot := float64(3 * (q.InputTokens / 100))
		if q.ArrivalS < slot || q.ArrivalS >= slot+3 {
			t.Fatalf("request %d at %v s, outside its slot [%v, %v)", i, q.ArrivalS, slot, slot+3)
		}
		if i > 0 && q.ArrivalS < a[i-1].ArrivalS {
			t.Fatalf("out of order at %d", i)
		}
		if b[i].ArrivalS != q.ArrivalS {
			t.Fatalf("not seeded: %v and %v", b[i].ArrivalS, q.ArrivalS)
		}
	}
	distinct := map[float64]bool{}
	for _, q := range a {
		distinct[q.ArrivalS] = true
	}
	if len(distinct) < 40 {
		t.Fatalf("only %d distinct arrivals", len(distinct))
	}
}

// PercentilesOf is nearest-rank (the value at index ⌊q·n⌋, the last at most) over xs sorted in
// place; without samples it is nil, written as null, and a single percentile of it prints "—".
func TestPercentilesOfIsNearestRank(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100 … 1: sorted to 1 … 100
	}
	q := PercentilesOf(xs)
	if q == nil || q.P50 != 51 || q.P90 != 91 || q.P99 != 100 || xs[0] != 1 {
		t.Fatalf("PercentilesOf(1…100) = %+v (xs[0] %g), want 51, 91, 100 and xs sorted", q, xs[0])
	}
	if q := PercentilesOf([]float64{0.2, 0.1, 0.3}); q.P50 != 0.2 || q.P90 != 0.3 || q.P99 != 0.3 {
		t.Errorf("PercentilesOf(0.2, 0.1, 0.3) = %+v, want 0.2, 0.3, 0.3", q)
	}
	if got := SecondsText(q.At(90)); got != "91.00 s" {
		t.Errorf("SecondsText of p90 = %q", got)
	}
	none := PercentilesOf(nil)
	if none != nil || none.At(99) != nil || SecondsText(none.At(99)) != "—" {
		t.Fatalf("PercentilesOf(nil) = %+v, want nil and \"—\"", none)
	}
	b, err := json.Marshal(PolicyReport{TTFTS: none, TPOTS: none})
	if err != nil || !bytes.Contains(b, []byte(`"ttft_s":null,"tpot_s":null`)) {
		t.Errorf("a report without samples: %s (%v)", b, err)
	}
}

// The simulator applies the switcher's steps as serve does: a switch whose engine an operator
// drains while it is held, before it is asked, is abandoned — its role stays, the log audits
// clean — instead of staying under way for ever.
func TestSimAbandonsASwitchLeftUnasked(t *testing.T) {
	reqs, changes := synthetic(t, Synthetic{Kind: "phases", RatePerS: 30, DurationS: 600, PhaseS: 200, Seed: 4})
	cfg := fleetConfig(t, 4, 2)
	for i := range cfg.Engines {
		cfg.Engines[i].Switch = config.SwitchSGLang
	}
	// The first switch of the replay: when its engine was held, and when it was asked.
	var engine string
	var held, asked float64
	readLog(t, simulate(t, cfg, reqs, "narwhal", changes), func(l decisionlog.Line) {
		switch ev := l.Fleet; {
		case ev == nil:
		case engine == "" && ev.Event == fleet.EventLifecycle && ev.To == fleet.Switching.String():
			engine, held = ev.Engine, ev.TimeS
		case engine != "" && asked == 0 && ev.Engine == engine && ev.Result == fleet.SwitchAsked:
			asked = ev.TimeS
		}
	})
	if engine == "" || asked <= held {
		t.Fatalf("no switch held before it was asked (engine %q held at %.3f s, asked at %.3f s)", engine, held, asked)
	}
	// The same replay, the engine drained while it is held.
	cfg.Sim.Faults = []config.Fault{{AtS: (held + asked) / 2, Engine: engine, Kind: "drain"}}
	rep := simulate(t, cfg, reqs, "narwhal", changes)
	var ends []string
	readLog(t, rep, func(l decisionlog.Line) {
		if ev := l.Fleet; ev != nil && ev.Engine == engine && ev.Event == fleet.EventSwitch && ev.TimeS < asked {
			ends = append(ends, string(ev.Result)+": "+ev.Cause)
		}
	})
	if want := []string{"abandoned: it became draining before it was asked"}; !slices.Equal(ends, want) {
		t.Fatalf("%s's switch before %.3f s: %q, want %q", engine, asked, ends, want)
	}
	var log bytes.Buffer
	if err := rep.WriteDecisions(&log); err != nil {
		t.Fatal(err)
	}
	if res, err := audit.Audit(&log, nil); err != nil || len(res.Violations) > 0 {
		t.Fatalf("audit: %v %v", err, res.Violations)
	}
}

// readLog hands every line of the narwhal policy's decision log to fn.
func readLog(t *testing.T, rep *Report, fn func(decisionlog.Line)) {
	t.Helper()
	var log bytes.Buffer
	if err := rep.WriteDecisions(&log); err != nil {
		t.Fatal(err)
	}
	if err := decisionlog.Read(&log, func(l decisionlog.Line) error { fn(l); return nil }); err != nil {
		t.Fatal(err)
	}
}

// The report's ttft_short_s covers only the completed requests with prompts under
// ShortPromptTokens: none, null; a light load of short and long prompts, the short ones' first
// tokens come sooner than the whole's.
func TestReportTTFTShort(t *testing.T) {
	reqs, _ := synthetic(t, Synthetic{Kind: "onoff", RatePerS: 4, DurationS: 120, Seed: 3})
	for i := range reqs {
		reqs[i].InputTokens, reqs[i].OutputTokens = 6000, 20
	}
	cfg := fleetConfig(t, 4, 2)
	if p := policy(t, simulate(t, cfg, reqs, "static", nil), "static"); p.TTFTShortS != nil || p.TTFTS == nil {
		t.Fatalf("no short prompt: ttft_short_s %+v, ttft_s %+v", p.TTFTShortS, p.TTFTS)
	}
	for i := range reqs {
		if i%2 == 0 {
			reqs[i].InputTokens = ShortPromptTokens - 1
		}
	}
	p := policy(t, simulate(t, cfg, reqs, "static", nil), "static")
	if p.TTFTShortS == nil || p.TTFTShortS.P50 >= p.TTFTS.P90 || p.TTFTShortS.P99 >= p.TTFTS.P99 {
		t.Fatalf("ttft_short_s %+v against ttft_s %+v", p.TTFTShortS, p.TTFTS)
	}
}
