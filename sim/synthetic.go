package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Synthetic describes a seeded synthetic workload: what the real traces lack (bursts, steps,
// storms of long prompts, slow cycles, a moving mix). Arrivals are Poisson with a rate that
// follows the kind's shape; request sizes are drawn from a chat mix (log-normal prompt and
// output lengths fitted to the Azure conversation trace's medians and means) unless the kind
// says otherwise. Zero fields take the defaults of DefaultSynthetic.
type Synthetic struct {
	Kind      string  // onoff, step, longprompt, diurnal, phases, daynight
	RatePerS  float64 // the base arrival rate
	DurationS float64
	Seed      int64

	OnS, OffS float64 // onoff: bursts at RatePerS × Factor for OnS, then silence for OffS
	Factor    float64 // onoff and step: the burst's and the step's rate multiple
	StepAtS   float64 // step: the rate is × Factor from StepAtS for StepLenS, then back
	StepLenS  float64
	// longprompt: every StormEveryS a storm of StormLenS adds StormRatePerS requests/s with
	// 8k–16k-token prompts over the chat load.
	StormEveryS, StormLenS, StormRatePerS float64
	PeriodS                               float64 // diurnal: the sine's period (its amplitude is 0.8 × the base rate); daynight: a day and a night
	PhaseS                                float64 // phases: the length of each of the three phases
	// PromptScale and OutputScale multiply every drawn prompt and output length (0: 1), for
	// mixes other than chat: code (longer prompts, shorter answers), agents, summaries.
	PromptScale, OutputScale float64
}

// SyntheticKinds are the kinds Generate knows.
var SyntheticKinds = []string{"onoff", "step", "longprompt", "diurnal", "phases", "daynight"}

// DefaultSynthetic is the workload of a kind with every parameter at its default.
func DefaultSynthetic(kind string) Synthetic {
	return Synthetic{Kind: kind, RatePerS: 20, DurationS: 3600, Seed: 1,
		OnS: 60, OffS: 60, Factor: 4, StepAtS: 1200, StepLenS: 1200,
		StormEveryS: 600, StormLenS: 60, StormRatePerS: 6, PeriodS: 3600, PhaseS: 1200, PromptScale: 1, OutputScale: 1}
}

// withDefaults fills zero fields from DefaultSynthetic.
func (s Synthetic) withDefaults() Synthetic {
	d := DefaultSynthetic(s.Kind)
	for _, f := range []struct{ v, def *float64 }{
		{&s.RatePerS, &d.RatePerS}, {&s.DurationS, &d.DurationS}, {&s.OnS, &d.OnS}, {&s.OffS, &d.OffS},
		{&s.Factor, &d.Factor}, {&s.StepAtS, &d.StepAtS}, {&s.StepLenS, &d.StepLenS}, {&s.StormEveryS, &d.StormEveryS},
		{&s.StormLenS, &d.StormLenS}, {&s.StormRatePerS, &d.StormRatePerS}, {&s.PeriodS, &d.PeriodS}, {&s.PhaseS, &d.PhaseS},
		{&s.PromptScale, &d.PromptScale}, {&s.OutputScale, &d.OutputScale},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	return s
}

// Generate draws the workload: its requests in arrival order, and the changes of its mix that
// a role change should answer (time to adapt).
func (s Synthetic) Generate() ([]Request, []Change, error) {
	s = s.withDefaults()
	for _, v := range []float64{s.RatePerS, s.DurationS, s.OnS, s.OffS, s.Factor, s.StepLenS, s.StormEveryS, s.StormLenS, s.StormRatePerS, s.PeriodS, s.PhaseS, s.PromptScale, s.OutputScale} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, nil, fmt.Errorf("synthetic %s: parameters must be finite and positive", s.Kind)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(s.Seed), 0x73796e746865)) // "synthe"
	var (
		rate    func(t float64) float64 // the chat load's rate at t
		extra   func(t float64) float64 // a second stream's rate (longprompt's storms)
		mix     func(t float64) (prompt, output int)
		changes []Change
	)
	chat := func(float64) (int, int) { return chatPrompt(rng), chatOutput(rng) }
	mix = chat
	switch s.Kind {
	case "onoff":
		rate = func(t float64) float64 {
			if math.Mod(t, s.OnS+s.OffS) < s.OnS {
				return s.RatePerS * s.Factor
			}
			return 0
		}
	case "step":
		rate = func(t float64) float64 {
			if t >= s.StepAtS && t < s.StepAtS+s.StepLenS {
				return s.RatePerS * s.Factor
			}
			return s.RatePerS
		}
	case "longprompt":
		rate = func(float64) float64 { return s.RatePerS }
		extra = func(t float64) float64 {
			if math.Mod(t, s.StormEveryS) >= s.StormEveryS-s.StormLenS {
				return s.StormRatePerS
			}
			return 0
		}
		for at := s.StormEveryS - s.StormLenS; at < s.DurationS; at += s.StormEveryS {
			changes = append(changes, Change{AtS: at, Direction: "to_prefill"}, Change{AtS: at + s.StormLenS, Direction: "to_decode"})
		}
	case "diurnal":
		rate = func(t float64) float64 { return s.RatePerS * (1 + 0.8*math.Sin(2*math.Pi*t/s.PeriodS)) }
	case "phases":
		rate = func(float64) float64 { return s.RatePerS }
		mix = func(t float64) (int, int) {
			if p := int(t / s.PhaseS); p%2 == 1 { // prefill-heavy: long prompts, short answers
				return clampInt(lognormal(rng, 4000, 0.4), 256, 16000), clampInt(lognormal(rng, 40, 0.5), 1, 200)
			}
			return clampInt(lognormal(rng, 300, 0.5), 16, 2000), clampInt(lognormal(rng, 500, 0.4), 16, 2000) // decode-heavy
		}
		for at := s.PhaseS; at < s.DurationS; at += s.PhaseS {
			dir := "to_prefill"
			if int(at/s.PhaseS)%2 == 0 {
				dir = "to_decode"
			}
			changes = append(changes, Change{AtS: at, Direction: dir})
		}
	case "daynight":
		// Days of chat at the base rate, nights of long-document work: 8k–16k-token prompts with
		// short answers at a tenth of the rate (about as many prompt tokens per second, a tenth of
		// the output), each half a period.
		night := func(t float64) bool { return math.Mod(t, s.PeriodS) >= s.PeriodS/2 }
		rate = func(t float64) float64 {
			if night(t) {
				return s.RatePerS / 10
			}
			return s.RatePerS
		}
		mix = func(t float64) (int, int) {
			if night(t) {
				return 8192 + rng.IntN(8193), clampInt(lognormal(rng, 60, 0.5), 1, 400)
			}
			return chatPrompt(rng), chatOutput(rng)
		}
		for at := s.PeriodS / 2; at < s.DurationS; at += s.PeriodS / 2 {
			dir := "to_prefill"
			if math.Mod(at, s.PeriodS) < s.PeriodS/4 {
				dir = "to_decode"
			}
			changes = append(changes, Change{AtS: at, Direction: dir})
		}
	default:
		return nil, nil, fmt.Errorf("synthetic workload %q: want one of %v", s.Kind, SyntheticKinds)
	}
	out := poisson(rng, s.DurationS, rate, mix)
	if extra != nil {
		storm := poisson(rng, s.DurationS, extra, func(float64) (int, int) {
			return 8192 + rng.IntN(8193), chatOutput(rng)
		})
		out = merge(out, storm)
	}
	if s.PromptScale != 1 || s.OutputScale != 1 {
		for i := range out {
			out[i].InputTokens = max(1, int(math.Round(float64(out[i].InputTokens)*s.PromptScale)))
			out[i].OutputTokens = max(1, int(math.Round(float64(out[i].OutputTokens)*s.OutputScale)))
		}
	}
	return out, changes, nil
}

