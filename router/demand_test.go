package router

import (
	"math"
	"testing"
)

// Issue 8: under constant load from the start, the short and long estimates agree at once (they
// divide by the time they cover, not by the whole horizon), so the consolidation trend does not
// read "rising" for the first long horizon.
func TestDemandCoversElapsedTime(t *testing.T) {
	d := newDemand(10, 120)
	const rate = 10.0 // arrivals per second, 100 prompt and 20 output tokens each
	for k := 0; k < 300; k++ {
		d.add(float64(k)/rate, 100, 20)
	}
	at := 300 / rate
	got := d.estimate(at)
	for name, r := range map[string]Rates{"short": got.Short, "long": got.Long} {
		if math.Abs(r.ArrivalsPerS-rate) > 0.5 || math.Abs(r.PromptTokensPerS-100*rate) > 50 || math.Abs(r.OutputTokensPerS-20*rate) > 10 {
			t.Fatalf("%s at %.0f s: %+v, want about %v arrivals/s", name, at, r, rate)
		}
	}
	// The first arrivals do not read as a burst: they are averaged over at least a second.
	d = newDemand(10, 120)
	d.add(0.001, 100, 20)
	if r := d.estimate(0.002).Short; r.ArrivalsPerS != 1 {
		t.Fatalf("one arrival at start reads %v/s, want 1", r.ArrivalsPerS)
	}
	// Past the horizon the divisor is the horizon again.
	d = newDemand(10, 120)
	for k := 0; k < 2000; k++ {
		d.add(float64(k)/rate, 100, 20)
	}
	if r := d.estimate(200).Long; math.Abs(r.ArrivalsPerS-rate) > 0.5 {
		t.Fatalf("long at 200 s: %+v", r)
	}
}
