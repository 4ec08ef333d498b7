package router_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/scripttest"
	"github.com/narwhal-llm/narwhal/router"
)

// driver runs router scripts in virtual time (router/testdata/scripts, cockroachdb/datadriven):
//
//	init [capacity=N] [max_wait=S] [reject_ratio=X] [concurrency=N] [affinity=BOOL] [ttft=S]
//	e1 prefill            (one engine per line: id role [pinned])
//	offer id=r1 tokens=N [max=N] [at=S] [prefix=a,b,c] [subset=e1,e2|-]
//	first id=r1 [at=S]      complete id=r1 [tokens=N] [at=S]
//	fail id=r1 [at=S]       cancel id=r1 [at=S]       tick at=S
//	lifecycle id=e1 to=failed|draining|recovering|active [sight=unconfirmed|blind] [at=S]
//	role id=e3 to=prefill [at=S]
//	add id=e4 role=prefill|decode|open [at=S]   (joins recovering: bring it up with lifecycle)
//	remove id=e3 [at=S]
//	state
//	price prefill=e1,e2 decode=e3 [step=S] [at=S]
//	pass [prompt] [subset=e1,e2] [at=S]   (a request outside router.paths: the engine PassThrough picks)
//	observe id=e1 [running=N] [waiting=N] [kv=X] [finished=N] [prompts=N] [none] [at=S]
//	                        (the engine's metrics; none: they could not be read)
//
// Every command prints its result, then what the router put in its outbox, and the driver
// fails the test if a conservation law breaks.
type driver struct {
	scripttest.Driver // time, requests and fleet changes (the commands shared with the controller's scripts)
	t                 testing.TB
	cfg               *config.Config
}

func (d *driver) run(t *testing.T, td *datadriven.TestData) string {
	var b strings.Builder
	switch td.Cmd {
	case "init":
		d.init(td)
	case "tick":
		d.Router.Tick(d.At(td))
	case "shutdown":
		d.Router.Shutdown(d.At(td))
	case "state":
		d.state(&b)
	case "price":
		var pre, dec string
		step := 5.0
		td.ScanArgs(t, "prefill", &pre)
		td.ScanArgs(t, "decode", &dec)
		td.MaybeScanArgs(t, "step", &step)
		split := router.Split{Prefill: splitIDs(pre), Decode: splitIDs(dec)}
		ps, _ := d.Router.Price(d.At(td), router.Query{Splits: []router.Split{split}, StepS: step})
		p := ps[0]
		fmt.Fprintf(&b, "ttft_ratio=%.3f tpot_ratio=%.3f worst=%.3f probe_ttft=%.3f\n", p.TTFTRatio, p.TPOTRatio, p.Worst, p.ProbeTTFT)
	case "observe":
		d.observe(td, &b)
	case "pass":
		kind := router.PassAny
		if td.HasArg("prompt") {
			kind = router.PassPrompt
		}
		addr, ok := d.Router.PassThrough(d.At(td), kind, d.Subset(td))
		fmt.Fprintf(&b, "passed to %s (%t)\n", d.idOf(addr), ok)
	default:
		if !d.Run(td, &b) {
			t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
		}
	}
	d.Output(&b)
	snap := d.Router.Snapshot(d.Now)
	if broken := snap.Conserved(); broken != "" {
		t.Fatalf("%s: conservation broken: %s\n%+v", td.Pos, broken, snap)
	}
	if b.Len() == 0 {
		return "ok\n"
	}
	return b.String()
}

func (d *driver) init(td *datadriven.TestData) {
	cfg := config.Default()
	// Scripts are disaggregated and unchunked unless they say (local=..., budget=...): each
	// tests one behaviour.
	cfg.Router.LocalPrefill = config.LocalPrefillOff
	p := cfg.Profiles[config.DefaultProfileName]
	p.ChunkedPrefill.BudgetTokens = 0
	cfg.Profiles[config.DefaultProfileName] = p
	for _, a := range td.CmdArgs {
		v := a.Vals[0]
		f, _ := strconv.ParseFloat(v, 64)
		switch a.Key {
		case "capacity":
			cfg.Router.WaitingSet.Capacity = int(f)
		case "max_wait":
			cfg.Router.WaitingSet.MaxWaitS = f
		case "reject_ratio":
			cfg.Router.Admission.RejectRatio = f
		case "ttft":
			cfg.SLO.TTFTS = f
		case "concurrency":
			p := cfg.Profiles[config.DefaultProfileName]
			p.PrefillConcurrency = int(f)
			cfg.Profiles[config.DefaultProfileName] = p
		case "affinity":
			cfg.Router.PrefixAffinity.Enabled = v == "true"
		case "max_streams":
			p := cfg.Profiles[config.DefaultProfileName]
			dc := *p.Decode
			dc.MaxStreams = int(f)
			p.Decode = &dc
			cfg.Profiles[config.DefaultProfileName] = p
		case "first_token_timeout":
			cfg.Router.FirstTokenTimeoutS = f
		case "passive":
			cfg.Health.Passive.ConsecutiveFailures = int(f)
		case "handoff":
			cfg.Router.Handoff = v
		case "tpot":
			cfg.SLO.TPOTS = f
		case "local":
			cfg.Router.LocalPrefill = v
		case "local_max":
			cfg.Router.LocalPrefillMaxTokens = int(f)
		case "budget":
			p := cfg.Profiles[config.DefaultProfileName]
			p.ChunkedPrefill.BudgetTokens = int(f)
			cfg.Profiles[config.DefaultProfileName] = p
		case "max_kv":
			p := cfg.Profiles[config.DefaultProfileName]
			dc := *p.Decode
			dc.MaxKVTokens = int(f)
			p.Decode = &dc
			cfg.Profiles[config.DefaultProfileName] = p
		default:
			d.t.Fatalf("%s: unknown init argument %s", td.Pos, a.Key)
		}
	}
	for i, line := range strings.Split(strings.TrimSpace(td.Input), "\n") {
		fields := strings.Fields(line)
		cfg.Engines = append(cfg.Engines, config.Engine{
			ID: fields[0], Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Role: fields[1],
			Profile: config.DefaultProfileName, Pinned: slices.Contains(fields[2:], "pinned"), Switch: config.SwitchRouting,
		})
		if slices.Contains(fields[2:], "sglang") {
			cfg.Engines[i].Switch = config.SwitchSGLang
		}
	}
	f, err := fleet.New(cfg, scripttest.Epoch)
	if err != nil {
		d.t.Fatal(err)
	}
	d.cfg = cfg
	d.Start(d.t, f, router.New(cfg, f.Snapshot(), scripttest.Epoch))
}

