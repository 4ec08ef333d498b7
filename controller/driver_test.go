package controller

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/narwhal-llm/narwhal/audit"
	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/scripttest"
	"github.com/narwhal-llm/narwhal/router"
)

// driver runs the real router and the controller in virtual time, as the live wrapper will:
// offers raise urgent triggers for the controller; tick applies time to the router, runs every
// evaluation due and applies its moves to the fleet and the router. The commands it shares with
// the router's scripts (offer, first, complete, fail, cancel, lifecycle, role, add, remove; time
// never going back) are internal/scripttest's; its own:
//
//	init [key=value ...]        config tweaks; input: one engine a line, "id role [pinned] [sglang]"
//	                            (sglang: it switches role in place)
//	tick at=.. [verbose] [refuse] prints every decision: outcome, reason, moves; verbose adds
//	                            candidates and gates; refuse: the edge makes none of its moves
//	role id=.. to=.. [at=..]      a role change made outside the controller (the log is not
//	                              audited then)
//	switch id=.. result=.. [at=..] an in-place switch's next step: asked, succeeded, failed or
//	                              abandoned (as the Switcher records them)
//	state                       the guards an acknowledged move sets
type driver struct {
	scripttest.Driver // time, requests and fleet changes (the commands shared with the router's scripts)
	t                 *testing.T
	log               *decisionlog.Log
	buf               *bytes.Buffer
	external          bool // a role change outside the controller: the log is not the controller's alone
	cfg               *config.Config
	c                 *Controller
}

// epoch is time 0 of the controller's tests.
var epoch = scripttest.Epoch

func (d *driver) run(t *testing.T, td *datadriven.TestData) string {
	var b strings.Builder
	switch td.Cmd {
	case "init":
		d.init(td)
	case "tick":
		now := d.At(td)
		d.Router.Tick(now)
		d.drain(&b)
		d.evaluate(now, td.HasArg("verbose"), td.HasArg("refuse"), &b)
	case "state": // the guards an acknowledged move sets
		last := "none"
		if !math.IsInf(d.c.lastToDecode, -1) {
			last = fmt.Sprintf("%.3f", d.c.lastToDecode)
		}
		fmt.Fprintf(&b, "last_to_decode=%s window opened_at=%.3f closed=%t confirmations=%+v\n", last, d.c.win.openedAt, d.c.win.closed, d.c.conf)
	case "role": // an operator's or another controller's move
		d.external = true
		d.Run(td, &b)
	case "switch":
		var id, result string
		td.ScanArgs(t, "id", &id)
		td.ScanArgs(t, "result", &result)
		now := d.At(td)
		var err error
		if result == string(fleet.SwitchAsked) {
			_, err = d.Fleet.AskSwitch(id, now, "test")
		} else {
			_, err = d.Fleet.FinishSwitch(id, fleet.SwitchResult(result), now, "test")
		}
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
		}
		e, _ := d.Fleet.Engine(id)
		fmt.Fprintf(&b, "%s: %s %s\n", id, e.Role, e.Lifecycle)
		d.Router.SetFleet(now, d.Fleet.Snapshot())
	default:
		if !d.Run(td, &b) {
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		}
	}
	d.drain(&b)
	if b.Len() == 0 {
		return "ok\n"
	}
	return b.String()
}

// drain prints the router's output and hands its trigger to the controller.
func (d *driver) drain(b *strings.Builder) {
	if out := d.Output(b); out.Urgent {
		d.c.Trigger(out.Trigger)
	}
}

// evaluate runs every evaluation due at now and applies its moves, as the live wrapper does;
// with refuse the edge applies none (as when Live cannot persist them).
func (d *driver) evaluate(now time.Time, verbose, refuse bool, b *strings.Builder) {
	for !d.c.NextDeadline().After(now) {
		dec, ok := d.c.Tick(now, d.Fleet.Snapshot(), d.Router)
		if !ok {
			return
		}
		fmt.Fprintf(b, "decision %d %s %s: %s\n", dec.Seq, dec.Caller, dec.Outcome, dec.Reason)
		if dec.AdvisoryResult != "" {
			fmt.Fprintf(b, "  advisory_result: %s\n", dec.AdvisoryResult)
		}
		if verbose {
			for _, c := range dec.Candidates {
				fmt.Fprintf(b, "  candidate %d/%d ttft=%s tpot=%s worst=%s", c.Prefill, c.Decode, ratio(float64(c.TTFTRatio)), ratio(float64(c.TPOTRatio)), ratio(float64(c.Worst)))
				if c.Move != "" {
					fmt.Fprintf(b, " move=%s", c.Move)
				}
				if c.RequestTTFTS != nil {
					fmt.Fprintf(b, " request_ttft=%.3f", float64(*c.RequestTTFTS))
				}
				if c.Draining {
					fmt.Fprintf(b, " draining drain_s=%.3f", *c.DrainS)
				}
				if c.InPlaceWorst != nil {
					fmt.Fprintf(b, " in_place_worst=%s", ratio(float64(*c.InPlaceWorst)))
				}
				if c.Current {
					b.WriteString(" (current)")
				}
				b.WriteString("\n")
			}
			for _, g := range dec.Gates {
				mark := "ok"
				if !g.Passed {
					mark = "FAILED"
				}
				fmt.Fprintf(b, "  gate %s %s: %s\n", g.Name, mark, g.Detail)
			}
		}
		if refuse && len(dec.Moves) > 0 {
			dec = Settled(dec, Ack{NotApplied: "refused by the test's edge"})
			fmt.Fprintf(b, "  refused: %s %s\n", dec.Outcome, dec.Reason[strings.LastIndex(dec.Reason, "; ")+2:])
		}
		moves := len(dec.Moves)
		dec = Settled(dec, ApplyDecision(d.Fleet, d.Router, dec, now, nil)) // as Live and the simulator apply it
		d.c.Applied(dec)
		if len(dec.Moves) != moves {
			d.t.Fatalf("the fleet refused a move of decision %d: %s", dec.Seq, dec.Reason)
		}
		for _, m := range dec.Moves {
			fmt.Fprintf(b, "  move %s %s -> %s (%s)\n", m.Engine, m.From, m.To, dec.Switch)
		}
		d.log.Decision(&dec) // after its moves' fleet events, as Live logs it
		d.Router.SetFleet(now, d.Fleet.Snapshot())
	}
}

