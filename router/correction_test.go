package router

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// event is one thing the FIFO engine model does at a time: a request's first token, or its end.
type event struct {
	at    float64
	h     Handle
	first bool
}

type events []event

func (q events) Len() int           { return len(q) }
func (q events) Less(i, j int) bool { return q[i].at < q[j].at }
func (q events) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)        { *q = append(*q, x.(event)) }
func (q *events) Pop() any          { old := *q; x := old[len(old)-1]; *q = old[:len(old)-1]; return x }

// Issue 8: under load the prefill correction compares like with like — the prefill from when
// the engine was free of the prefill before it, not from dispatch — so a FIFO engine whose true
// speed is 0.5, 1 or 2 times its profile at 87% utilisation settles within 10% of the truth.
// (Before, the queueing on the engine counted as prefill: a true 0.5 settled near 0.38.)
func TestCorrectionUnderLoad(t *testing.T) {
	for _, truth := range []float64{0.5, 1, 2} {
		t.Run(fmt.Sprint(truth), func(t *testing.T) {
			cfg := config.Default()
			r := testRouter(t, cfg, "p prefill", "d decode")
			prof := cfg.Profiles[config.DefaultProfileName]
			const prompt = 2000
			service := truth * prof.Prefill.Seconds(prompt) // the engine's true prefill time
			rate := 0.87 / service
			rng := rand.New(rand.NewPCG(1, uint64(truth*10)))

			var q events
			free := 0.0 // the FIFO engine is free of earlier prefills at this time
			dispatched := func(now float64, h Handle) {
				start := max(now, free)
				free = start + service
				d := &r.engines[1]
				first := free + prof.KVTransferS + prof.Decode.StepSeconds(d.streams, int(d.kv))
				heap.Push(&q, event{at: first, h: h, first: true})
			}
			drain := func(now float64) {
				var out Output
				r.Take(&out)
				for _, o := range out.Outcomes {
					if o.Status == Dispatched {
						dispatched(now, o.Handle)
					}
				}
			}
			next := 0.0
			for n := 0; n < 4000 || q.Len() > 0; {
				if n < 4000 && (q.Len() == 0 || next < q[0].at) {
					o := r.Offer(at(next), Offer{ID: "r", PromptTokens: prompt, MaxTokens: 1})
					switch o.Status {
					case Dispatched:
						dispatched(next, o.Handle)
					case Rejected:
						t.Fatalf("rejected at %.2f: %+v", next, o)
					}
					n++
					next += rng.ExpFloat64() / rate
					continue
				}
				ev := heap.Pop(&q).(event)
				if ev.first {
					if err := r.FirstToken(at(ev.at), ev.h); err != nil {
						t.Fatal(err)
					}
					heap.Push(&q, event{at: ev.at + 0.001, h: ev.h})
				} else if err := r.Complete(at(ev.at), ev.h, 1); err != nil {
					t.Fatal(err)
				}
				drain(ev.at)
			}
			if got := r.engines[0].corr[0]; math.Abs(got-truth)/truth > 0.10 {
				t.Fatalf("prefill correction %.3f for a true factor %.1f at 87%% utilisation", got, truth)
			}
		})
	}
}

// Issue 36: a handed-off request joins its decode engine's batch at the next step boundary,
// half a step on average after its KV lands, and its first token comes a step later; the
// handoff prices that one step. The wait for the boundary is not prefill: on an idle prefill
// engine (no queue to take turns with) feeding a decode engine whose step is most of a prompt's
// prefill, the factor averages within 5% of the true 1 (counted as prefill, 1.25 here).
func TestCorrectionStepAlignment(t *testing.T) {
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff
	r := testRouter(t, cfg, "p prefill", "d decode")
	prof := cfg.Profiles[config.DefaultProfileName]
	rng := rand.New(rand.NewPCG(36, 1))
	sum, n := 0.0, 0
	for i := range 240 {
		now := float64(i)*0.25 + 0.1*rng.Float64() // an idle engine: the prefill is done long before the next
		o := r.Offer(at(now), Offer{ID: "r", PromptTokens: 1024, MaxTokens: 1000})
		if o.Status != Dispatched || o.Placement.Kind != Disaggregated {
			t.Fatalf("request %d: %+v", i, o)
		}
		d := &r.engines[1]
		step := prof.Decode.StepSeconds(d.streams, int(d.kv))
		landed := now + prof.Prefill.Seconds(1024) + prof.KVTransferS
		first := (math.Floor(landed/step) + 2) * step // the boundary after it, then one step
		if err := r.FirstToken(at(first), o.Handle); err != nil {
			t.Fatal(err)
		}
		if i >= 60 { // the decode batch built up (one stream more each): steps of tens of ms
			sum, n = sum+r.engines[0].corr[0], n+1
		}
	}
	if mean := sum / float64(n); math.Abs(mean-1) > 0.05 {
		t.Fatalf("mean prefill factor %.3f for a true 1 (decode step at the end %.1f ms, prefill %.1f ms)", mean,
			1000*prof.Decode.StepSeconds(r.engines[1].streams, int(r.engines[1].kv)), 1000*prof.Prefill.Seconds(1024))
	}
}

