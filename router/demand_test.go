package router

import (
	"math"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
)

// Issue 8: under constant load from the start, the short and long estimates agree at once (they
// divide by the time they cover, not by the whole horizon), so the consolidation trend does not
// read "rising" for the first long horizon.
func TestDemandCoversElapsedTime(t *testing.T) {
	d := newDemand(10, 120)
	const rate = 10.0 // arrivals per second, 100 prompt and 20 output tokens each
	for k := 0; k < 300; k++ {
		d.add(float64(k)/rate, 100, 20, false)
	}
	at := 300 / rate
	got := d.estimate(at, 0)
	for name, r := range map[string]Rates{"short": got.Short, "long": got.Long} {
		if math.Abs(r.ArrivalsPerS-rate) > 0.5 || math.Abs(r.PromptTokensPerS-100*rate) > 50 || math.Abs(r.OutputTokensPerS-20*rate) > 10 {
			t.Fatalf("%s at %.0f s: %+v, want about %v arrivals/s", name, at, r, rate)
		}
	}
	// The first arrivals do not read as a burst: they are averaged over at least a second.
	d = newDemand(10, 120)
	d.add(0.001, 100, 20, false)
	if r := d.estimate(0.002, 0).Short; r.ArrivalsPerS != 1 {
		t.Fatalf("one arrival at start reads %v/s, want 1", r.ArrivalsPerS)
	}
	// Past the horizon the divisor is the horizon again.
	d = newDemand(10, 120)
	for k := 0; k < 2000; k++ {
		d.add(float64(k)/rate, 100, 20, false)
	}
	if r := d.estimate(200, 0).Long; math.Abs(r.ArrivalsPerS-rate) > 0.5 {
		t.Fatalf("long at 200 s: %+v", r)
	}
}

// Issue 9: a request without max_tokens is expected to produce the running mean of observed
// output lengths, and that mean climbs while the first (short) answers are the only ones seen.
// Its demand is read with the mean of the moment, not frozen at arrival: under a constant load
// whose answers get longer as they are observed, short and long output demand agree, and the
// consolidation trend is not made by the estimator. Before, samples carried the mean of their
// arrival: on azure-2023-conv (narwhal sim) short output demand read 1.3× the long one for the
// first two minutes while the trace's true output rate was flat, and the trend gate blocked
// every decode→prefill move through a prefill overload.
func TestDemandEstimatesOutputWithTheCurrentMean(t *testing.T) {
	r := testRouter(t, config.Default(), "p1 prefill", "d1 decode")
	for k := 0; k < 1200; k++ { // 10 requests/s for 120 s, each answering k/4 tokens
		now := at(float64(k) * 0.1)
		o := r.Offer(now, Offer{ID: "r", PromptTokens: 100})
		if o.Status != Dispatched {
			t.Fatalf("offer %d: %+v", k, o)
		}
		_ = r.FirstToken(now, o.Handle)
		_ = r.Complete(now, o.Handle, 1+k/4)
	}
	d := r.Demand(at(120))
	if d.Short.OutputTokensPerS > d.Long.OutputTokensPerS*1.01 || d.Short.OutputTokensPerS < d.Long.OutputTokensPerS*0.99 {
		t.Fatalf("constant arrivals: short output demand %.0f tok/s, long %.0f", d.Short.OutputTokensPerS, d.Long.OutputTokensPerS)
	}
	if mean := r.expectedOutput(); math.Abs(d.Long.OutputTokensPerS-10*float64(mean)) > 0.01*10*float64(mean) {
		t.Fatalf("long output demand %.0f tok/s, want 10 arrivals/s × the mean %d", d.Long.OutputTokensPerS, mean)
	}
	// Explicit max_tokens keep their own value.
	o := r.Offer(at(120), Offer{ID: "x", PromptTokens: 100, MaxTokens: 100000})
	if o.Status != Dispatched && o.Status != Waiting {
		t.Fatalf("explicit offer: %+v", o)
	}
	if got := r.Demand(at(120)).Short.OutputTokensPerS - d.Short.OutputTokensPerS; math.Abs(got-100000/10.0) > 1 {
		t.Fatalf("an explicit 100,000-token request adds %.0f tok/s to the short demand, want 10,000", got)
	}
}