func (d *driver) init(td *datadriven.TestData) {
	cfg := config.Default()
	cfg.Router.LocalPrefill = config.LocalPrefillOff // the scripts' splits carry what they say
	th, re := &cfg.Controller.Thresholds, &cfg.Controller.Reactive
	prof := cfg.Profiles[config.DefaultProfileName]
	dc := *prof.Decode
	for _, a := range td.CmdArgs {
		v := a.Vals[0]
		f, _ := strconv.ParseFloat(v, 64)
		switch a.Key {
		case "step":
			re.StepS = f
		case "urgent_delay":
			re.UrgentDelayS = f
		case "span":
			re.EvidenceSpanS = f
		case "min_arrivals":
			re.EvidenceMinArrivals = int(f)
		case "max_span":
			re.EvidenceMaxSpanS = f
		case "expand":
			th.Expand = f
		case "shrink":
			th.Shrink = f
		case "confirm":
			th.ConfirmPasses = int(f)
		case "dwell":
			th.DwellS = f
		case "cooldown":
			th.CooldownS = f
		case "guard":
			th.FlipResidentGuard = int(f)
		case "advisory":
			cfg.Controller.Advisory = v == "true"
		case "min_decode":
			cfg.Controller.MinDecode = int(f)
		case "min_prefill":
			cfg.Controller.MinPrefill = int(f)
		case "ttft":
			cfg.SLO.TTFTS = f
		case "tpot":
			cfg.SLO.TPOTS = f
		case "first_token_timeout":
			cfg.Router.FirstTokenTimeoutS = f
		case "concurrency":
			prof.PrefillConcurrency = int(f)
		case "max_streams":
			dc.MaxStreams = int(f)
		default:
			d.t.Fatalf("%s: unknown init argument %s", td.Pos, a.Key)
		}
	}
	prof.Decode = &dc
	cfg.Profiles[config.DefaultProfileName] = prof
	cfg.Router.WaitingSet.MaxWaitS = 600
	for i, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		f := strings.Fields(line)
		ce := config.Engine{ID: f[0], Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: f[1], Profile: config.DefaultProfileName}
		for _, flag := range f[2:] {
			ce.Pinned = ce.Pinned || flag == "pinned"
			if flag == "sglang" {
				ce.Switch = config.SwitchSGLang
			}
		}
		cfg.Engines = append(cfg.Engines, ce)
	}
	if err := cfg.Validate(); err != nil {
		d.t.Fatal(err)
	}
	fl, err := fleet.New(cfg, epoch)
	if err != nil {
		d.t.Fatal(err)
	}
	d.audit()
	d.buf, d.external = &bytes.Buffer{}, false
	d.log = decisionlog.New(d.buf, epoch, cfg, fl.Snapshot())
	fl.OnChange(d.log.Fleet)
	d.cfg = cfg
	d.Start(d.t, fl, router.New(cfg, fl.Snapshot(), epoch))
	d.c = New(cfg, epoch)
}

// audit checks the decision log of the scenario that ran: the auditor finds nothing in any
// controller test's log (unless the scenario moved engines behind the controller's back).
func (d *driver) audit() {
	if d.buf == nil || d.external {
		return
	}
	res, err := audit.Audit(bytes.NewReader(d.buf.Bytes()), nil)
	if err != nil {
		d.t.Fatalf("audit: %v\n%s", err, d.buf)
	}
	for _, v := range res.Violations {
		d.t.Errorf("audit: %v", v)
	}
}

// TestDataDriven runs the scenario scripts (the gate scripts of testdata/gates.d run under
// their own names, in gates_test.go).
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if strings.Contains(path, "gates.d") {
			t.Skip("run by TestGate_*")
		}
		runScript(t, path)
	})
}

// runScript runs one script through the driver and audits its decision log.
func runScript(t *testing.T, path string) {
	d := &driver{t: t}
	datadriven.RunTest(t, path, d.run)
	d.audit()
}
