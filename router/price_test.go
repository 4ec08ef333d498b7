package router

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// Issue 8: priced demand is injected in expectation, fractions included: 1.9 requests/s over a
// 0.5 s step injects 0.95 of a request (before, none), which delays the probe behind it.
func TestPriceInjectsFractionalDemand(t *testing.T) {
	r := testRouter(t, oneSecondPrompts(config.Default().Router.LocalPrefill), "p prefill", "d decode")
	offerEvery(t, r, 0.5, 19) // 1.9 requests/s over the 10 s short horizon
	now := at(10)
	if d := r.Demand(now).Priced; d.ArrivalsPerS < 1.85 || d.ArrivalsPerS > 1.95 {
		t.Fatalf("priced demand %+v, want 1.9 arrivals/s", d)
	}
	ps, _ := r.Price(now, Query{Splits: []Split{r.CurrentSplit()}, StepS: 0.5})
	pr := ps[0]
	// The injected 0.95 request takes the engine from now to now+1 s; the probe, arriving at
	// now+0.5 s, waits for it: about 0.5 + 1 s, plus the handoff and one decode step.
	if pr.ProbeTTFT < 1.45 {
		t.Fatalf("probe TTFT %.3f s: the fractional demand was not priced", pr.ProbeTTFT)
	}
}

// Splits priced together in one walk of the waiting set price as each does alone: the
// schedulers of one split share nothing with another's, and the request's projected TTFT is
// the same FIFO prefix, whichever splits come with it.
func TestPriceSplitsTogetherAsAlone(t *testing.T) {
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff // prefill engines alone bring a request forward
	r := testRouter(t, cfg, "p1 prefill", "p2 prefill", "d1 decode", "d2 decode", "d3 decode")
	var target Handle
	for k := 0; k < 40; k++ {
		o := r.Offer(at(float64(k)*0.05), Offer{ID: "r", PromptTokens: 2000 + 300*(k%7), MaxTokens: 64 + k})
		if o.Status == Rejected {
			t.Fatalf("offer %d: %+v", k, o)
		}
		if k == 30 {
			target = o.Handle
		}
	}
	if r.Snapshot(at(2)).Retained.Waiting < 20 {
		t.Fatalf("want a waiting set: %+v", r.Snapshot(at(2)).Retained)
	}
	splits := []Split{
		{Prefill: []string{"p1", "p2"}, Decode: []string{"d1", "d2", "d3"}},
		{Prefill: []string{"p1", "p2", "d1"}, Decode: []string{"d2", "d3"}},
		{Prefill: []string{"p1"}, Decode: []string{"p2", "d1", "d2", "d3"}},
		{Prefill: []string{"p1", "p2", "d1", "d2", "d3"}}, // no decode pool: +Inf
	}
	now := at(2)
	together, waiting := r.Price(now, Query{Splits: splits, StepS: 5, Request: target})
	if !waiting {
		t.Fatal("the target request is waiting")
	}
	for k, s := range splits {
		alone, _ := r.Price(now, Query{Splits: []Split{s}, StepS: 5, Request: target})
		if together[k] != alone[0] {
			t.Errorf("split %d: together %+v, alone %+v", k, together[k], alone[0])
		}
		if together[k].RequestTTFT <= 0 || together[k].RequestPrefill <= 0 {
			t.Errorf("split %d: no projection of the request: %+v", k, together[k])
		}
	}
	if !math.IsInf(together[3].TPOTRatio, 1) {
		t.Errorf("a split without decode engines: tpot_ratio %v, want +Inf", together[3].TPOTRatio)
	}
	if together[1].RequestTTFT >= together[0].RequestTTFT {
		t.Errorf("a third prefill engine does not bring the request's TTFT forward: %v >= %v", together[1].RequestTTFT, together[0].RequestTTFT)
	}
	if _, waiting := r.Price(now, Query{Splits: splits[:1], StepS: 5}); waiting {
		t.Error("a query without a request reports one waiting")
	}
}

// A deadline converted to a time and back is reached: at(Time(s)) >= s. (Truncating to the
// nanosecond made a virtual-time caller wake at a wait limit Tick did not see as reached, for
// ever.)
func TestTimeRoundTripReachesTheDeadline(t *testing.T) {
	r := testRouter(t, config.Default(), "p prefill", "d decode")
	for k := 0; k < 100000; k++ {
		s := float64(k)*0.0137 + 1e-9*float64(k%7)
		if got := r.Time(s).Sub(r.epoch).Seconds(); got < s {
			t.Fatalf("Time(%v) is %v seconds after the epoch, before the deadline", s, got)
		}
	}
}