func (d *driver) state(b *strings.Builder) {
	s := d.Router.Snapshot(d.Now)
	c := s.Counters
	fmt.Fprintf(b, "offers=%d invalid=%d admitted=%d overflow=%+v\n", c.Offers, c.Invalid, c.Admitted, c.Overflow)
	fmt.Fprintf(b, "dispatched=%+v completed=%d failed=%d cancelled=%+v first_token_timeouts=%d\n",
		c.Dispatched, c.Completed, c.Failed, c.Cancelled, c.FirstTokenTimeouts)
	if c.ContextLengthExceeded+c.Ejections > 0 {
		fmt.Fprintf(b, "context_length_exceeded=%d ejections=%d\n", c.ContextLengthExceeded, c.Ejections)
	}
	if c.PassedThrough > 0 {
		fmt.Fprintf(b, "passed_through=%d\n", c.PassedThrough)
	}
	fmt.Fprintf(b, "retained=%+v\n", s.Retained)
	for _, e := range s.Engines {
		fmt.Fprintf(b, "%s: prefill=%d decode=%d busy=%.3f corr=%.3f/%.3f", e.ID, e.PrefillResidents, e.DecodeResidents, e.BusyUntilS, e.Correction.Prefill, e.Correction.Decode)
		if e.ReservedStreams > 0 {
			fmt.Fprintf(b, " reserved=%d", e.ReservedStreams)
		}
		if e.Fallback {
			b.WriteString(" fallback")
		}
		if p := e.Passive; p.ConsecutiveFailures > 0 || p.Ejected {
			fmt.Fprintf(b, " upstream_failures=%d ejected=%t", p.ConsecutiveFailures, p.Ejected)
		}
		if e.Observed != nil {
			b.WriteString(" ")
			writeObserved(b, *e.Observed)
		}
		b.WriteString("\n")
	}
}

// idOf is the engine at addr ("-" for none).
func (d *driver) idOf(addr string) string {
	for _, e := range d.cfg.Engines {
		if e.Address == addr {
			return e.ID
		}
	}
	return "-"
}

func (d *driver) observe(td *datadriven.TestData, b *strings.Builder) {
	var id string
	td.ScanArgs(d.t, "id", &id)
	var o *router.Observation
	if !td.HasArg("none") {
		o = &router.Observation{}
		var finished, prompts int
		td.MaybeScanArgs(d.t, "running", &o.Running)
		td.MaybeScanArgs(d.t, "waiting", &o.Waiting)
		if td.HasArg("kv") {
			td.ScanArgs(d.t, "kv", &o.KVUsage)
			o.HasKVUsage = true
		}
		if td.HasArg("finished") {
			td.ScanArgs(d.t, "finished", &finished)
			o.Finished = float64(finished)
		}
		if td.HasArg("prompts") {
			td.ScanArgs(d.t, "prompts", &prompts)
			o.PromptTokens, o.HasPromptTokens = float64(prompts), true
		}
	}
	got, ok := d.Router.Observe(d.At(td), id, o)
	switch {
	case !ok:
		b.WriteString("unknown engine\n")
		return
	case o == nil:
		b.WriteString("not observed\n")
		return
	}
	writeObserved(b, got)
	b.WriteString("\n")
}

func writeObserved(b *strings.Builder, o router.Observed) {
	fmt.Fprintf(b, "observed running=%g waiting=%g foreign=%d foreign_prefill=%.3f", o.Running, o.Waiting, o.Foreign, o.ForeignPrefillS)
	if o.UnservedLegs > 0 {
		fmt.Fprintf(b, " unserved_legs=%d", o.UnservedLegs)
	}
	if o.NoHandoff {
		b.WriteString(" no_handoff")
	}
}

func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/scripts", func(t *testing.T, path string) {
		d := &driver{t: t}
		datadriven.RunTest(t, path, d.run)
	})
}

func splitIDs(s string) []string {
	if s == "-" {
		return nil
	}
	return strings.Split(s, ",")
}
