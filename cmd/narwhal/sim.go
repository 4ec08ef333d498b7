package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/page"
	"github.com/narwhal-llm/narwhal/sim"
)

func newSim(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfgPath, tracePath, policies, reportPath, decisionsPath string
		sweepSpec, plotPath                                     string
		durationS, rateScale, windowS, spreadS                  float64
		seed                                                    int64
		parallel                                                int
		syn                                                     sim.Synthetic
	)
	cmd := &cobra.Command{
		Use:   "sim (--trace FILE | --synthetic KIND) [--config FILE] [--policy P,...] [--report FILE] [--decisions FILE]",
		Short: "Replay a request trace through the real router and controller in virtual time, against simulated engines and baseline policies",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			if (tracePath == "") == (syn.Kind == "") {
				return usageErr(fmt.Errorf("sim: give one of --trace FILE and --synthetic KIND (%v)", sim.SyntheticKinds))
			}
			if rateScale <= 0 {
				return usageErr(fmt.Errorf("sim: --rate-scale %g: want a positive factor", rateScale))
			}
			ps, err := sim.ParsePolicies(policies, len(cfg.Engines))
			if err != nil {
				return usageErr(err)
			}
			var reqs []sim.Request
			var changes []sim.Change
			name := filepath.Base(tracePath)
			if syn.Kind != "" {
				syn.Seed = seed
				if reqs, changes, err = syn.Generate(); err != nil {
					return usageErr(err)
				}
				name = "synthetic:" + syn.Kind
			} else if reqs, err = sim.LoadTrace(tracePath, 0); err != nil {
				return failureErr(err)
			}
			notes := []string(nil)
			if spreadS > 0 {
				reqs = sim.Spread(reqs, spreadS, seed)
				notes = append(notes, fmt.Sprintf("arrivals sharing a time were spread uniformly over the %g s that follows it (seed %d)", spreadS, seed))
			}
			if sweepSpec != "" {
				scales, err := sim.ParseSweep(sweepSpec)
				if err != nil {
					return usageErr(err)
				}
				sw, err := sim.RunSweep(cfg, reqs, sim.Options{Policies: ps, Seed: seed, WindowS: windowS, Parallel: parallel, Trace: name}, scales)
				if err != nil {
					return failureErr(err)
				}
				sw.WriteTable(stdout, ps)
				return writeOut(reportPath, nil, func(w io.Writer) error { return writeJSON(w, sw) })
			}
			for i := range reqs {
				reqs[i].ArrivalS /= rateScale
			}
			for i := range changes {
				changes[i].AtS /= rateScale
			}
			begin := time.Now()
			var mu sync.Mutex
			last := time.Now()
			progress := func(policy string, t float64) {
				mu.Lock()
				defer mu.Unlock()
				if time.Since(begin) > 3*time.Second && time.Since(last) > time.Second {
					last = time.Now()
					fmt.Fprintf(stderr, "sim: %s at %.0f s virtual, %.1f s wall\n", policy, t, time.Since(begin).Seconds())
				}
			}
			rep, err := sim.Simulate(cfg, reqs, sim.Options{Policies: ps, Seed: seed, WindowS: windowS, DurationS: durationS,
				Progress: progress, Parallel: parallel, Trace: name, Changes: changes, Notes: notes})
			if err != nil {
				return failureErr(err)
			}
			if err := writeOut(reportPath, stdout, func(w io.Writer) error { return writeJSON(w, rep) }); err != nil {
				return err
			}
			plot := func(w io.Writer) error { rep.WritePlot(w); return nil }
			if strings.HasSuffix(plotPath, ".html") { // the live page's charts, from the replay's history
				plot = func(w io.Writer) error { return page.Static(w, rep.Page(cfg)) }
			}
			if err := writeOut(plotPath, nil, plot); err != nil {
				return err
			}
			if err := writeOut(decisionsPath, nil, rep.WriteDecisions); err != nil {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", "", "the config (default: the embedded one)")
	f.StringVar(&tracePath, "trace", "", "the trace CSV (arrival_s,input_tokens,output_tokens[,prefix_blocks]; .gz read as gzip)")
	f.StringVar(&policies, "policy", "narwhal", "policies, comma-separated: narwhal, static, static:P, static:best, threshold, oracle:greedy")
	f.StringVar(&reportPath, "report", "", "write the JSON report here (default: stdout)")
	f.StringVar(&decisionsPath, "decisions", "", "write every decision record here, as JSON lines with a \"policy\" field")
	f.StringVar(&plotPath, "plot", "", "write an SVG here: offered rate, TTFT p99 against the SLO and the split over time, a row per policy; a FILE.html gets the live page's charts of the replay (a policy a view)")
	f.StringVar(&sweepSpec, "sweep-rate", "", "A:B:STEP: replay at each rate scale from A to B and print each policy's attainment and goodput (the largest rate at 90% attainment)")
	f.Float64Var(&durationS, "duration-s", 0, "replay the first N seconds of the trace (after --rate-scale; 0: all)")
	f.Float64Var(&rateScale, "rate-scale", 1, "compress the trace's time by this factor (2: twice the rate)")
	f.Float64Var(&spreadS, "spread-s", 0, "spread the requests of each arrival time uniformly over the N seconds that follow it (a trace quantised to an N-second grid; seeded by --seed)")
	f.Float64Var(&windowS, "window-s", 60, "the width of the report's windows and of oracle:greedy's, seconds")
	f.Int64Var(&seed, "seed", 1, "seed of the simulated engines' noise")
	f.IntVar(&parallel, "parallel", 0, "replays run at once (0: all)")
	d := sim.DefaultSynthetic("")
	f.StringVar(&syn.Kind, "synthetic", "", "replay a seeded synthetic workload instead of a trace: onoff, step, longprompt, diurnal, phases or daynight")
	f.Float64Var(&syn.RatePerS, "synthetic-rate", d.RatePerS, "synthetic: the base arrival rate, requests/s")
	f.Float64Var(&syn.DurationS, "synthetic-duration-s", d.DurationS, "synthetic: the workload's length, seconds")
	f.Float64Var(&syn.OnS, "on-s", d.OnS, "onoff: the length of a burst, seconds")
	f.Float64Var(&syn.OffS, "off-s", d.OffS, "onoff: the length of a silence, seconds")
	f.Float64Var(&syn.Factor, "factor", d.Factor, "onoff and step: the rate multiple of a burst and of the step")
	f.Float64Var(&syn.StepAtS, "step-at-s", d.StepAtS, "step: when the rate steps up, seconds")
	f.Float64Var(&syn.StepLenS, "step-len-s", d.StepLenS, "step: how long it stays up, seconds")
	f.Float64Var(&syn.StormEveryS, "storm-every-s", d.StormEveryS, "longprompt: a storm of long prompts every N seconds")
	f.Float64Var(&syn.StormLenS, "storm-len-s", d.StormLenS, "longprompt: the length of a storm, seconds")
	f.Float64Var(&syn.StormRatePerS, "storm-rate", d.StormRatePerS, "longprompt: the storm's extra 8k-16k-token requests/s")
	f.Float64Var(&syn.PeriodS, "period-s", d.PeriodS, "diurnal: the period of the rate's sine; daynight: a day of chat and a night of long documents, seconds")
	f.Float64Var(&syn.PhaseS, "phase-s", d.PhaseS, "phases: the length of each phase (decode-heavy, prefill-heavy, decode-heavy), seconds")
	return cmd
}

// writeOut writes one output of a command with write: to the file at path, or, when path is
// empty, to fallback (nothing when fallback is nil). Errors are runtime failures.
func writeOut(path string, fallback io.Writer, write func(io.Writer) error) error {
	if path == "" {
		if fallback == nil {
			return nil
		}
		if err := write(fallback); err != nil {
			return failureErr(err)
		}
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return failureErr(err)
	}
	if err := write(f); err != nil {
		f.Close()
		return failureErr(fmt.Errorf("%s: %w", path, err))
	}
	if err := f.Close(); err != nil {
		return failureErr(err)
	}
	return nil
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