// The priced demand's requests bring their streams to the decode pool, as waiting requests do:
// in a silence after a burst (no resident, nothing waiting) the decode pool still prices the
// demand of the next step. Before, its tpot_ratio was 0 while its prefill work was priced, and
// every decode→prefill move looked like a gain (narwhal sim --synthetic onoff drifted to 7
// prefill engines and 1 decode engine in each silence).
func TestPriceCountsTheDemandsDecodeStreams(t *testing.T) {
	r := testRouter(t, config.Default(), "p1 prefill", "p2 prefill", "d1 decode", "d2 decode")
	for k := 0; k < 200; k++ { // 20 requests/s of 1,000-token prompts and 200-token answers
		now := at(float64(k) * 0.05)
		o := r.Offer(now, Offer{ID: "r", PromptTokens: 1000, MaxTokens: 200})
		if o.Status != Dispatched {
			t.Fatalf("offer %d: %+v", k, o)
		}
		_ = r.FirstToken(now, o.Handle)
		_ = r.Complete(now, o.Handle, 200)
	}
	now := at(12)
	if s := r.Snapshot(now); s.Retained.Waiting != 0 || s.Engines[2].DecodeResidents+s.Engines[3].DecodeResidents != 0 {
		t.Fatalf("want an idle fleet: %+v", s.Retained)
	}
	ps, _ := r.Price(now, Query{Splits: []Split{r.CurrentSplit(), {Prefill: []string{"p1", "p2", "d1"}, Decode: []string{"d2"}}}, StepS: 5})
	if ps[0].TPOTRatio <= 0 {
		t.Fatalf("the decode pool prices nothing of the demand: %+v", ps[0])
	}
	if ps[1].TPOTRatio <= ps[0].TPOTRatio {
		t.Errorf("one decode engine carries the demand's streams no slower than two: %v <= %v", ps[1].TPOTRatio, ps[0].TPOTRatio)
	}
}

// A waiting request's output work lands on the decode pool when its first token appears: the
// decode pool is priced at the horizon (the probe's arrival), so a backlog that will still be
// prefilling then does not crowd it. Before, a long waiting set of long prompts put every one
// of its streams on the decode pool at once: tpot_ratio +Inf for every split, and the
// controller moved prefill engines to decode in a prefill overload (narwhal sim, Mooncake
// conversation trace).
func TestPriceLandsWaitingStreamsByTheHorizon(t *testing.T) {
	cfg := config.Default()
	p := cfg.Profiles[config.DefaultProfileName]
	p.Decode.MaxKVTokens = 200_000 // ten 20,000-token requests fill a decode engine
	cfg.Profiles[config.DefaultProfileName] = p
	r := testRouter(t, cfg, "p1 prefill", "d1 decode", "d2 decode")
	for k := 0; k < 40; k++ {
		if o := r.Offer(at(0), Offer{ID: "r", PromptTokens: 16000, MaxTokens: 4000}); o.Status == Rejected {
			t.Fatalf("offer %d: %+v", k, o)
		}
	}
	if w := r.Snapshot(at(0)).Retained.Waiting; w < 30 {
		t.Fatalf("want a backlog behind the one prefill engine: %d waiting", w)
	}
	ps, _ := r.Price(at(0), Query{Splits: []Split{r.CurrentSplit()}, StepS: 5})
	if math.IsInf(ps[0].TPOTRatio, 1) {
		t.Fatalf("the backlog's streams all priced on the decode pool at once: %+v", ps[0])
	}
	if ps[0].TTFTRatio < 10 {
		t.Fatalf("the backlog is not priced on the prefill pool: %+v", ps[0])
	}
}

// The router uses an offer's first MaxPrefixBlocks prefix hashes, whoever sends it: the ext_proc
// parser hashes no more, and a longer slice (the simulator's, from a trace) is cut, so affinity
// sees what it sees behind Envoy.
func TestOfferPrefixCut(t *testing.T) {
	r := testRouter(t, config.Default(), "p prefill", "d decode")
	long := make([]uint64, 3*MaxPrefixBlocks)
	for i := range long {
		long[i] = uint64(i + 1)
	}
	r.Offer(at(0), Offer{ID: "r", PromptTokens: 8000, Prefix: long})
	if n := r.aff.lru.Len(); n != MaxPrefixBlocks {
		t.Fatalf("the affinity index holds %d blocks of one offer, want %d", n, MaxPrefixBlocks)
	}
}

