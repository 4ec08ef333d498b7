package controller

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/narwhal-llm/narwhal/audit"
	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// TestAuditedProperty drives the controller on the real router with random configs and random
// sequences — offers, first tokens, completions, cancels, engine failures and recoveries, pins
// and unpins, time passing with every evaluation due applied to the fleet — and checks the
// resulting decision log with the auditor, which shares no code with the controller: no pin
// moved, no floor broken while capacity allowed, no dwell or cooldown broken, one move per
// regular pass or urgent wake, no move toward prefill with the window open, nothing moved in
// advisory mode, every role change made by its decision. Every move's gates all passed, and
// every urgent move improves the split's worst by more than min_gain, not only its triggering
// request's projection (docs/role-control.md section 6).
func TestAuditedProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		cfg := config.Default()
		c := &cfg.Controller
		c.Advisory = rapid.IntRange(0, 4).Draw(rt, "advisory") == 0
		c.Monitor.IntervalS = rapid.Float64Range(0.2, 1).Draw(rt, "monitor")
		c.Reactive.StepS = rapid.Float64Range(0.5, 3).Draw(rt, "step")
		c.Reactive.UrgentDelayS = c.Reactive.StepS * rapid.Float64Range(0.05, 0.9).Draw(rt, "urgent")
		c.Reactive.EvidenceSpanS = rapid.Float64Range(0.1, 3).Draw(rt, "span")
		c.Reactive.EvidenceMinArrivals = rapid.IntRange(0, 10).Draw(rt, "min_arrivals")
		c.Reactive.EvidenceMaxSpanS = c.Reactive.EvidenceSpanS + rapid.Float64Range(0, 5).Draw(rt, "max_span")
		c.Thresholds.ConfirmPasses = rapid.IntRange(1, 3).Draw(rt, "confirm")
		c.Thresholds.DwellS = rapid.Float64Range(0, 5).Draw(rt, "dwell")
		c.Thresholds.CooldownS = rapid.Float64Range(0, 5).Draw(rt, "cooldown")
		c.Thresholds.FlipResidentGuard = rapid.IntRange(0, 8).Draw(rt, "guard")
		cfg.SLO.TTFTS = rapid.Float64Range(0.05, 2).Draw(rt, "ttft")
		cfg.SLO.TPOTS = rapid.Float64Range(0.005, 0.05).Draw(rt, "tpot")
		cfg.Router.FirstTokenTimeoutS = rapid.Float64Range(0.5, 5).Draw(rt, "ftt")
		p := cfg.Profiles[config.DefaultProfileName]
		p.PrefillConcurrency = rapid.IntRange(1, 3).Draw(rt, "concurrency")
		cfg.Profiles[config.DefaultProfileName] = p
		n := rapid.IntRange(3, 6).Draw(rt, "engines")
		for i := 0; i < n; i++ {
			role := "decode"
			if i == 0 || i > 1 && rapid.Bool().Draw(rt, "prefill") {
				role = "prefill"
			}
			cfg.Engines = append(cfg.Engines, config.Engine{ID: fmt.Sprintf("e%d", i+1), Address: fmt.Sprintf("10.0.0.%d:80", i+1),
				Role: role, Profile: config.DefaultProfileName, Pinned: rapid.IntRange(0, 5).Draw(rt, "pinned") == 0})
		}
		if err := cfg.Validate(); err != nil {
			rt.Skip(err.Error())
		}
		fl, err := fleet.New(cfg, epoch)
		if err != nil {
			rt.Fatal(err)
		}
		var buf bytes.Buffer
		log := decisionlog.New(&buf, epoch, cfg, fl.Snapshot())
		fl.OnChange(log.Fleet)
		r := router.New(cfg, fl.Snapshot(), epoch)
		ctl := New(cfg, epoch)
		now := epoch
		var handles []router.Handle
		take := func() {
			var out router.Output
			if r.Take(&out); out.Urgent {
				ctl.Trigger(out.Trigger)
			}
		}
		for step := rapid.IntRange(10, 80).Draw(rt, "steps"); step > 0; step-- {
			switch op := rapid.SampledFrom([]string{"offer", "offer", "offer", "first", "complete", "cancel", "fail", "recover", "pin", "tick", "tick", "tick"}).Draw(rt, "op"); op {
			case "offer":
				o := r.Offer(now, router.Offer{ID: "r", PromptTokens: rapid.IntRange(10, 16000).Draw(rt, "tokens"), MaxTokens: rapid.IntRange(1, 3000).Draw(rt, "max")})
				if o.Handle != 0 {
					handles = append(handles, o.Handle)
				}
			case "first", "complete", "cancel":
				if len(handles) == 0 {
					continue
				}
				h := handles[rapid.IntRange(0, len(handles)-1).Draw(rt, "which")]
				switch op {
				case "first":
					_ = r.FirstToken(now, h)
				case "complete":
					_ = r.Complete(now, h, rapid.IntRange(0, 3000).Draw(rt, "out"))
				default:
					_ = r.Cancel(now, h)
				}
			case "fail", "recover", "pin":
				e := fl.Snapshot().Engines[rapid.IntRange(0, n-1).Draw(rt, "engine")]
				switch op {
				case "fail":
					_, _ = fl.SetLifecycle(e.ID, fleet.Failed, now, "test")
				case "recover":
					if _, err := fl.SetLifecycle(e.ID, fleet.Recovering, now, "test"); err == nil {
						_, _ = fl.SetLifecycle(e.ID, fleet.Active, now, "test")
					}
				default:
					_, _ = fl.SetPinned(e.ID, !e.Pinned, now, "test")
				}
				r.SetFleet(now, fl.Snapshot())
			case "tick":
				now = now.Add(time.Duration(rapid.IntRange(1, 1500).Draw(rt, "dt_ms")) * time.Millisecond)
				r.Tick(now)
				take()
				for !ctl.NextDeadline().After(now) {
					d, ok := ctl.Tick(now, fl.Snapshot(), r)
					if !ok {
						break
					}
					if d.Caller == decisionlog.CallerUrgent && (d.Outcome == decisionlog.OutcomeMoved || d.AdvisoryResult == decisionlog.WouldMove) {
						urgentImproves(rt, d, c.Thresholds.MinGain, c.Thresholds.Expand)
					}
					for _, m := range d.Moves {
						for _, g := range d.Gates {
							if !g.Passed && d.Caller != decisionlog.CallerRepair {
								rt.Fatalf("decision %d moved with gate %s failed: %s", d.Seq, g.Name, g.Detail)
							}
						}
						if _, err := fl.Move(m.Engine, m.To, now, d.Seq); err != nil {
							rt.Fatalf("decision %d: the fleet refused %v: %v", d.Seq, m, err)
						}
					}
					ctl.Applied(d)
					log.Decision(&d)
					r.SetFleet(now, fl.Snapshot())
					take()
				}
			}
			take()
		}
		if err := log.Err(); err != nil {
			rt.Fatal(err)
		}
		res, err := audit.Audit(bytes.NewReader(buf.Bytes()), nil)
		if err != nil {
			rt.Fatal(err)
		}
		for _, v := range res.Violations {
			rt.Errorf("audit: %v", v)
		}
		if len(res.Violations) > 0 {
			rt.Fatalf("log:\n%s", buf.String())
		}
	})
}

