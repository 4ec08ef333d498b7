package main

import (
	"cmp"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/sim"
)

// The generator is a function of its seed, and spans what the scorecard promises: every shape,
// fleets of 4 to 64 engines starting anywhere from 1P to N−1P, the four profiles, every mix,
// phases from 20 s to 30 min, and some faults.
func TestGenerateSpansTheSpace(t *testing.T) {
	a, b := generate(7, 200), generate(7, 200)
	for i := range a {
		if a[i].name() != b[i].name() || a[i].syn != b[i].syn || a[i].load != b[i].load {
			t.Fatalf("scenario %d differs between two draws of one seed: %s / %s", i+1, a[i].name(), b[i].name())
		}
	}
	if c := generate(8, 200); slices.EqualFunc(a, c, func(x, y *scenario) bool { return x.name() == y.name() }) {
		t.Errorf("seeds 7 and 8 drew the same scenarios")
	}
	families, fleets, profs, mixesSeen := map[string]int{}, map[int]int{}, map[string]int{}, map[int]int{}
	faults, minPhase, maxPhase := 0, math.Inf(1), 0.0
	for _, sc := range a {
		families[sc.family]++
		fleets[sc.engines]++
		profs[sc.profile.name]++
		mixesSeen[sc.mix]++
		if sc.start < 1 || sc.start >= sc.engines {
			t.Errorf("%s: starts at %dP of %d engines", sc.name(), sc.start, sc.engines)
		}
		if sc.fault != nil {
			faults++
			if sc.fault[0] >= sc.fault[1] || sc.fault[1] > sc.syn.DurationS || sc.faulty >= sc.engines {
				t.Errorf("%s: fault %v of engine %d over %.0f s", sc.name(), *sc.fault, sc.faulty, sc.syn.DurationS)
			}
		}
		if sc.family == "phases" {
			minPhase, maxPhase = min(minPhase, sc.syn.PhaseS), max(maxPhase, sc.syn.PhaseS)
		}
	}
	if len(families) != len(shapes) || len(fleets) != 4 || len(profs) != 4 || len(mixesSeen) != len(mixes) {
		t.Errorf("families %v, fleets %v, profiles %v, mixes %v", families, fleets, profs, mixesSeen)
	}
	if faults == 0 || faults > 60 {
		t.Errorf("%d of 200 scenarios with a fault", faults)
	}
	if minPhase > 60 || maxPhase < 600 {
		t.Errorf("phases from %.0f s to %.0f s", minPhase, maxPhase)
	}
}

// A scenario's workload is drawn at the rate asked, within the request budget once its engines
// are slowed, its prompts within what the profile prefills in half its SLO.
func TestWorkloadRateAndPrompts(t *testing.T) {
	ts := loadTraces("../..")
	base := config.Default()
	for _, sc := range generate(3, 40) {
		reqs, _ := sc.workload(ts, 10)
		nom := nominal(sc.profile, sc.engines, reqs)
		if !(nom > 0) || math.IsInf(nom, 0) {
			t.Fatalf("%s: nominal capacity %v", sc.name(), nom)
		}
		rate := 5.0
		reqs, _ = sc.workload(ts, rate)
		got := float64(len(reqs)) / sc.syn.DurationS
		// Shapes modulate the rate around the base they are given; a trace is thinned to it.
		if sc.family == "trace" || sc.family == "stationary" {
			if got < 0.7*rate || got > 1.3*rate {
				t.Errorf("%s: %.2f req/s, want about %.1f", sc.name(), got, rate)
			}
		}
		limit := maxPrompt(sc.profile)
		if sc.profile.prof.Prefill.Seconds(limit) > sc.profile.slo.TTFTS/2 || sc.profile.prof.Prefill.Seconds(limit+1) <= sc.profile.slo.TTFTS/2 && limit < sc.profile.prof.Prefill.MaxTokens {
			t.Errorf("%s: prompt limit %d tokens is not the longest prefilled in half the SLO", sc.name(), limit)
		}
		if !slices.IsSortedFunc(reqs, func(a, b sim.Request) int { return cmp.Compare(a.ArrivalS, b.ArrivalS) }) {
			t.Errorf("%s: arrivals out of order", sc.name())
		}
		for _, q := range reqs {
			if q.InputTokens > limit || q.InputTokens < 1 || q.OutputTokens < 1 {
				t.Fatalf("%s: request %+v (prompt limit %d)", sc.name(), q, limit)
			}
		}
		if cfg := sc.config(base); len(cfg.Engines) != sc.engines || cfg.Engines[sc.start-1].Role != config.RolePrefill || cfg.Engines[sc.start].Role != config.RoleDecode {
			t.Errorf("%s: config engines %v", sc.name(), cfg.Engines)
		}
	}
}

// A slowed profile is the same engine k times slower under an SLO k times looser: the nominal
// capacity divides by k.
func TestSlowedScalesCapacity(t *testing.T) {
	reqs, _, err := sim.Synthetic{Kind: "step", Factor: 1, RatePerS: 5, DurationS: 200, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range profiles() {
		a, b := nominal(p, 8, reqs), nominal(slowed(p, 4), 8, reqs)
		if math.Abs(a/b-4) > 0.01 {
			t.Errorf("%s: nominal %.2f req/s, slowed ×4 %.2f", p.name, a, b)
		}
	}
}

// -rates reads each scenario's rate from another run's table of every scenario, and says so when
// the file has none.
func TestReadRates(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "benchmarks.md")
	table := "| scenario | req/s | requests | narwhal |\n| --- | ---: | ---: | ---: |\n" +
		"| #001 stationary chat 4e default×4 1P | 13.88 | 19537 | 0.933 |\n" +
		"| #049 stationary chat 8e default×6 3P fault | 23.85 | 26869 | 0.701 |\n" +
		"| #050 a worst-ten row without the requests column | 9.99 | 0.5 | 0.7 |\n"
	if err := os.WriteFile(doc, []byte("# Benchmarks\n\n"+table), 0o644); err != nil {
		t.Fatal(err)
	}
	rates, err := readRates(doc)
	if err != nil || len(rates) != 2 || rates[1] != 13.88 || rates[49] != 23.85 {
		t.Fatalf("rates %v, %v", rates, err)
	}
	empty := filepath.Join(dir, "empty.md")
	if err := os.WriteFile(empty, []byte("# nothing here\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readRates(empty); err == nil || !strings.Contains(err.Error(), "no table of every scenario") {
		t.Fatalf("a file without the table: %v", err)
	}
	if _, err := readRates(filepath.Join(dir, "missing.md")); err == nil {
		t.Fatal("a missing file: no error")
	}
}