// ring.all yields the handles in FIFO order, across the buffer's wrap.
func TestRingAllWraps(t *testing.T) {
	var q ring
	for h := Handle(1); h <= 12; h++ {
		q.push(h)
	}
	for range 10 {
		q.pop()
	}
	for h := Handle(13); h <= 20; h++ { // wraps past the end of the 16-slot buffer
		q.push(h)
	}
	var got []Handle
	for h := range q.all() {
		got = append(got, h)
	}
	if len(got) != q.len() || got[0] != 11 || got[len(got)-1] != 20 {
		t.Fatalf("all gave %v", got)
	}
	for i, h := range got {
		if h != q.at(i) {
			t.Fatalf("all[%d] = %d, at(%d) = %d", i, h, i, q.at(i))
		}
	}
}

// A prepared donor takes new streams only when no other decode engine has room; Prepare("")
// or a role change ends the preparation; the snapshot shows it.
func TestPrepareHoldsTheDonorOutOfDecodePlacement(t *testing.T) {
	cfg := config.Default()
	p := cfg.Profiles[config.DefaultProfileName]
	dc := *p.Decode
	dc.MaxStreams = 2
	p.Decode = &dc
	cfg.Profiles[config.DefaultProfileName] = p
	r := testRouter(t, cfg, "p1 prefill", "d1 decode", "d2 decode")
	r.Prepare("d1")
	var decodes []string
	for k := 0; k < 4; k++ {
		now := at(float64(k))
		o := r.Offer(now, Offer{ID: "r", PromptTokens: 10, MaxTokens: 10})
		if o.Status != Dispatched {
			t.Fatalf("offer %d: %+v", k, o)
		}
		decodes = append(decodes, o.Placement.Decode)
		_ = r.FirstToken(now, o.Handle)
	}
	// d2 first (d1 is prepared) until d2 is full at two streams, then d1.
	if want := []string{"d2", "d2", "d1", "d1"}; !slices.Equal(decodes, want) {
		t.Fatalf("decode placements %v, want %v", decodes, want)
	}
	if s := r.Snapshot(at(4)); !s.Engines[1].Prepared || s.Engines[2].Prepared {
		t.Fatalf("snapshot: %+v", s.Engines)
	}
	r.Prepare("")
	if s := r.Snapshot(at(4)); s.Engines[1].Prepared {
		t.Fatal(`Prepare("") left d1 prepared`)
	}
	r.Prepare("p1") // not a decode engine: nothing is prepared
	if s := r.Snapshot(at(4)); s.Engines[0].Prepared {
		t.Fatal("a prefill engine was prepared")
	}
	r.Prepare("d2")
	fl, err := fleet.New(cfg, epoch) // testRouter's engines, as configured
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.SetRole("d2", fleet.Prefill, at(5), "test"); err != nil {
		t.Fatal(err)
	}
	r.SetFleet(at(5), fl.Snapshot())
	if s := r.Snapshot(at(5)); s.Engines[2].Prepared {
		t.Fatal("d2 stayed prepared after its move to prefill")
	}
}

