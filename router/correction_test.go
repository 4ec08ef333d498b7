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
