package router

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// TestConservationProperty drives the router with random sequences of offers, first tokens,
// completions, failures, cancels, ticks and fleet changes, and checks after every step that the
// conservation laws hold and that outcomes are well formed; at the end every request is
// finished and nothing leaks: no residents, no reserved KV, no waiting work, no slots held.
// epoch is time 0 of the router's tests (the scripts' too: internal/scripttest.Epoch).
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestConservationProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := config.Default()
		cfg.Router.WaitingSet.Capacity = rapid.IntRange(1, 8).Draw(rt, "capacity")
		cfg.Router.WaitingSet.MaxWaitS = rapid.Float64Range(0.1, 5).Draw(rt, "max_wait")
		cfg.Router.Admission.RejectRatio = rapid.SampledFrom([]float64{0, 1, 3}).Draw(rt, "reject_ratio")
		p := cfg.Profiles[config.DefaultProfileName]
		p.PrefillConcurrency = rapid.IntRange(1, 3).Draw(rt, "concurrency")
		d := *p.Decode
		d.MaxStreams = rapid.IntRange(1, 6).Draw(rt, "max_streams")
		p.Decode = &d
		cfg.Profiles[config.DefaultProfileName] = p
		n := rapid.IntRange(2, 5).Draw(rt, "engines")
		for i := 0; i < n; i++ {
			role := "decode"
			if i%2 == 0 {
				role = "prefill"
			}
			cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i), Address: fmt.Sprintf("10.0.0.%d:80", i), Role: role, Profile: config.DefaultProfileName})
		}
		f, err := fleet.New(cfg, epoch)
		if err != nil {
			rt.Fatal(err)
		}
		r := New(cfg, f.Snapshot(), epoch)
		now := epoch
		var live []Handle // handles the router may still hold
		status := map[Handle]Status{}
		subsets := map[Handle][]string{} // the subset hints of waiting requests
		inSubset := func(step string, o Outcome, hint []string) {
			dest := o.Placement.DecodeAddr // router.handoff decode, or the aggregate engine
			if hint != nil && o.Status == Dispatched && !slices.Contains(hint, dest) {
				rt.Fatalf("%s: placed on %s outside its subset hint %v", step, dest, hint)
			}
		}
		check := func(step string) {
			var out Output
			r.Take(&out)
			ejected := out.Ejections
			for _, o := range out.Outcomes {
				if o.Handle == 0 || (o.Status != Dispatched && !(o.Status == Rejected && (o.Code == WaitTimeout || o.Code == ShuttingDown))) {
					rt.Fatalf("%s: bad outbox entry %+v", step, o)
				}
				if status[o.Handle] != Waiting {
					rt.Fatalf("%s: outbox names %v, which was %v, not waiting", step, o.Handle, status[o.Handle])
				}
				inSubset(step, o, subsets[o.Handle])
				delete(subsets, o.Handle)
				status[o.Handle] = o.Status
			}
			for _, ej := range ejected { // the edge marks it failed, as serve does
				if rapid.Bool().Draw(rt, "apply_ejection") {
					_, _ = f.SetLifecycle(ej.Engine, fleet.Failed, now, "passive")
					r.SetFleet(now, f.Snapshot())
				}
			}
			s := r.Snapshot(now)
			if broken := s.Conserved(); broken != "" {
				rt.Fatalf("%s: %s: %+v", step, broken, s)
			}
			if out := r.expectedOutput(); out < 1 || out > r.maxKV {
				rt.Fatalf("%s: expected output %d outside [1, %d]", step, out, r.maxKV)
			}
		}
		// Token counts come from clients and engines: mostly plausible, sometimes absurd.
		tokens := func(label string, plausible int) int {
			return rapid.OneOf(rapid.IntRange(0, plausible), rapid.SampledFrom([]int{-1, 1 << 40, math.MaxInt, math.MaxInt32, 2_000_000})).Draw(rt, label)
		}
		steps := rapid.IntRange(1, 120).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			now = now.Add(time.Duration(rapid.IntRange(0, 400).Draw(rt, "dt_ms")) * time.Millisecond)
			pick := func() (Handle, bool) {
				if len(live) == 0 {
					return 0, false
				}
				return live[rapid.IntRange(0, len(live)-1).Draw(rt, "which")], true
			}
			op := rapid.SampledFrom([]string{"offer", "offer", "first", "complete", "fail", "upstream", "nobody", "cancel", "tick", "fleet", "shutdown"}).Draw(rt, "op")
			if op == "shutdown" && rapid.IntRange(0, 9).Draw(rt, "really") > 0 {
				op = "tick"
			}
			switch op {
			case "offer":
				var hint []string // sometimes a gateway's subset hint: a few engines' addresses
				if rapid.IntRange(0, 3).Draw(rt, "hinted") == 0 {
					hint = []string{}
					for i := range n {
						if rapid.Bool().Draw(rt, "in_subset") {
							hint = append(hint, fmt.Sprintf("10.0.0.%d:80", i))
						}
					}
				}
				o := r.Offer(now, Offer{ID: "r", PromptTokens: max(1, tokens("tokens", 20000)), MaxTokens: max(0, tokens("max", 500)), NonStreaming: rapid.Bool().Draw(rt, "nostream"), Subset: hint})
				inSubset("offer", o, hint)
				if o.Status == Waiting && hint != nil {
					subsets[o.Handle] = hint
				}
				if o.Status == Rejected {
					if o.Handle != 0 || o.Code == 0 || (o.Code.Status() == 429 || o.Code == ShuttingDown) != (o.RetryAfterS > 0) ||
						(o.Code == ContextLengthExceeded) != (o.Limit > 0 && o.Need > o.Limit) {
						rt.Fatalf("bad rejection %+v", o)
					}
				} else {
					live = append(live, o.Handle)
					status[o.Handle] = o.Status
				}
			case "shutdown":
				r.Shutdown(now)
			case "first", "complete", "fail", "upstream", "nobody", "cancel":
				h, ok := pick()
				if !ok {
					continue
				}
				switch op {
				case "first":
					_ = r.FirstToken(now, h)
				case "complete":
					_ = r.Complete(now, h, tokens("out", 300))
				case "fail":
					_ = r.Fail(now, h, FailRequest)
				case "upstream":
					_ = r.Fail(now, h, FailUpstream)
				case "nobody":
					_ = r.Fail(now, h, FailUpstreamNoBody)
				case "cancel":
					_ = r.Cancel(now, h)
				}
			case "tick":
				r.Tick(now)
			case "fleet":
				e := f.Snapshot().Engines[rapid.IntRange(0, n-1).Draw(rt, "engine")]
				switch rapid.SampledFrom([]string{"fail", "recover", "role"}).Draw(rt, "change") {
				case "fail":
					_, _ = f.SetLifecycle(e.ID, fleet.Failed, now, "t")
				case "recover":
					if _, err := f.SetLifecycle(e.ID, fleet.Recovering, now, "t"); err == nil {
						_, _ = f.SetLifecycle(e.ID, fleet.Active, now, "t")
					}
				case "role":
					_, _ = f.SetRole(e.ID, 3-e.Role, now, "t")
				}
				r.SetFleet(now, f.Snapshot())
			}
			check(op)
		}
		// Finish everything: cancel what is held, then nothing may remain.
		for _, h := range live {
			_ = r.Cancel(now, h)
			check("drain")
		}
		s := r.Snapshot(now)
		if s.Retained.Waiting+s.Retained.Prefilling+s.Retained.Decoding != 0 || s.Retained.WaitingTokens != 0 || s.Retained.AwaitingOutputTokens != 0 {
			rt.Fatalf("leaked: %+v", s.Retained)
		}
		for i := range r.engines {
			e := &r.engines[i]
			if e.prefilling != 0 || e.streams != 0 || e.decoding != 0 || e.kv != 0 || e.queued != 0 || math.Abs(e.waitWork) > 1e-9 {
				rt.Fatalf("engine %s leaked: %+v", e.id, *e)
			}
		}
		if len(r.free) != len(r.slots) {
			rt.Fatalf("%d of %d slots still held", len(r.slots)-len(r.free), len(r.slots))
		}
		// Past the long demand horizon every sample has left: the retained demand is zero.
		now = now.Add(config.Seconds(cfg.Router.Demand.LongHorizonS + 1))
		r.Tick(now)
		if s := r.Snapshot(now); s.Retained != (Retained{}) || s.Demand != (Demand{}) {
			rt.Fatalf("retained demand after the long horizon: %+v %+v", s.Retained, s.Demand)
		}
	})
}