// The decode pool is priced at the horizon for residents too: a resident that finishes before
// it does not load the pool then. Before, every resident counted, and a decode pool whose
// streams were all about to end priced as loaded as now (narwhal sim, synthetic step: +Inf for
// a 5P/3D split the static replay runs at 100% attainment, and a move reversed at once).
func TestPriceCountsResidentsDecodingAtTheHorizon(t *testing.T) {
	r := testRouter(t, config.Default(), "p1 prefill", "d1 decode")
	for k := 0; k < 20; k++ { // 20 streams of 5 tokens: done in well under a second
		now := at(float64(k) * 0.001)
		o := r.Offer(now, Offer{ID: "short", PromptTokens: 10, MaxTokens: 5})
		_ = r.FirstToken(now, o.Handle)
	}
	long := r.Offer(at(0.05), Offer{ID: "long", PromptTokens: 10, MaxTokens: 100000})
	_ = r.FirstToken(at(0.05), long.Handle)
	now := at(130) // past the demand's horizons: nothing but the residents is priced
	if s := r.Snapshot(now); s.Engines[1].DecodeResidents != 21 {
		t.Fatalf("d1 decodes %d streams, want 21", s.Engines[1].DecodeResidents)
	}
	ps, _ := r.Price(now, Query{Splits: []Split{r.CurrentSplit()}, StepS: 5})
	// The short streams are projected done (no completion seen yet): only the long one
	// decodes at the horizon, beside the probe's stream (no demand: a probe-sized prompt).
	e := &r.engines[1]
	two := e.stepSeconds(2, 10+100000+ProbePromptTokens) / r.slo.TPOTS
	if math.Abs(ps[0].TPOTRatio-two) > 1e-9 {
		t.Fatalf("tpot_ratio %.6f, want %.6f (the long stream and the probe's decoding at the horizon)", ps[0].TPOTRatio, two)
	}
}

// An engine added to the decode pool takes every stream of a horizon of seconds, but the pool's
// step is the mean a stream gets, residents included: one engine more prices as a pool less
// loaded, not as the empty engine's step (docs/role-control.md section 3).
func TestPriceDecodeIsTheMeanAStreamGets(t *testing.T) {
	r := testRouter(t, config.Default(), "p1 prefill", "d1 decode", "d2 prefill")
	for k := range 20 { // long streams on d1, the only decode engine
		now := at(float64(k) * 0.001)
		o := r.Offer(now, Offer{ID: "long", PromptTokens: 10, MaxTokens: 8000})
		_ = r.FirstToken(now, o.Handle)
	}
	now := at(10)
	ps, _ := r.Price(now, Query{Splits: []Split{
		{Prefill: []string{"p1", "d2"}, Decode: []string{"d1"}},
		{Prefill: []string{"p1"}, Decode: []string{"d1", "d2"}},
	}, StepS: 5})
	sp := &r.pricing.splits[1]
	d1, d2 := sp.decode.streams[r.byID["d1"]], sp.decode.streams[r.byID["d2"]]
	if d1 <= d2 || d2 < 1 {
		t.Fatalf("streams at the horizon: d1 %d, d2 %d; want d1's residents and the new streams on d2", d1, d2)
	}
	e1, e2 := &r.engines[r.byID["d1"]], &r.engines[r.byID["d2"]]
	s1 := e1.stepSeconds(d1, sp.decode.kv[r.byID["d1"]])
	s2 := e2.stepSeconds(d2, sp.decode.kv[r.byID["d2"]])
	want := (float64(d1)*s1 + float64(d2)*s2) / float64(d1+d2) / r.slo.TPOTS
	if math.Abs(ps[1].TPOTRatio-want) > 1e-9 || !(s2 < s1) {
		t.Fatalf("tpot_ratio %.6f, want the stream-weighted mean %.6f of d1's step %.6f and d2's %.6f", ps[1].TPOTRatio, want, s1/r.slo.TPOTS, s2/r.slo.TPOTS)
	}
	if !(ps[1].TPOTRatio < ps[0].TPOTRatio) {
		t.Fatalf("one decode engine more prices %.6f, not under %.6f", ps[1].TPOTRatio, ps[0].TPOTRatio)
	}
}

// Snapshot's drains (one walk of the entries for every engine) are the ones drainEnd projects an
// engine at a time (freeAt's, before local prefill lets an engine prefill beside its residents).
func TestSnapshotDrainsAsFreeAt(t *testing.T) {
	r := testRouter(t, config.Default(), "p1 prefill", "p2 prefill", "d1 decode", "d2 decode")
	now := epoch
	for i := range 12 {
		now = now.Add(time.Millisecond)
		o := r.Offer(now, Offer{ID: "d", PromptTokens: 64, MaxTokens: 100 * (i + 1)})
		if o.Status == Dispatched && i%3 != 0 {
			_ = r.FirstToken(now, o.Handle)
		}
	}
	now = now.Add(50 * time.Millisecond)
	snap := r.Snapshot(now)
	tt := r.at(now)
	for i := range r.engines {
		r.engines[i].drainOK = false
	}
	for i, l := range snap.Engines {
		if want := r.drainEnd(tt, i) - tt; l.DrainS != want || (r.engines[i].streams > 0 && want <= 0) {
			t.Errorf("%s: drain_s %v, drainEnd %v (streams %d)", l.ID, l.DrainS, want, r.engines[i].streams)
		}
		if free := r.freeAt(tt, i) - tt; free > l.DrainS {
			t.Errorf("%s: free for prefill in %v, after its drain %v", l.ID, free, l.DrainS)
		}
	}
}