// poisson draws arrivals over [0, duration) at a rate that varies in time (thinning against the
// rate's maximum over a fine grid), each sized by mix.
func poisson(rng *rand.Rand, duration float64, rate func(float64) float64, mix func(float64) (int, int)) []Request {
	peak := 0.0
	for t := 0.0; t < duration; t += 1 {
		peak = max(peak, rate(t))
	}
	var out []Request
	if peak <= 0 {
		return out
	}
	for t := rng.ExpFloat64() / peak; t < duration; t += rng.ExpFloat64() / peak {
		if rng.Float64()*peak < rate(t) {
			p, o := mix(t)
			out = append(out, Request{ArrivalS: math.Round(t*1000) / 1000, InputTokens: p, OutputTokens: o})
		}
	}
	return out
}

// merge interleaves two arrival-ordered request lists.
func merge(a, b []Request) []Request {
	out := make([]Request, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0].ArrivalS <= b[0].ArrivalS {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// chatPrompt and chatOutput draw the sizes of a chat request: log-normal, median 1,020 and
// mean about 1,150 prompt tokens, median 130 and mean about 210 output tokens, as in the Azure
// conversation trace.
func chatPrompt(rng *rand.Rand) int { return clampInt(lognormal(rng, 1020, 0.5), 16, 8000) }
func chatOutput(rng *rand.Rand) int { return clampInt(lognormal(rng, 130, 0.95), 1, 2000) }

func lognormal(rng *rand.Rand, median, sigma float64) float64 {
	return median * math.Exp(sigma*rng.NormFloat64())
}

func clampInt(x float64, lo, hi int) int { return min(max(int(math.Round(x)), lo), hi) }
