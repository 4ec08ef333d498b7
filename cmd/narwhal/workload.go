package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/narwhal-llm/narwhal/sim"
)

// workload is the request stream of sim and load: a trace or a seeded synthetic kind, with the
// same flags in both.
type workload struct {
	tracePath          string
	syn                sim.Synthetic
	seed               int64
	spreadS, rateScale float64
}

// bind adds the workload's flags to f; seedUsage says what --seed seeds in the command.
func (w *workload) bind(f *pflag.FlagSet, seedUsage string) {
	f.StringVar(&w.tracePath, "trace", "", "the trace CSV (arrival_s,input_tokens,output_tokens[,prefix_blocks]; .gz read as gzip)")
	f.Float64Var(&w.rateScale, "rate-scale", 1, "compress the trace's time by this factor (2: twice the rate)")
	f.Float64Var(&w.spreadS, "spread-s", 0, "spread the requests of each arrival time uniformly over the N seconds that follow it (a trace quantised to an N-second grid; seeded by --seed)")
	f.Int64Var(&w.seed, "seed", 1, seedUsage)
	d := sim.DefaultSynthetic("")
	f.StringVar(&w.syn.Kind, "synthetic", "", "replay a seeded synthetic workload instead of a trace: onoff, step, longprompt, diurnal, phases or daynight")
	f.Float64Var(&w.syn.RatePerS, "synthetic-rate", d.RatePerS, "synthetic: the base arrival rate, requests/s")
	f.Float64Var(&w.syn.DurationS, "synthetic-duration-s", d.DurationS, "synthetic: the workload's length, seconds")
	f.Float64Var(&w.syn.OnS, "on-s", d.OnS, "onoff: the length of a burst, seconds")
	f.Float64Var(&w.syn.OffS, "off-s", d.OffS, "onoff: the length of a silence, seconds")
	f.Float64Var(&w.syn.Factor, "factor", d.Factor, "onoff and step: the rate multiple of a burst and of the step")
	f.Float64Var(&w.syn.StepAtS, "step-at-s", d.StepAtS, "step: when the rate steps up, seconds")
	f.Float64Var(&w.syn.StepLenS, "step-len-s", d.StepLenS, "step: how long it stays up, seconds")
	f.Float64Var(&w.syn.StormEveryS, "storm-every-s", d.StormEveryS, "longprompt: a storm of long prompts every N seconds")
	f.Float64Var(&w.syn.StormLenS, "storm-len-s", d.StormLenS, "longprompt: the length of a storm, seconds")
	f.Float64Var(&w.syn.StormRatePerS, "storm-rate", d.StormRatePerS, "longprompt: the storm's extra 8k-16k-token requests/s")
	f.Float64Var(&w.syn.PeriodS, "period-s", d.PeriodS, "diurnal: the period of the rate's sine; daynight: a day of chat and a night of long documents, seconds")
	f.Float64Var(&w.syn.PhaseS, "phase-s", d.PhaseS, "phases: the length of each phase (decode-heavy, prefill-heavy, decode-heavy), seconds")
}

// name is the workload's name in reports.
func (w *workload) name() string {
	if w.syn.Kind != "" {
		return "synthetic:" + w.syn.Kind
	}
	return filepath.Base(w.tracePath)
}

// requests generates or reads the requests (spread, and with scale their times divided by
// --rate-scale), the changes a synthetic kind announces and notes for a report. cmd names the
// command in errors.
func (w *workload) requests(cmd string, scale bool) ([]sim.Request, []sim.Change, []string, error) {
	if (w.tracePath == "") == (w.syn.Kind == "") {
		return nil, nil, nil, usageErr(fmt.Errorf("%s: give one of --trace FILE and --synthetic KIND (%v)", cmd, sim.SyntheticKinds))
	}
	if w.rateScale <= 0 {
		return nil, nil, nil, usageErr(fmt.Errorf("%s: --rate-scale %g: want a positive factor", cmd, w.rateScale))
	}
	var reqs []sim.Request
	var changes []sim.Change
	var err error
	if w.syn.Kind != "" {
		w.syn.Seed = w.seed
		if reqs, changes, err = w.syn.Generate(); err != nil {
			return nil, nil, nil, usageErr(err)
		}
	} else if reqs, err = sim.LoadTrace(w.tracePath, 0); err != nil {
		return nil, nil, nil, failureErr(err)
	}
	var notes []string
	if w.spreadS > 0 {
		reqs = sim.Spread(reqs, w.spreadS, w.seed)
		notes = append(notes, fmt.Sprintf("arrivals sharing a time were spread uniformly over the %g s that follows it (seed %d)", w.spreadS, w.seed))
	}
	if scale {
		reqs, changes = sim.ScaleRate(reqs, changes, w.rateScale)
	}
	return reqs, changes, notes, nil
}