// TestPoissonWait holds the queueing term of the probe (docs/role-control.md section 3) to the
// M/D/1 wait of Pollaczek–Khinchine, to half the M/M/2 wait, and to its bounds.
func TestPoissonWait(t *testing.T) {
	for _, tc := range []struct {
		name      string
		c         int
		lambda, s float64
		want      float64
	}{
		{"M/D/1 at half load: ρs/2(1−ρ)", 1, 0.5, 1, 0.5},
		{"M/D/1 at 0.2", 1, 0.2, 1, 0.125},
		{"two servers at one erlang: half of C·s/(c−a) = (1/3)/1", 2, 1, 1, 1.0 / 6},
		{"no arrivals", 4, 0, 0.3, 0},
		{"no servers", 0, 3, 0.3, 0},
		{"saturated: one service", 4, 20, 0.3, 0.3},
		{"near saturation: at most one service", 1, 0.99, 1, 1},
	} {
		if got := poissonWait(tc.c, tc.lambda, tc.s); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: poissonWait(%d, %g, %g) = %g, want %g", tc.name, tc.c, tc.lambda, tc.s, got, tc.want)
		}
	}
	// More servers never wait longer, and more arrivals never wait less.
	for c := 1; c < 64; c++ {
		for l := 0.5; l < 80; l *= 1.3 {
			w := poissonWait(c, l, 0.25)
			if w2 := poissonWait(c+1, l, 0.25); w2 > w+1e-15 {
				t.Fatalf("c=%d λ=%g: %g with one more server, %g without", c, l, w2, w)
			}
			if w3 := poissonWait(c, l*1.1, 0.25); w3 < w-1e-15 {
				t.Fatalf("c=%d λ=%g: %g at 1.1λ, %g at λ", c, l, w3, w)
			}
		}
	}
}

// Pricing counts the prefill a decode engine does locally (router.local_prefill: auto,
// docs/role-control.md section 3): with the prefill engine busy for ten seconds, a request is
// priced at its own prefill on an idle decode engine, not behind that work; with local prefill
// off, behind it. An engine that switches in place (SGLang) is never a local server.
func TestPriceCountsLocalPrefill(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		sglang bool
		local  bool
	}{{config.LocalPrefillAuto, false, true}, {config.LocalPrefillOff, false, false}, {config.LocalPrefillAuto, true, false}} {
		r := testRouter(t, oneSecondPrompts(tc.mode), "p prefill", "d decode")
		if tc.sglang {
			r.engines[r.byID["d"]].inPlace = true
		}
		r.engines[r.byID["p"]].busyUntil = 10
		ps, _ := r.Price(at(0), Query{Splits: []Split{r.CurrentSplit()}, StepS: 0.5})
		if got := ps[0].ProbeTTFT < 2; got != tc.local {
			t.Errorf("%s (sglang %v): probe TTFT %.3f s; priced on the decode engine: %v, want %v", tc.mode, tc.sglang, ps[0].ProbeTTFT, got, tc.local)
		}
		// The record's local_share: an idle decode engine gives all its time but the step its
		// probe stream takes of half the TPOT SLO (in steps of 5%).
		if share := ps[0].LocalShare; (share >= 0.5 && share <= 1) != tc.local || (!tc.local && share != 0) {
			t.Errorf("%s (sglang %v): local share %.2f engines", tc.mode, tc.sglang, share)
		}
	}
}

// A local prefill server gives a request its prefill at full speed and takes the next one as
// many times later as its share of time is small: at a share of a quarter, a one-second prefill
// holds it for four.
func TestPrefillSchedHold(t *testing.T) {
	curve := &config.PrefillCurve{BaseS: 1, MaxTokens: 16384}
	var p prefillSched
	p.reset()
	p.add(curve, 1, 4, 0, 0)
	if first, second := p.schedule(100, 0), p.schedule(100, 0); first != 1 || second != 5 {
		t.Fatalf("first done at %g, second at %g; want 1 and 5", first, second)
	}
	if r := p.rate(100); math.Abs(r-0.25) > 1e-9 {
		t.Fatalf("rate %g prompts/s, want 0.25", r)
	}
}