// urgentImproves fails an urgent decision that moved (or would have) to a candidate split whose
// worst is not lower than the current split's by more than gain (on two +Inf, whose overload is
// not): a gain for the triggering request at the tail is no improvement that counts.
func urgentImproves(rt *rapid.T, d decisionlog.Decision, minGain, expand float64) {
	var cur, cand *decisionlog.Priced
	for i := range d.Candidates {
		if d.Candidates[i].Current {
			cur = &d.Candidates[i]
		} else {
			cand = &d.Candidates[i]
		}
	}
	if cur == nil || cand == nil {
		rt.Fatalf("urgent decision %d moved with candidates %+v", d.Seq, d.Candidates)
	}
	// The gain that counts (docs/role-control.md section 3): min_gain, or, the prefill pool
	// under pressure, half of what one engine added to it can give when that is less.
	w, cw := float64(cand.Worst), float64(cur.Worst)
	v, cv := w, cw
	if math.IsInf(w, 1) && math.IsInf(cw, 1) {
		v, cv = float64(cand.Overload), float64(cur.Overload)
	}
	gain := minGain
	if float64(cur.TTFTRatio) >= expand {
		gain = min(minGain, cv/float64(2*cand.Prefill))
	}
	if !(v < cv-gain) {
		rt.Fatalf("urgent decision %d moved to a split priced %v (overload %v) from %v (overload %v), gain %g", d.Seq, w, cand.Overload, cw, cur.Overload, gain)
	}
}
