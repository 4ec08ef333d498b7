package router

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// driver runs router scripts in virtual time (router/testdata/scripts, cockroachdb/datadriven):
//
//	init [capacity=N] [max_wait=S] [reject_ratio=X] [concurrency=N] [affinity=BOOL] [ttft=S]
//	e1 prefill            (one engine per line: id role [pinned])
//	offer id=r1 tokens=N [max=N] [at=S] [prefix=a,b,c]
//	first id=r1 [at=S]      complete id=r1 [tokens=N] [at=S]
//	fail id=r1 [at=S]       cancel id=r1 [at=S]       tick at=S
//	lifecycle id=e1 to=failed|draining|recovering|active [at=S]
//	role id=e3 to=prefill [at=S]
//	add id=e4 role=prefill|decode|open [at=S]   (joins recovering: bring it up with lifecycle)
//	remove id=e3 [at=S]
//	state
//	price prefill=e1,e2 decode=e3 [step=S] [at=S]
//
// Every command prints its result, then what the router put in its outbox, and the driver
// fails the test if a conservation law breaks.
type driver struct {
	t       testing.TB
	cfg     *config.Config
	fleet   *fleet.Fleet
	r       *Router
	now     time.Time
	handles map[string]Handle
	names   map[Handle]string
	prefix  map[string]uint64
	added   int // engines added (their addresses)
}

func newDriver(t testing.TB) *driver {
	return &driver{t: t, handles: map[string]Handle{}, names: map[Handle]string{}, prefix: map[string]uint64{}}
}

func (d *driver) at(td *datadriven.TestData) time.Time {
	if td.HasArg("at") {
		var s float64
		td.ScanArgs(d.t, "at", &s)
		at := epoch.Add(time.Duration(s * float64(time.Second)))
		if at.Before(d.now) {
			d.t.Fatalf("%s: time goes back to %vs", td.Pos, s)
		}
		d.now = at
	}
	return d.now
}

func (d *driver) handle(td *datadriven.TestData) Handle {
	var id string
	td.ScanArgs(d.t, "id", &id)
	h, ok := d.handles[id]
	if !ok {
		d.t.Fatalf("%s: no request %s", td.Pos, id)
	}
	return h
}

func (d *driver) run(t *testing.T, td *datadriven.TestData) string {
	var b strings.Builder
	switch td.Cmd {
	case "init":
		d.init(td)
	case "offer":
		d.offer(td, &b)
	case "first", "complete", "fail", "cancel":
		now, h := d.at(td), d.handle(td)
		var err error
		switch td.Cmd {
		case "first":
			err = d.r.FirstToken(now, h)
		case "complete":
			n := 0
			td.MaybeScanArgs(t, "tokens", &n)
			err = d.r.Complete(now, h, n)
		case "fail":
			why := FailRequest
			if td.HasArg("upstream") {
				why = FailUpstream
			}
			err = d.r.Fail(now, h, why)
		case "cancel":
			err = d.r.Cancel(now, h)
		}
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
		}
	case "tick":
		d.r.Tick(d.at(td))
	case "shutdown":
		d.r.Shutdown(d.at(td))
	case "lifecycle", "role", "add", "remove":
		d.fleetChange(td, &b)
	case "state":
		d.state(&b)
	case "price":
		var pre, dec string
		step := 5.0
		td.ScanArgs(t, "prefill", &pre)
		td.ScanArgs(t, "decode", &dec)
		td.MaybeScanArgs(t, "step", &step)
		split := Split{Prefill: splitIDs(pre), Decode: splitIDs(dec)}
		ps, _ := d.r.Price(d.at(td), Query{Splits: []Split{split}, StepS: step})
		p := ps[0]
		fmt.Fprintf(&b, "ttft_ratio=%.3f tpot_ratio=%.3f worst=%.3f probe_ttft=%.3f\n", p.TTFTRatio, p.TPOTRatio, p.Worst, p.ProbeTTFT)
	default:
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	out := d.r.Ready()
	for _, o := range out.Outcomes {
		b.WriteString(d.outcome(d.names[o.Handle], o))
	}
	for _, e := range out.Ejections {
		fmt.Fprintf(&b, "ejected: %s after %d upstream failures\n", e.Engine, e.Failures)
	}
	if out.Urgent {
		fmt.Fprintf(&b, "urgent: %s projected_ttft=%.3f\n", out.Trigger.Request, out.Trigger.ProjectedTTFT)
	}
	d.r.Advance()
	snap := d.r.Snapshot(d.now)
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
			Profile: config.DefaultProfileName, Pinned: len(fields) > 2 && fields[2] == "pinned",
		})
	}
	f, err := fleet.New(cfg, epoch)
	if err != nil {
		d.t.Fatal(err)
	}
	d.cfg, d.fleet, d.now = cfg, f, epoch
	d.r = New(cfg, f.Snapshot(), epoch)
}