// Issue 36: a first token its decode engine gave from a step widened by a local prefill's chunk
// is no prefill sample: while the decode engine's local work runs, a handed-off request leaves
// the prefill engine's factor and sample count as they were; after it, it counts.
func TestCorrectionSkipsLocalChunks(t *testing.T) {
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff
	r := testRouter(t, cfg, "p prefill", "d decode")
	r.engines[1].localUntil = 5 // d prefills locally until 5 s
	for i, now := range []float64{1, 6} {
		o := r.Offer(at(now), Offer{ID: "r", PromptTokens: 1024, MaxTokens: 10})
		if o.Status != Dispatched {
			t.Fatalf("at %v s: %+v", now, o)
		}
		if err := r.FirstToken(at(now+0.5), o.Handle); err != nil { // slow: a widened step
			t.Fatal(err)
		}
		if got := r.engines[0].samples[0]; got != i {
			t.Fatalf("after the first token at %v s: %d prefill samples, want %d", now+0.5, got, i)
		}
	}
	if c := r.engines[0].corr[0]; c <= 1 {
		t.Fatalf("the sample after the local work left the factor at %.3f", c)
	}
}

// Issue 8: a factor that keeps its engine from getting traffic cannot starve it for long:
// without samples it decays toward 1 (halfway every correctionHalfLifeS), and the engine takes
// placements again once it prices below the loaded one.
func TestCorrectionDecaysWithoutSamples(t *testing.T) {
	r := testRouter(t, config.Default(), "p prefill", "d1 decode", "d2 decode")
	r.engines[1].corr[1] = maxCorrection // a few slow early samples drove d1 to the bound
	first := -1.0
	for s := 0.0; s < 600; s++ { // one long request a second; each stays decoding
		o := r.Offer(at(s), Offer{ID: "r", PromptTokens: 100, MaxTokens: 2000})
		if o.Status != Dispatched {
			t.Fatalf("at %v s: %+v", s, o)
		}
		_ = r.FirstToken(at(s), o.Handle)
		if o.Placement.Decode == "d1" {
			first = s
			break
		}
	}
	if first < 0 || first > 5*correctionHalfLifeS {
		t.Fatalf("d1 took its first placement at %v s; want within %v s", first, 5*correctionHalfLifeS)
	}
	if c, want := r.engines[1].corr[1], 1+(maxCorrection-1)*math.Exp2(-first/correctionHalfLifeS); math.Abs(c-want) > 0.01*want {
		t.Fatalf("d1's factor %.3f after %v s without samples, want %.3f", c, first, want)
	}
}

// testRouter builds a router over engines given as "id role", on the default profile.
func testRouter(t *testing.T, cfg *config.Config, engines ...string) *Router {
	t.Helper()
	for i, e := range engines {
		f := strings.Fields(e)
		cfg.Engines = append(cfg.Engines, config.Engine{ID: f[0], Address: fmt.Sprintf("10.0.0.%d:80", i+1), Role: f[1], Profile: config.DefaultProfileName})
	}
	fl, err := fleet.New(cfg, epoch)
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, fl.Snapshot(), epoch)
}

// at is a time seconds after the test epoch.
func at(s float64) time.Time { return epoch.Add(time.Duration(s * float64(time.Second))) }
