package router

// sample is one admitted offer as demand: (time, prompt tokens, expected output tokens). A
// request without max_tokens has no output of its own (output 0, estimated): its expected output
// is the running mean of observed output lengths when the estimate is read, not when it arrived.
// Otherwise, as the mean climbs from its first (short) observations, recent samples would carry
// larger estimates than old ones and the short horizon would read as rising output demand — a
// consolidation trend made by the estimator (docs/role-control.md, "Demand").
type sample struct {
	t         float64
	prompt    int64
	output    int64
	estimated bool
}

// window is one demand horizon over a shared sample ring: the sums of the samples newer than
// now - horizon. output sums the explicit samples; estimated counts the others.
type window struct {
	horizon        float64
	start          int // index (in ring order) of the oldest sample inside the window
	n, estimated   int
	prompt, output int64
}

// demand keeps the arrival samples of the long horizon in a ring and two windows over it.
// Adding and expiring samples are O(1) amortized; nothing allocates once the ring has grown.
type demand struct {
	ring        []sample
	head, count int // ring holds count samples from head
	short, long window
}

func newDemand(shortS, longS float64) demand {
	return demand{ring: make([]sample, 64), short: window{horizon: shortS}, long: window{horizon: longS}}
}

func (d *demand) at(i int) *sample { return &d.ring[(d.head+i)%len(d.ring)] }

// add records an arrival; an estimated one (no max_tokens) keeps no output of its own.
func (d *demand) add(t float64, prompt, output int64, estimated bool) {
	if d.count == len(d.ring) {
		grown := make([]sample, 2*len(d.ring))
		for i := 0; i < d.count; i++ {
			grown[i] = *d.at(i)
		}
		d.ring, d.head = grown, 0
	}
	s := sample{t: t, prompt: prompt, estimated: estimated}
	if !estimated {
		s.output = output
	}
	*d.at(d.count) = s
	d.count++
	d.short.push(s, 1)
	d.long.push(s, 1)
}

// push adds (sign 1) or removes (sign -1) a sample's sums.
func (w *window) push(s sample, sign int) {
	w.n += sign
	w.prompt += int64(sign) * s.prompt
	w.output += int64(sign) * s.output
	if s.estimated {
		w.estimated += sign
	}
}

// expireWindow moves the window's start past the samples older than now - horizon.
func (d *demand) expireWindow(w *window, now float64) {
	for w.n > 0 {
		s := d.at(w.start)
		if s.t > now-w.horizon {
			return
		}
		w.push(*s, -1)
		w.start++
	}
}

// expire drops the samples that left each window by now.
func (d *demand) expire(now float64) {
	d.expireWindow(&d.short, now)
	d.expireWindow(&d.long, now)
	// The long horizon is the longer (config validation): samples before its start leave.
	drop := min(d.long.start, d.short.start)
	d.head = (d.head + drop) % len(d.ring)
	d.count -= drop
	d.short.start -= drop
	d.long.start -= drop
}

// rates divides the window's sums by the time it actually covers at now (seconds since the
// router started): the horizon, or less while the router is younger than it, so that under
// constant load the short and long estimates agree from the start (issue 8). The time covered
// is at least minCoveredS (or the horizon, if shorter), so that the first arrivals do not read
// as a burst. mean is the expected output of an estimated sample.
func (w *window) rates(now float64, mean int64) Rates {
	covered := min(w.horizon, max(now, min(w.horizon, minCoveredS)))
	return Rates{
		ArrivalsPerS:     float64(w.n) / covered,
		PromptTokensPerS: float64(w.prompt) / covered,
		OutputTokensPerS: float64(w.output+int64(w.estimated)*mean) / covered,
	}
}

// minCoveredS is the shortest time a demand estimate is averaged over.
const minCoveredS = 1.0

// estimate returns the short, long and priced demand at now (after expiring old samples); mean
// is the expected output of a request without max_tokens.
func (d *demand) estimate(now float64, mean int64) Demand {
	d.expire(now)
	s, l := d.short.rates(now, mean), d.long.rates(now, mean)
	return Demand{Short: s, Long: l, Priced: s.Max(l)}
}