// A prefill pool short of the priced arrivals falls behind by their difference for as long as
// the split is held (Query.SustainS): the probe waits that backlog. One engine of one-second
// prompts against 1.25 arrivals a second falls 0.25 s behind each second; held 60 s it is 15 s
// behind. Under its rate, holding it adds nothing.
func TestPriceShortfallHeld(t *testing.T) {
	for _, tc := range []struct {
		gap   float64 // seconds between arrivals
		short bool
	}{{0.8, true}, {1.25, false}} {
		r := testRouter(t, oneSecondPrompts(config.LocalPrefillOff), "p prefill", "d decode")
		offerEvery(t, r, tc.gap, int(math.Ceil(10/tc.gap))) // over the 10 s short horizon
		now := at(10)
		lambda := r.Demand(now).Priced.ArrivalsPerS
		q := Query{Splits: []Split{r.CurrentSplit()}, StepS: 5}
		alone, _ := r.Price(now, q)
		q.SustainS = 60
		held, _ := r.Price(now, q)
		backlog := held[0].QueueWaitS - alone[0].QueueWaitS
		if want := max(0, lambda-1) * 60; math.Abs(backlog-want) > 0.01 || (backlog > 0) != tc.short {
			t.Errorf("arrivals every %.2f s (%.3f/s) against one a second: held 60 s the probe waits %.2f s more, want %.2f", tc.gap, lambda, backlog, want)
		}
		if tc.short && held[0].TTFTRatio < alone[0].TTFTRatio+backlog/r.slo.TTFTS-0.01 {
			t.Errorf("the backlog is not in the TTFT ratio: %.2f held, %.2f alone", held[0].TTFTRatio, alone[0].TTFTRatio)
		}
	}
}

// Pricing gives a decode engine the local share of the steady state its demand leads to, not
// of its streams now: the output asked of it brings rate · limit streams at the limit's step
// (limit: half the 50 ms TPOT SLO), whose step leaves local prefill less. With no output asked
// (a donor whose streams only drain) its streams now are all it carries.
func TestLocalShareAtSteadyState(t *testing.T) {
	r := testRouter(t, config.Default(), "p prefill", "d decode")
	e := &r.engines[r.byID["d"]]
	for _, tc := range []struct {
		rate float64 // output tokens a second asked of it
		want float64
	}{
		{0, 0.75},     // 10 streams of 2,000 KV tokens: a step of 5.4 ms against 25 ms
		{100, 0.75},   // 2.5 streams at the limit: its 10 now carry more
		{4000, 0.45},  // 100 streams: a step of 13.5 ms
		{20000, 0.00}, // its fullest batch, 256 streams, steps 27 ms: nothing to spare
	} {
		if got := r.localShare(e, 10, 20000, tc.rate); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("asked %g tokens/s: local share %.2f, want %.2f", tc.rate, got, tc.want)
		}
	}
}

// oneSecondPrompts is the default config with a prefill curve of one second a prompt, whatever
// its size, and router.local_prefill mode.
func oneSecondPrompts(mode string) *config.Config {
	cfg := config.Default()
	cfg.Router.LocalPrefill = mode
	p := cfg.Profiles[config.DefaultProfileName]
	p.Prefill = &config.PrefillCurve{BaseS: 1, MaxTokens: 16384}
	cfg.Profiles[config.DefaultProfileName] = p
	return cfg
}

// offerEvery offers n requests of 100 prompt tokens and one output token gap seconds apart from
// the epoch, each done at once, so that they leave only the demand they make; then it resets
// the corrections their instant first tokens taught, so that pricing prices the curves.
func offerEvery(t *testing.T, r *Router, gap float64, n int) {
	t.Helper()
	for k := range n {
		o := r.Offer(at(float64(k)*gap), Offer{ID: "r", PromptTokens: 100, MaxTokens: 1})
		if o.Status != Dispatched {
			t.Fatalf("offer %d: %+v", k, o)
		}
		_ = r.FirstToken(at(float64(k)*gap), o.Handle)
		_ = r.Complete(at(float64(k)*gap), o.Handle, 1)
	}
	for i := range r.engines {
		r.engines[i].corr = [2]float64{1, 1}
	}
}
