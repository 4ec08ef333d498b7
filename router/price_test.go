package router

import (
	"testing"

	"github.com/narwhal-llm/narwhal/config"
)

// Issue 8: priced demand is injected in expectation, fractions included: 1.9 requests/s over a
// 0.5 s step injects 0.95 of a request (before, none), which delays the probe behind it.
func TestPriceInjectsFractionalDemand(t *testing.T) {
	cfg := config.Default()
	p := cfg.Profiles[config.DefaultProfileName]
	p.Prefill = &config.PrefillCurve{BaseS: 1, MaxTokens: 16384} // one second a prompt
	cfg.Profiles[config.DefaultProfileName] = p
	r := testRouter(t, cfg, "p prefill", "d decode")
	for k := 0; k < 19; k++ { // 1.9 requests/s over the 10 s short horizon, each done at once
		o := r.Offer(at(float64(k)*0.5), Offer{ID: "r", PromptTokens: 100, MaxTokens: 1})
		if o.Status != Dispatched {
			t.Fatalf("offer %d: %+v", k, o)
		}
		_ = r.FirstToken(at(float64(k)*0.5), o.Handle)
		_ = r.Complete(at(float64(k)*0.5), o.Handle, 1)
	}
	for i := range r.engines { // the instant first tokens taught a correction; price the curve
		r.engines[i].corr = [2]float64{1, 1}
	}
	now := at(10)
	if d := r.Demand(now).Priced; d.ArrivalsPerS < 1.85 || d.ArrivalsPerS > 1.95 {
		t.Fatalf("priced demand %+v, want 1.9 arrivals/s", d)
	}
	pr := r.Price(now, r.CurrentSplit(), 0.5)
	// The injected 0.95 request takes the engine from now to now+1 s; the probe, arriving at
	// now+0.5 s, waits for it: about 0.5 + 1 s, plus the handoff and one decode step.
	if pr.ProbeTTFT < 1.45 {
		t.Fatalf("probe TTFT %.3f s: the fractional demand was not priced", pr.ProbeTTFT)
	}
}
