package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/page"
	"github.com/narwhal-llm/narwhal/sim"
)

func newSim(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfgPath, policies, reportPath, decisionsPath string
		sweepSpec, plotPath                          string
		durationS, windowS                           float64
		parallel                                     int
		wl                                           workload
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
			if len(cfg.Engines) == 0 {
				return usageErr(fmt.Errorf("the config lists no engines: sim replays a fixed fleet, list it under engines (discovery is not simulated)"))
			}
			ps, err := sim.ParsePolicies(policies, len(cfg.Engines))
			if err != nil {
				return usageErr(err)
			}
			reqs, changes, notes, err := wl.requests("sim", sweepSpec == "")
			if err != nil {
				return err
			}
			name, seed := wl.name(), wl.seed
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
			rep.WriteTable(stdout)
			if err := writeOut(reportPath, nil, func(w io.Writer) error { return writeJSON(w, rep) }); err != nil {
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
	f.StringVar(&policies, "policy", "narwhal", "policies, comma-separated: narwhal, static, static:P, static:best, threshold, oracle:greedy, oracle:split")
	f.StringVar(&reportPath, "report", "", "write the JSON report here (stdout gets a table either way)")
	f.StringVar(&decisionsPath, "decisions", "", "write every decision record here, as JSON lines with a \"policy\" field")
	f.StringVar(&plotPath, "plot", "", "write an SVG here: offered rate, TTFT p99 against the SLO and the split over time, a row per policy; a FILE.html gets the live page's charts of the replay (a policy a view)")
	f.StringVar(&sweepSpec, "sweep-rate", "", "A:B:STEP: replay at each rate scale from A to B and print each policy's attainment and goodput (the largest rate at 90% attainment)")
	f.Float64Var(&durationS, "duration-s", 0, "replay the first N seconds of the trace (after --rate-scale; 0: all)")
	f.Float64Var(&windowS, "window-s", 60, "the width of the report's windows and of the oracles', seconds")
	f.IntVar(&parallel, "parallel", 0, "replays run at once (0: all)")
	wl.bind(f, "seed of the simulated engines' noise and of --spread-s")
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