func (d *driver) offer(td *datadriven.TestData, b *strings.Builder) {
	var id string
	o := Offer{}
	td.ScanArgs(d.t, "id", &id)
	td.ScanArgs(d.t, "tokens", &o.PromptTokens)
	td.MaybeScanArgs(d.t, "max", &o.MaxTokens)
	o.NonStreaming = td.HasArg("nostream")
	o.ID = id
	if td.HasArg("prefix") {
		var p string
		td.ScanArgs(d.t, "prefix", &p)
		var h uint64
		for _, blk := range strings.Split(p, ",") {
			h = h*1000003 ^ uint64(len(blk)) ^ d.blockID(blk)
			o.Prefix = append(o.Prefix, h)
		}
	}
	out := d.r.Offer(d.at(td), o)
	if out.Handle != 0 {
		d.handles[id], d.names[out.Handle] = out.Handle, id
	}
	b.WriteString(d.outcome(id, out))
}

func (d *driver) blockID(s string) uint64 {
	if v, ok := d.prefix[s]; ok {
		return v
	}
	d.prefix[s] = uint64(len(d.prefix) + 1)
	return d.prefix[s]
}

func (d *driver) outcome(id string, o Outcome) string {
	switch o.Status {
	case Waiting:
		return fmt.Sprintf("%s: waiting\n", id)
	case Dispatched:
		p := o.Placement
		if p.Kind == Aggregate {
			return fmt.Sprintf("%s: dispatched aggregate on %s ttft=%.3f\n", id, p.Prefill, p.ProjectedTTFT)
		}
		return fmt.Sprintf("%s: dispatched prefill=%s decode=%s ttft=%.3f\n", id, p.Prefill, p.Decode, p.ProjectedTTFT)
	case Rejected:
		s := fmt.Sprintf("%s: rejected %d %s", id, o.Code.Status(), o.Code)
		if o.RetryAfterS > 0 {
			s += fmt.Sprintf(" retry-after=%d", o.RetryAfterS)
		}
		if o.Code == ContextLengthExceeded {
			s += fmt.Sprintf(" need=%d limit=%d", o.Need, o.Limit)
		}
		return s + "\n"
	}
	return fmt.Sprintf("%s: status %d\n", id, o.Status)
}

func (d *driver) fleetChange(td *datadriven.TestData, b *strings.Builder) {
	var id, to string
	td.ScanArgs(d.t, "id", &id)
	if td.Cmd == "lifecycle" || td.Cmd == "role" {
		td.ScanArgs(d.t, "to", &to)
	}
	now := d.at(td)
	var err error
	switch td.Cmd {
	case "add":
		var role string
		td.ScanArgs(d.t, "role", &role)
		if role == "open" {
			role = ""
		}
		d.added++
		_, err = d.fleet.Add(config.Engine{ID: id, Address: fmt.Sprintf("10.0.1.%d:8000", d.added), Role: role, Profile: config.DefaultProfileName}, "test", now)
	case "remove":
		_, err = d.fleet.Remove(id, now, "test")
	case "role":
		role, perr := fleet.ParseRole(to)
		if perr != nil {
			d.t.Fatal(perr)
		}
		_, err = d.fleet.SetRole(id, role, now, "test")
	default:
		var l fleet.Lifecycle
		for _, c := range fleet.Lifecycles {
			if c.String() == to {
				l = c
			}
		}
		_, err = d.fleet.SetLifecycle(id, l, now, "test")
	}
	if err != nil {
		fmt.Fprintf(b, "error: %v\n", err)
		return
	}
	d.r.SetFleet(now, d.fleet.Snapshot())
}

func (d *driver) state(b *strings.Builder) {
	s := d.r.Snapshot(d.now)
	c := s.Counters
	fmt.Fprintf(b, "offers=%d invalid=%d admitted=%d overflow=%+v\n", c.Offers, c.Invalid, c.Admitted, c.Overflow)
	fmt.Fprintf(b, "dispatched=%+v completed=%d failed=%d cancelled=%+v first_token_timeouts=%d\n",
		c.Dispatched, c.Completed, c.Failed, c.Cancelled, c.FirstTokenTimeouts)
	if c.ContextLengthExceeded+c.Ejections > 0 {
		fmt.Fprintf(b, "context_length_exceeded=%d ejections=%d\n", c.ContextLengthExceeded, c.Ejections)
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
		b.WriteString("\n")
	}
}

func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/scripts", func(t *testing.T, path string) {
		d := newDriver(t)
		datadriven.RunTest(t, path, d.run)
	})
}

func splitIDs(s string) []string {
	if s == "-" {
		return nil
	}
	return strings.Split(s, ",")
}
